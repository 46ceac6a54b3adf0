"""ShardSampler: a drop-in for RandomSampler and DistributedSampler over a ShardDataset that
deals every index once an epoch across ranks (DistributedSampler's padding included),
resumes exactly under another number of ranks, and, through a spoke smaller than the
dataset, sends its order as a plan: the link carries what is read, and the next epoch
reads what was kept from the cache."""

import collections

import pytest

import shardcache
from conftest import RECORD, binary, start

TOTAL = 48


def samplers(spoke, ranks, **kwargs):
    ds = shardcache.ShardDataset(spoke, "c4", dtype=None)
    return [shardcache.ShardSampler(ds, num_replicas=ranks, rank=r, plan=False, **kwargs) for r in range(ranks)]


def test_every_index_once_an_epoch_across_ranks_with_distributed_samplers_padding(spoke):
    for ranks in (1, 3, 5):
        dealt = samplers(spoke, ranks, seed=2)
        for s in dealt:
            s.set_epoch(4)
        per_rank = [list(s) for s in dealt]
        assert all(len(mine) == len(s) == -(-TOTAL // ranks) for mine, s in zip(per_rank, dealt))
        counts = collections.Counter(i for mine in per_rank for i in mine)
        assert set(counts) == set(range(TOTAL)), ranks
        # Padded to a multiple of the ranks with the epoch's first places (as DistributedSampler).
        assert sum(counts.values()) - TOTAL == (-TOTAL) % ranks
    cut = samplers(spoke, 5, seed=2, drop_last=True)
    assert sum(len(list(s)) for s in cut) == TOTAL // 5 * 5
    one = samplers(spoke, 1, seed=2)[0]
    first, second = list(one), list(one)
    assert sorted(first) == sorted(second) == list(range(TOTAL)) and first != second, "a new epoch each pass"
    assert list(samplers(spoke, 1, seed=2)[0]) == first, "the same seed, the same first epoch"
    unshuffled = samplers(spoke, 1, shuffle=False)[0]
    assert list(unshuffled) == list(range(TOTAL))


def test_a_state_resumes_the_rest_of_the_epoch_once_under_another_number_of_ranks(spoke):
    before = samplers(spoke, 2, seed=5)
    for s in before:
        s.set_epoch(1)
    read = [list(s)[:7] for s in before]  # each rank read 7 samples, then the job stopped
    state = before[0].state_dict(consumed=7)
    after = samplers(spoke, 3, seed=5)
    for s in after:
        s.load_state_dict(state)
    rest = [i for s in after for i in s]
    full = collections.Counter(i for s in samplers(spoke, 2, seed=5) for i in (s.set_epoch(1), list(s))[1])
    assert collections.Counter(i for mine in read for i in mine) + collections.Counter(rest) == full


def test_through_a_spoke_half_the_datasets_size_the_plan_brings_what_is_read_and_keeps_some(tmp_path):
    data = tmp_path / "data"
    subprocess_run([binary("shardcache"), "gen", "--dir", str(data), "--dataset", "big", "--shards", "8",
                    "--shard-size", "1MiB", "--record-size", "16KiB", "--seed", "9"])
    hub, hub_addr = start([binary("hub-server"), "--root", str(data), "--listen", "127.0.0.1:0"],
                          "hub-server listening on ")
    spoke, rest = start([binary("spoke-cache"), "--hub", f"http://{hub_addr}", "--cache-dir", str(tmp_path / "cache"),
                         "--capacity", "4MiB", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
                        "spoke-cache listening on ")
    try:
        endpoint = f"http://{rest.split()[0]}"
        files = [p.read_bytes() for p in sorted((data / "big").glob("*.bin"))]
        records = [f[i:i + RECORD] for f in files for i in range(0, len(f), RECORD)]
        ds = shardcache.ShardDataset(endpoint, "big", dtype=None)
        sampler = shardcache.ShardSampler(ds, seed=1)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            order = list(sampler)
            for i in range(0, len(order), 32):
                batch = order[i:i + 32]
                assert ds.get_batch(batch) == [records[j] for j in batch]
        status = shardcache.Client(endpoint).status()
        rows = {row["epoch"]: row for row in status["jobs"] if row["job"] == sampler.job}
        dataset = 8 << 20
        assert rows[0]["link_bytes"] <= dataset * 1.05, rows[0]
        assert rows[1]["link_bytes"] < dataset and rows[1]["hit_reads"] > 0, rows[1]
        assert status["kept_sample_bytes"] > 0, status
    finally:
        for proc in (spoke, hub):
            proc.kill()
            proc.wait()


def subprocess_run(args):
    import subprocess

    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
