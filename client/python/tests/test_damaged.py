"""Damaged and hostile dataset files through a real hub: each written by the format's
own tool, then damaged as a truncated upload, a buggy writer or an attacker would; each
raises ``ShardcacheError`` with a code a trainer can act on and a message naming the
file, never hangs, crashes the process or returns garbage, and the client goes on
reading good data afterwards."""

import hashlib
import io
import json
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
import warnings

import numpy as np
import pytest

import shardcache
from conftest import binary, start


def write_damaged(root):
    rng = np.random.default_rng(36)
    # A pax record whose length is "0": CPython's tarfile looped forever on it
    # (CVE-2019-20907); the walk must refuse it, not spin.
    (root / "wds-pax0").mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(3):
            name = f"{'long' * 30}{i:03d}.txt"  # past ustar's 100 bytes: a pax "path" record
            info = tarfile.TarInfo(name)
            data = f"sample {i}".encode()
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = bytearray(buffer.getvalue())
    assert raw[156:157] == b"x"  # the first member's pax header; its records follow it
    space = raw.index(b" ", 512)  # the first record: "NNN path=...\n"
    raw[512:space] = b"0" * (space - 512)
    (root / "wds-pax0" / "shard-0.tar").write_bytes(bytes(raw))

    # .npy headers: an empty descr (a panic in split_at before), a shape whose product
    # wraps past 2^64 (~2^60 windows before).
    for name, old, new in [("npy-descr", "'<u2'", "''"), ("npy-shape", "(300,)", "(4294967296, 4294967296, 16)")]:
        (root / name).mkdir()
        path = root / name / "a.npy"
        np.save(path, rng.integers(0, 50_000, 300, dtype=np.uint16))
        data = path.read_bytes()
        header_end = data.index(b"\n") + 1
        header = data[:header_end].decode("latin1")
        changed = header.replace(old, new)
        # Same header length: the padding spaces give or take what the change did.
        changed = changed.replace(" " * (len(changed) - len(header) + 1), " ", 1) if len(changed) > len(header) else \
            changed[:-1] + " " * (len(header) - len(changed)) + "\n"
        assert len(changed) == len(header)
        path.write_bytes(changed.encode("latin1") + data[header_end:])

    # A Megatron .idx whose sequence count times 12 wraps to 8 past the size check.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    (root / "megatron-wrap").mkdir()
    prefix = root / "megatron-wrap" / "part"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for _ in range(4):
        builder.add_item(torch.from_numpy(rng.integers(0, 50_000, 20).astype(np.int64)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    idx = bytearray((root / "megatron-wrap" / "part.idx").read_bytes())
    idx[18:26] = (0x1555_5555_5555_5556).to_bytes(8, "little")
    (root / "megatron-wrap" / "part.idx").write_bytes(bytes(idx))

    # MDS shards compressed by MosaicML's writer: one whose index.json claims it
    # decompresses to 1 TiB, and a real zstd bomb (96 MiB of zeros in a few KiB) read
    # under a 64 MiB budget.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from streaming import MDSWriter
    for name, blob, count in [("mds-claim", 16, 2), ("mds-bomb", 96 << 20, 1)]:
        with MDSWriter(out=str(root / name), columns={"id": "int", "blob": "bytes"}, compression="zstd",
                       size_limit=1 << 30) as writer:
            for i in range(count):
                writer.write({"id": i, "blob": bytes(blob)})
    index = json.loads((root / "mds-claim" / "index.json").read_text())
    index["shards"][0]["raw_data"]["bytes"] = 1 << 40
    (root / "mds-claim" / "index.json").write_text(json.dumps(index))

    # A good dataset, read after each failure.
    (root / "good").mkdir()
    np.save(root / "good" / "a.npy", np.arange(100, dtype=np.uint16))


# The fuzz harness's seeds, valid files written by each format's own writer, and its
# hostile ones (tests/fuzz/make_seeds.py), served beside the damaged files above.
SEEDS = pathlib.Path(__file__).resolve().parents[3] / "tests" / "fuzz" / "seeds"
SEED_FORMATS = {
    "tokens": {"format": "tokens", "seq_len": 16},
    "raw": {"format": "tokens", "seq_len": 16, "dtype": "uint16"},
    "megatron": {"format": "megatron"},
    "mds": {"format": "mds"}, "mds-zstd": {"format": "mds"}, "mds-gz": {"format": "mds"},
    "mds-snappy": {"format": "mds"},
    "wds": {"format": "webdataset"}, "wds-gnu": {"format": "webdataset"},
    "parquet": {"format": "parquet"},
}
HOSTILE = {"mds-snappy-claim": {"format": "mds"}, "mds-zstd-bombs": {"format": "mds"}}
DAMAGED = {
    "wds-pax0": {"format": "webdataset"}, "npy-descr": {"format": "tokens", "seq_len": 16},
    "npy-shape": {"format": "tokens", "seq_len": 16}, "megatron-wrap": {"format": "megatron"},
    "mds-claim": {"format": "mds"}, "mds-bomb": {"format": "mds"}, "good": {"format": "tokens", "seq_len": 9},
}


@pytest.fixture(scope="module")
def damaged_hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    write_damaged(root)
    for name in SEED_FORMATS:
        shutil.copytree(SEEDS / name, root / f"seed-{name}")
    for name in HOSTILE:
        shutil.copytree(SEEDS / "hostile" / name, root / f"hostile-{name}")
    hub, addr = start([binary("hub-server"), "--root", str(root), "--listen", "127.0.0.1:0"],
                      "hub-server listening on ")
    yield f"http://{addr}"
    hub.kill()
    hub.wait()


def read_all(client, dataset, memory_budget=None, **format):
    samples = client.samples(dataset, memory_budget=memory_budget, **format)
    order = [(s, k) for s, count in enumerate(samples.counts) for k in range(count)]
    if format.get("format") in ("mds", "parquet"):
        return samples.read_decoded(order)
    if format.get("format") == "webdataset":
        return samples.read_fields(order)
    return samples.read(order)


@pytest.mark.parametrize("dataset, fmt, code, words", [
    ("wds-pax0", {"format": "webdataset"}, "INVALID_ARGUMENT", r"wds-pax0/shard-0\.tar: damaged at byte \d+: pax record"),
    ("npy-descr", {"format": "tokens", "seq_len": 16}, "INVALID_ARGUMENT", r"npy-descr/a\.npy: damaged: .*dtype"),
    ("npy-shape", {"format": "tokens", "seq_len": 16}, "INVALID_ARGUMENT", r"npy-shape/a\.npy: damaged: .*more than 2\^64"),
    ("megatron-wrap", {"format": "megatron"}, "INVALID_ARGUMENT", r"megatron-wrap/part\.idx: damaged at byte 18: .*sequences"),
    ("mds-claim", {"format": "mds"}, "INVALID_ARGUMENT",
     r"mds-claim/index\.json: damaged: .*decompresses to 1099511627776 bytes, but \d+ bytes of Zstd decompress to \d+ at most"),
])
def test_a_damaged_file_raises_an_error_naming_it_and_the_client_reads_on(damaged_hub, dataset, fmt, code, words):
    client = shardcache.Client(damaged_hub)
    with pytest.raises(shardcache.ShardcacheError) as raised:
        read_all(client, dataset, **fmt)
    # An ordinary Exception (not pyo3's PanicException, a BaseException), with its code.
    assert isinstance(raised.value, Exception)
    assert raised.value.code == code, raised.value
    assert re.search(words, str(raised.value)), raised.value
    good = client.samples("good", format="tokens", seq_len=9)
    assert np.frombuffer(good.read([(0, 1)])[0], np.uint16).tolist() == list(range(9, 19))


def test_a_zstd_bomb_stops_at_the_budget_and_reads_under_a_larger_one(damaged_hub):
    client = shardcache.Client(damaged_hub)
    with pytest.raises(shardcache.ShardcacheError) as raised:
        read_all(client, "mds-bomb", memory_budget=64 << 20, format="mds")
    assert raised.value.code == "RESOURCE_EXHAUSTED"
    assert "past the budget of 67108864" in str(raised.value), raised.value
    # Honest about its size: read whole when the budget holds it.
    rows = read_all(client, "mds-bomb", memory_budget=256 << 20, format="mds")
    assert [row["id"] for row in rows] == [0] and len(rows[0]["blob"]) == 96 << 20


def digest(rows):
    return hashlib.sha256(pickle.dumps(rows)).hexdigest()


# Reads each dataset it is given and prints, per dataset, the error code it raised or a
# digest of its samples: run under an address-space limit, where an allocation the
# budget did not bound kills the process (SIGABRT), the one outcome a trainer cannot catch.
CHILD = r"""
import hashlib, json, pickle, resource, sys
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # before anything is imported or mapped
import shardcache
endpoint, datasets = sys.argv[1], json.loads(sys.argv[2])
client = shardcache.Client(endpoint)
for name, fmt in datasets.items():
    try:
        samples = client.samples(name, **fmt)
        order = [(s, k) for s, count in enumerate(samples.counts) for k in range(count)]
        read = {"mds": samples.read_decoded, "parquet": samples.read_decoded, "webdataset": samples.read_fields}
        rows = read.get(fmt["format"], samples.read)(order)
        outcome = {"digest": hashlib.sha256(pickle.dumps(rows)).hexdigest(), "budget": samples.memory_budget}
    except shardcache.ShardcacheError as e:
        outcome = {"code": e.code, "message": str(e)}
    print(json.dumps({name: outcome}), flush=True)
"""


def test_every_damaged_or_hostile_file_under_a_4_gib_address_space_is_an_error_or_its_samples(damaged_hub, tmp_path):
    """The corpus (the damaged files above, the fuzz seeds, the hostile seeds: a snappy
    shard claiming 4 GiB, four zstd shards of 1 GiB each) read through a spoke by a child
    limited to 4 GiB of address space, as a trainer in a container is: each ends in an
    error it can catch or the samples read without the limit, and the child exits."""
    spoke, addr = start([binary("spoke-cache"), "--hub", damaged_hub, "--cache-dir", str(tmp_path / "cache"),
                         "--listen", "127.0.0.1:0"], "spoke-cache listening on ")
    try:
        endpoint = f"http://{addr}"
        readable = {**DAMAGED, **{f"seed-{n}": f for n, f in SEED_FORMATS.items()}}
        hostile = {f"hostile-{n}": f for n, f in HOSTILE.items()}
        env = {k: v for k, v in os.environ.items() if k != "SHARDCACHE_MEMORY_BUDGET"}
        limit = 4 << 30
        child = subprocess.run(
            [sys.executable, "-c", CHILD, endpoint, json.dumps({**readable, **hostile}), str(limit)],
            capture_output=True, text=True, timeout=300, env=env)
        assert child.returncode == 0, f"the child died ({child.returncode}): {child.stderr[-2000:]}"
        outcomes = {k: v for line in child.stdout.splitlines() for k, v in json.loads(line).items()}
        assert set(outcomes) == set(readable) | set(hostile), outcomes
        client = shardcache.Client(endpoint)
        for name, fmt in readable.items():
            outcome = outcomes[name]
            if "digest" in outcome:
                assert outcome["budget"] <= limit // 8, outcome  # what the process may use
                assert outcome["digest"] == digest(read_all(client, name, **fmt)), f"{name}: other samples"
            else:
                assert outcome["code"] in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"), (name, outcome)
        assert outcomes["hostile-mds-snappy-claim"]["code"] == "INVALID_ARGUMENT", outcomes
        assert "4294967295 bytes" in outcomes["hostile-mds-snappy-claim"]["message"], outcomes
        bombs = outcomes["hostile-mds-zstd-bombs"]
        assert bombs["code"] == "RESOURCE_EXHAUSTED" and "decompressing hostile-mds-zstd-bombs/" in bombs["message"], bombs
        # The valid seeds and the good dataset are read whole in the child too.
        unread = {n: outcomes[n] for n in readable if (n.startswith("seed-") or n in ("good", "mds-bomb"))
                  and "digest" not in outcomes[n]}
        assert not unread, unread
    finally:
        spoke.kill()
        spoke.wait()
