"""Plans followed sample by sample: a reader's next reads sent to the spoke as byte ranges,
a rolling window ahead of its reads, each with where the same sample is read next.

A spoke follows a job's plan whole shard by whole shard while a block of it fits its
cache; otherwise (a uniform shuffle, ``shard_block`` as large as the cache, a map-style
sampler) it answers the plan with ``samples=True`` and the reader sends its samples here.
The spoke then fetches the nearest ahead in batches of ranges, holds them until read, and
keeps for the next epoch what is read again: each sample crosses the long link once an
epoch as read, never as part of a whole shard evicted before it is read.

Positions are counted across epochs (``epoch * samples_per_epoch + place``); a sample's
next use is the position of its next read: exact where the order says it per sample (the
sampler's permutation), or the start of the block that reads it next (a block shuffle's
large blocks: any sample kept until its block is read is read once then, so the spoke
needs no more).
"""

import itertools
import warnings
from typing import Any, Iterable, Iterator, Optional, Tuple

from ._native import ShardcacheError

# Samples a reader sends ahead of its reads at least (a window of the spoke's is a few
# hundred to a few thousand samples; twice its bytes are sent once the spoke says how many
# those are).
AHEAD_SAMPLES = 2048
# And at most: one plan call of this many reads is ~400 KB.
MAX_AHEAD_SAMPLES = 1 << 15

# Formats whose samples are ranges a read asks for as such (MDS shards compressed whole
# and Parquet row groups, read and decoded whole for many samples, are not).
SAMPLE_RANGES_FORMATS = ("records", "tokens", "megatron", "webdataset")

# One planned read: its position, its sample (shard, sample), and its next use.
Planned = Tuple[int, Tuple[int, int], Optional[int]]


class SampleWindow:
    """Sends ``job``'s reads of ``records`` (a dataset's samples) ahead of them: ``planned``
    yields ``(position, (shard, sample), next_use)`` in reading order; :meth:`read` is told
    how many were read, and keeps a window of sent reads ahead. A spoke that refuses is
    warned about once and told nothing more (a plan is a hint)."""

    def __init__(self, records: Any, job: str, samples_per_epoch: int, planned: Iterable[Planned]):
        self.records = records
        self.job = job
        self.samples_per_epoch = samples_per_epoch
        self.planned: Iterator[Planned] = iter(planned)
        self.ahead = AHEAD_SAMPLES
        self.sent = 0
        self.done = 0
        self.stopped = False
        self.send()

    def read(self, count: int) -> None:
        """``count`` more samples were read: sends what keeps the window ahead of them."""
        self.done += count
        if self.sent < self.done + self.ahead // 2:
            self.send()

    def send(self) -> None:
        if self.stopped:
            return
        batch = list(itertools.islice(self.planned, max(self.done + self.ahead - self.sent, 0)))
        if not batch:
            return
        records = self.records
        names = records.shards
        try:
            pieces = records.samples.pieces([item for _, item, _ in batch])
            reads = [
                (position, names[shard], offset, length, next_use)
                for (position, _, next_use), parts in zip(batch, pieces)
                for shard, offset, length in parts
            ]
            answer = records.client.plan_samples(self.job, records.dataset, self.samples_per_epoch, reads)
        except ShardcacheError as error:
            self.stopped = True
            if getattr(error, "code", "") != "UNIMPLEMENTED":
                warnings.warn(f"shardcache: the spoke did not take the samples of the plan: {error}", stacklevel=3)
            return
        self.sent += len(batch)
        mean = max(sum(r[3] for r in reads) // max(len(batch), 1), 1)
        self.ahead = min(max(AHEAD_SAMPLES, 2 * answer["window_bytes"] // mean), MAX_AHEAD_SAMPLES)


def follows_samples(answer: Any) -> bool:
    """Whether a spoke's answer to a plan (``Client.plan``) asks for its samples."""
    return bool(answer and answer.get("samples"))


def planned_reads(positions: Iterable[int], base: int, item, next_use) -> Iterator[Planned]:
    """``(base + p, item(p), next_use(item(p)))`` of each of ``positions``."""
    for p in positions:
        sample = item(p)
        yield base + p, sample, next_use(sample)
