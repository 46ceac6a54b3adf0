//! `plan-bench`: a cache half the size of the dataset, three reshuffled epochs, with and
//! without the job's access plan (`SetPlan`). Prints, per epoch, the bytes fetched from
//! the hub (as a multiple of the dataset) and the share of reads that were hits, for
//! least-recently-used eviction and for plan-aware eviction, in the same run, next to the
//! bound no eviction can beat after the first epoch (capacity / dataset of the reads).
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/plan-bench
//! ```

#![allow(clippy::unwrap_used)]

use shardcache_client::{CacheClient, Range};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, next_random, spoke_options, test_options};

const SHARDS: u64 = 32;
const SHARD: u64 = 8 << 20;
const RECORD: u64 = 64 << 10;
const BATCH: u64 = 16;
const EPOCHS: u64 = 3;

/// Epoch `epoch`'s shard order (a reshuffle per epoch, as a trainer's sampler).
fn shard_order(epoch: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..SHARDS).collect();
    let mut seed = 0x5eed ^ (epoch + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for i in (1..order.len()).rev() {
        order.swap(i, (next_random(&mut seed) % (i as u64 + 1)) as usize);
    }
    order
}

fn name(shard: u64) -> String {
    shardcache_cli::dataset_gen::shard_name(shard as u32)
}

/// (hub bytes, hit reads, reads) per epoch; a read is one record, a hit when none of
/// it came from the hub.
async fn run(with_plan: bool) -> Vec<(u64, u64, u64)> {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "c4", SHARDS as u32, SHARD);
    let mut hub_options = test_options();
    hub_options.limits.max_read = 16 << 20;
    let hub = TestHub::start_with(root.path(), hub_options).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.chunk_size = 4 << 20;
    options.cache.capacity = SHARDS * SHARD / 2;
    options.max_read = 16 << 20;
    let spoke = TestSpoke::start(cache.path(), options).await;
    let (client, control) = (spoke.client().await, CacheClient::connect(&spoke.endpoint).await.unwrap());
    let mut epochs = Vec::new();
    for epoch in 0..EPOCHS {
        let order = shard_order(epoch);
        if with_plan {
            let plan: Vec<Vec<String>> = [order.clone(), shard_order(epoch + 1)]
                .iter()
                .map(|o| o.iter().map(|&s| name(s)).collect())
                .collect();
            control.set_plan("trainer", epoch, "c4", &plan).await.unwrap();
        }
        let (hub_before, status_before) =
            (hub.stats.snapshot().bytes_served, control.status().await.unwrap());
        let mut seed = epoch;
        for &shard in &order {
            // The shard's records in a shuffled order, BATCH per call.
            let mut records: Vec<u64> = (0..SHARD / RECORD).collect();
            for i in (1..records.len()).rev() {
                records.swap(i, (next_random(&mut seed) % (i as u64 + 1)) as usize);
            }
            for batch in records.chunks(BATCH as usize) {
                let ranges: Vec<Range> =
                    batch.iter().map(|&r| Range::new("c4", name(shard), r * RECORD, RECORD)).collect();
                client.read_ranges(&ranges).await.unwrap();
            }
        }
        spoke.settled().await;
        let status = control.status().await.unwrap();
        let counts = |s: &shardcache_proto::v1::StatusResponse| {
            s.datasets
                .iter()
                .map(|d| (d.hit_requests, d.hit_requests + d.miss_requests))
                .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
        };
        let (hits, reads) =
            (counts(&status).0 - counts(&status_before).0, counts(&status).1 - counts(&status_before).1);
        epochs.push((hub.stats.snapshot().bytes_served - hub_before, hits, reads));
    }
    spoke.stop().await;
    epochs
}

#[tokio::main]
async fn main() {
    let dataset = SHARDS * SHARD;
    let (lru, planned) = (run(false).await, run(true).await);
    println!(
        "| epoch | LRU: hub bytes / dataset | LRU: hit reads | plan: hub bytes / dataset | plan: hit reads | bound after epoch 1 |"
    );
    println!("|---|---|---|---|---|---|");
    for (epoch, (l, p)) in lru.iter().zip(&planned).enumerate() {
        println!(
            "| {} | {:.2} | {:.0}% | {:.2} | {:.0}% | {} |",
            epoch + 1,
            l.0 as f64 / dataset as f64,
            100.0 * l.1 as f64 / l.2 as f64,
            p.0 as f64 / dataset as f64,
            100.0 * p.1 as f64 / p.2 as f64,
            if epoch == 0 { "-".to_owned() } else { "50% hits, 0.50 x the dataset".to_owned() },
        );
    }
    // What the table claims: each epoch read the whole dataset, once.
    assert!(
        lru.iter().chain(&planned).all(|e| e.2 == SHARDS * SHARD / RECORD),
        "every record read once an epoch"
    );
}
