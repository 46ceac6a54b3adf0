//! `store-bench`: chooses the spoke's store layout and chunk size. Writes a 512 MiB
//! "dataset" in chunks from four writer threads (as concurrent fetches admit them) into
//! each layout,
//! then measures random 16 KiB sample reads (twice: right after the fill, and again) and
//! sequential whole-chunk reads, in one run. Prints a markdown table.
//!
//! - **memtable + compaction**: the layout before ingestion, rebuilt here as the
//!   baseline: each chunk's pages in one `WriteBatch` (no WAL), memtables flushed to L0
//!   and compacted down the levels; the write is done when RocksDB has no compaction
//!   left to run, since that work is part of what a GiB costs.
//! - **ingested chunk files**: the spoke's `Store` (one SST file per chunk, ingested).
//!
//! CPU is this process's user + system seconds (RocksDB's background threads included)
//! per GiB written.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/store-bench [DIR]
//! ```
//! DIR (default: a temporary directory) should be on the disk the cache will use. A
//! second argument runs only the layouts whose name contains it (e.g. under `perf`).

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use shardcache_bench::measure::cpu_seconds;
use shardcache_proto::checksum::{Checked, crc32c};
use shardcache_tests::next_random;
use spoke_cache::store::{ShardRecord, Store, StoreOptions, page_key};

const SHARDS: u64 = 8;
const SHARD_SIZE: u64 = 64 << 20;
const SAMPLE: u64 = 16 << 10;
const RANDOM_READS: usize = 20_000;
const WRITERS: u64 = 4;

/// A store layout under test.
trait Layout: Send + Sync {
    /// Writes chunk `index` (of `chunk.data.len()` bytes, the row's chunk size) of shard
    /// `id`; its checksum comes with it, as a verified fetch's does.
    fn write(&self, id: u64, index: u64, chunk: &Checked);
    /// Waits until the layout has no write work left in the background.
    fn settle(&self) {}
    fn read(&self, id: u64, offset: u64, len: u64) -> Bytes;
}

impl Layout for Store {
    fn write(&self, id: u64, index: u64, chunk: &Checked) {
        self.admit_chunk(id, index * chunk.data.len() as u64, chunk).unwrap();
    }

    fn read(&self, id: u64, offset: u64, len: u64) -> Bytes {
        self.read(id, offset, len).unwrap().unwrap().data
    }
}

/// The memtable layout: pages written through `WriteBatch`es (the spoke before).
struct Memtable {
    db: rocksdb::DB,
    page: u64,
}

impl Memtable {
    fn open(dir: &Path, page: u64) -> Self {
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        table.set_block_cache(&rocksdb::Cache::new_lru_cache(64 << 20));
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_block_based_table_factory(&table);
        options.set_compression_type(rocksdb::DBCompressionType::None);
        options.set_write_buffer_size(32 << 20);
        options.set_max_background_jobs(2);
        Self { db: rocksdb::DB::open_cf(&options, dir, ["pages"]).unwrap(), page }
    }
}

impl Layout for Memtable {
    fn write(&self, id: u64, index: u64, chunk: &Checked) {
        let chunk = &chunk.data[..];
        let mut batch = rocksdb::WriteBatch::with_capacity_bytes(chunk.len() + 4096);
        let mut value = Vec::with_capacity(4 + self.page as usize);
        for (i, page) in chunk.chunks(self.page as usize).enumerate() {
            value.clear();
            value.extend_from_slice(&crc32c(page).to_le_bytes());
            value.extend_from_slice(page);
            let page = index * chunk.len() as u64 / self.page + i as u64;
            batch.put_cf(&self.db.cf_handle("pages").unwrap(), page_key(id, page), &value);
        }
        let mut options = rocksdb::WriteOptions::default();
        options.disable_wal(true);
        self.db.write_opt(batch, &options).unwrap();
    }

    fn settle(&self) {
        self.db.flush_cf(&self.db.cf_handle("pages").unwrap()).unwrap();
        let pages = self.db.cf_handle("pages").unwrap();
        let busy = |name: &str| self.db.property_int_value_cf(&pages, name).unwrap().unwrap_or(0) > 0;
        while busy("rocksdb.compaction-pending") || busy("rocksdb.num-running-compactions") {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn read(&self, id: u64, offset: u64, len: u64) -> Bytes {
        let (first, last) = (offset / self.page, (offset + len - 1) / self.page);
        let keys: Vec<[u8; 16]> = (first..=last).map(|p| page_key(id, p)).collect();
        let mut out = Vec::with_capacity(len as usize);
        for (page, value) in
            (first..).zip(self.db.batched_multi_get_cf(&self.db.cf_handle("pages").unwrap(), &keys, true))
        {
            let value = value.unwrap().unwrap();
            let (crc, data) = value.split_at(4);
            assert_eq!(crc32c(data).to_le_bytes(), crc);
            let from = offset.saturating_sub(page * self.page) as usize;
            let to = ((offset + len - page * self.page) as usize).min(data.len());
            out.extend_from_slice(&data[from..to]);
        }
        out.into()
    }
}

fn main() {
    let base = std::env::args().nth(1).map(std::path::PathBuf::from);
    let only = std::env::args().nth(2).unwrap_or_default();
    let scratch = tempfile::tempdir_in(base.unwrap_or_else(std::env::temp_dir)).unwrap();
    println!("store-bench: {SHARDS} shards x {} MiB, {WRITERS} writers", SHARD_SIZE >> 20);
    println!();
    println!(
        "| layout | chunk | write MB/s | CPU s/GiB written | random 16 KiB p50 / p99 after fill | again | sequential MB/s | disk MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // (name, page size, chunk size, ingested)
    let rows: [(&str, u64, u64, bool); 5] = [
        ("memtable + compaction, 64 KiB pages (before)", 64 << 10, 1 << 20, false),
        ("memtable + compaction, 64 KiB pages", 64 << 10, 4 << 20, false),
        ("ingested chunk files, 64 KiB pages", 64 << 10, 1 << 20, true),
        ("**ingested chunk files, 64 KiB pages (chosen)**", 64 << 10, 4 << 20, true),
        ("ingested chunk files, 16 KiB pages", 16 << 10, 4 << 20, true),
    ];
    for (name, page_size, chunk_size, ingested) in rows.into_iter().filter(|(name, ..)| name.contains(&only))
    {
        let chunk: Vec<u8> = (0..chunk_size).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let chunk = Checked::new(chunk.into());
        let dir = scratch.path().join(format!("{page_size}-{chunk_size}-{ingested}"));
        let layout: Arc<dyn Layout> = if ingested {
            let store = Store::open(&dir, &StoreOptions { page_size, ..StoreOptions::default() }).unwrap();
            for id in 1..=SHARDS {
                let record =
                    ShardRecord { id, size: SHARD_SIZE, chunk_size: chunk_size as u32, ..Default::default() };
                store.put_record("ds", &format!("s{id}"), &record).unwrap();
            }
            Arc::new(store)
        } else {
            Arc::new(Memtable::open(&dir, page_size))
        };
        let (cpu_before, started) = (cpu_seconds(std::process::id()), Instant::now());
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (layout, chunk) = (layout.clone(), chunk.clone());
                std::thread::spawn(move || {
                    // Writer w takes every WRITERS-th chunk, so shards fill in parallel.
                    let all = (1..=SHARDS).flat_map(|id| (0..SHARD_SIZE / chunk_size).map(move |i| (id, i)));
                    for (id, index) in all.skip(w as usize).step_by(WRITERS as usize) {
                        layout.write(id, index, &chunk);
                    }
                })
            })
            .collect();
        writers.into_iter().for_each(|w| w.join().unwrap());
        layout.settle();
        let elapsed = started.elapsed();
        let cpu = (cpu_seconds(std::process::id()) - cpu_before)
            / ((SHARDS * SHARD_SIZE) as f64 / (1u64 << 30) as f64);
        let write = mb_per_s(SHARDS * SHARD_SIZE, elapsed);
        let first = random_reads(layout.as_ref(), 7);
        let second = random_reads(layout.as_ref(), 11);
        let started = Instant::now();
        for id in 1..=SHARDS {
            for index in 0..SHARD_SIZE / chunk_size {
                let bytes = layout.read(id, index * chunk_size, chunk_size);
                assert_eq!(&bytes[..], &chunk.data[..], "wrong bytes read back");
            }
        }
        let sequential = mb_per_s(SHARDS * SHARD_SIZE, started.elapsed());
        drop(layout);
        println!(
            "| {name} | {} MiB | {write:.0} | {cpu:.2} | {:.0} / {:.0} us | {:.0} / {:.0} us | {sequential:.0} | {} |",
            chunk_size >> 20,
            first.0,
            first.1,
            second.0,
            second.1,
            du(&dir) >> 20
        );
    }
}

/// p50 and p99 (us) of random 16 KiB reads, each checked against the chunk's bytes.
fn random_reads(layout: &dyn Layout, seed: u64) -> (f64, f64) {
    let mut rng = seed;
    let mut latencies = Vec::with_capacity(RANDOM_READS);
    for _ in 0..RANDOM_READS {
        let id = 1 + next_random(&mut rng) % SHARDS;
        let offset = (next_random(&mut rng) % (SHARD_SIZE / SAMPLE)) * SAMPLE;
        let t = Instant::now();
        let bytes = layout.read(id, offset, SAMPLE);
        latencies.push(t.elapsed());
        assert_eq!(bytes.len() as u64, SAMPLE);
    }
    latencies.sort();
    let at = |q: f64| latencies[(latencies.len() as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.99))
}

/// Bytes of the files under `dir`.
fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => du(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e6
}
