"""Writes the fuzz harness's seed datasets (tests/fuzz/seeds/) with each format's own
reference writer, small so that a mutated copy is read in well under a millisecond:

- tokens: ``numpy.save`` .npy files, and raw uint16 files (nanoGPT's ``train.bin``);
- megatron: megatron-core's ``IndexedDatasetBuilder`` (.bin + .idx);
- mds, mds-zstd, mds-gz, mds-snappy: MosaicML Streaming's ``MDSWriter``, every default
  encoding, two shards each;
- wds: webdataset's ``TarWriter`` (pax headers for a long name), and wds-gnu: GNU tar's
  ``--format=gnu`` (``L`` long-name records) over the same files;
- parquet: ``pyarrow.parquet.write_table``: snappy, zstd and gzip, data pages v1 and v2,
  dictionaries, lists, structs, maps, nulls;
- hostile/: files no mutation of a small seed reaches, each refused within the budget
  (``tests/fuzz/tests/formats.rs``): mds-snappy-claim, ``MDSWriter``'s snappy shard of
  ~100 bytes whose index.json claims 4 GiB - 1 of raw data; mds-zstd-bombs, four
  ``MDSWriter`` zstd shards of ~32 KiB that each decompress to 1 GiB (one sample of
  zeros), read side by side.

Run with the test venv (scripts/ensure-test-deps.sh installs it):
    ~/.cache/shardcache/venv/bin/python tests/fuzz/make_seeds.py tests/fuzz/seeds
The seeds are committed; running this again writes equivalent files (numpy's seeded
generator), not necessarily identical bytes (writers stamp versions and times)."""

import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np


def tokens(root, rng):
    (root / "tokens").mkdir()
    for name, length in [("a.npy", 300), ("b.npy", 37)]:
        np.save(root / "tokens" / name, rng.integers(0, 50_000, length, dtype=np.uint16))
    (root / "raw").mkdir()
    for name, length in [("train-0.bin", 301), ("train-1.bin", 150)]:
        rng.integers(0, 50_000, length, dtype=np.uint16).tofile(root / "raw" / name)


def megatron(root, rng):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    (root / "megatron").mkdir()
    path = root / "megatron" / "part"
    builder = IndexedDatasetBuilder(f"{path}.bin", dtype=np.uint16)
    for _ in range(6):
        builder.add_item(torch.from_numpy(rng.integers(0, 50_000, int(rng.integers(1, 60))).astype(np.int64)))
        builder.end_document()
    builder.finalize(f"{path}.idx")


MDS_COLUMNS = {"id": "int", "text": "str", "tokens": "ndarray:int32", "blob": "bytes", "meta": "json",
               "score": "float32", "grid": "ndarray", "small": "uint16", "fixed": "ndarray:int16:2,3",
               "half": "float16"}


def mds(root, rng):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from streaming import MDSWriter
    samples = [{
        "id": i, "text": f"sample #{i} é", "blob": rng.bytes(int(rng.integers(0, 40))),
        "tokens": rng.integers(0, 50_000, int(rng.integers(1, 12))).astype(np.int32),
        "meta": {"i": i, "tags": ["a", "b"][: i % 3]}, "score": float(i) / 7,
        "grid": rng.random((int(rng.integers(1, 3)), 2)).astype(np.float32), "small": i * 3,
        "fixed": np.arange(6, dtype=np.int16).reshape(2, 3) + i, "half": i / 3,
    } for i in range(12)]
    for name, compression in [("mds", None), ("mds-zstd", "zstd:7"), ("mds-gz", "gz"), ("mds-snappy", "snappy")]:
        with MDSWriter(out=str(root / name), columns=MDS_COLUMNS, size_limit=1 << 10, compression=compression) as w:
            for sample in samples:
                w.write(sample)
        # Two shards are enough; the rest only slow each input down.
        index = root / name / "index.json"
        import json
        listed = json.loads(index.read_text())
        keep = listed["shards"][:2]
        names = {s["raw_data"]["basename"] for s in keep} | {s["zip_data"]["basename"] for s in keep if s.get("zip_data")}
        for file in (root / name).iterdir():
            if file.name != "index.json" and file.name not in names:
                file.unlink()
        listed["shards"] = keep
        index.write_text(json.dumps(listed, sort_keys=True))


def webdataset(root, rng):
    import webdataset as wds
    (root / "wds").mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        with wds.TarWriter(str(root / "wds" / "shard-0000.tar")) as sink:
            for i in range(4):
                key = f"part.0/{'x' * (110 if i == 1 else 3)}{i:03d}"
                sample = {"__key__": key, "txt": f"sample {i}", "seg.png": rng.bytes(int(rng.integers(0, 700))),
                          "cls": str(i % 10), "empty.bin": b""}
                sink.write(sample)
                for field, value in sample.items():
                    if field != "__key__":
                        path = Path(tmp) / f"{key}.{field}"
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(value if isinstance(value, bytes) else value.encode())
                        files.append(f"{key}.{field}")
        (root / "wds-gnu").mkdir()
        subprocess.run(["tar", "--format=gnu", "-cf", str(root / "wds-gnu" / "shard-0000.tar"), "-C", tmp, *files],
                       check=True)


def parquet(root, rng):
    import pyarrow as pa
    import pyarrow.parquet as pq
    (root / "parquet").mkdir()
    schema = pa.schema([
        ("id", pa.int64()), ("text", pa.string()), ("tokens", pa.list_(pa.int32())), ("flag", pa.bool_()),
        ("meta", pa.struct([("source", pa.string()), ("lengths", pa.list_(pa.int64()))])),
        ("attrs", pa.map_(pa.string(), pa.int64())), ("day", pa.date32()), ("price", pa.decimal128(9, 2)),
        ("label", pa.string()),
    ])
    for n, (codec, version) in enumerate([("snappy", "1.0"), ("zstd", "2.0"), ("gzip", "1.0")]):
        rows = [{
            "id": i, "text": None if i % 5 == 2 else f"row {i} é", "tokens": rng.integers(0, 1000, i % 4).tolist(),
            "flag": i % 3 == 0, "meta": {"source": f"s{i % 2}", "lengths": [i] if i % 2 else []},
            "attrs": [("k", i)], "day": None, "price": None, "label": ["cat", "dog"][i % 2],
        } for i in range(9)]
        table = pa.Table.from_pylist(rows, schema=schema)
        pq.write_table(table, root / "parquet" / f"part-{n}.parquet", row_group_size=4, compression=codec,
                       data_page_version=version, use_dictionary=["label", "text"])


def hostile(root):
    import json
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from streaming import MDSWriter
    claim = root / "hostile" / "mds-snappy-claim"
    with MDSWriter(out=str(claim), columns={"id": "int", "text": "str"}, compression="snappy") as writer:
        for i in range(4):
            writer.write({"id": i, "text": f"sample {i}"})
    index = json.loads((claim / "index.json").read_text())
    index["shards"][0]["raw_data"]["bytes"] = (1 << 32) - 1
    (claim / "index.json").write_text(json.dumps(index))
    # One shard of one sample of zeros, 1 GiB in all; the others are copies under their
    # own names (MDSWriter would hold each whole in memory to write it).
    bombs = root / "hostile" / "mds-zstd-bombs"
    blob = (1 << 30) - 64  # the shard's header and the sample's size fill the rest
    with MDSWriter(out=str(bombs), columns={"blob": "bytes"}, compression="zstd:3",
                   size_limit=1 << 31) as writer:
        writer.write({"blob": bytes(blob)})
    index = json.loads((bombs / "index.json").read_text())
    first = index["shards"][0]
    for n in range(1, 4):
        shard = json.loads(json.dumps(first))
        shard["raw_data"]["basename"] = f"shard.{n:05d}.mds"
        shard["zip_data"]["basename"] = f"shard.{n:05d}.mds.zstd"
        shutil.copy(bombs / first["zip_data"]["basename"], bombs / shard["zip_data"]["basename"])
        index["shards"].append(shard)
    (bombs / "index.json").write_text(json.dumps(index))


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/seeds")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    rng = np.random.default_rng(36)
    tokens(out, rng)
    megatron(out, rng)
    mds(out, rng)
    webdataset(out, rng)
    parquet(out, rng)
    hostile(out)
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        print(f"{path.relative_to(out)}\t{path.stat().st_size}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
