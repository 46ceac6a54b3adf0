"""Plain Python through the read-only mount (`shardcache mount`): numpy.memmap and
open()/seek()/read() of a shard equal its file. Skips, saying why, only where FUSE
cannot be mounted (`make test` installs fuse3)."""

import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import RECORD, RECORDS_PER_SHARD, binary


@pytest.fixture
def mounted(spoke, tmp_path):
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("FUSE cannot be mounted here: no /dev/fuse or no fusermount3")
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
