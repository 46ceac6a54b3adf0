"""A sampler for :class:`~shardcache.ShardDataset` that tells the spoke the order it reads.

``ShardSampler(dataset)`` is a drop-in for ``RandomSampler(dataset)``, and with
``num_replicas``/``rank`` (or torch.distributed's) for ``DistributedSampler(dataset)``:
the same arguments, ``set_epoch``, ``len``; each epoch a new permutation of the dataset
from ``(seed, epoch)``, dealt to the ranks as ``DistributedSampler`` deals it (padded with
the epoch's first places to a multiple of the ranks, or cut to one with ``drop_last``).
The permutation is computed per position (``shardcache_client::order``, the Rust SDK's),
never listed: an epoch of a billion samples costs nothing to start.

With ``plan=True`` (the default) it sends the spoke its rank's next samples as byte ranges
ahead of the reads, each with the position of its next read (the next epoch's permutation
inverted), as the job its dataset's reads name: a spoke smaller than the dataset fetches
them ahead in batches (one round trip for many, not one a sample) and keeps for the next
epoch what it has room for, so a shuffled map-style reader through a spoke is never slower
than it is without one, and costs the link no more than its reads. A server that takes no
plans (a hub) is told nothing more.

Resumable: ``state_dict(consumed)`` records the samples all ranks have read this epoch,
and a state resumes under another number of ranks, the rest of the epoch once each.
"""

import warnings
from typing import Any, Dict, Iterator, Optional

from ._native import SamplerOrder
from .epochs import EpochState
from .plans import SAMPLE_RANGES_FORMATS, SampleWindow

# Indices computed at once (one call into the native order).
CHUNK = 1024


def _torch_sampler_base() -> type:
    try:
        from torch.utils.data import Sampler

        return Sampler
    except ImportError:
        return object


class ShardSampler(EpochState, _torch_sampler_base()):  # type: ignore[misc]
    """Indices of ``dataset`` (a :class:`~shardcache.ShardDataset`) for this rank, an epoch
    at a time; see the module's documentation."""

    def __init__(
        self,
        dataset: Any,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        plan: bool = True,
        job: Optional[str] = None,
    ):
        from ._torch import rank_and_world

        default_rank, default_world = rank_and_world()
        self.num_replicas = default_world if num_replicas is None else num_replicas
        self.rank = default_rank if rank is None else rank
        if self.num_replicas <= 0 or not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is outside 0..{self.num_replicas}")
        self.dataset = dataset
        self.shuffle, self.seed, self.drop_last, self.plan = shuffle, seed, drop_last, plan
        self.order = SamplerOrder(len(dataset), seed, shuffle, self.num_replicas, drop_last)
        self.job = job or f"{dataset._records.dataset}:sampler:{seed}"
        # The dataset's reads name this job (pickled into DataLoader workers with it).
        dataset.job = self.job
        self._init_epochs()

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch (its permutation), from its start; the dataset's reads name it
        (call it before iterating the DataLoader, as with ``DistributedSampler``). Without
        it each iteration runs the next epoch."""
        self._choose(epoch)
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        """Samples this rank reads from where it stands (an epoch's share from its start)."""
        places = self.order.places
        left = max(places - self.base - self.rank, 0)
        return (left + self.num_replicas - 1) // self.num_replicas - self.consumed

    def state_dict(self, consumed: Optional[int] = None) -> Dict[str, int]:
        """Where the job is: ``consumed`` samples this rank has read since the epoch began
        (or since it was resumed); every rank has read as many, as in data-parallel
        training."""
        _, place = self._place(consumed, self.num_replicas)
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "place_in_epoch": place,
            "num_replicas": self.num_replicas,
        }

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Resumes where ``state`` was saved, whatever number of ranks saved it: the next
        iteration deals the rest of that epoch to this run's ranks."""
        if state["seed"] != self.seed:
            warnings.warn(f"shardcache: resuming seed {state['seed']} in a sampler of seed {self.seed}", stacklevel=2)
            self.seed = state["seed"]
            self.order = SamplerOrder(len(self.dataset), self.seed, self.shuffle, self.num_replicas, self.drop_last)
        self._choose(state["epoch"], state["place_in_epoch"])
        self.dataset.set_epoch(self.epoch)

    def _window(self) -> Optional[SampleWindow]:
        records = self.dataset._records
        if not self.plan or records.format not in SAMPLE_RANGES_FORMATS:
            return None
        order, epoch, places = self.order, self.epoch, self.order.places

        def planned():
            start = 0
            while True:
                at = order.rank_places(self.rank, self.base, start, CHUNK)
                if not at:
                    return
                samples = order.rank_samples(epoch, self.rank, self.base, start, CHUNK)
                for place, sample in zip(at, samples):
                    later = order.place_of(epoch + 1, sample)
                    next_use = None if later is None else (epoch + 1) * places + later
                    yield epoch * places + place, records.locate(sample), next_use
                start += len(at)

        return SampleWindow(records, self.dataset.job, places, planned())

    def __iter__(self) -> Iterator[int]:
        self._begin_iteration()
        self.dataset.set_epoch(self.epoch)
        window = self._window()
        start = 0
        while True:
            indices = self.order.rank_samples(self.epoch, self.rank, self.base, start, CHUNK)
            if not indices:
                return
            if window is not None:
                window.read(len(indices))
            yield from indices
            start += len(indices)
