//! `group-bench`: what owner routing costs a warm trainer. One node reads random batches
//! (24 x 16 KiB samples per `ReadRanges`, 64 batches in flight) from a warm single spoke
//! and from a warm group of three spokes (`--peers`; the SDK splits each batch by owner
//! and puts it back in order), alternating, twice each, in one run. Checks that every
//! measured read was a hit (the spokes' miss counters do not move).
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/group-bench
//! ```

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::time::Instant;

use futures::{StreamExt, stream};
use shardcache_client::{CacheClient, Client, Range};
use shardcache_tests::{HubProcess, SpokeProcess, free_loopback_addr, make_dataset, next_random};

const SHARDS: u32 = 8;
const SHARD: u64 = 16 << 20;
const SAMPLE: u64 = 16 << 10;
const BATCH: usize = 24;
const IN_FLIGHT: usize = 64;
const BATCHES: usize = 4000;

/// Samples per second reading `BATCHES` random batches through `client`.
async fn samples_per_s(client: &Client, seed: u64) -> f64 {
    let mut rng = seed;
    let batches: Vec<Vec<Range>> = (0..BATCHES)
        .map(|_| {
            (0..BATCH)
                .map(|_| {
                    let shard = (next_random(&mut rng) % u64::from(SHARDS)) as u32;
                    let offset = next_random(&mut rng) % (SHARD / SAMPLE) * SAMPLE;
                    Range::new("c4", shardcache_cli::dataset_gen::shard_name(shard), offset, SAMPLE)
                })
                .collect()
        })
        .collect();
    let started = Instant::now();
    stream::iter(batches)
        .map(|ranges| {
            let client = client.clone();
            async move { client.read_ranges(&ranges).await.unwrap() }
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|_| async {})
        .await;
    (BATCHES * BATCH) as f64 / started.elapsed().as_secs_f64()
}

async fn misses(control: &CacheClient) -> u64 {
    control.status().await.unwrap().datasets.iter().map(|d| d.miss_requests).sum()
}

#[tokio::main]
async fn main() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", SHARDS, SHARD);
    let hub = HubProcess::start(root.path(), &[]);
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let single = SpokeProcess::start(&hub.endpoint, dirs[0].path(), &[]);
    let addrs: Vec<String> = (0..3).map(|_| free_loopback_addr()).collect();
    let peers = addrs.iter().map(|a| format!("http://{a}")).collect::<Vec<_>>().join(",");
    let members: Vec<SpokeProcess> = addrs
        .iter()
        .zip(&dirs[1..])
        .map(|(addr, dir)| {
            let me = format!("http://{addr}");
            SpokeProcess::start_at(&hub.endpoint, dir.path(), addr, &["--peers", &peers, "--peer-self", &me])
        })
        .collect();
    assert_eq!(members.len(), 3);
    let (single_control, group_control) =
        (CacheClient::connect(&single.endpoint).await.unwrap(), CacheClient::connect(&peers).await.unwrap());
    single_control.prefetch("c4", &[], 0).await.unwrap().finish().await.unwrap();
    group_control.prefetch("c4", &[], 0).await.unwrap().finish().await.unwrap();
    let (single_client, group_client) =
        (Client::connect(&single.endpoint).await.unwrap(), Client::connect(&peers).await.unwrap());
    let before = (misses(&single_control).await, misses(&group_control).await);
    let mut rows = Vec::new();
    for round in 0..2 {
        let one = samples_per_s(&single_client, 2 * round + 1).await;
        let group = samples_per_s(&group_client, 2 * round + 2).await;
        rows.push((one, group));
    }
    assert_eq!(
        (misses(&single_control).await, misses(&group_control).await),
        before,
        "every measured read was a hit"
    );
    println!(
        "{SHARDS} shards x 16 MiB, warm; random batches of {BATCH} x 16 KiB, {IN_FLIGHT} in flight, {BATCHES} batches"
    );
    println!("| round | single spoke: samples/s | group of 3: samples/s | group / single |");
    println!("|---|---|---|---|");
    for (round, (one, group)) in rows.iter().enumerate() {
        println!("| {} | {one:.0} | {group:.0} | {:.2} |", round + 1, group / one);
    }
}
