//! `plan-bench`: a cache half the size of the dataset, three reshuffled epochs, with and
//! without the job's access plan (`SetPlan`). Reads follow a block shuffle (shards
//! permuted per epoch, the records of each block of [`BLOCK`] shards shuffled together),
//! tagged with the job and epoch, so the spoke's own per-job rows give each epoch's
//! reads, hits and hub bytes. Prints them for least-recently-used eviction and for the
//! plan (eviction and prefetch) in the same run, next to the bound no policy can beat
//! after the first epoch: (capacity - the block being read - the plan window) / dataset
//! of the reads hit.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/plan-bench
//! ```

#![allow(clippy::unwrap_used)]

use futures::StreamExt;
use shardcache_client::{PlannedEpoch, Range};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, next_random, spoke_options, test_options};

const SHARDS: u64 = 64;
const SHARD: u64 = 4 << 20;
const RECORD: u64 = 64 << 10;
const BLOCK: usize = 4;
const BATCH: usize = 16;
/// Batches read at once, in order (a DataLoader's workers x prefetch factor): reads reach
/// the spoke a little out of order, as from a real trainer.
const READERS: usize = 4;
const EPOCHS: u64 = 3;
const CAPACITY: u64 = SHARDS * SHARD / 2;
/// `--plan-window`: the next block, beyond the one being read.
const WINDOW: u64 = BLOCK as u64 * SHARD;
/// What streams through the cache: the block being read and the window.
const STREAMED: u64 = BLOCK as u64 * SHARD + WINDOW;

fn shuffle<T>(items: &mut [T], seed: &mut u64) {
    for i in (1..items.len()).rev() {
        items.swap(i, (next_random(seed) % (i as u64 + 1)) as usize);
    }
}

/// Epoch `epoch`'s reads, (shard, record) in order: shards permuted, then each block's
/// records shuffled together (MosaicML Streaming's `py1b`, the Python dataset's default).
fn epoch_reads(epoch: u64) -> Vec<(u64, u64)> {
    let mut seed = 0x5eed ^ (epoch + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut shards: Vec<u64> = (0..SHARDS).collect();
    shuffle(&mut shards, &mut seed);
    let mut reads = Vec::new();
    for block in shards.chunks(BLOCK) {
        let mut records: Vec<(u64, u64)> =
            block.iter().flat_map(|&s| (0..SHARD / RECORD).map(move |r| (s, r))).collect();
        shuffle(&mut records, &mut seed);
        reads.extend(records);
    }
    reads
}

fn name(shard: u64) -> String {
    shardcache_cli::dataset_gen::shard_name(shard as u32)
}

fn plan(epoch: u64) -> PlannedEpoch {
    let names: Vec<String> = epoch_reads(epoch).iter().map(|&(s, _)| name(s)).collect();
    PlannedEpoch::from_reads(names.iter().map(String::as_str))
}

/// Per epoch, the spoke's row for it: (reads, hit reads, hub bytes).
async fn run(with_plan: bool) -> Vec<(u64, u64, u64)> {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "c4", SHARDS as u32, SHARD);
    let mut hub_options = test_options();
    hub_options.limits.max_read = 16 << 20;
    let hub = TestHub::start_with(root.path(), hub_options).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.chunk_size = 1 << 20;
    options.cache.capacity = CAPACITY;
    options.cache.plan_window = WINDOW;
    options.max_read = 16 << 20;
    let spoke = TestSpoke::start(cache.path(), options).await;
    let control = spoke.control().await;
    for epoch in 0..EPOCHS {
        if with_plan {
            control.set_plan("trainer/0", epoch, "c4", &[plan(epoch), plan(epoch + 1)]).await.unwrap();
        }
        let client = spoke.client().await.for_job("trainer", epoch).unwrap();
        futures::stream::iter(epoch_reads(epoch).chunks(BATCH).map(|batch| {
            let ranges: Vec<Range> =
                batch.iter().map(|&(s, r)| Range::new("c4", name(s), r * RECORD, RECORD)).collect();
            let client = client.clone();
            async move { client.read_ranges(&ranges).await.unwrap() }
        }))
        .buffered(READERS)
        .for_each(|_| async {})
        .await;
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
    let dataset = SHARDS * SHARD;
    let (lru, planned) = (run(false).await, run(true).await);
    let bound = (CAPACITY - STREAMED) as f64 / dataset as f64;
    println!(
        "{SHARDS} shards x {} MiB, capacity {} MiB, plan window {} MiB, blocks of {BLOCK} shards, {READERS} batches of {BATCH} in flight",
        SHARD >> 20,
        CAPACITY >> 20,
        WINDOW >> 20
    );
    println!(
        "| epoch | LRU: hub bytes / dataset | LRU: hit reads | plan: hub bytes / dataset | plan: hit reads | bound: hits, hub bytes |"
    );
    println!("|---|---|---|---|---|---|");
    for (epoch, (l, p)) in lru.iter().zip(&planned).enumerate() {
        println!(
            "| {} | {:.2} | {:.1}% | {:.2} | {:.1}% | {} |",
            epoch + 1,
            l.2 as f64 / dataset as f64,
            100.0 * l.1 as f64 / l.0 as f64,
            p.2 as f64 / dataset as f64,
            100.0 * p.1 as f64 / p.0 as f64,
            if epoch == 0 {
                "-, 1.00".to_owned()
            } else {
                format!("{:.1}%, {:.2}", 100.0 * bound, 1.0 - bound)
            },
        );
    }
    // Each epoch read every record once.
    assert!(lru.iter().chain(&planned).all(|e| e.0 == SHARDS * SHARD / RECORD));
}
