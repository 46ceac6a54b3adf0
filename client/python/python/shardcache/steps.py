"""How long a training loop waits on data, measured where it waits, for the job's own
table on the spoke (``shardcache report JOB``, ``Client.report(job)``).

    for batch in shardcache.timed(loader, client, job="train-7b"):
        step(batch)

:func:`timed` wraps any iterable of batches (a ``DataLoader`` over
:class:`~shardcache.StreamingShardDataset`, over :class:`~shardcache.ShardDataset` with
:class:`~shardcache.ShardSampler`, or anything else): the time ``next()`` takes is the
batch's data wait, the time until the loop asks for the next is its step's work (the
GPU's). :class:`StepTimer` is the same by hand (``waiting()`` before asking,
``arrived(samples)`` after). Each rank sends a second's worth at a time from a thread of
its own, never on the loop's path: a spoke that is slow or gone costs the loop nothing
(reports waiting past a few are dropped). The spoke matches the ranks' batches by index
(a step waits for its slowest rank) and keeps the table per phase, as ``make demo``
prints it. The same numbers as the Rust SDK's ``StepTimer``.
"""

import logging
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional

from ._native import Client

SEND_EVERY_S = 1.0
QUEUED_REPORTS = 16

_log = logging.getLogger("shardcache")


def _micros(seconds: float) -> int:
    return max(0, min(int(seconds * 1e6), 2**32 - 1))


class StepTimer:
    """Times one rank's batches of ``job`` (the ``job=`` its reads name) for the spoke's
    table. ``rank`` and ``ranks`` default to torch.distributed's (or ``$RANK`` and
    ``$WORLD_SIZE``)."""

    def __init__(self, client: Client, job: str, rank: Optional[int] = None,
                 ranks: Optional[int] = None, epoch: int = 0):
        if rank is None or ranks is None:
            from ._torch import rank_and_world
            default_rank, default_ranks = rank_and_world()
            rank = default_rank if rank is None else rank
            ranks = default_ranks if ranks is None else ranks
        self.client, self.job, self.rank, self.ranks = client, job, int(rank), int(ranks)
        self.epoch, self._first = int(epoch), 0
        self._wait, self._busy, self._samples = [], [], []
        self._started_ms = 0  # when the loop asked for the report's first batch (wall clock)
        self._asked: Optional[float] = None
        self._arrived: Optional[tuple] = None
        self._sent = time.monotonic()
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue(QUEUED_REPORTS)
        self._sender = threading.Thread(target=self._send_loop, name="shardcache-steps", daemon=True)
        self._sender.start()

    def start_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` begins (its first batch is batch 0)."""
        self._close(time.monotonic())
        self._send()
        self.epoch, self._first = int(epoch), 0

    def waiting(self) -> None:
        """The loop asks for its next batch."""
        now = time.monotonic()
        self._close(now)
        self._asked = now
        if now - self._sent >= SEND_EVERY_S:
            self._send()

    def arrived(self, samples: int) -> None:
        """The loop has its batch, of ``samples`` samples."""
        now = time.monotonic()
        wait = 0.0 if self._asked is None else now - self._asked
        if not self._wait and self._arrived is None:
            self._started_ms = int((time.time() - wait) * 1000)
        self._asked = None
        self._arrived = (now, _micros(wait), int(samples))

    def flush(self) -> None:
        """Sends what was measured so far."""
        self._send()

    def close(self) -> None:
        """The loop is done: its last batch is sent, and the sender waits for it."""
        self._close(time.monotonic())
        self._send()
        self._queue.put(None)
        self._sender.join(timeout=10)

    def _close(self, now: float) -> None:
        if self._arrived is not None:
            at, wait, samples = self._arrived
            self._arrived = None
            self._wait.append(wait)
            self._busy.append(_micros(now - at))
            self._samples.append(samples)

    def _send(self) -> None:
        self._sent = time.monotonic()
        if not self._wait:
            return
        report = (self.epoch, self._first, self._wait, self._busy, self._samples, self._started_ms)
        self._first += len(self._wait)
        self._wait, self._busy, self._samples = [], [], []
        try:
            self._queue.put_nowait(report)
        except queue.Full:
            _log.debug("step reports are not being taken as fast as made; one dropped")

    def _send_loop(self) -> None:
        while True:
            report = self._queue.get()
            if report is None:
                return
            epoch, first, wait, busy, samples, started_ms = report
            try:
                self.client.report_steps(self.job, self.rank, self.ranks, epoch, first, wait, busy, samples, started_ms)
            except Exception as e:  # the loop's data is the point; its report is not
                _log.debug("a step report was not taken: %s", e)


def timed(batches: Iterable[Any], client: Client, job: str, *, epoch: int = 0,
          rank: Optional[int] = None, ranks: Optional[int] = None,
          samples: Optional[Callable[[Any], int]] = None) -> Iterator[Any]:
    """Yields the batches of ``batches`` (one epoch of them), timing how long the loop
    waits for each; ``samples(batch)`` counts a batch's samples (by default a list's
    length, a tuple's or dict's first field's, a tensor's first dimension)."""
    count = samples or _samples_of
    timer = StepTimer(client, job, rank=rank, ranks=ranks, epoch=epoch)
    try:
        it = iter(batches)
        while True:
            timer.waiting()
            try:
                batch = next(it)
            except StopIteration:
                return
            timer.arrived(count(batch))
            yield batch
    finally:
        timer.close()


def _samples_of(batch: Any) -> int:
    """A batch's samples: a list's length, a tuple's or dict's first field's, a tensor's
    or array's first dimension; 1 when it has no length."""
    if isinstance(batch, tuple) and batch:
        batch = batch[0]
    elif isinstance(batch, dict) and batch:
        batch = next(iter(batch.values()))
    try:
        return len(batch)
    except TypeError:
        return 1
