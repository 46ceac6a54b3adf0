"""Map-style and streaming datasets: every record exactly once per epoch across 2 ranks x
3 workers, deterministic order per (seed, epoch), exact resume, the right bytes."""

import itertools
import random
import tracemalloc
import warnings

import numpy as np
import pytest

import shardcache
from conftest import RECORD, RECORDS_PER_SHARD, SHARDS, binary, start

TOTAL = SHARDS * RECORDS_PER_SHARD


def test_map_dataset_reads_every_record(spoke, records):
    ds = shardcache.ShardDataset(spoke, "c4")
    assert len(ds) == TOTAL
    for i in (0, 1, RECORDS_PER_SHARD - 1, RECORDS_PER_SHARD, TOTAL - 1, -1):
        expected = np.frombuffer(records[i], dtype=np.uint32)
        assert np.array_equal(ds[i], expected), i
    # Token ids as int64 (what nn.Embedding takes), writable.
    assert ds[5].dtype == np.int64 and ds[5].shape == (RECORD // 4,) and ds[5].flags.writeable
    stored = shardcache.ShardDataset(spoke, "c4", tensor_dtype=None)
    assert stored[5].dtype == np.uint32 and stored[5].flags.writeable
    # Of the stored dtype: an array over the buffer the SDK filled, not a copy of it.
    assert isinstance(stored[5].base, memoryview) and isinstance(stored[5].base.obj, bytearray)
    assert np.array_equal(stored[5], np.frombuffer(records[5], dtype=np.uint32))
    batch = stored.get_batch([3, 40, 17])
    assert [bytes(a) for a in batch] == [records[3], records[40], records[17]]
    raw = shardcache.ShardDataset(spoke, "c4", dtype=None)
    assert raw[7] == records[7]
    with pytest.raises(IndexError):
        ds[TOTAL]


def streaming(spoke, rank=0, world_size=2, epoch=0, seed=11, batch_size=4, shard_block=4):
    ds = shardcache.StreamingShardDataset(
        spoke,
        "c4",
        batch_size=batch_size,
        seed=seed,
        rank=rank,
        world_size=world_size,
        prefetch=False,
        shard_block=shard_block,
    )
    ds.set_epoch(epoch)
    return ds


def test_two_ranks_and_three_workers_read_every_record_exactly_once(spoke):
    seen = []
    for rank in range(2):
        ds = streaming(spoke, rank=rank)
        per_rank = [item for worker in range(3) for item in ds.indices(worker, 3)]
        assert len(per_rank) == len(ds)
        seen.extend(per_rank)
    assert sorted(seen) == [(s, r) for s in range(SHARDS) for r in range(RECORDS_PER_SHARD)]


def test_order_depends_only_on_seed_and_epoch(spoke):
    first = streaming(spoke, epoch=3).epoch_order()
    assert streaming(spoke, epoch=3).epoch_order() == first
    assert streaming(spoke, epoch=4).epoch_order() != first
    assert streaming(spoke, epoch=3, seed=12).epoch_order() != first
    # A block shuffle: batches mix shards (3 shards make one block of the default 4).
    mixed = [first[i : i + 4] for i in range(0, len(first), 4)]
    assert sum(1 for batch in mixed if len({s for s, _ in batch}) > 1) > len(mixed) // 2
    # One shard per block: shard-major, each shard's records contiguous.
    major = [s for s, _ in streaming(spoke, epoch=3, shard_block=1).epoch_order()]
    assert sum(1 for a, b in zip(major, major[1:]) if a != b) == SHARDS - 1
    # Blocks of two: the first two shards' records all come before the third's.
    paired = [s for s, _ in streaming(spoke, epoch=3, shard_block=2).epoch_order()]
    assert paired[-1] not in paired[: 2 * RECORDS_PER_SHARD]
    assert len(set(paired[: 2 * RECORDS_PER_SHARD])) == 2


def dataloader_order(ds, workers):
    """What an in-order DataLoader hands the trainer: batches from workers in turn."""
    per_worker = [ds.indices(w, workers) for w in range(workers)]
    batches = [[lst[i:i + ds.batch_size] for i in range(0, len(lst), ds.batch_size)] for lst in per_worker]
    out = []
    for k in range(max(len(b) for b in batches)):
        for w in range(workers):
            if k < len(batches[w]):
                out.append(batches[w][k])
    return out


@pytest.mark.parametrize("done_batches", [0, 1, 2, 4, 5])
def test_resuming_mid_epoch_neither_repeats_nor_skips(spoke, done_batches):
    ds = streaming(spoke, rank=1, epoch=2)
    full = [item for batch in dataloader_order(ds, 3) for item in batch]
    consumed = [item for batch in dataloader_order(ds, 3)[:done_batches] for item in batch]
    state = ds.state_dict(consumed=len(consumed))

    resumed = streaming(spoke, rank=1, epoch=0)
    resumed.load_state_dict(state)
    rest = [item for batch in dataloader_order(resumed, 3) for item in batch]
    assert consumed + rest == full


def consumed_by(datasets, workers, batches):
    """The records the first ``batches`` batches of each rank's DataLoader hold."""
    return [item for ds in datasets for batch in dataloader_order(ds, workers)[:batches] for item in batch]


def test_resuming_under_another_world_size_and_workers_sees_every_record_once(spoke):
    everything = sorted((s, r) for s in range(SHARDS) for r in range(RECORDS_PER_SHARD))
    # 4 ranks x 2 workers -> 3 x 3 -> 2 x 1 -> the end; and 2 x 1 -> 8 x 2.
    for layouts, batches in ([(4, 2), (3, 3), (2, 1)], [1, 1]), ([(2, 1), (8, 2)], [2]):
        state, seen = None, []
        for (world, workers), done in zip(layouts, batches + [None]):
            ranks = [streaming(spoke, rank=r, world_size=world, epoch=2) for r in range(world)]
            for ds in ranks:
                if state is not None:
                    ds.load_state_dict(state)
            if done is None:  # the last layout reads the rest of the epoch
                seen += consumed_by(ranks, workers, 10**6)
                break
            seen += consumed_by(ranks, workers, done)
            # Rank 0 saves (all ranks have taken as many batches).
            consumed = sum(len(b) for b in dataloader_order(ranks[0], workers)[:done])
            state = ranks[0].state_dict(consumed=consumed)
            assert state["sample_in_epoch"] == len(seen), (layouts, state)
        assert sorted(seen) == everything, layouts


def test_a_state_saved_before_sample_in_epoch_still_resumes(spoke):
    ds = streaming(spoke, rank=1, epoch=2)
    full = [item for batch in dataloader_order(ds, 3) for item in batch]
    resumed = streaming(spoke, rank=1, epoch=0)
    resumed.load_state_dict({"seed": 11, "epoch": 2, "consumed": 8, "world_size": 2})
    assert [item for batch in dataloader_order(resumed, 3) for item in batch] == full[8:]


def test_iterating_yields_the_records_in_order(spoke, records):
    ds = shardcache.StreamingShardDataset(spoke, "c4", batch_size=4, seed=5, rank=0, world_size=1)
    ds.set_epoch(1)
    got = [a.astype(np.uint32).tobytes() for a in ds]
    expected = [records[s * RECORDS_PER_SHARD + r] for s, r in ds.epoch_order()]
    assert got == expected


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on 2 cores
def test_torch_dataloader_with_workers(spoke):
    torch = pytest.importorskip("torch")
    ds = shardcache.StreamingShardDataset(spoke, "c4", batch_size=4, seed=1, rank=0, world_size=1, job="loader")
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=3)
    total = sum(batch.shape[0] for batch in loader)
    assert total == TOTAL
    # Each worker sent its own plan; their reads count under the one job.
    status = shardcache.Client(spoke).status()
    plans = sorted(p["job"] for p in status["plans"] if p["job"].startswith("loader/"))
    assert plans == [f"loader/rank0/worker{w}" for w in range(3)], plans
    assert [j["reads"] for j in status["jobs"] if j["job"] == "loader"] == [TOTAL]


def test_iteration_sends_the_plan_to_a_spoke_and_a_hub_ignores_it(spoke, hub, recwarn):
    for endpoint in (spoke, hub):
        ds = shardcache.StreamingShardDataset(
            endpoint, "c4", batch_size=4, seed=3, rank=0, world_size=1, prefetch=False, job="plan-test"
        )
        ds.set_epoch(2)
        assert sum(1 for _ in ds) == TOTAL
    # The spoke took the plan and the hub said it takes none: no warning either way.
    assert not [w for w in recwarn if "access plan" in str(w.message)]
    # The spoke counted the epoch's reads under the job and epoch; rows add up to totals.
    status = shardcache.Client(spoke).status()
    row = [j for j in status["jobs"] if j["job"] == "plan-test" and j["epoch"] == 2]
    assert len(row) == 1 and row[0]["reads"] == TOTAL and row[0]["bytes"] == TOTAL * RECORD, status["jobs"]
    counted = status["datasets"]["c4"]
    assert sum(j["reads"] for j in status["jobs"]) == counted["hit_requests"] + counted["miss_requests"]
    assert sum(j["hub_bytes"] for j in status["jobs"]) == counted["upstream_bytes"]
    # The worker's plan, read to its end of this epoch (this epoch's shards, then the next's).
    plan = [p for p in status["plans"] if p["job"] == "plan-test/rank0/worker0"]
    assert len(plan) == 1 and plan[0]["positions"] == 2 * SHARDS and plan[0]["cursor"] == SHARDS - 1, plan


def test_a_dtype_that_does_not_divide_the_record_is_refused(spoke):
    with pytest.raises(ValueError, match="not a multiple of uint32's 4 bytes"):
        shardcache.ShardDataset(spoke, "c4", record_size=RECORD - 2)


def test_batches_are_int64_tensors_an_embedding_takes_without_warnings(spoke):
    torch = pytest.importorskip("torch")
    import warnings

    ds = shardcache.StreamingShardDataset(spoke, "c4", batch_size=4, seed=2, rank=0, world_size=1, plan=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch's non-writable-array warning would fail this
        batch = next(iter(loader))
    assert batch.dtype == torch.int64 and batch.shape == (4, RECORD // 4)
    # An embedding over the generator's vocabulary (LLaMA 3's 128,256 ids) takes them.
    table = torch.nn.Embedding(128_256, 2)
    assert table(batch).shape == (4, RECORD // 4, 2)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_epochs_advance_by_themselves_under_persistent_workers(spoke):
    torch = pytest.importorskip("torch")
    ds = shardcache.StreamingShardDataset(spoke, "c4", batch_size=4, seed=3, rank=0, world_size=1, plan=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    epochs = []
    for _ in range(2):
        # set_epoch on the main process's copy cannot reach persistent workers.
        epochs.append([tuple(row[:4].tolist()) for batch in loader for row in batch])
    assert len(epochs[0]) == len(epochs[1]) == TOTAL
    assert sorted(epochs[0]) == sorted(epochs[1]), "each epoch reads every record once"
    assert epochs[0] != epochs[1], "the second epoch is not the first one's order again"
    # Iterated directly, the dataset advances by itself too; set_epoch still chooses.
    ds.set_epoch(0)
    first = [tuple(a[:4].tolist()) for a in ds]
    assert [tuple(a[:4].tolist()) for a in ds] != first, "the next iteration is the next epoch"
    ds.set_epoch(0)
    assert [tuple(a[:4].tolist()) for a in ds] == first, "set_epoch(0) chose epoch 0 again"


def test_a_dataloader_with_another_batch_size_is_refused_with_the_fix(spoke):
    torch = pytest.importorskip("torch")
    for workers in (0, 2):
        ds = streaming(spoke, batch_size=4)
        loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=workers)
        with pytest.raises(Exception, match="batch_size=8 is not the dataset's batch_size=4"):
            next(iter(loader))
    # The same batch size, or none (records one by one), is taken.
    assert len(next(iter(torch.utils.data.DataLoader(streaming(spoke, batch_size=4), batch_size=4)))) == 4
    assert next(iter(torch.utils.data.DataLoader(streaming(spoke, batch_size=4), batch_size=None))).shape == (4096,)


def listed_order(units, seed, epoch, shard_block):
    """The epoch order as versions before shardcache.order listed it, whole."""
    picked = list(range(len(units)))
    random.Random(f"shardcache:{seed}:{epoch}").shuffle(picked)
    order = []
    for start in range(0, len(picked), shard_block):
        inside = [(s, first + k) for s, first, count in (units[u] for u in picked[start:start + shard_block])
                  for k in range(count)]
        random.Random(f"shardcache:{seed}:{epoch}:block{start}").shuffle(inside)
        order.extend(inside)
    return order


def test_the_computed_order_is_the_one_earlier_versions_listed(spoke):
    # A state saved by an earlier version resumes in the same order.
    units = [(s, 0, RECORDS_PER_SHARD) for s in range(SHARDS)]
    for epoch, block in ((3, 2), (0, 4), (7, 1)):
        assert streaming(spoke, epoch=epoch, shard_block=block).epoch_order() == listed_order(units, 11, epoch, block)


def test_a_huge_epoch_is_computed_not_listed(tmp_path):
    # 2^28 records of 4 KiB in one sparse 1 TiB file: listed as pairs, the epoch order
    # alone would take ~30 GiB in every worker. Through a hub (which takes no plan, so
    # the plan is computed and then declined).
    (tmp_path / "huge").mkdir()
    with open(tmp_path / "huge" / "shard-00000.bin", "wb") as f:
        f.truncate(1 << 40)
    proc, addr = start([binary("hub-server"), "--root", str(tmp_path), "--listen", "127.0.0.1:0"],
                       "hub-server listening on ")
    try:
        tracemalloc.start()
        ds = shardcache.StreamingShardDataset(
            f"http://{addr}", "huge", batch_size=8, record_size=4096, rank=1, world_size=2, prefetch=False
        )
        assert len(ds) == 1 << 27
        first = list(itertools.islice(iter(ds), 16))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(first) == 16 and all(a.shape == (1024,) and not a.any() for a in first)
        assert peak < 64 << 20, f"{peak} bytes of Python memory for the first batches"
        # Rank 1's first positions, spread over the whole file by the computed shuffle.
        items = list(itertools.islice(ds.iter_indices(), 1000))
        assert len(set(items)) == 1000 and max(r for _, r in items) > (1 << 27)
    finally:
        proc.kill()
        proc.wait()


def test_a_state_saved_before_computed_orders_warns_where_its_blocks_were_shuffled_otherwise(spoke, monkeypatch):
    monkeypatch.setattr(shardcache.order, "LISTED_BLOCK", 10)  # the c4 blocks (48 records) are "large"
    old = {"seed": 11, "epoch": 2, "sample_in_epoch": 8, "consumed": 4, "world_size": 2}
    with pytest.warns(UserWarning, match="shuffled blocks of more than 10 samples another way"):
        streaming(spoke).load_state_dict(old)
    saved = streaming(spoke, epoch=2).state_dict(consumed=4)
    assert saved["order"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        streaming(spoke).load_state_dict(saved)  # saved by this version: no warning
        streaming(spoke).load_state_dict(dict(old, sample_in_epoch=0, consumed=0))  # at an epoch's start
