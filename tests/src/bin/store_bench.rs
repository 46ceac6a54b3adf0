//! `store-bench`: chooses the spoke's page layout. Writes a 512 MiB "dataset" into the
//! spoke's RocksDB store under several layouts, then measures random 16 KiB sample reads
//! and sequential whole-shard reads, in one run. Prints a markdown table.
//!
//! ```sh
//! cargo run --release -p shardcache-tests --bin store-bench [DIR]
//! ```
//! DIR (default: a temporary directory) should be on the disk the cache will use.

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::time::{Duration, Instant};

use spoke_cache::store::{ShardRecord, Store, StoreOptions};

const SHARDS: u64 = 8;
const SHARD_SIZE: u64 = 64 << 20;
const CHUNK: u64 = 1 << 20;
const SAMPLE: u64 = 16 << 10;
const RANDOM_READS: usize = 20_000;

fn main() {
    let base = std::env::args().nth(1).map(std::path::PathBuf::from);
    let scratch = tempfile::tempdir_in(base.unwrap_or_else(std::env::temp_dir)).unwrap();
    let layouts = [
        ("inline pages 16 KiB", false, 16 << 10),
        ("inline pages 64 KiB", false, 64 << 10),
        ("inline pages 256 KiB", false, 256 << 10),
        ("BlobDB pages 64 KiB", true, 64 << 10),
        ("BlobDB pages 1 MiB (= chunk)", true, 1 << 20),
    ];
    println!("| layout | write MB/s | random 16 KiB read p50 | p99 | reads/s | sequential shard read MB/s |");
    println!("|---|---|---|---|---|---|");
    let chunk: Vec<u8> = (0..CHUNK).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for (name, blob_files, page_size) in layouts {
        let dir = scratch.path().join(name.replace(' ', "_"));
        let options = StoreOptions { blob_files, page_size, ..StoreOptions::default() };
        let store = Store::open(&dir, &options).unwrap();
        let started = Instant::now();
        for id in 1..=SHARDS {
            let mut record =
                ShardRecord { id, size: SHARD_SIZE, chunk_size: CHUNK as u32, ..Default::default() };
            for index in 0..SHARD_SIZE / CHUNK {
                record.set_chunk(index, true);
                store.admit_chunk("ds", &format!("s{id}"), &record, index * CHUNK, &chunk).unwrap();
            }
        }
        let write = mb_per_s(SHARDS * SHARD_SIZE, started.elapsed());
        // Reopen: reads come from files (and the OS page cache), not the memtable.
        drop(store);
        let store = Store::open(&dir, &options).unwrap();

        let mut rng = 7u64;
        let mut latencies = Vec::with_capacity(RANDOM_READS);
        let started = Instant::now();
        for _ in 0..RANDOM_READS {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let id = 1 + (rng >> 33) % SHARDS;
            let offset = ((rng >> 7) % (SHARD_SIZE / SAMPLE)) * SAMPLE;
            let t = Instant::now();
            let bytes = store.read(id, offset, SAMPLE).unwrap().unwrap();
            latencies.push(t.elapsed());
            assert_eq!(bytes.len() as u64, SAMPLE);
        }
        let reads_per_s = RANDOM_READS as f64 / started.elapsed().as_secs_f64();
        latencies.sort();
        let at = |q: f64| latencies[(latencies.len() as f64 * q) as usize].as_secs_f64() * 1e6;

        let started = Instant::now();
        for id in 1..=SHARDS {
            for index in 0..SHARD_SIZE / CHUNK {
                store.read(id, index * CHUNK, CHUNK).unwrap().unwrap();
            }
        }
        let sequential = mb_per_s(SHARDS * SHARD_SIZE, started.elapsed());
        println!(
            "| {name} | {write:.0} | {:.0} us | {:.0} us | {reads_per_s:.0} | {sequential:.0} |",
            at(0.5),
            at(0.99)
        );
    }
}

fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e6
}
