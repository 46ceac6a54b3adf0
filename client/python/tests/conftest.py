"""Real hub and spoke processes (the cargo-built binaries) on 127.0.0.1:0, over a
generated dataset of 16 KiB records, for the Python SDK's tests."""

import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
BIN = pathlib.Path(os.environ.get("SHARDCACHE_BIN_DIR", REPO / "target" / "debug"))

RECORD = 16 * 1024
SHARDS = 3
RECORDS_PER_SHARD = 16


def binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `cargo build --workspace --bins` (make test does)")
    return str(path)


def start(args, prefix):
    """Starts a server and waits for its "listening on" line; returns (process, rest)."""
    env = dict(os.environ, RUST_LOG="warn")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, env=env, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith(prefix):
        proc.kill()
        pytest.fail(f"expected {prefix!r}, got {line!r}")
    return proc, line[len(prefix):]


@pytest.fixture(scope="session")
def dataset_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    subprocess.run(
        [binary("shardcache"), "gen", "--dir", str(root), "--dataset", "c4", "--shards", str(SHARDS),
         "--shard-size", f"{RECORD * RECORDS_PER_SHARD}B", "--record-size", "16KiB", "--seed", "3"],
        check=True, stdout=subprocess.DEVNULL,
    )
    return root


@pytest.fixture(scope="session")
def hub(dataset_dir):
    proc, addr = start([binary("hub-server"), "--root", str(dataset_dir), "--listen", "127.0.0.1:0"],
                       "hub-server listening on ")
    yield f"http://{addr}"
    proc.kill()
    proc.wait()


@pytest.fixture(scope="session")
def spoke(hub, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    proc, rest = start([binary("spoke-cache"), "--hub", hub, "--cache-dir", str(cache),
                        "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
                       "spoke-cache listening on ")
    yield f"http://{rest.split()[0]}"
    proc.kill()
    proc.wait()


@pytest.fixture(scope="session")
def records(dataset_dir):
    """Every record's bytes, in shard-name order, straight from the files."""
    out = []
    for shard in sorted((dataset_dir / "c4").glob("*.bin")):
        data = shard.read_bytes()
        out.extend(data[i:i + RECORD] for i in range(0, len(data), RECORD))
    return out
