"""Damaged and hostile dataset files through a real hub: each written by the format's
own tool, then damaged as a truncated upload, a buggy writer or an attacker would; each
raises ``ShardcacheError`` with a code a trainer can act on and a message naming the
file, never hangs, crashes the process or returns garbage, and the client goes on
reading good data afterwards."""

import io
import json
import re
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


@pytest.fixture(scope="module")
def damaged_hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    write_damaged(root)
    hub, addr = start([binary("hub-server"), "--root", str(root), "--listen", "127.0.0.1:0"],
                      "hub-server listening on ")
    yield f"http://{addr}"
    hub.kill()
    hub.wait()


def read_all(client, dataset, memory_budget=None, **format):
    samples = client.samples(dataset, memory_budget=memory_budget, **format)
    order = [(s, k) for s, count in enumerate(samples.counts) for k in range(count)]
    if format.get("format") in ("mds",):
        return samples.read_decoded(order)
    if format.get("format") == "webdataset":
        return samples.read_fields(order)
    return samples.read(order)


@pytest.mark.parametrize("dataset, fmt, code, words", [
    ("wds-pax0", {"format": "webdataset"}, "INVALID_ARGUMENT", r"wds-pax0/shard-0\.tar: damaged at byte \d+: pax record"),
    ("npy-descr", {"format": "tokens", "seq_len": 16}, "INVALID_ARGUMENT", r"npy-descr/a\.npy: damaged: .*dtype"),
    ("npy-shape", {"format": "tokens", "seq_len": 16}, "INVALID_ARGUMENT", r"npy-shape/a\.npy: damaged: .*more than 2\^64"),
    ("megatron-wrap", {"format": "megatron"}, "INVALID_ARGUMENT", r"megatron-wrap/part\.idx: damaged at byte 18: .*sequences"),
    ("mds-claim", {"format": "mds"}, "RESOURCE_EXHAUSTED", r"decompressing mds-claim/.*no dataset file needs that much"),
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
