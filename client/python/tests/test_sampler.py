"""ShardSampler: a drop-in for RandomSampler and DistributedSampler over a ShardDataset that
deals every index once an epoch across ranks (DistributedSampler's padding included),
resumes exactly under another number of ranks, and, through a spoke smaller than the
dataset, sends its order as a plan: the link carries what is read, and the next epoch
reads what was kept from the cache; in a DataLoader with workers, its window rolls ahead
of the reads and every read is one the spoke had in the job's plan."""

import collections
import time

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


class Indexed:
    """``ds`` with each sample's index beside it (a torch Dataset by duck typing), to
    check what a DataLoader's workers read against the files."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitems__(self, indices):
        return list(zip(indices, self.ds.__getitems__(indices)))


def test_in_a_dataloader_with_workers_its_rolling_plan_is_followed_and_every_index_read_once(tmp_path):
    """Two ranks, each a DataLoader with 2 workers over ShardSampler, on a dataset with more
    samples per rank than the plan's window sends at once (its window rolls as the reads
    go): every index once an epoch across the ranks, every read one the spoke had in the
    job's plan, the link (the emulator's count) carrying no more than was read, and what
    the spoke kept read from its cache the next epoch."""
    import torch  # make test installs it: the test fails without it, never skips
    record, samples = 4096, 6144  # 3072 a rank, over the 2048 the window sends at first
    data = tmp_path / "data"
    subprocess_run([binary("shardcache"), "gen", "--dir", str(data), "--dataset", "ds", "--shards", "6",
                    "--shard-size", f"{record * samples // 6}B", "--record-size", f"{record}B", "--seed", "9"])
    files = [p.read_bytes() for p in sorted((data / "ds").glob("*.bin"))]
    records = [f[i:i + record] for f in files for i in range(0, len(f), record)]
    assert len(records) == samples
    counters = tmp_path / "link.counters"
    hub, hub_addr = start([binary("hub-server"), "--root", str(data), "--listen", "127.0.0.1:0",
                           "--link-compression-level", "0"], "hub-server listening on ")
    link, link_addr = start([binary("wan-proxy"), "--listen", "127.0.0.1:0", "--upstream", hub_addr,
                             "--rtt", "0ms", "--counters-file", str(counters)], "wan-proxy listening on ")
    spoke, rest = start([binary("spoke-cache"), "--hub", f"http://{link_addr}", "--cache-dir", str(tmp_path / "cache"),
                         "--capacity", "4MiB", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
                        "spoke-cache listening on ")
    try:
        endpoint = f"http://{rest.split()[0]}"
        client = shardcache.Client(endpoint)
        ds = shardcache.ShardDataset(endpoint, "ds", dtype=None)
        ranks = [shardcache.ShardSampler(ds, num_replicas=2, rank=r, seed=4) for r in (0, 1)]
        job = ranks[0].job
        kept_before = 0
        for epoch in range(2):
            before = settled_link(counters, client)
            read = collections.Counter()
            for sampler in ranks:
                sampler.set_epoch(epoch)
                loader = torch.utils.data.DataLoader(Indexed(ds), batch_size=32, sampler=sampler, num_workers=2,
                                                     collate_fn=list)
                for batch in loader:
                    for index, sample in batch:
                        assert sample == records[index], f"sample {index} differs from the files"
                        read[index] += 1
            assert read == collections.Counter(range(samples)), f"epoch {epoch}: every index once across the ranks"
            wire = settled_link(counters, client) - before
            status = client.status()
            row = next(r for r in status["jobs"] if r["job"] == job and r["epoch"] == epoch)
            assert row["reads"] == samples, row
            assert row["planned_reads"] == samples, f"epoch {epoch}: reads not in the job's plan: {row}"
            assert wire <= samples * record * 1.05, f"epoch {epoch}: {wire} bytes over the link for {samples * record}"
            if epoch == 1:
                assert row["hit_reads"] * record >= kept_before > 0, (row, kept_before)
            kept_before = status["kept_sample_bytes"]
    finally:
        for proc in (spoke, link, hub):
            proc.kill()
            proc.wait()


def settled_link(counters, client):
    """The bytes the emulator delivered toward the spoke once the spoke has nothing in
    flight and the counts did not move across a fresh write of the counters file (100 ms):
    a condition waited for (at most 60 s)."""
    deadline, last = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        quiet = client.status()["fetches_in_flight"] == 0
        to_client, _, _, writes = (int(v) for v in counters.read_text().split()) if counters.exists() else (0, 0, 0, 0)
        if quiet and last is not None and last[0] == to_client and writes > last[1]:
            return to_client
        if not (quiet and last is not None and last[0] == to_client):
            last = (to_client, writes) if quiet else None
        time.sleep(0.025)
    raise AssertionError(f"the link did not settle within 60 s: {last}")


def subprocess_run(args):
    import subprocess

    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
