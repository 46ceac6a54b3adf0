"""Plain Python through the read-only mount (`shardcache mount`): numpy.memmap and
open()/seek()/read() of a shard equal its file. A test that cannot mount fails, saying
why (`make test` installs fuse3), unless SHARDCACHE_SKIP_MOUNT=1 says to skip them."""

import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import RECORD, RECORDS_PER_SHARD, binary, start


def require_fuse():
    """Fails where FUSE cannot be mounted, or skips where SHARDCACHE_SKIP_MOUNT=1 says so."""
    if os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None:
        return
    why = "FUSE cannot be mounted here: no /dev/fuse or no fusermount3"
    if os.environ.get("SHARDCACHE_SKIP_MOUNT") == "1":
        pytest.skip(f"{why} (SHARDCACHE_SKIP_MOUNT=1)")
    pytest.fail(f"{why}; set SHARDCACHE_SKIP_MOUNT=1 to skip the mount tests")


@pytest.fixture
def mounted(spoke, tmp_path):
    require_fuse()
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    proc = subprocess.Popen([binary("shardcache"), "mount", spoke, str(mountpoint)],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, RUST_LOG="warn"))
    line = proc.stdout.readline()
    assert line.startswith("shardcache mounted "), line
    yield mountpoint
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert not os.path.ismount(mountpoint)


def test_memmap_and_open_read_the_shards(mounted, dataset_dir, records):
    assert sorted(os.listdir(mounted / "c4")) == sorted(p.name for p in (dataset_dir / "c4").glob("*.bin"))
    for index, shard in enumerate(sorted((dataset_dir / "c4").glob("*.bin"))):
        through = np.memmap(mounted / "c4" / shard.name, dtype=np.uint32, mode="r")
        assert np.array_equal(through, np.fromfile(shard, dtype=np.uint32)), shard.name
        with open(mounted / "c4" / shard.name, "rb") as f:
            f.seek(5 * RECORD)
            assert f.read(RECORD) == records[index * RECORDS_PER_SHARD + 5]


MIB = 1 << 20

# Process A: maps the shard with numpy.memmap at its first version, reads its head, then
# (told to go on) reads a page at each MiB and prints its SHA-256, until the end or until
# a page cannot be read (SIGBUS: the mount answers EIO for the old version's pages the
# kernel does not have).
READER = r"""
import hashlib, sys
import numpy as np
m = np.memmap(sys.argv[1], dtype=np.uint8, mode="r")
print(hashlib.sha256(bytes(m[:4096])).hexdigest(), flush=True)
sys.stdin.readline()
for offset in range(0, len(m), 1 << 20):
    print(hashlib.sha256(bytes(m[offset:offset + 4096])).hexdigest(), flush=True)
"""


def test_memmap_reads_the_version_it_mapped_while_another_process_reads_the_new(tmp_path):
    require_fuse()
    import hashlib
    import sys

    data = tmp_path / "data" / "ds"
    data.mkdir(parents=True)
    old = np.random.default_rng(1).integers(0, 256, 8 * MIB, dtype=np.uint8).tobytes()
    new = np.random.default_rng(2).integers(0, 256, 8 * MIB, dtype=np.uint8).tobytes()
    (data / "big.bin").write_bytes(old)
    hub, addr = start([binary("hub-server"), "--root", str(data.parent), "--listen", "127.0.0.1:0"],
                      "hub-server listening on ")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    mount = subprocess.Popen([binary("shardcache"), "mount", f"http://{addr}", str(mountpoint)],
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ, RUST_LOG="warn"))
    try:
        assert mount.stdout.readline().startswith("shardcache mounted ")
        through = mountpoint / "ds" / "big.bin"
        sha = lambda b: hashlib.sha256(b).hexdigest()
        reader = subprocess.Popen([sys.executable, "-c", READER, str(through)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert reader.stdout.readline().strip() == sha(old[:4096]), "A maps the first version"
        # The shard changes; process B (this one) reads it whole through the mount.
        (data / "big.next").write_bytes(new)
        os.replace(data / "big.next", data / "big.bin")
        with open(through, "rb") as f:
            assert f.read() == new, "B reads the new version"
        # A reads on: pages of its own version, or SIGBUS where the kernel has none of
        # it (the old version is gone from the hub); never a page of the new version.
        out, _ = reader.communicate("go\n", timeout=60)
        pages = out.split()
        assert reader.returncode in (0, -7), f"A ended with {reader.returncode}"
        assert pages, "A read its cached head again"
        for i, page in enumerate(pages):
            assert page == sha(old[i * MIB:i * MIB + 4096]), f"A saw another version at {i} MiB"
    finally:
        mount.terminate()
        mount.wait(timeout=30)
        hub.kill()
        hub.wait()
