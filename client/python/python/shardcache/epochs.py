"""Where a reader stands in its epochs, written once for the datasets and the sampler:
the epoch, the places of its order all ranks had read before a resume (``base``), this
rank's reads since (``consumed``), and whether the next iteration runs the next epoch by
itself.

Epochs advance by themselves: a copy that has run an epoch runs the next one when
iterated again, unless ``set_epoch`` (or ``load_state_dict``) chose one meanwhile. With
``persistent_workers`` each DataLoader worker keeps its copy and never sees the main
process's ``set_epoch``, so without this every epoch would repeat epoch 0's order."""

from typing import Optional, Tuple


class EpochState:
    """The epoch and resume state of a reader (a mixin of ``StreamingShardDataset`` and
    ``ShardSampler``)."""

    def _init_epochs(self) -> None:
        self.epoch = 0
        self.base = 0
        self.consumed = 0
        self._iterated = False
        self._chosen = False

    def _choose(self, epoch: int, base: int = 0) -> None:
        """Epoch ``epoch``, from ``base`` places read by all ranks (0: its start)."""
        self.epoch = epoch
        self.base, self.consumed = base, 0
        self._chosen = True

    def _begin_iteration(self) -> None:
        """At an iteration's start: the next epoch, unless one was chosen since the last."""
        if self._iterated and not self._chosen:
            self._choose(self.epoch + 1)
        self._iterated, self._chosen = True, False

    def _place(self, consumed: Optional[int], ranks: int) -> Tuple[int, int]:
        """(this rank's reads, the places all ``ranks`` have read) with ``consumed`` reads
        of this rank since the epoch began or was resumed (its own count when None)."""
        consumed = self.consumed if consumed is None else consumed
        return consumed, self.base + consumed * ranks
