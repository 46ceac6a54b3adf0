"""Datasets as they are, read through a spoke without conversion, byte-exact against
each format's own reader on files that reader's tools wrote:

- Megatron indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``) written by megatron-core's
  ``IndexedDatasetBuilder``, against its ``IndexedDataset``: one sample per sequence;
- token arrays: ``.npy`` files written by ``numpy.save``, and raw ``uint16`` files (nanoGPT's
  ``train.bin``), against ``numpy.memmap``: windows of ``seq_len + 1`` tokens every
  ``seq_len``, across file boundaries;

then the datasets over them: every sample of an epoch once across ranks and workers, a
resume under another world size, int64 values."""

import warnings

import numpy as np
import pytest

import shardcache
from conftest import binary, start

SEQ_LEN = 64


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
    return root


@pytest.fixture(scope="module")
def formats_spoke(formats_root, tmp_path_factory):
    hub, hub_addr = start([binary("hub-server"), "--root", str(formats_root), "--listen", "127.0.0.1:0"],
                          "hub-server listening on ")
    cache = tmp_path_factory.mktemp("formats-cache")
    spoke, rest = start([binary("spoke-cache"), "--hub", f"http://{hub_addr}", "--cache-dir", str(cache),
                         "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
                        "spoke-cache listening on ")
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


@pytest.mark.parametrize("name,options", [
    ("megatron", dict(format="megatron")),
    ("npy", dict(format="tokens", seq_len=SEQ_LEN)),
])
def test_datasets_over_a_format_give_every_sample_once_and_resume_under_another_world(
        formats_spoke, name, options):
    reference = shardcache.ShardDataset(formats_spoke, name, **options)
    everything = sorted(tuple(reference[i]) for i in range(len(reference)))
    assert reference[0].dtype == np.int64

    def rank(r, world):
        return shardcache.StreamingShardDataset(formats_spoke, name, batch_size=4, seed=3, rank=r,
                                                world_size=world, prefetch=False, plan=False, **options)

    # 2 ranks x 2 workers take 2 batches each; then 3 ranks x 1 worker read the rest.
    first = [rank(r, 2) for r in range(2)]
    seen = []
    for ds in first:
        mine = [ds.indices(w, 2) for w in range(2)]
        seen += mine[0][:4] + mine[1][:4]  # batch 0 from worker 0, batch 1 from worker 1
    state = first[0].state_dict(consumed=8)
    assert state["sample_in_epoch"] == 16
    rest = []
    for r in range(3):
        ds = rank(r, 3)
        ds.load_state_dict(state)
        rest += list(ds)
    records = first[0]._records
    seen_values = [tuple(records.decode(d)) for d in records.read(seen)]
    assert sorted(seen_values + [tuple(v) for v in rest]) == everything
