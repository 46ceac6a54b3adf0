//! `hub-bench`: how fast the hub serves on this machine, next to raw loopback TCP
//! measured in the same run. Prints a markdown table (recorded in BENCHMARKS.md).
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/hub-bench
//! ```
//!
//! Rows: raw TCP (1 and 4 streams), StreamShard (1 and 4 concurrent streams; SDK
//! default HTTP/2 windows vs larger ones), ReadRange of random 16 KiB samples, and
//! ReadRanges of 24-sample batches (one rank's batch in the seed).

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::time::{Duration, Instant};

use futures::future::join_all;
use hub_server::ServeOptions;
use shardcache_bench::measure::{mb_per_s, percentiles, raw_tcp};
use shardcache_client::{Client, Range};
use shardcache_reader::ReadLimits;
use shardcache_tests::{TestHub, make_dataset, next_random, test_options};

const SHARDS: u32 = 8;
const SHARD_SIZE: u64 = 64 << 20;
const RECORD: u64 = 16 << 10;
const RANDOM_READS: usize = 3000;
const BATCHES: usize = 500;
const BATCH: usize = 24;

#[tokio::main]
async fn main() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", SHARDS, SHARD_SIZE);
    let mut options = ServeOptions {
        limits: ReadLimits { message_size: 1 << 20, max_read: 16 << 20, compression: None },
        ..test_options()
    };
    (options.server.max_concurrency, options.server.request_timeout) = (256, Duration::from_secs(60));
    let hub = TestHub::start_with(root.path(), options).await;
    let total = u64::from(SHARDS) * SHARD_SIZE;

    println!("| measurement | result |");
    println!("|---|---|");
    for streams in [1, 4] {
        let mbs = raw_tcp(streams, total).await;
        println!("| raw loopback TCP, {streams} stream(s), {} MiB | {mbs:.0} MB/s |", total >> 20);
    }
    let default_client = hub.client().await;
    let wide = wide_window_client(&hub.endpoint).await;
    for (label, client) in
        [("SDK default windows", &default_client), ("16 MiB stream / 64 MiB conn windows", &wide)]
    {
        for streams in [1usize, 4] {
            let mbs = stream_all(client, streams).await;
            println!("| StreamShard, {streams} stream(s), {label}, {} MiB | {mbs:.0} MB/s |", total >> 20);
        }
    }
    let (p50, p99) = random_reads(&default_client).await;
    println!(
        "| ReadRange 16 KiB random, sequential calls, n={RANDOM_READS} | p50 {p50:.0} us, p99 {p99:.0} us |"
    );
    let (p50, p99, samples) = batches(&default_client).await;
    println!(
        "| ReadRanges {BATCH} x 16 KiB random, n={BATCHES} | p50 {p50:.0} us, p99 {p99:.0} us, {samples:.0} samples/s |"
    );
}

async fn wide_window_client(endpoint: &str) -> Client {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .unwrap()
        .initial_stream_window_size(16 << 20)
        .initial_connection_window_size(64 << 20)
        .connect()
        .await
        .unwrap();
    Client::from_channel(channel, endpoint)
}

/// MB/s of reading every shard through StreamShard, `streams` shards at a time.
async fn stream_all(client: &Client, streams: usize) -> f64 {
    let started = Instant::now();
    let shards: Vec<_> = (0..SHARDS).map(shardcache_cli::dataset_gen::shard_name).collect();
    let mut bytes = 0;
    for group in shards.chunks(streams) {
        let reads = group.iter().map(|shard| async move {
            let mut stream = client.stream_shard("c4", shard, 0, None).await.unwrap();
            let mut n = 0u64;
            while let Some(chunk) = stream.next_chunk().await.unwrap() {
                n += chunk.data.len() as u64;
            }
            n
        });
        bytes += join_all(reads).await.into_iter().sum::<u64>();
    }
    mb_per_s(bytes, started.elapsed())
}

fn random_sample(rng: &mut u64) -> Range {
    let shard = (next_random(rng) % u64::from(SHARDS)) as u32;
    let record = next_random(rng) % (SHARD_SIZE / RECORD);
    Range::new("c4", shardcache_cli::dataset_gen::shard_name(shard), record * RECORD, RECORD)
}

async fn random_reads(client: &Client) -> (f64, f64) {
    let mut rng = 1;
    let mut latencies = Vec::with_capacity(RANDOM_READS);
    for _ in 0..RANDOM_READS {
        let range = random_sample(&mut rng);
        let started = Instant::now();
        client.read_range(&range).await.unwrap();
        latencies.push(started.elapsed());
    }
    percentiles(latencies)
}

async fn batches(client: &Client) -> (f64, f64, f64) {
    let mut rng = 2;
    let mut latencies = Vec::with_capacity(BATCHES);
    let started = Instant::now();
    for _ in 0..BATCHES {
        let batch: Vec<_> = (0..BATCH).map(|_| random_sample(&mut rng)).collect();
        let t = Instant::now();
        client.read_ranges(&batch).await.unwrap();
        latencies.push(t.elapsed());
    }
    let samples_per_s = (BATCHES * BATCH) as f64 / started.elapsed().as_secs_f64();
    let (p50, p99) = percentiles(latencies);
    (p50, p99, samples_per_s)
}
