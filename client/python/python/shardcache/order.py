"""The epoch order of :class:`~shardcache.StreamingShardDataset`, computed a position at a
time and never listed whole.

A dataset's claims are checked against its files' bytes, but a valid dataset may still
hold billions of samples: an epoch order listed as Python pairs would take ~100 bytes
each in every DataLoader worker. Here the order is its blocks (a few numbers each) and
one block's inner shuffle at a time:

- a block of at most :data:`LISTED_BLOCK` samples is shuffled as a list of its positions
  (``random.Random(f"shardcache:{seed}:{epoch}:block{first unit}")``, an ``array`` of 8
  bytes a position): the order earlier versions listed, so a state saved by one resumes
  in the same order (a state they saved in an epoch with larger blocks resumes with a
  warning: those blocks were shuffled another way);
- a larger block is shuffled by a permutation computed per position (a Feistel network
  over the next power of four, cycle-walking the values past the block back in: Black &
  Rogaway's cipher on an arbitrary domain), in constant memory: :class:`Permutation`, the
  Rust SDK's (``shardcache_client::order``), one implementation for both.

A worker walks only its own positions (``base + rank + world_size * j``), so each
worker's cost is its share of the epoch, not the epoch.
"""

import array
import bisect
import random
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ._native import Permutation

# Samples a block may have and still be shuffled as a list (8 MiB of positions).
LISTED_BLOCK = 1 << 20


class _Block:
    """One block of units: where its samples start in the epoch, and their inner order."""

    def __init__(self, start: int, units: List[Tuple[int, int, int]], key: Optional[str]):
        self.start = start
        self.units = units
        self.ends: List[int] = []
        total = 0
        for _, _, count in units:
            total += count
            self.ends.append(total)
        self.size = total
        self.key = key  # None: not shuffled
        self._order: Optional[Sequence[int]] = None  # an array, or a Permutation

    def position(self, k: int) -> int:
        """The block's sample (0..size, in unit order) at place ``k`` of its order."""
        if self.key is None:
            return k
        if self._order is None:
            if self.size <= LISTED_BLOCK:
                order = array.array("q", range(self.size))
                random.Random(self.key).shuffle(order)
                self._order = order
            else:
                self._order = Permutation(self.size, self.key)
        return self._order[k]

    def item(self, k: int) -> Tuple[int, int]:
        """(shard, sample) at place ``k`` of this block's order."""
        sample = self.position(k)
        u = bisect.bisect_right(self.ends, sample)
        shard, first, count = self.units[u]
        return shard, first + sample - (self.ends[u] - count)

    def release(self) -> None:
        self._order = None


class EpochOrder:
    """The order of one epoch: units ``(shard, first sample, samples)`` shuffled by
    ``(seed, epoch)``, cut into blocks of ``shard_block`` units, each block's samples
    shuffled together (a block shuffle, as MosaicML Streaming's ``py1b``)."""

    def __init__(self, units: Sequence[Tuple[int, int, int]], seed: int, epoch: int, shuffle: bool, shard_block: int):
        picked = list(range(len(units)))
        if shuffle:
            random.Random(f"shardcache:{seed}:{epoch}").shuffle(picked)
        self.blocks: List[_Block] = []
        self.starts: List[int] = []
        total = 0
        for first in range(0, len(picked), shard_block):
            key = f"shardcache:{seed}:{epoch}:block{first}" if shuffle else None
            block = _Block(total, [units[u] for u in picked[first : first + shard_block]], key)
            self.blocks.append(block)
            self.starts.append(total)
            total += block.size
        self.size = total
        self._current: Optional[_Block] = None
        # Which block reads each unit, and each shard's units (first sample, unit), for
        # where a sample is read (`block_start_of`).
        self.unit_block = [0] * len(units)
        for at, u in enumerate(picked):
            self.unit_block[u] = at // shard_block
        self.units = units
        self._shard_units: Optional[Dict[int, List[Tuple[int, int]]]] = None

    def __len__(self) -> int:
        return self.size

    def block_start_of(self, shard: int, sample: int) -> int:
        """The position at which the block that reads ``(shard, sample)`` begins: where the
        sample is read, to a block (a plan followed sample by sample needs no more: any
        sample kept until its block is read is read once then)."""
        if self._shard_units is None:
            by_shard: Dict[int, List[Tuple[int, int]]] = {}
            for u, (s, first, _) in enumerate(self.units):
                by_shard.setdefault(s, []).append((first, u))
            for listed in by_shard.values():
                listed.sort()
            self._shard_units = by_shard
        listed = self._shard_units[shard]
        u = listed[bisect.bisect_right(listed, (sample, len(self.units))) - 1][1]
        return self.starts[self.unit_block[u]]

    def _block(self, position: int) -> _Block:
        block = self.blocks[bisect.bisect_right(self.starts, position) - 1]
        if block is not self._current:
            if self._current is not None:
                self._current.release()  # one block's inner order held at a time
            self._current = block
        return block

    def __getitem__(self, position: int) -> Tuple[int, int]:
        if not 0 <= position < self.size:
            raise IndexError(f"position {position} is outside 0..{self.size}")
        block = self._block(position)
        return block.item(position - block.start)

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        return (self[p] for p in range(self.size))

    def positions(self, base: int, rank: int, world_size: int, consumed: int, batch_size: int,
                  worker_id: int, num_workers: int) -> Iterator[int]:
        """The epoch positions worker ``worker_id`` of rank ``rank`` reads, in order:
        past ``base``, every ``world_size``-th from ``rank``, past this rank's
        ``consumed``, in runs of ``batch_size`` dealt to the workers in turn."""
        j = consumed + worker_id * batch_size
        stride = num_workers * batch_size
        while True:
            for jj in range(j, j + batch_size):
                p = base + rank + world_size * jj
                if p >= self.size:
                    return
                yield p
            j += stride

    def items(self, positions: Iterator[int]) -> Iterator[Tuple[int, int]]:
        return (self[p] for p in positions)

    def plan(self, positions: Iterator[int], listed_up_to: int) -> Tuple[List[int], List[int]]:
        """The shards read at ``positions`` in the order of their first read, and for each
        the index (in that list) of the last shard first read before its own last read.
        Past ``listed_up_to`` positions it is read from the blocks (every shard of a block
        read until the block's last new shard), so a plan of a huge share costs its blocks."""
        index: Dict[int, int] = {}
        order: List[int] = []
        until: List[int] = []

        def read(shard: int) -> None:
            at = index.get(shard)
            if at is None:
                index[shard] = len(order)
                order.append(shard)
                until.append(len(order) - 1)
            else:
                until[at] = len(order) - 1

        for n, p in enumerate(positions):
            if n == listed_up_to:
                self._plan_blocks(p, read, until, index)
                break
            read(self[p][0])
        return order, until

    def _plan_blocks(self, position: int, read, until: List[int], index: Dict[int, int]) -> None:
        first = bisect.bisect_right(self.starts, position) - 1
        for block in self.blocks[first:]:
            shards = list(dict.fromkeys(shard for shard, _, _ in block.units))
            for shard in shards:
                read(shard)
            last = len(until) - 1
            for shard in shards:
                until[index[shard]] = max(until[index[shard]], last)
