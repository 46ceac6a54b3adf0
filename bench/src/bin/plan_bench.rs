//! `plan-bench`: a cache half the size of the dataset, three reshuffled epochs read as
//! the Python `StreamingShardDataset` reads them with its defaults, with and without the
//! access plans, at two dataset sizes. Prints, per epoch, the spoke's own per-job rows:
//! hub bytes as a share of the dataset and the share of reads that were hits.
//!
//! What is emulated (`client/python/python/shardcache/datasets.py`): shards permuted per
//! epoch, the 16 KiB records of each block of [`BLOCK`] shards shuffled together; the
//! rank's records cut into batches of [`BATCH_SIZE`] dealt to [`WORKERS`] DataLoader
//! workers in turn, each worker (with plans) sending its own plan (`JOB/rank0/workerW`:
//! the rest of this epoch and the next, with each shard's last read) when its epoch
//! starts; the batches read in order, one `ReadRanges` each, with [`PREFETCH_FACTOR`] per
//! worker in flight (a DataLoader's workers run ahead of the trainer by that much). The spoke
//! runs with its defaults (4 MiB chunks, whole-shard fetch, `--plan-window auto`) and a
//! capacity of half the dataset. The bench checks that each epoch read every record once
//! and that the rows' hub bytes are what the hub served.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/plan-bench [SHARDSxMIB...]
//! ```
//! `PLAN_BENCH_WINDOW=BYTES` runs the spoke with that fixed `--plan-window` instead of
//! `auto`, to compare.
//! (default: 16x16 and 75x16, 256 MiB and 1200 MiB in the demo's 16 MiB shards, and
//! 64x4, 256 MiB in 4 MiB shards.)

#![allow(clippy::unwrap_used)]

use futures::StreamExt;
use shardcache_client::{CacheClient, Client, PlannedEpoch, Range};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, next_random, spoke_options, test_options};

/// A dataset: this many shards of this many bytes.
#[derive(Debug, Clone, Copy)]
struct Shape {
    shards: u64,
    shard: u64,
}
const RECORD: u64 = 16 << 10;
/// The Python dataset's defaults.
const BLOCK: usize = 4;
const BATCH_SIZE: usize = 24;
const WORKERS: usize = 4;
/// torch's default: batches each worker has ready or in progress.
const PREFETCH_FACTOR: usize = 2;
const EPOCHS: u64 = 3;

fn shuffle<T>(items: &mut [T], seed: &mut u64) {
    for i in (1..items.len()).rev() {
        items.swap(i, (next_random(seed) % (i as u64 + 1)) as usize);
    }
}

/// Epoch `epoch`'s records (shard, record) in order: shards permuted, then each block's
/// records shuffled together.
fn epoch_order(shape: Shape, epoch: u64) -> Vec<(u64, u64)> {
    let mut seed = 0x5eed ^ (epoch + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut order: Vec<u64> = (0..shape.shards).collect();
    shuffle(&mut order, &mut seed);
    let mut reads = Vec::new();
    for block in order.chunks(BLOCK) {
        let mut records: Vec<(u64, u64)> =
            block.iter().flat_map(|&s| (0..shape.shard / RECORD).map(move |r| (s, r))).collect();
        shuffle(&mut records, &mut seed);
        reads.extend(records);
    }
    reads
}

/// Worker `worker`'s records of an epoch: batch `b` of the epoch goes to worker
/// `b % WORKERS`.
fn worker_reads(order: &[(u64, u64)], worker: usize) -> Vec<(u64, u64)> {
    order.chunks(BATCH_SIZE).skip(worker).step_by(WORKERS).flatten().copied().collect()
}

fn name(shard: u64) -> String {
    shardcache_cli::dataset_gen::shard_name(shard as u32)
}

fn plan(reads: &[(u64, u64)]) -> PlannedEpoch {
    let names: Vec<String> = reads.iter().map(|&(s, _)| name(s)).collect();
    PlannedEpoch::from_reads(names.iter().map(String::as_str))
}

/// One epoch: each worker's plan (when `with_plan`), then the batches in order,
/// `WORKERS x PREFETCH_FACTOR` in flight.
async fn epoch_reads(client: &Client, control: &CacheClient, shape: Shape, epoch: u64, with_plan: bool) {
    let order = epoch_order(shape, epoch);
    if with_plan {
        let next = epoch_order(shape, epoch + 1);
        for worker in 0..WORKERS {
            let job = format!("trainer/rank0/worker{worker}");
            let epochs = [plan(&worker_reads(&order, worker)), plan(&worker_reads(&next, worker))];
            control.set_plan(&job, epoch, "c4", &epochs).await.unwrap();
        }
    }
    futures::stream::iter(order.chunks(BATCH_SIZE))
        .map(|batch| {
            let ranges: Vec<Range> =
                batch.iter().map(|&(s, r)| Range::new("c4", name(s), r * RECORD, RECORD)).collect();
            async move { client.read_ranges(&ranges).await.unwrap() }
        })
        .buffered(WORKERS * PREFETCH_FACTOR)
        .for_each(|_| async {})
        .await;
}

/// Per epoch, the spoke's row for it: (reads, hit reads, hub bytes).
async fn run(shape: Shape, with_plan: bool) -> Vec<(u64, u64, u64)> {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "c4", shape.shards as u32, shape.shard);
    let mut hub_options = test_options();
    hub_options.limits.max_read = 16 << 20;
    let hub = TestHub::start_with(root.path(), hub_options).await;
    let mut options = spoke_options(&hub.endpoint);
    // The spoke's defaults (the test harness's are smaller), a capacity of half.
    (options.cache.chunk_size, options.cache.read_ahead_chunks, options.cache.shard_fetch_parallelism) =
        (4 << 20, 4, 8);
    options.cache.capacity = shape.shards * shape.shard / 2;
    // PLAN_BENCH_WINDOW=BYTES: the old fixed window, to compare.
    if let Some(bytes) = std::env::var("PLAN_BENCH_WINDOW").ok().and_then(|w| w.parse().ok()) {
        options.cache.plan_window = spoke_cache::policy::window::PlanWindow::Bytes(bytes);
    }
    let spoke = TestSpoke::start(cache.path(), options).await;
    let control = spoke.control().await;
    for epoch in 0..EPOCHS {
        let client = spoke.client().await.for_job("trainer", epoch).unwrap();
        epoch_reads(&client, &control, shape, epoch, with_plan).await;
    }
    spoke.settled().await;
    let status = control.status().await.unwrap();
    // What the table claims: the rows hold every read and every byte from the hub.
    let dataset = &status.datasets[0];
    assert_eq!(status.jobs.iter().map(|j| j.hub_bytes).sum::<u64>(), hub.stats.snapshot().bytes_served);
    assert_eq!(
        status.jobs.iter().map(|j| j.reads).sum::<u64>(),
        dataset.hit_requests + dataset.miss_requests
    );
    spoke.stop().await;
    (0..EPOCHS)
        .map(|epoch| {
            let row = status.jobs.iter().find(|j| j.job == "trainer" && j.epoch == epoch).unwrap();
            (row.reads, row.hit_reads, row.hub_bytes)
        })
        .collect()
}

#[tokio::main]
async fn main() {
    // SHARDSxMIB arguments, e.g. 16x16 (16 shards of 16 MiB).
    let shapes: Vec<Shape> = std::env::args()
        .skip(1)
        .map(|a| {
            let (shards, mib) = a.split_once('x').expect("SHARDSxMIB, e.g. 16x16");
            Shape { shards: shards.parse().unwrap(), shard: mib.parse::<u64>().unwrap() << 20 }
        })
        .collect();
    let shapes = if shapes.is_empty() {
        vec![
            Shape { shards: 16, shard: 16 << 20 },
            Shape { shards: 75, shard: 16 << 20 },
            Shape { shards: 64, shard: 4 << 20 },
        ]
    } else {
        shapes
    };
    println!(
        "| dataset | epoch | LRU: hub bytes / dataset | LRU: hit reads | plan: hub bytes / dataset | plan: hit reads |"
    );
    println!("|---|---|---|---|---|---|");
    for shape in shapes {
        let dataset = shape.shards * shape.shard;
        let (lru, planned) = (run(shape, false).await, run(shape, true).await);
        for (epoch, (l, p)) in lru.iter().zip(&planned).enumerate() {
            println!(
                "| {} x {} MiB | {} | {:.2} | {:.1}% | {:.2} | {:.1}% |",
                shape.shards,
                shape.shard >> 20,
                epoch + 1,
                l.2 as f64 / dataset as f64,
                100.0 * l.1 as f64 / l.0 as f64,
                p.2 as f64 / dataset as f64,
                100.0 * p.1 as f64 / p.0 as f64,
            );
        }
        // Each epoch read every record once (a ReadRanges counts one read per range).
        assert!(lru.iter().chain(&planned).all(|e| e.0 == dataset / RECORD), "every record once an epoch");
    }
}
