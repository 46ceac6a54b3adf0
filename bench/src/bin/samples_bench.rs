//! `samples-bench`: variable-size samples against fixed-size records of the same mean
//! size, through a warm spoke, read by the SDK's sample index (`shardcache_formats`)
//! in shuffled batches of 32. Prints a markdown table.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/samples-bench
//! ```
//!
//! The variable dataset is a Megatron indexed dataset (PREFIX.bin + PREFIX.idx) of
//! documents uniformly 1-64 KiB; the fixed one, records of their mean size. Both are
//! warmed into the spoke first, and the bench checks that the measured reads were
//! served from it (the hub sent nothing during them) and returned every sample's size.

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{path::Path, time::Instant};

use futures::future::join_all;
use shardcache_client::{CacheClient, Client};
use shardcache_formats::{Format, SampleIndex};
use shardcache_tests::{HubProcess, SpokeProcess, next_random};

const SHARDS: u64 = 8;
const SHARD_BYTES: u64 = 48 << 20;
/// Variable samples: 1..=64 KiB, uniformly; the fixed ones their mean.
const MIN: u64 = 1 << 10;
const MAX: u64 = 64 << 10;
const READERS: usize = 8;
const BATCH: usize = 32;
const ROUNDS: usize = 3;

#[tokio::main]
async fn main() {
    let root = tempfile::tempdir().unwrap();
    let mean =
        shardcache_bench::formats::megatron(&root.path().join("variable"), SHARDS, SHARD_BYTES, MIN, MAX);
    write_fixed(&root.path().join("fixed"));
    let hub = HubProcess::start_logged(
        root.path(),
        &["--metrics-listen", "127.0.0.1:0"],
        std::process::Stdio::null(),
        "warn",
    );
    let cache = tempfile::tempdir().unwrap();
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &["--capacity", "4GiB"]);
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    for dataset in ["variable", "fixed"] {
        control.prefetch(dataset, &[], 0).await.unwrap().finish().await.unwrap();
    }

    println!("| samples (through a warm spoke, {READERS} readers, batches of {BATCH}) | samples/s | MB/s |");
    println!("|---|---|---|");
    let mut rates = Vec::new();
    for (dataset, format) in [
        ("fixed", Format::Records { record_size: mean }),
        ("variable", Format::Megatron),
        ("fixed", Format::Records { record_size: mean }),
        ("variable", Format::Megatron),
    ] {
        let index = SampleIndex::open(&client, dataset, &format).await.unwrap();
        let before = hub.bytes_served().await;
        let (samples, bytes, secs) = read_shuffled(&client, &index).await;
        assert_eq!(hub.bytes_served().await, before, "{dataset}: the measured reads were not all hits");
        let rate = samples as f64 / secs;
        println!(
            "| {dataset}: {} samples, mean {:.1} KiB | {rate:.0} | {:.0} |",
            index.len(),
            bytes as f64 / samples as f64 / 1024.0,
            bytes as f64 / secs / 1e6
        );
        rates.push((dataset, rate));
    }
    let best = |name: &str| rates.iter().filter(|(d, _)| *d == name).map(|(_, r)| *r).fold(0.0, f64::max);
    println!(
        "| variable / fixed (best of two runs each) | {:.2} | target >= 0.80 |",
        best("variable") / best("fixed")
    );
}

/// Reads every sample of `index` `ROUNDS` times in shuffled batches by `READERS` tasks;
/// samples, bytes and seconds.
async fn read_shuffled(client: &Client, index: &SampleIndex) -> (u64, u64, f64) {
    let mut items: Vec<(usize, u64)> = Vec::new();
    for (shard, count) in index.counts().into_iter().enumerate() {
        items.extend((0..count).map(|k| (shard, k)));
    }
    let mut state = 42;
    for i in (1..items.len()).rev() {
        items.swap(i, (next_random(&mut state) % (i as u64 + 1)) as usize);
    }
    let started = Instant::now();
    let per_reader = items.len().div_ceil(READERS);
    let reads = items.chunks(per_reader).map(|mine| async move {
        let (mut samples, mut bytes) = (0u64, 0u64);
        for _ in 0..ROUNDS {
            for batch in mine.chunks(BATCH) {
                let data = index.read(client, batch).await.unwrap();
                for (&(shard, k), d) in batch.iter().zip(&data) {
                    let expected: u64 = index.pieces(shard, k).unwrap().iter().map(|p| p.length).sum();
                    assert_eq!(d.len() as u64, expected);
                }
                samples += data.len() as u64;
                bytes += data.iter().map(|d| d.len() as u64).sum::<u64>();
            }
        }
        (samples, bytes)
    });
    let done = join_all(reads).await;
    let secs = started.elapsed().as_secs_f64();
    (done.iter().map(|d| d.0).sum(), done.iter().map(|d| d.1).sum(), secs)
}

/// Plain files of the same total size (records of the variable samples' mean size).
fn write_fixed(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for shard in 0..SHARDS {
        let data: Vec<u8> = (0..SHARD_BYTES).map(|i| (i as u8).wrapping_mul(31) ^ (shard as u8)).collect();
        std::fs::write(dir.join(format!("shard-{shard}.bin")), data).unwrap();
    }
}
