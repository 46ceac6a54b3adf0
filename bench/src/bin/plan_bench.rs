//! `plan-bench`: a cache half the size of the dataset, three reshuffled epochs read as
//! the Python `StreamingShardDataset` reads them with its defaults, with and without the
//! access plans, at two dataset sizes. Prints, per epoch, the spoke's own per-job rows:
//! hub bytes as a share of the dataset and the share of reads that were hits.
//!
//! What is emulated (`client/python/python/shardcache/datasets.py`): shards permuted per
//! epoch, the 16 KiB records of each block of [`BLOCK`] shards shuffled together; the
//! rank's records cut into batches dealt to [`WORKERS`] DataLoader workers in turn; each
//! worker reads its records [`READ_BATCH`] per `ReadRanges`, one call at a time, all
//! workers at once, and (with plans) sends its own plan (`JOB/rank0/workerW`: the rest of
//! this epoch and the next, with each shard's last read) when its epoch starts. The spoke
//! runs with its defaults (4 MiB chunks, whole-shard fetch, `--plan-window auto`) and a
//! capacity of half the dataset. The bench checks that each epoch read every record once
//! and that the rows' hub bytes are what the hub served.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/plan-bench [SHARDS...]
//! ```
//! (default: 16 and 75 shards of 16 MiB, 256 MiB and 1200 MiB.)

#![allow(clippy::unwrap_used)]

use futures::future::join_all;
use shardcache_client::{CacheClient, Client, PlannedEpoch, Range};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, next_random, spoke_options, test_options};

const SHARD: u64 = 16 << 20;
const RECORD: u64 = 16 << 10;
/// The Python dataset's defaults.
const BLOCK: usize = 4;
const READ_BATCH: usize = 32;
const BATCH_SIZE: usize = 24;
const WORKERS: usize = 4;
const EPOCHS: u64 = 3;

fn shuffle<T>(items: &mut [T], seed: &mut u64) {
    for i in (1..items.len()).rev() {
        items.swap(i, (next_random(seed) % (i as u64 + 1)) as usize);
    }
}

/// Epoch `epoch`'s records (shard, record) in order: shards permuted, then each block's
/// records shuffled together.
fn epoch_order(shards: u64, epoch: u64) -> Vec<(u64, u64)> {
    let mut seed = 0x5eed ^ (epoch + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut order: Vec<u64> = (0..shards).collect();
    shuffle(&mut order, &mut seed);
    let mut reads = Vec::new();
    for block in order.chunks(BLOCK) {
        let mut records: Vec<(u64, u64)> =
            block.iter().flat_map(|&s| (0..SHARD / RECORD).map(move |r| (s, r))).collect();
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

/// One worker's epoch: its plan (when `with_plan`), then its reads, a call at a time.
async fn worker_epoch(
    client: Client,
    control: CacheClient,
    shards: u64,
    epoch: u64,
    worker: usize,
    with_plan: bool,
) {
    let now = worker_reads(&epoch_order(shards, epoch), worker);
    if with_plan {
        let next = worker_reads(&epoch_order(shards, epoch + 1), worker);
        let job = format!("trainer/rank0/worker{worker}");
        control.set_plan(&job, epoch, "c4", &[plan(&now), plan(&next)]).await.unwrap();
    }
    for batch in now.chunks(READ_BATCH) {
        let ranges: Vec<Range> =
            batch.iter().map(|&(s, r)| Range::new("c4", name(s), r * RECORD, RECORD)).collect();
        client.read_ranges(&ranges).await.unwrap();
    }
}

/// Per epoch, the spoke's row for it: (reads, hit reads, hub bytes).
async fn run(shards: u64, with_plan: bool) -> Vec<(u64, u64, u64)> {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "c4", shards as u32, SHARD);
    let mut hub_options = test_options();
    hub_options.limits.max_read = 16 << 20;
    let hub = TestHub::start_with(root.path(), hub_options).await;
    let mut options = spoke_options(&hub.endpoint);
    // The spoke's defaults (the test harness's are smaller), a capacity of half.
    (options.cache.chunk_size, options.cache.read_ahead_chunks, options.cache.shard_fetch_parallelism) =
        (4 << 20, 4, 8);
    options.cache.capacity = shards * SHARD / 2;
    let spoke = TestSpoke::start(cache.path(), options).await;
    let control = spoke.control().await;
    for epoch in 0..EPOCHS {
        let client = spoke.client().await.for_job("trainer", epoch).unwrap();
        let workers =
            (0..WORKERS).map(|w| worker_epoch(client.clone(), control.clone(), shards, epoch, w, with_plan));
        join_all(workers).await;
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
    let sizes: Vec<u64> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let sizes = if sizes.is_empty() { vec![16, 75] } else { sizes };
    println!(
        "| dataset | epoch | LRU: hub bytes / dataset | LRU: hit reads | plan: hub bytes / dataset | plan: hit reads |"
    );
    println!("|---|---|---|---|---|---|");
    for shards in sizes {
        let dataset = shards * SHARD;
        let (lru, planned) = (run(shards, false).await, run(shards, true).await);
        for (epoch, (l, p)) in lru.iter().zip(&planned).enumerate() {
            println!(
                "| {shards} x {} MiB | {} | {:.2} | {:.1}% | {:.2} | {:.1}% |",
                SHARD >> 20,
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
