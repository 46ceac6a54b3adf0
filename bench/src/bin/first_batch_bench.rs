//! `first-batch-bench`: time to the first batch of a cold epoch over the long link, for
//! each format the SDK reads: open the dataset's index through a cold spoke whose hub is
//! behind the WAN emulator (60 ms RTT, 2 Gbit/s), then read one batch of 32 samples of
//! the first shard. Prints a markdown table, in milliseconds and in round trips.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/first-batch-bench
//! ```
//!
//! Each format is read through a spoke of its own with an empty cache; the bench checks
//! that each batch came back whole (32 samples of their sizes). The issue's target is
//! three round trips plus the first batch's bytes.

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::time::Instant;

use shardcache_bench::formats;
use shardcache_client::Client;
use shardcache_formats::{Format, SampleIndex};
use shardcache_tests::{HubProcess, ProxyProcess, SpokeProcess};

const RTT_MS: f64 = 60.0;
const BATCH: u64 = 32;
const SHARDS: u64 = 8;

#[tokio::main]
async fn main() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    shardcache_tests::make_dataset(r, "records", SHARDS as u32, 16 << 20);
    formats::megatron(&r.join("megatron"), SHARDS, 16 << 20, 1 << 10, 64 << 10);
    formats::npy(&r.join("npy"), SHARDS, 8 << 20);
    formats::mds(&r.join("mds"), SHARDS, 1000, 16 << 10);
    formats::webdataset(&r.join("wds"), SHARDS, 1000, 16 << 10);
    let hub = HubProcess::start(r, &[]);
    let hub_addr = hub.endpoint.trim_start_matches("http://").parse().unwrap();
    let link = ProxyProcess::start(hub_addr, &["--rtt", "60ms", "--rate", "2Gbit"]);

    println!(
        "| format (cold spoke, hub 60 ms away) | open the index | first batch of {BATCH} | to the first batch |"
    );
    println!("|---|---|---|---|");
    let rows = [
        ("records (16 KiB)", "records", Format::Records { record_size: 16 << 10 }),
        ("megatron (1-64 KiB documents)", "megatron", Format::Megatron),
        ("tokens (.npy, seq_len 4095)", "npy", Format::Tokens { seq_len: 4095, dtype: None }),
        ("mds (16 KiB samples)", "mds", Format::Mds),
        ("webdataset (16 KiB + cls)", "wds", Format::WebDataset),
    ];
    for (label, dataset, format) in rows {
        let cache = tempfile::tempdir().unwrap();
        let spoke = SpokeProcess::start(&link.endpoint, cache.path(), &[]);
        let client = Client::connect(&spoke.endpoint).await.unwrap();
        let started = Instant::now();
        let index = SampleIndex::open(&client, dataset, &format).await.unwrap();
        let opened = started.elapsed().as_secs_f64() * 1e3;
        let batch: Vec<(usize, u64)> = (0..BATCH).map(|k| (0, k)).collect();
        let data = index.read(&client, &batch).await.unwrap();
        let total = started.elapsed().as_secs_f64() * 1e3;
        assert_eq!(data.len() as u64, BATCH);
        for (&(s, k), d) in batch.iter().zip(&data) {
            let size: u64 = index.pieces(s, k).unwrap().iter().map(|p| p.length).sum();
            assert_eq!(d.len() as u64, size, "{label}: sample {k} came back whole");
        }
        let rtts = |ms: f64| ms / RTT_MS;
        println!(
            "| {label} | {opened:.0} ms ({:.1} RTT) | {:.0} ms ({:.1} RTT) | {total:.0} ms ({:.1} RTT) |",
            rtts(opened),
            total - opened,
            rtts(total - opened),
            rtts(total)
        );
    }
}
