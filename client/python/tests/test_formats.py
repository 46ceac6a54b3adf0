"""Datasets as they are, read through a spoke without conversion, byte-exact against
each format's own reader on files that reader's tools wrote:

- Megatron indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``) written by megatron-core's
  ``IndexedDatasetBuilder``, against its ``IndexedDataset``: one sample per sequence;
- MDS datasets written by MosaicML Streaming's ``MDSWriter``, plain and compressed (zstd, gz, snappy),
  against its ``LocalDataset``: a dict of columns per sample, every default encoding;
- WebDataset tar shards written by webdataset's ``TarWriter``, against its own
  iteration: a dict of ``__key__`` and each field's bytes;
- Parquet files written by ``pyarrow`` (several row groups, each codec it writes by
  default or is often given), against ``pyarrow``'s ``to_pylist``: a dict per row;
- token arrays: ``.npy`` files written by ``numpy.save``, and raw ``uint16`` files (nanoGPT's
  ``train.bin``), against ``numpy.memmap``: windows of ``seq_len + 1`` tokens every
  ``seq_len``, across file boundaries;

then the datasets over them: every sample of an epoch once across ranks and workers, a
resume under another world size, int64 values."""

import datetime
import decimal
import re
import urllib.request
import warnings

import numpy as np
import pytest

import shardcache
from conftest import binary, start

SEQ_LEN = 64
# The formats spoke's metrics URL.
METRICS = []


@pytest.fixture(scope="module")
def formats_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    rng = np.random.default_rng(7)
    # Token arrays: one file shorter than a window, so windows cross two boundaries.
    (root / "npy").mkdir()
    for name, length in [("a.npy", 1000), ("b.npy", 37), ("c.npy", 2500)]:
        np.save(root / "npy" / name, rng.integers(0, 50_000, length, dtype=np.uint16))
    (root / "raw").mkdir()
    for name, length in [("train-0.bin", 3001), ("train-1.bin", 1500)]:
        rng.integers(0, 50_000, length, dtype=np.uint16).tofile(root / "raw" / name)
    # Megatron: two prefixes of documents from 1 to 3000 tokens, by its own builder.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    (root / "megatron").mkdir()
    for prefix, documents in [("part-a", 40), ("part-b", 25)]:
        path = root / "megatron" / prefix
        builder = IndexedDatasetBuilder(f"{path}.bin", dtype=np.uint16)
        for _ in range(documents):
            length = int(rng.integers(1, 3000))
            builder.add_item(torch.from_numpy(rng.integers(0, 50_000, length).astype(np.int64)))
            builder.end_document()
        builder.finalize(f"{path}.idx")
    # part-b alone, as a dataset of one prefix (GPT packing).
    (root / "megatron-b").mkdir()
    for ext in ("bin", "idx"):
        (root / "megatron-b" / f"part-b.{ext}").write_bytes((root / "megatron" / f"part-b.{ext}").read_bytes())
    write_mds(root, rng)
    write_webdataset(root, rng)
    write_parquet(root, rng)
    return root


def parquet_rows(rng, first, count):
    """Rows with the column types Hugging Face datasets hold: numbers, text, bytes,
    token lists, structs, maps, nulls, dates, times and timestamps, decimals."""
    utc = datetime.timezone.utc
    return [{
        "id": i, "text": None if i % 11 == 5 else "row " * int(rng.integers(0, 40)) + f"#{i} é",
        "score": float(i) / 7, "flag": i % 3 == 0, "small": np.int8(i % 100 - 50).item(),
        "blob": rng.bytes(int(rng.integers(0, 3000))),
        "tokens": rng.integers(0, 128_000, int(rng.integers(0, 300))).tolist(),
        "meta": {"source": f"s{i % 4}", "lengths": [i, i + 1] if i % 2 else []},
        "attrs": [(f"k{j}", j * i) for j in range(i % 3)],
        "day": datetime.date(2020, 1, 1) + datetime.timedelta(days=i),
        "at": datetime.datetime(2024, 5, 1, 12, 0) + datetime.timedelta(microseconds=i * 1_000_003),
        "at_utc": datetime.datetime(2024, 5, 1, tzinfo=utc) + datetime.timedelta(seconds=i * 3601),
        "clock": datetime.time(i % 24, i % 60, i % 60, i * 7 % 1_000_000),
        "price": decimal.Decimal(i * 37 - 500).scaleb(-2),
    } for i in range(first, first + count)]


def write_parquet(root, rng):
    """Three Parquet files by pyarrow, row groups of 7 rows, each file another codec
    (snappy, pyarrow's and Hugging Face's default; zstd; gzip); one with nanosecond
    timestamps, which pandas writes by default."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("id", pa.int64()), ("text", pa.string()), ("score", pa.float64()), ("flag", pa.bool_()),
        ("small", pa.int8()), ("blob", pa.binary()), ("tokens", pa.list_(pa.int32())),
        ("meta", pa.struct([("source", pa.string()), ("lengths", pa.list_(pa.int64()))])),
        ("attrs", pa.map_(pa.string(), pa.int64())), ("day", pa.date32()), ("at", pa.timestamp("us")),
        ("at_utc", pa.timestamp("ms", tz="UTC")), ("clock", pa.time64("us")), ("price", pa.decimal128(9, 2)),
    ])
    (root / "parquet").mkdir()
    first = 0
    for n, (count, codec) in enumerate([(40, "snappy"), (23, "zstd"), (9, "gzip")]):
        table = pa.Table.from_pylist(parquet_rows(rng, first, count), schema=schema)
        pq.write_table(table, root / "parquet" / f"train-{n:05d}-of-00003.parquet", row_group_size=7,
                       compression=codec)
        first += count
    (root / "parquet-ns").mkdir()
    table = pa.table({"at": pa.array([0, 1], pa.timestamp("ns"))})
    pq.write_table(table, root / "parquet-ns" / "data.parquet")


def write_webdataset(root, rng):
    """Tar shards by webdataset's own TarWriter: keys with directories and dots in
    them, a field name with two dots, a long name (past ustar's 100 bytes), big and
    empty fields."""
    import webdataset as wds

    (root / "wds").mkdir()
    for shard in range(3):
        with wds.TarWriter(str(root / "wds" / f"shard-{shard:04d}.tar")) as sink:
            for i in range(20 + shard * 7):
                key = f"part.{shard}/{'x' * (120 if i == 3 else 4)}{i:05d}"
                sink.write({"__key__": key, "txt": f"sample {i}" * int(rng.integers(0, 50)),
                            "seg.png": rng.bytes(int(rng.integers(0, 200_000))), "cls": str(i % 10),
                            "empty.bin": b""})


MDS_COLUMNS = {"id": "int", "text": "str", "tokens": "ndarray:int32", "blob": "bytes", "meta": "json",
               "score": "float32", "grid": "ndarray", "small": "uint16", "fixed": "ndarray:int16:2,3"}


def write_mds(root, rng):
    """MDS datasets by MosaicML Streaming's own MDSWriter: several shards (a small
    size_limit), every default encoding; the same samples compressed with zstd, gzip and
    snappy; one with a pickled column; one compressed with bzip2."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from streaming import MDSWriter
    samples = [{
        "id": i, "text": "sample " * int(rng.integers(0, 30)) + f"#{i} é", "blob": rng.bytes(int(rng.integers(0, 900))),
        "tokens": rng.integers(0, 50_000, int(rng.integers(1, 400))).astype(np.int32),
        "meta": {"i": i, "tags": ["a", "b"][: i % 3]}, "score": float(i) / 7,
        "grid": rng.random((int(rng.integers(1, 4)), 3)).astype(np.float32), "small": i * 3,
        "fixed": np.arange(6, dtype=np.int16).reshape(2, 3) + i,
    } for i in range(60)]
    for name, compression in [("mds", None), ("mds-zstd", "zstd:7"), ("mds-gz", "gz"), ("mds-snappy", "snappy")]:
        with MDSWriter(out=str(root / name), columns=MDS_COLUMNS, size_limit=1 << 14, compression=compression) as w:
            for sample in samples:
                w.write(sample)
    with MDSWriter(out=str(root / "mds-pkl"), columns={"obj": "pkl"}) as writer:
        writer.write({"obj": {"a": (1, 2)}})
    with MDSWriter(out=str(root / "mds-bz2"), columns={"id": "int"}, compression="bz2") as writer:
        writer.write({"id": 1})


@pytest.fixture(scope="module")
def formats_spoke(formats_root, tmp_path_factory):
    hub, hub_addr = start([binary("hub-server"), "--root", str(formats_root), "--listen", "127.0.0.1:0"],
                          "hub-server listening on ")
    cache = tmp_path_factory.mktemp("formats-cache")
    spoke, rest = start([binary("spoke-cache"), "--hub", f"http://{hub_addr}", "--cache-dir", str(cache),
                         "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
                        "spoke-cache listening on ")
    METRICS.append(f"http://{rest.split()[3]}/metrics")
    yield f"http://{rest.split()[0]}"
    for proc in (spoke, hub):
        proc.kill()
        proc.wait()


def every_sample(samples):
    """Every (shard, k) in order, and their bytes (read in batches of 50)."""
    items = [(s, k) for s, count in enumerate(samples.counts) for k in range(count)]
    data = []
    for i in range(0, len(items), 50):
        data += samples.read(items[i:i + 50])
    return items, data


def windows(tokens):
    count = (len(tokens) - (SEQ_LEN + 1)) // SEQ_LEN + 1
    return [tokens[g * SEQ_LEN: g * SEQ_LEN + SEQ_LEN + 1] for g in range(count)]


def test_npy_windows_match_numpy_memmap_across_files(formats_spoke, formats_root):
    client = shardcache.Client(formats_spoke)
    samples = client.samples("npy", format="tokens", seq_len=SEQ_LEN)
    assert samples.shards == ["a.npy", "b.npy", "c.npy"] and samples.dtype == "uint16"
    tokens = np.concatenate([np.load(formats_root / "npy" / n, mmap_mode="r") for n in samples.shards])
    expected = windows(tokens)
    _, data = every_sample(samples)
    assert len(data) == len(samples) == len(expected)
    for got, want in zip(data, expected):
        assert np.array_equal(np.frombuffer(got, dtype=np.uint16), want)
    # The window starting at token 960 runs from a.npy through b.npy into c.npy.
    crossing = 960 // SEQ_LEN
    assert np.array_equal(np.frombuffer(data[crossing], dtype=np.uint16), tokens[960:1025])


def test_raw_token_files_read_as_their_dtype_match_numpy_memmap(formats_spoke, formats_root):
    client = shardcache.Client(formats_spoke)
    samples = client.samples("raw", format="tokens", seq_len=SEQ_LEN, dtype="uint16")
    tokens = np.concatenate([np.memmap(formats_root / "raw" / n, dtype=np.uint16, mode="r") for n in samples.shards])
    expected = windows(tokens)
    _, data = every_sample(samples)
    assert len(data) == len(expected)
    assert all(np.array_equal(np.frombuffer(g, dtype=np.uint16), w) for g, w in zip(data, expected))
    with pytest.raises(shardcache.ShardcacheError, match="no .npy files"):
        client.samples("raw", format="tokens", seq_len=SEQ_LEN)


def test_megatron_sequences_match_megatron_cores_reader(formats_spoke, formats_root):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    samples = shardcache.Client(formats_spoke).samples("megatron", format="megatron")
    assert samples.shards == ["part-a.bin", "part-b.bin"] and samples.dtype == "uint16"
    assert samples.counts == [40, 25]
    items, data = every_sample(samples)
    for (shard, k), got in zip(items, data):
        reference = IndexedDataset(str(formats_root / "megatron" / samples.shards[shard][:-4]))
        assert np.array_equal(np.frombuffer(got, dtype=np.uint16), reference[k]), (shard, k)
    # A .bin without its .idx, or a dataset with none, is said so.
    with pytest.raises(shardcache.ShardcacheError, match="no PREFIX.bin with its PREFIX.idx"):
        shardcache.Client(formats_spoke).samples("raw", format="megatron")


def ident(sample):
    """What tells one sample from another: an array's values, an MDS sample's id, a
    WebDataset sample's key."""
    if isinstance(sample, dict):
        return sample.get("__key__", sample.get("id"))
    return tuple(sample)


@pytest.mark.parametrize("name,options", [
    ("megatron", dict(format="megatron")),
    ("megatron-b", dict(format="megatron-gpt", seq_len=SEQ_LEN)),
    ("npy", dict(format="tokens", seq_len=SEQ_LEN)),
    ("mds", dict(format="mds")),
    ("wds", dict(format="webdataset")),
    ("parquet", dict(format="parquet")),
])
@pytest.mark.parametrize("before,after", [((4, 2), (3, 3)), ((2, 1), (8, 2))])
def test_every_format_resumes_under_another_world_size_seeing_each_sample_once(
        formats_spoke, name, options, before, after):
    reference = shardcache.ShardDataset(formats_spoke, name, **options)
    everything = sorted(ident(reference[i]) for i in range(len(reference)))
    assert len(set(everything)) == len(everything)

    def rank(r, world):
        return shardcache.StreamingShardDataset(formats_spoke, name, batch_size=4, seed=3, rank=r,
                                                world_size=world, prefetch=False, plan=False, **options)

    # Each of the first layout's ranks takes 2 batches (from its workers in turn);
    # rank 0 saves; the second layout reads the rest of the epoch.
    (world, workers), (new_world, new_workers) = before, after
    seen = []
    first = [rank(r, world) for r in range(world)]
    for ds in first:
        mine = [ds.indices(w, workers) for w in range(workers)]
        batches = [mine[b % workers][(b // workers) * 4:(b // workers) * 4 + 4] for b in range(2)]
        seen += ds._records.load([item for batch in batches for item in batch])
    state = first[0].state_dict(consumed=8)
    assert state["sample_in_epoch"] == 8 * world == len(seen)
    rest = []
    for r in range(new_world):
        ds = rank(r, new_world)
        ds.load_state_dict(state)
        per_worker = [ds.indices(w, new_workers) for w in range(new_workers)]
        rest += ds._records.load([item for items in per_worker for item in items])
    assert sorted(ident(s) for s in seen + rest) == everything


@pytest.mark.parametrize("name", ["mds", "mds-zstd", "mds-gz", "mds-snappy"])
def test_mds_samples_match_mosaicml_streamings_reader(formats_spoke, formats_root, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from streaming import LocalDataset
    # LocalDataset reads uncompressed shards; the compressed copies hold the same samples.
    reference = LocalDataset(local=str(formats_root / "mds"))
    samples = shardcache.Client(formats_spoke).samples(name, format="mds")
    if name != "mds":
        assert all(shard.endswith(".mds." + name.removeprefix("mds-")) for shard in samples.shards)
    assert len(samples.shards) > 2, "several shards"
    assert [name for name, _ in samples.columns] == sorted(MDS_COLUMNS)
    _, data = every_sample(samples)
    assert len(data) == len(reference) == 60
    for i, raw in enumerate(data):
        got, want = samples.decode(raw), reference[i]
        assert set(got) == set(want)
        for column, value in want.items():
            if isinstance(value, np.ndarray):
                assert got[column].dtype == value.dtype and np.array_equal(got[column], value), (i, column)
            else:
                assert got[column] == value, (i, column, got[column], value)
    # The map-style dataset hands out the same dicts.
    ds = shardcache.ShardDataset(formats_spoke, name, format="mds")
    assert ds[59]["id"] == 59 and ds[59]["text"] == reference[59]["text"]
    # And the streaming one, over two ranks: every sample once.
    ids = []
    for rank in range(2):
        ids += [sample["id"] for sample in shardcache.StreamingShardDataset(
            formats_spoke, name, format="mds", batch_size=4, rank=rank, world_size=2, prefetch=False)]
    assert sorted(ids) == list(range(60))


def test_mds_pickles_need_consent_and_other_compressions_are_refused_with_the_fix(formats_spoke):
    client = shardcache.Client(formats_spoke)
    pkl = client.samples("mds-pkl", format="mds")
    (raw,) = pkl.read([(0, 0)])
    with pytest.raises(shardcache.ShardcacheError, match="allow_unsafe_types=True"):
        pkl.decode(raw)
    assert pkl.decode(raw, allow_unsafe_types=True) == {"obj": {"a": (1, 2)}}
    with pytest.raises(shardcache.ShardcacheError, match="compressed with bz2: zstd .* is read"):
        client.samples("mds-bz2", format="mds")


def without_locations(sample):
    """webdataset's sample without where it read it from (``__url__``, ``__local_path__``)."""
    return {k: v for k, v in sample.items() if k == "__key__" or not k.startswith("__")}


def test_webdataset_samples_match_webdatasets_own_iteration(formats_spoke, formats_root):
    import webdataset as wds

    samples = shardcache.Client(formats_spoke).samples("wds", format="webdataset")
    assert samples.shards == [f"shard-{i:04d}.tar" for i in range(3)] and samples.counts == [20, 27, 34]
    items = [(s, k) for s, count in enumerate(samples.counts) for k in range(count)]
    ours = samples.read_fields(items)
    urls = [str(formats_root / "wds" / name) for name in samples.shards]
    theirs = list(wds.WebDataset(urls, shardshuffle=False))
    assert len(ours) == len(theirs)
    for got, want in zip(ours, theirs):
        want = without_locations(want)
        assert got == want, (got["__key__"], want["__key__"])
    # The datasets hand out the same dicts.
    ds = shardcache.ShardDataset(formats_spoke, "wds", format="webdataset")
    assert ds[len(ds) - 1] == without_locations(theirs[-1])


@pytest.mark.parametrize("num_samples", [None, 7, 1100, 1000, 1500])
def test_megatron_gpt_packing_matches_megatron_cores_gpt_dataset(formats_spoke, formats_root, num_samples, tmp_path):
    """One prefix packed as megatron-core's GPTDataset packs it (seq_len 64, its default
    seed 1234): sample i is GPTDataset[i]'s tokens and last label. part-b holds ~580
    samples an epoch: 1100 takes two epochs shuffled together, 1000 and 1500 two and
    three with the last shuffled on its own (under 80% of an epoch's samples)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        from megatron.core.datasets.utils import Split

    class Tokenizer:  # what GPTDataset asks of a tokenizer here
        vocab_size, eod, pad = 50_000, 0, 49_999
        unique_identifiers = {"class": "Tokenizer"}

    prefix = str(formats_root / "megatron" / "part-b")
    sequences = IndexedDataset(prefix)
    config = GPTDatasetConfig(random_seed=1234, sequence_length=SEQ_LEN, blend=([prefix], None), split="1,0,0",
                              tokenizer=Tokenizer(), reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False, path_to_cache=str(tmp_path))
    wanted = num_samples if num_samples is not None else int(sequences.sequence_lengths.sum()) // SEQ_LEN
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = GPTDataset(sequences, prefix, np.arange(len(sequences), dtype=np.int32), wanted, Split.train,
                               config)
    # A dataset of one prefix: part-b alone (the blend of both is not packed here).
    client = shardcache.Client(formats_spoke)
    with pytest.raises(shardcache.ShardcacheError, match="one PREFIX.bin"):
        client.samples("megatron", format="megatron-gpt", seq_len=SEQ_LEN)
    samples = client.samples("megatron-b", format="megatron-gpt", seq_len=SEQ_LEN, num_samples=wanted)
    assert len(samples) == len(reference)
    per_epoch = (int(sequences.sequence_lengths.sum()) - 1) // SEQ_LEN
    assert per_epoch < 1000 < 2 * per_epoch < 1500, per_epoch  # the epochs the docstring says
    _, data = every_sample(samples)
    for i, raw in enumerate(data):
        item = reference[i]
        text = np.concatenate([item["tokens"].numpy(), item["labels"].numpy()[-1:]])
        assert np.array_equal(np.frombuffer(raw, dtype=np.uint16), text), i


def whole_shard_fetches():
    """The formats spoke's count of shards fetched whole from its hub."""
    text = urllib.request.urlopen(METRICS[-1]).read().decode()
    return sum(float(v) for v in re.findall(r"^shardcache_spoke_whole_shard_fetches_total(?:{[^}]*})? (\S+)$", text, re.M))


def test_parquet_rows_match_pyarrow(formats_spoke, formats_root):
    import pyarrow.parquet as pq

    before = whole_shard_fetches()
    samples = shardcache.Client(formats_spoke).samples("parquet", format="parquet")
    # The index is the footers: opening it fetches no file whole.
    assert whole_shard_fetches() == before
    assert samples.shards == [f"train-{n:05d}-of-00003.parquet" for n in range(3)]
    assert samples.counts == [40, 23, 9]
    assert [name for name, _ in samples.columns][:3] == ["id", "text", "score"]
    want = []
    for name in samples.shards:
        want += pq.read_table(formats_root / "parquet" / name).to_pylist()
    # Read in a shuffled order, in batches spanning row groups and files.
    items = [(s, k) for s, count in enumerate(samples.counts) for k in range(count)]
    order = np.random.default_rng(1).permutation(len(items))
    got = {}
    for i in range(0, len(order), 10):
        batch = [items[j] for j in order[i:i + 10]]
        for j, row in zip(order[i:i + 10], samples.read_decoded(batch)):
            got[int(j)] = row
    assert len(got) == len(want) == 72
    for j, row in enumerate(want):
        assert got[j] == row, (j, got[j], row)
        assert got[j]["at_utc"].utcoffset() == datetime.timedelta(0)
    # A row is values, not bytes of its own.
    with pytest.raises(shardcache.ShardcacheError, match="read them with read_decoded"):
        samples.read([(0, 0)])
    # The datasets hand out the same dicts, across ranks.
    ds = shardcache.ShardDataset(formats_spoke, "parquet", format="parquet")
    assert ds[71] == want[71]
    ids = []
    for rank in range(2):
        ids += [row["id"] for row in shardcache.StreamingShardDataset(
            formats_spoke, "parquet", format="parquet", batch_size=4, rank=rank, world_size=2, prefetch=False)]
    assert sorted(ids) == list(range(72))
    # The block shuffle's unit is the row group (7 rows here), not the file: with
    # shard_block=1 the epoch is row group after row group, 6 + 4 + 2 of them.
    ds = shardcache.StreamingShardDataset(formats_spoke, "parquet", format="parquet", batch_size=4, shard_block=1,
                                          seed=5, prefetch=False, plan=False)
    order = ds.epoch_order()
    runs = [key for i, key in enumerate((s, k // 7) for s, k in order) if i == 0 or key != ((order[i - 1][0], order[i - 1][1] // 7))]
    assert len(runs) == len(set(runs)) == 12, runs


def test_opening_a_dataset_is_not_the_jobs_reads(formats_spoke):
    """Index reads (and a tar's walk) carry no job: they neither count as the job's
    reads nor move its plan."""
    client = shardcache.Client(formats_spoke)
    client.set_job("opens-only", 0)
    for name, fmt in [("mds", "mds"), ("wds", "webdataset"), ("parquet", "parquet"), ("megatron", "megatron")]:
        client.samples(name, format=fmt)
    assert not [j for j in client.status()["jobs"] if j["job"] == "opens-only"]
    client.samples("mds", format="mds").read([(0, 0)])
    assert [j["reads"] for j in client.status()["jobs"] if j["job"] == "opens-only"] == [1]


def test_parquet_nanosecond_timestamps_are_refused_with_the_fix(formats_spoke):
    with pytest.raises(shardcache.ShardcacheError, match=r"column at holds nanosecond timestamps.*coerce_timestamps"):
        shardcache.Client(formats_spoke).samples("parquet-ns", format="parquet")
