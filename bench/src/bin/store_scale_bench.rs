//! `store-scale-bench`: the spoke's store with as many chunks as a production spoke
//! holds. A 2-4 TB NVMe in 4 MiB chunks is 500k-1M chunks, each ingested as a file
//! (`store/`); what that costs grows with the number of files, not their size, so the
//! chunks here are small (one 4 KiB page each, in shards of 64 chunks, as 256 MiB shards
//! of 4 MiB chunks) and the disk holds many.
//!
//! Writes chunks from four threads (as concurrent fetches admit them) up to each
//! checkpoint, merging complete shards as the spoke does above `--merge-above-files`,
//! then closes the store and measures, per checkpoint, in a fresh process: the reopen as
//! the spoke does it (open, then the records and the live files that say which chunks
//! are present) up to a first read checked against its CRC32C; the resident memory and
//! open descriptors after it; the MANIFEST's size; and evicting one shard. The last line
//! gives the growth per chunk, so a million can be projected. Prints a markdown table.
//! `STORE_SCALE_MERGE_ABOVE=N` sets the merge threshold (above FILES: no merges, the
//! store as it was).
//!
//! ```sh
//! cargo build --release --workspace --bins
//! target/release/store-scale-bench [DIR] [FILES]   # FILES: 500000 by default
//! ```

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Instant,
};

use bytes::Bytes;
use shardcache_bench::measure::{cpu_seconds, rss_mib};
use shardcache_proto::checksum::Checked;
use spoke_cache::store::{ShardRecord, Store, StoreOptions};

const PAGE: u64 = 4 << 10;
const CHUNKS_PER_SHARD: u64 = 64;
const WRITERS: u64 = 4;

/// One checkpoint's measurements.
#[derive(Debug)]
struct Row {
    files: u64,
    write_files_per_s: f64,
    cpu_ms_per_file: f64,
    reopen_ms: f64,
    rss_mib: f64,
    fds: usize,
    manifest_mib: f64,
    evict_ms: f64,
}

/// The spoke's options, but 4 KiB pages; `STORE_SCALE_MERGE_ABOVE` overrides
/// `--merge-above-files` (e.g. a number above FILES: the store without merges).
fn options() -> StoreOptions {
    let merge_above_files = std::env::var("STORE_SCALE_MERGE_ABOVE")
        .map_or(spoke_cache::store::DEFAULT_MERGE_ABOVE_FILES, |n| n.parse().unwrap());
    StoreOptions { page_size: PAGE, merge_above_files, ..StoreOptions::default() }
}

fn record(id: u64) -> ShardRecord {
    ShardRecord {
        id,
        version: "v1".into(),
        size: CHUNKS_PER_SHARD * PAGE,
        chunk_size: PAGE as u32,
        ..Default::default()
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

fn manifest_mib(dir: &Path) -> f64 {
    let bytes: u64 = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("MANIFEST-"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    bytes as f64 / f64::from(1 << 20)
}

/// Writes shards `from..to` (their records, then every chunk) from [`WRITERS`] threads;
/// whoever stores a shard's last chunk merges it as the spoke does (`Admission::admit`,
/// `--merge-above-files`). Returns the shards merged.
fn write_shards(store: &Arc<Store>, from: u64, to: u64) -> u64 {
    let page = Checked::new(Bytes::from(vec![7u8; PAGE as usize]));
    for id in from..to {
        store.put_record("ds", &format!("s{id}"), &record(id)).unwrap();
    }
    let next = Arc::new(AtomicU64::new(from * CHUNKS_PER_SHARD));
    let stored: Arc<Vec<AtomicU64>> = Arc::new((from..to).map(|_| AtomicU64::new(0)).collect());
    let merged = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (store, next, page) = (store.clone(), next.clone(), page.clone());
            let (stored, merged) = (stored.clone(), merged.clone());
            std::thread::spawn(move || {
                loop {
                    let chunk = next.fetch_add(1, Relaxed);
                    if chunk >= to * CHUNKS_PER_SHARD {
                        return;
                    }
                    let (id, index) = (chunk / CHUNKS_PER_SHARD, chunk % CHUNKS_PER_SHARD);
                    store.admit_chunk(id, index * PAGE, &page).unwrap();
                    if stored[(id - from) as usize].fetch_add(1, Relaxed) + 1 == CHUNKS_PER_SHARD
                        && store.merge_shard(id, CHUNKS_PER_SHARD * PAGE).unwrap()
                    {
                        merged.fetch_add(1, Relaxed);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    merged.load(Relaxed)
}

/// In a process of its own (`--reopen DIR SHARDS`, so that the memory measured is the
/// restarted spoke's, not the writer's): opens the store as the spoke does, reads one
/// chunk back checked, evicts the last shard; prints "reopen_ms rss_mib fds evict_ms".
fn reopen(dir: &Path, shards: u64) {
    let started = Instant::now();
    let store = Store::open(dir, &options()).unwrap();
    let records = store.load_records().unwrap();
    let present: u64 = records
        .iter()
        .map(|(_, _, r)| r.present.iter().map(|b| u64::from(b.count_ones())).sum::<u64>())
        .sum();
    let probe = shards / 2;
    let read = store.read(probe, 3 * PAGE, PAGE).unwrap().expect("the chunk is there and checks");
    assert_eq!(read.data.len() as u64, PAGE);
    let reopen_ms = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(present, shards * CHUNKS_PER_SHARD, "every chunk file was found at reopen");
    let (rss, fds) = (rss_mib(std::process::id()), open_fds());
    let started = Instant::now();
    store.delete_shard(shards - 1, Some(("ds", &format!("s{}", shards - 1)))).unwrap();
    let evict_ms = started.elapsed().as_secs_f64() * 1e3;
    println!("{reopen_ms} {rss} {fds} {evict_ms}");
}

/// Runs [`reopen`] in a child process; returns its four figures.
fn reopen_in_child(dir: &Path, shards: u64) -> [f64; 4] {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--reopen")
        .arg(dir)
        .arg(shards.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "reopen failed: {}", String::from_utf8_lossy(&out.stderr));
    let figures: Vec<f64> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(|f| f.parse().unwrap()).collect();
    figures.try_into().unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--reopen") {
        return reopen(Path::new(&args[1]), args[2].parse().unwrap());
    }
    let base = args.first().map(std::path::PathBuf::from);
    let files: u64 = args.get(1).map_or(500_000, |f| f.parse().unwrap());
    let scratch = tempfile::tempdir_in(base.unwrap_or_else(std::env::temp_dir)).unwrap();
    let dir = scratch.path().join("store");
    let last_shard = files / CHUNKS_PER_SHARD;
    let checkpoints: Vec<u64> = [16, 8, 4, 2, 1].iter().map(|d| last_shard / d).collect();
    println!(
        "store-scale-bench: {files} chunks of {} KiB in shards of {CHUNKS_PER_SHARD}, {WRITERS} writers, complete shards merged above {} files",
        PAGE >> 10,
        options().merge_above_files
    );
    println!();
    println!(
        "| chunks stored | page files | shards merged | write chunks/s | CPU ms per chunk written | reopen to a checked read | RSS after reopen | open descriptors | MANIFEST | evict one shard |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut rows: Vec<Row> = Vec::new();
    let (mut written, mut merged, mut store) = (0, 0, Arc::new(Store::open(&dir, &options()).unwrap()));
    for shards in checkpoints {
        let (cpu, started) = (cpu_seconds(std::process::id()), Instant::now());
        merged += write_shards(&store, written, shards);
        let new_files = ((shards - written) * CHUNKS_PER_SHARD) as f64;
        let write_files_per_s = new_files / started.elapsed().as_secs_f64();
        let cpu_ms_per_file = (cpu_seconds(std::process::id()) - cpu) * 1e3 / new_files;
        let page_files = store.page_files_count();
        drop(store);
        let [reopen_ms, rss_mib, fds, evict_ms] = reopen_in_child(&dir, shards);
        let row = Row {
            files: shards * CHUNKS_PER_SHARD,
            write_files_per_s,
            cpu_ms_per_file,
            reopen_ms,
            rss_mib,
            fds: fds as usize,
            manifest_mib: manifest_mib(&dir),
            evict_ms,
        };
        println!(
            "| {} | {page_files} | {merged} | {:.0} | {:.2} | {:.0} ms | {:.0} MiB | {} | {:.1} MiB | {:.1} ms |",
            row.files,
            row.write_files_per_s,
            row.cpu_ms_per_file,
            row.reopen_ms,
            row.rss_mib,
            row.fds,
            row.manifest_mib,
            row.evict_ms
        );
        rows.push(row);
        // The evicted shard is written again with the next step.
        written = shards - 1;
        store = Arc::new(Store::open(&dir, &options()).unwrap());
        store.load_records().unwrap();
    }
    let (first, last) = (&rows[0], &rows[rows.len() - 1]);
    let per_file = |a: f64, b: f64| (b - a) / (last.files - first.files) as f64;
    let (reopen, rss) = (per_file(first.reopen_ms, last.reopen_ms), per_file(first.rss_mib, last.rss_mib));
    println!();
    println!(
        "Growth per chunk between {} and {} chunks: reopen {:.2} us, resident memory {:.0} bytes; projected at 1M chunks: reopen {:.0} ms, RSS {:.0} MiB.",
        first.files,
        last.files,
        reopen * 1e3,
        rss * f64::from(1 << 20),
        last.reopen_ms + reopen * (1_000_000 - last.files) as f64,
        last.rss_mib + rss * (1_000_000 - last.files) as f64,
    );
}
