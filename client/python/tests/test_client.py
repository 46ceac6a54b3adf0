"""The Python client against real servers: the same bytes as the Rust SDK (the CLI),
errors as ShardcacheError with the gRPC code, safe after fork."""

import multiprocessing
import pathlib
import subprocess

import pytest

import shardcache
from conftest import RECORD, binary, start


def test_reads_equal_the_files_and_the_rust_sdk(spoke, hub, dataset_dir):
    for endpoint in (hub, spoke):
        client = shardcache.Client(endpoint)
        assert [d["name"] for d in client.ls()] == ["c4"]
        shards = client.ls("c4")
        assert len(shards) == 3 and all(s["record_size"] == RECORD for s in shards)
        for info in shards:
            path = dataset_dir / "c4" / info["shard"]
            data = path.read_bytes()
            assert client.stat("c4", info["shard"])["size"] == len(data)
            assert client.read("c4", info["shard"], 0, len(data)) == data
            rust = subprocess.run(
                [binary("shardcache"), "--endpoint", endpoint, "cat", "c4", info["shard"],
                 "--offset", "1000", "--length", "40000"],
                check=True, capture_output=True,
            ).stdout
            assert client.read("c4", info["shard"], 1000, 40000) == rust == data[1000:41000]
        batch = [("c4", shards[i % 3]["shard"], i * 777, 100 + i) for i in range(24)]
        for got, (_, shard, offset, length) in zip(client.read_many(batch), batch):
            assert got == (dataset_dir / "c4" / shard).read_bytes()[offset:offset + length]


def test_errors_carry_the_grpc_code_and_message(spoke):
    client = shardcache.Client(spoke)
    with pytest.raises(shardcache.ShardcacheError) as missing:
        client.stat("c4", "no-such-shard.bin")
    assert missing.value.code == "NOT_FOUND"
    assert "no-such-shard.bin" in missing.value.message
    with pytest.raises(shardcache.ShardcacheError) as past:
        client.read("c4", "shard-00000.bin", 10 * RECORD * 16, 1)
    assert past.value.code == "INVALID_ARGUMENT"
    with pytest.raises(shardcache.ShardcacheError) as bad:
        client.read("../etc", "passwd", 0, 1)
    assert bad.value.code == "INVALID_ARGUMENT"
    assert "'..'" in bad.value.message
    with pytest.raises(shardcache.ShardcacheError) as down:
        shardcache.Client("http://127.0.0.1:1").ls()
    assert down.value.code == "UNAVAILABLE"
    # The cause and what to do, not just "transport error".
    assert "Connection refused" in down.value.message, down.value.message
    assert "nothing is listening" in down.value.message, down.value.message
    # https:// to the plaintext spoke: the scheme to use.
    with pytest.raises(shardcache.ShardcacheError) as scheme:
        shardcache.Client(spoke.replace("http://", "https://")).ls()
    assert "use http://" in scheme.value.message, scheme.value.message


def _read_in_child(client, queue):
    try:
        queue.put(client.read("c4", "shard-00001.bin", 0, 64))
    except Exception as e:  # reported to the parent, which fails the test
        queue.put(repr(e))


def test_a_client_used_before_fork_works_in_the_child(spoke, dataset_dir):
    client = shardcache.Client(spoke)
    assert len(client.read("c4", "shard-00000.bin", 0, 64)) == 64  # runtime + connection made
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(client, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert got == (dataset_dir / "c4" / "shard-00001.bin").read_bytes()[:64]
    assert child.exitcode == 0
    # And the parent's client still works.
    assert len(client.read("c4", "shard-00002.bin", 0, 64)) == 64


def test_prefetch_and_status_on_the_spoke(spoke):
    client = shardcache.Client(spoke)
    progress = client.prefetch("c4", ["shard-00002.bin", "shard-00000.bin"])
    assert progress["shards_done"] == progress["shards_total"] == 2
    status = client.status()
    assert status["datasets"]["c4"]["cached_bytes"] >= 2 * 16 * RECORD


def test_access_plans_are_taken_by_a_spoke_and_checked(spoke):
    client = shardcache.Client(spoke)
    order = ["shard-00002.bin", "shard-00000.bin"]
    assert client.set_plan("trainer", 0, "c4", [order, list(reversed(order))]) == 2
    # Shards read together: each one's `until` is the last shard first read before it ends.
    assert client.set_plan("trainer", 0, "c4", [order], [[1, 1]]) == 2
    with pytest.raises(shardcache.ShardcacheError) as refused:
        client.set_plan("trainer", 0, "c4", [order], [[1]])
    assert "one per shard or none" in str(refused.value)
    with pytest.raises(shardcache.ShardcacheError) as refused:
        client.set_plan("trainer", 0, "c4", [["no-such-shard.bin"]])
    assert refused.value.code == "INVALID_ARGUMENT"
    assert client.set_plan("trainer", 0, "c4", []) == 0


def test_settings_come_from_arguments_or_the_clis_environment(spoke, tmp_path, monkeypatch):
    # No endpoint given: SHARDCACHE_ENDPOINT, as for the CLI.
    monkeypatch.setenv("SHARDCACHE_ENDPOINT", spoke)
    assert shardcache.Client().endpoint == spoke
    assert [d["name"] for d in shardcache.Client().ls()] == ["c4"]
    monkeypatch.delenv("SHARDCACHE_ENDPOINT")
    with pytest.raises(ValueError, match="SHARDCACHE_ENDPOINT"):
        shardcache.Client()
    # A token file as the CLI reads it: its trailing newline is fine, a file every user
    # can read is refused, and a token given where the file is asked for is not echoed.
    token = tmp_path / "token"
    token.write_text("sct_" + "ab" * 32 + "\n")
    token.chmod(0o600)
    assert shardcache.Client(spoke, token_file=str(token)).ls()
    token.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        shardcache.Client(spoke, token_file=str(token))
    secret = "sct_" + "cd" * 32
    with pytest.raises(ValueError) as echoed:
        shardcache.Client(spoke, token_file=secret)
    assert "cd" * 32 not in str(echoed.value)
    monkeypatch.setenv("SHARDCACHE_TOKEN_FILE", str(token))
    with pytest.raises(ValueError, match="chmod 600"):
        shardcache.Client(spoke)
    with pytest.raises(ValueError, match="not both"):
        shardcache.Client(spoke, token="x", token_file=str(token))


def test_a_range_over_the_servers_max_read_is_streamed(dataset_dir):
    # A hub that answers at most 128 KiB per read call, in 64 KiB messages.
    proc, addr = start([binary("hub-server"), "--root", str(dataset_dir), "--listen", "127.0.0.1:0",
                        "--max-read", "128KiB", "--message-size", "64KiB"], "hub-server listening on ")
    try:
        client = shardcache.Client(f"http://{addr}")
        whole = (dataset_dir / "c4" / "shard-00001.bin").read_bytes()
        with pytest.raises(shardcache.ShardcacheError) as refused:
            client.read("c4", "shard-00001.bin", 0, len(whole))
        assert refused.value.code == "INVALID_ARGUMENT" and "Client.stream" in refused.value.message
        chunks = list(client.stream("c4", "shard-00001.bin"))
        assert len(chunks) == len(whole) // (64 * 1024) and b"".join(chunks) == whole
        part = b"".join(client.stream("c4", "shard-00001.bin", offset=5000, length=100_000))
        assert part == whole[5000:105_000]
        assert list(client.stream("c4", "shard-00001.bin", offset=len(whole), length=0)) == []
    finally:
        proc.kill()
        proc.wait()
