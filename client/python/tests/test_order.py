"""The epoch order computed per position (shardcache.order): a permutation of every
sample whatever the block's size, split across ranks and workers exactly once."""

import pytest

from shardcache import order as order_module
from shardcache.order import EpochOrder, Permutation


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 17, 1000, 4097])
def test_a_computed_permutation_is_a_bijection(n):
    p = Permutation(n, "k")
    assert sorted(p(i) for i in range(n)) == list(range(n))
    assert [p(i) for i in range(n)] == [Permutation(n, "k")(i) for i in range(n)]
    if n > 3:
        assert [p(i) for i in range(n)] != [Permutation(n, "other")(i) for i in range(n)]
        assert [p(i) for i in range(n)] != list(range(n))
    with pytest.raises(IndexError):
        p(n)


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


def test_a_plan_read_from_the_blocks_names_the_same_shards():
    order = EpochOrder(UNITS, seed=4, epoch=1, shuffle=True, shard_block=2)
    listed, _ = order.plan(order.positions(0, 0, 1, 0, 4, 0, 1), listed_up_to=1 << 30)
    blocks, until = order.plan(order.positions(0, 0, 1, 0, 4, 0, 1), listed_up_to=0)
    assert sorted(blocks) == sorted(listed) == [0, 1, 2, 3]
    # Each shard is read until its block's last new shard.
    assert all(u >= i for i, u in enumerate(until))
