"""What the long link carries for a map-style dataset under ``DataLoader(shuffle=True)``
through a spoke half the dataset's size: what the reader reads plus one fill of the
cache in its first epoch (the spoke stores what fits, then fetches the rest as read),
less in its next (what was kept is read from the cache)."""

import subprocess

import pytest

from conftest import RECORD, binary, start

torch = pytest.importorskip("torch")

import shardcache  # noqa: E402

SHARDS = 8
RECORDS_PER_SHARD = 64  # 1 MiB shards
CAPACITY = SHARDS * RECORDS_PER_SHARD * RECORD // 2


@pytest.fixture(scope="module")
def half_size_spoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("maps")
    subprocess.run(
        [binary("shardcache"), "gen", "--dir", str(root), "--dataset", "maps", "--shards", str(SHARDS),
         "--shard-size", f"{RECORD * RECORDS_PER_SHARD}B", "--record-size", "16KiB", "--seed", "5"],
        check=True, stdout=subprocess.DEVNULL,
    )
    hub, hub_addr = start([binary("hub-server"), "--root", str(root), "--listen", "127.0.0.1:0"],
                          "hub-server listening on ")
    cache = tmp_path_factory.mktemp("half-cache")
    spoke, rest = start([binary("spoke-cache"), "--hub", f"http://{hub_addr}", "--cache-dir", str(cache),
                         "--capacity", f"{CAPACITY}B", "--chunk-size", "128KiB", "--listen", "127.0.0.1:0",
                         "--metrics-listen", "127.0.0.1:0"],
                        "spoke-cache listening on ")
    records = []
    for shard in sorted((root / "maps").glob("*.bin")):
        data = shard.read_bytes()
        records.extend(data[i:i + RECORD] for i in range(0, len(data), RECORD))
    yield f"http://{rest.split()[0]}", records
    for proc in (spoke, hub):
        proc.kill()
        proc.wait()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 2 workers on 2 cores
def test_a_shuffled_map_style_dataset_through_a_half_size_spoke_costs_its_reads_plus_one_fill(half_size_spoke):
    endpoint, records = half_size_spoke
    client = shardcache.Client(endpoint)
    ds = shardcache.ShardDataset(endpoint, "maps", dtype=None)
    assert len(ds) == len(records)
    fetched = []
    for epoch in range(2):
        before = client.status()["datasets"].get("maps", {}).get("upstream_bytes", 0)
        loader = torch.utils.data.DataLoader(
            ds, batch_size=16, shuffle=True, num_workers=2, collate_fn=list,
            generator=torch.Generator().manual_seed(epoch),
        )
        seen = 0
        for batch in loader:
            for sample in batch:
                assert bytes(sample) in records
                seen += 1
        assert seen == len(records)
        fetched.append(client.status()["datasets"]["maps"]["upstream_bytes"] - before)
    read = len(records) * RECORD
    assert fetched[0] <= read + CAPACITY, f"epoch 1 brought {fetched[0]} for {read} read"
    assert fetched[1] < fetched[0], f"epoch 2 brought {fetched[1]}, epoch 1 {fetched[0]}"
