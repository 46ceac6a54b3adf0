"""The epoch order computed per position (shardcache.order): a permutation of every
sample whatever the block's size, split across ranks and workers exactly once."""

import pytest

from shardcache import order as order_module
from shardcache.order import EpochOrder, Permutation


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 17, 1000, 4097])
def test_a_computed_permutation_is_a_bijection(n):
    p = Permutation(n, "k")
    assert sorted(p[i] for i in range(n)) == list(range(n))
    assert [p[i] for i in range(n)] == [Permutation(n, "k")[i] for i in range(n)]
    if n > 3:
        assert [p[i] for i in range(n)] != [Permutation(n, "other")[i] for i in range(n)]
        assert [p[i] for i in range(n)] != list(range(n))
    with pytest.raises(IndexError):
        p[n]


UNITS = [(0, 0, 300), (1, 0, 77), (2, 0, 5), (2, 5, 140), (3, 0, 1)]
EVERYTHING = sorted((s, first + k) for s, first, count in UNITS for k in range(count))


@pytest.mark.parametrize("listed", [1 << 20, 10])
def test_every_sample_once_whether_blocks_are_listed_or_computed(monkeypatch, listed):
    monkeypatch.setattr(order_module, "LISTED_BLOCK", listed)
    order = EpochOrder(UNITS, seed=4, epoch=1, shuffle=True, shard_block=2)
    items = list(order)
    assert sorted(items) == EVERYTHING
    assert list(EpochOrder(UNITS, 4, 1, True, 2)) == items
    assert list(EpochOrder(UNITS, 4, 2, True, 2)) != items
    # Blocks of two units: the first block's samples all come before the rest.
    first_block = {s for s, _ in items[: order.blocks[0].size]}
    assert len(first_block) <= 2
    # 3 ranks x 2 workers, resumed past 50 samples: the rest exactly once.
    seen = [order[p] for rank in range(3) for worker in range(2)
            for p in order.positions(50, rank, 3, 0, 7, worker, 2)]
    assert sorted(seen) == sorted(items[50:])


def test_a_plan_names_the_shards_in_the_order_of_their_first_read():
    order = EpochOrder(UNITS, seed=4, epoch=1, shuffle=True, shard_block=2)
    # One by one: worker 1 of 2 on rank 2 of 3 names what it reads, first read first.
    mine = list(order.positions(0, 2, 3, 0, 4, 1, 2))
    listed, until = order.plan(iter(mine), listed_up_to=1 << 30)
    first_reads = list(dict.fromkeys(order[p][0] for p in mine))
    assert listed == first_reads
    shards = [order[p][0] for p in mine]
    first = {s: shards.index(s) for s in listed}
    last = {s: i for i, s in enumerate(shards)}
    # Each read until the last shard whose first read comes before its own last read.
    assert until == [max(j for j, t in enumerate(listed) if first[t] <= last[s]) for s in listed]
    # From the blocks: every block's shards in unit order, each read until its block's last new shard.
    blocks, until = order.plan(order.positions(0, 0, 1, 0, 4, 0, 1), listed_up_to=0)
    expected, ends = [], {}
    for block in order.blocks:
        for shard in dict.fromkeys(s for s, _, _ in block.units):
            if shard not in expected:
                expected.append(shard)
        for shard, _, _ in block.units:
            ends[shard] = len(expected) - 1
    assert blocks == expected and until == [ends[s] for s in expected]


_MASK64 = (1 << 64) - 1


def _reference_permutation(n, key):
    """The Python permutation every release before the Rust one computed (the states they
    saved resume in its order): a Feistel network over the next power of four, keyed by
    blake2b, cycle-walking."""
    import hashlib

    bits = max(2, (n - 1).bit_length())
    bits += bits & 1
    half, mask = bits // 2, (1 << (bits // 2)) - 1
    digest = hashlib.blake2b(key.encode(), digest_size=32).digest()
    keys = [int.from_bytes(digest[8 * r: 8 * r + 8], "little") for r in range(4)]

    def mix(x):
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
        return x ^ (x >> 31)

    def encrypt(x):
        left, right = x >> half, x & mask
        for k in keys:
            left, right = right, left ^ (mix(right ^ k) & mask)
        return (left << half) | right

    def at(p):
        x = encrypt(p)
        while x >= n:
            x = encrypt(x)
        return x

    return [at(p) for p in range(n)]


@pytest.mark.parametrize("n,key", [(1, "a"), (5, "shardcache:0:1:block0"), (1000, "k"), (4097, "shardcache:3:2:block8")])
def test_the_native_permutation_is_the_one_earlier_releases_computed_and_inverts(n, key):
    p = Permutation(n, key)
    assert [p[i] for i in range(n)] == _reference_permutation(n, key)
    assert p.take(0, n) == [p[i] for i in range(n)]
    assert all(p.position_of(p[i]) == i for i in range(n))


def test_where_a_block_begins_is_where_its_samples_are_read():
    order = EpochOrder(UNITS, seed=4, epoch=1, shuffle=True, shard_block=2)
    for position, (shard, sample) in enumerate(order):
        start = order.block_start_of(shard, sample)
        block = order.blocks[order.starts.index(start)]
        assert block.start <= position < block.start + block.size, (shard, sample)
