"""A group of three spokes (`--peers`) from Python: the datasets take the group's list
wherever they take an endpoint, read every record right, and the group fetches the
dataset from the hub once (status through the list adds the members up)."""

import socket

import numpy as np
import pytest

import shardcache
from conftest import RECORD, RECORDS_PER_SHARD, SHARDS, binary, start


def free_ports(n):
    """n free loopback ports (the members must know each other's before they start)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture
def group(hub, tmp_path):
    urls = [f"http://127.0.0.1:{p}" for p in free_ports(3)]
    procs = []
    for i, url in enumerate(urls):
        proc, _ = start([binary("spoke-cache"), "--hub", hub, "--cache-dir", str(tmp_path / f"m{i}"),
                         "--listen", url.removeprefix("http://"), "--metrics-listen", "127.0.0.1:0",
                         "--peers", ",".join(urls), "--peer-self", url],
                        "spoke-cache listening on ")
        procs.append(proc)
    yield ",".join(urls)
    for proc in procs:
        proc.kill()
        proc.wait()


def test_datasets_read_through_a_group_and_it_fetches_once(group, records):
    ds = shardcache.ShardDataset(group, "c4")
    assert len(ds) == SHARDS * RECORDS_PER_SHARD
    for i in range(len(ds)):
        assert np.array_equal(ds[i], np.frombuffer(records[i], dtype=np.uint32)), i
    status = shardcache.Client(group).status()["datasets"]["c4"]
    assert status["upstream_bytes"] == SHARDS * RECORDS_PER_SHARD * RECORD, "one copy over the link"
    assert status["cached_shards"] == SHARDS, "each shard held once, by its owner"
