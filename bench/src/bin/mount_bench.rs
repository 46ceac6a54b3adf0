//! `mount-bench`: the read-only FUSE mount (`shardcache mount`) against the SDK on the
//! same warm spoke, in one run. Sequential: every shard of a 1 GiB dataset read whole,
//! through the mount with 1 MiB reads (as `dd bs=1M`) and with the SDK's `StreamShard`,
//! shard by shard in turn; and as 1 MiB `ReadRange`s, 16 at once, through the SDK (the
//! shape of the kernel's read-ahead). Random: 16 readers (as `fio --numjobs=16
//! --bs=16k --rw=randread`), each reading 16 KiB samples at random offsets one at a
//! time (no sample twice in a round), through the mount (`pread`) and with the SDK's
//! `ReadRange`; latency percentiles of the mount's reads. Each mount round is a fresh
//! mount (where the mount uses the kernel's page cache it starts empty). Prints who
//! read and what read-ahead the mount said it got; checks that every measured read was
//! a hit on the spoke and that the bytes through the mount are the file's. Run it as a
//! user too (`/dev/fuse` open to them): `setpriv --reuid=65534 --regid=65534
//! --clear-groups target/release/mount-bench`. `mount-bench --kernel-cache` mounts
//! with that flag (reads through the page cache, with the kernel's read-ahead).
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/mount-bench
//! ```

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{
    io::Read,
    os::unix::fs::{FileExt, MetadataExt},
    path::Path,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use shardcache_client::{CacheClient, Client, Range};
use shardcache_tests::{HubProcess, MountProcess, SpokeProcess, make_dataset, next_random};

const SHARDS: u32 = 16;
const SHARD: u64 = 64 << 20;
const SAMPLE: u64 = 16 << 10;
const READERS: usize = 16;
const READS_PER_READER: usize = 2000;

fn names() -> Vec<String> {
    (0..SHARDS).map(shardcache_cli::dataset_gen::shard_name).collect()
}

/// Seconds to read `name` whole through the SDK's stream.
async fn sdk_stream_one(client: &Client, name: &str) -> f64 {
    let started = Instant::now();
    let mut bytes = 0;
    let mut stream = client.stream_shard("c4", name, 0, None).await.unwrap();
    while let Some(chunk) = stream.next_chunk().await.unwrap() {
        bytes += chunk.data.len() as u64;
    }
    assert_eq!(bytes, SHARD);
    started.elapsed().as_secs_f64()
}

/// Seconds to read `name` whole through the mount with 1 MiB reads (as `dd bs=1M`).
fn mount_one(mnt: &Path, name: &str) -> f64 {
    let started = Instant::now();
    let mut bytes = 0;
    let mut buffer = vec![0; 1 << 20];
    let mut file = std::fs::File::open(mnt.join("c4").join(name)).unwrap();
    loop {
        let n = file.read(&mut buffer).unwrap();
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    assert_eq!(bytes, SHARD);
    started.elapsed().as_secs_f64()
}

/// MB/s of every shard read whole through the SDK's stream and through the mount (1 MiB
/// reads), shard by shard, the two in turn (which goes first alternates): a machine
/// that slows for a while slows both, not whichever ran then. Then (untimed) checks that
/// the first shard's bytes through the mount are its file's.
async fn sequential(client: &Client, mnt: &Path, files: &Path) -> (f64, f64) {
    let (mut sdk, mut mount) = (0.0, 0.0);
    for (i, name) in names().iter().enumerate() {
        let through_mount = || tokio::task::block_in_place(|| mount_one(mnt, name));
        if i % 2 == 0 {
            sdk += sdk_stream_one(client, name).await;
            mount += through_mount();
        } else {
            mount += through_mount();
            sdk += sdk_stream_one(client, name).await;
        }
    }
    let first = &names()[0];
    assert!(
        std::fs::read(mnt.join("c4").join(first)).unwrap() == std::fs::read(files.join(first)).unwrap(),
        "the mount's bytes are the file's"
    );
    let total = f64::from(SHARDS) * SHARD as f64 / 1e6;
    (total / sdk, total / mount)
}

/// MB/s reading every shard as the mount asks for it, without FUSE: 1 MiB `ReadRange`s,
/// 16 in flight (the mount's read-ahead), through the SDK. Splits the mount's gap to the
/// stream into the requests' shape and FUSE itself.
async fn sdk_ranged(client: &Client) -> f64 {
    let started = Instant::now();
    let ranges: Vec<Range> = names()
        .iter()
        .flat_map(|name| (0..SHARD >> 20).map(move |i| Range::new("c4", name, i << 20, 1 << 20)))
        .collect();
    let bytes: usize = stream::iter(ranges)
        .map(|range| {
            let client = client.clone();
            async move { client.read_range(&range).await.unwrap().data.len() }
        })
        .buffered(16)
        .fold(0, |sum, n| async move { sum + n })
        .await;
    assert_eq!(bytes as u64, u64::from(SHARDS) * SHARD);
    bytes as f64 / 1e6 / started.elapsed().as_secs_f64()
}

/// `reader`'s share of the samples, in a random order: every reader of a round reads
/// different samples (no read is answered from the kernel's page cache by an earlier one).
fn offsets(reader: usize, seed: u64) -> Vec<(u32, u64)> {
    let per_shard = SHARD / SAMPLE;
    let mut all: Vec<u64> = (0..u64::from(SHARDS) * per_shard).collect();
    let mut rng = seed + 1;
    for i in (1..all.len()).rev() {
        all.swap(i, (next_random(&mut rng) % (i as u64 + 1)) as usize);
    }
    all[reader * READS_PER_READER..(reader + 1) * READS_PER_READER]
        .iter()
        .map(|&s| ((s / per_shard) as u32, s % per_shard * SAMPLE))
        .collect()
}

/// Reads/s of 16 readers through the SDK's ReadRange.
async fn sdk_random(client: &Client, seed: u64) -> f64 {
    let started = Instant::now();
    let readers = (0..READERS).map(|reader| {
        let client = client.clone();
        async move {
            for (shard, offset) in offsets(reader, seed) {
                let name = shardcache_cli::dataset_gen::shard_name(shard);
                client.read_range(&Range::new("c4", name, offset, SAMPLE)).await.unwrap();
            }
        }
    });
    stream::iter(readers).buffer_unordered(READERS).for_each(|()| async {}).await;
    (READERS * READS_PER_READER) as f64 / started.elapsed().as_secs_f64()
}

/// Reads/s of 16 reader threads through the mount (`pread`), and the reads' latencies.
fn mount_random(mnt: &Path, seed: u64) -> (f64, Vec<Duration>) {
    let files: Vec<std::fs::File> =
        names().iter().map(|n| std::fs::File::open(mnt.join("c4").join(n)).unwrap()).collect();
    let files = &files;
    let started = Instant::now();
    let latencies: Vec<Duration> = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..READERS)
            .map(|reader| {
                scope.spawn(move || {
                    let mut buffer = vec![0; SAMPLE as usize];
                    offsets(reader, seed)
                        .into_iter()
                        .map(|(shard, offset)| {
                            let began = Instant::now();
                            files[shard as usize].read_exact_at(&mut buffer, offset).unwrap();
                            began.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        readers.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });
    ((READERS * READS_PER_READER) as f64 / started.elapsed().as_secs_f64(), latencies)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3
}

async fn misses(control: &CacheClient) -> u64 {
    control.status().await.unwrap().datasets.iter().map(|d| d.miss_requests).sum()
}

#[tokio::main]
async fn main() {
    let flags: Vec<&str> =
        std::env::args().any(|a| a == "--kernel-cache").then_some("--kernel-cache").into_iter().collect();
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "c4", SHARDS, SHARD);
    let hub = HubProcess::start(root.path(), &[]);
    let cache = tempfile::tempdir().unwrap();
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &[]);
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    control.prefetch("c4", &[], 0).await.unwrap().finish().await.unwrap();
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    let before = misses(&control).await;
    let mut rows = Vec::new();
    for round in 0..2u64 {
        let sdk_ranged = sdk_ranged(&client).await;
        let sdk_rand = sdk_random(&client, round).await;
        // Fresh mounts: the kernel's page cache (where the mount uses it) starts empty
        // for each measurement.
        let mnt = tempfile::tempdir().unwrap();
        let log = cache.path().join("mount.log");
        let random_log = cache.path().join("mount-random.log");
        let mount = MountProcess::start_logged_with(&spoke.endpoint, mnt.path(), &flags, &log, "info");
        let (sdk_seq, mount_seq) = sequential(&client, mnt.path(), &files).await;
        drop(mount);
        let mount = MountProcess::start(&spoke.endpoint, mnt.path(), &flags, &random_log);
        let (mount_rand, mut latencies) = tokio::task::block_in_place(|| mount_random(mnt.path(), round));
        drop(mount);
        latencies.sort();
        rows.push((
            sdk_seq,
            sdk_ranged,
            mount_seq,
            sdk_rand,
            mount_rand,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
        ));
    }
    assert_eq!(misses(&control).await, before, "every measured read was a hit on the spoke");
    // Who read, and what read-ahead the mount said it got (its log).
    let said = std::fs::read_to_string(cache.path().join("mount.log")).unwrap();
    let mode = said.lines().filter(|l| l.contains("page cache") || l.contains("read-ahead"));
    println!("reader and mount uid {}; the mount said:", std::fs::metadata("/proc/self").unwrap().uid());
    for line in
        mode.map(|l| l.split("mount: ").last().unwrap_or(l)).collect::<std::collections::BTreeSet<_>>()
    {
        println!("  {line}");
    }
    println!(
        "{SHARDS} shards x {} MiB, warm spoke; sequential: every shard, 1 MiB reads; random: {READERS} readers x {READS_PER_READER} reads of 16 KiB",
        SHARD >> 20
    );
    println!(
        "| round | SDK stream MB/s | SDK 1 MiB ranges x16 MB/s | mount 1 MiB reads MB/s | mount / SDK stream | SDK ReadRange reads/s | mount pread reads/s | mount / SDK | mount p50 / p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (i, (sdk_seq, sdk_ranged, mount_seq, sdk_rand, mount_rand, p50, p99)) in rows.iter().enumerate() {
        println!(
            "| {} | {sdk_seq:.0} | {sdk_ranged:.0} | {mount_seq:.0} | {:.2} | {sdk_rand:.0} | {mount_rand:.0} | {:.2} | {p50:.2} / {p99:.2} ms |",
            i + 1,
            mount_seq / sdk_seq,
            mount_rand / sdk_rand
        );
    }
}
