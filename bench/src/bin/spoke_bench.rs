//! `spoke-bench`: the spoke cache on this machine, as processes (release binaries), next
//! to raw loopback TCP measured in the same run. Prints a markdown table.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/spoke-bench [--perf]
//! ```
//!
//! `--perf` also records a CPU profile (`perf record`) of the spoke and of this process
//! (the clients) during the warm stream and prints where their time went, by category.
//!
//! Rows: 16 clients streaming a 1 GiB dataset cold (through the spoke from the hub) and
//! warm (from the spoke's disk), with the spoke's peak RSS after each; warm random 16 KiB
//! ReadRange latency; restart time to the first served read with 10,000 cached chunks
//! (each one file in the store), checked to be a cache hit. The spoke runs with its
//! default configuration except where a row says otherwise.

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::time::{Duration, Instant};

use shardcache_bench::{
    measure::{cpu_seconds, mb_per_s, peak_rss_mib, percentiles, raw_tcp, stream_shards},
    profile::Profile,
};
use shardcache_client::{CacheClient, Client, Range};
use shardcache_tests::{HubProcess, SpokeProcess, make_dataset, next_random};

const SHARDS: u32 = 16;
const SHARD_SIZE: u64 = 64 << 20;
const SAMPLE: u64 = 16 << 10;
const RANDOM_READS: usize = 5000;
/// Pause before the second latency run (the first runs right after the fill).
const QUIET_SECS: u64 = 20;

#[tokio::main]
async fn main() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", SHARDS, SHARD_SIZE);
    let total = u64::from(SHARDS) * SHARD_SIZE;
    // Transport measured against raw TCP: the bytes as they are (compression measured
    // apart, compress-bench).
    let hub = HubProcess::start(root.path(), &["--link-compression-level", "0"]);

    println!("| measurement | result |");
    println!("|---|---|");
    let raw = raw_tcp(4, total).await;
    println!("| raw loopback TCP, 4 streams, 1 GiB | {raw:.0} MB/s |");

    let cache = tempfile::tempdir().unwrap();
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &[]);
    // The gRPC port, as a reader on another node reads it (the same-node door's rows are
    // node-bench's).
    let client = Client::connect(&spoke.endpoint).await.unwrap().over_grpc();
    let perf = std::env::args().any(|a| a == "--perf");
    let mut profile = None;
    for phase in ["cold", "warm"] {
        let profiling = (perf && phase == "warm")
            .then(|| Profile::start(&[(spoke.child.id(), "spoke"), (std::process::id(), "clients")]));
        let (spoke_cpu, clients_cpu) = (cpu_seconds(spoke.child.id()), cpu_seconds(std::process::id()));
        let mbs = stream_dataset(&client).await;
        profile = profiling.map(Profile::finish).or(profile);
        let rss = peak_rss_mib(spoke.child.id());
        let gib = total as f64 / f64::from(1 << 30);
        let spoke_cpu = (cpu_seconds(spoke.child.id()) - spoke_cpu) / gib;
        let clients_cpu = (cpu_seconds(std::process::id()) - clients_cpu) / gib;
        println!(
            "| 16 clients stream 1 GiB, {phase} | {mbs:.0} MB/s ({:.0}% of raw TCP); CPU s/GiB: spoke {spoke_cpu:.2}, clients {clients_cpu:.2}; spoke peak RSS {rss:.0} MiB |",
            mbs * 100.0 / raw
        );
    }
    if let Some(profile) = profile {
        println!("\nWarm stream, where the time went (perf, leaf symbols):\n\n{profile}");
        return;
    }
    let (p50, p99) = random_reads(&client).await;
    println!(
        "| warm random 16 KiB ReadRange, one at a time, n={RANDOM_READS}, right after | p50 {p50:.0} us, p99 {p99:.0} us |"
    );
    // Again a little later: the store does no background work after a fill (no
    // compaction), so the two runs should agree.
    tokio::time::sleep(Duration::from_secs(QUIET_SECS)).await;
    let (p50, p99) = random_reads(&client).await;
    println!(
        "| warm random 16 KiB ReadRange, one at a time, n={RANDOM_READS}, {QUIET_SECS} s later | p50 {p50:.0} us, p99 {p99:.0} us |"
    );
    drop(spoke);

    // 10,000+ cached chunks: 10 shards of 64 MiB in 64 KiB chunks.
    let cache = tempfile::tempdir().unwrap();
    let args = ["--chunk-size", "64KiB", "--capacity", "4GiB"];
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &args);
    let shards: Vec<String> = (0..10).map(shardcache_cli::dataset_gen::shard_name).collect();
    CacheClient::connect(&spoke.endpoint)
        .await
        .unwrap()
        .prefetch("c4", &shards, 0)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let pid = spoke.child.id().to_string();
    let mut spoke = spoke;
    std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    spoke.child.wait().unwrap();
    let started = Instant::now();
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &args);
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    client.read_range(&Range::new("c4", &shards[3], 1 << 20, SAMPLE)).await.unwrap();
    let elapsed = started.elapsed();
    let status = CacheClient::connect(&spoke.endpoint).await.unwrap().status().await.unwrap();
    let (hits, misses) = (status.datasets[0].hit_requests, status.datasets[0].miss_requests);
    assert_eq!((hits, misses), (1, 0), "the first read after the restart was served from the cache");
    assert!(status.used_bytes >= 640 << 20, "every chunk survived the restart: {}", status.used_bytes);
    println!(
        "| restart to first served read, 10,240 cached chunks (640 MiB, 64 KiB chunks), a hit | {:.0} ms |",
        elapsed.as_secs_f64() * 1e3
    );
}

/// 16 concurrent clients, each streaming one shard: MB/s.
async fn stream_dataset(client: &Client) -> f64 {
    let (bytes, elapsed) = stream_shards(client, "c4", SHARDS).await;
    mb_per_s(bytes, elapsed)
}

async fn random_reads(client: &Client) -> (f64, f64) {
    let mut rng = 3;
    let mut latencies: Vec<Duration> = Vec::with_capacity(RANDOM_READS);
    for _ in 0..RANDOM_READS {
        let shard =
            shardcache_cli::dataset_gen::shard_name((next_random(&mut rng) % u64::from(SHARDS)) as u32);
        let offset = next_random(&mut rng) % (SHARD_SIZE / SAMPLE) * SAMPLE;
        let started = Instant::now();
        client.read_range(&Range::new("c4", shard, offset, SAMPLE)).await.unwrap();
        latencies.push(started.elapsed());
    }
    percentiles(latencies)
}
