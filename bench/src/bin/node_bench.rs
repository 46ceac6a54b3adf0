//! `node-bench`: what a warm spoke gives the readers on its own node (issue 59), beside
//! the ceiling measured in the same run. Prints markdown tables.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/node-bench [--from-disk]
//! ```
//!
//! For 1, 4 and 16 readers (tasks of this process), each source streams the whole 1 GiB
//! dataset (the readers share its 16 shards, each reading whole shards in 1 MiB pieces)
//! and then reads batches of 16 random 16 KiB samples:
//! - `page cache`: the dataset's files read by the readers themselves (`pread`): the
//!   ceiling;
//! - `hub-server`: a hub serving the same files on this machine, no cache;
//! - `spoke, gRPC`: the warm spoke over its gRPC port (`Client::over_grpc`);
//! - `spoke, door`: the warm spoke through its same-node door (`--local-socket`, found by
//!   the SDK by itself): the readers read the stored pages from the spoke's files.
//!
//! Columns: GB/s; CPU seconds per GiB of the server (hub or spoke) and of the readers
//! (this process); p50 and p99 of one batch. The bench checks that it measured what it
//! says: the door rows' bytes were placed by the door (its counters), the gRPC rows'
//! were not, and every byte read is the dataset's (CRC32C checked by the SDK, the page
//! cache rows against the files' own).
//!
//! `--only page|hub|grpc|door` runs that source's rows only (to profile one: `perf
//! record -p` the spoke meanwhile).
//!
//! `--from-disk` drops the page cache of the dataset's and the spoke's files before each
//! row (`posix_fadvise(DONTNEED)`, as `vmtouch -e`: clean pages leave memory), so every
//! row reads the disk: data larger than memory. Its `page cache` rows are then the disk's
//! own sequential and 16 KiB random rates.

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use futures::future::join_all;
use shardcache_bench::measure::{cpu_seconds, percentiles};
use shardcache_client::{CacheClient, Client, Range};
use shardcache_tests::{HubProcess, SpokeProcess, make_dataset, next_random, scrape_metrics};

const SHARDS: u32 = 16;
const SHARD_SIZE: u64 = 64 << 20;
const PIECE: u64 = 1 << 20;
const SAMPLE: u64 = 16 << 10;
const BATCH: usize = 16;
/// Batches each reader reads per row.
const BATCHES: usize = 150;

/// Where a row's readers read from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    PageCache,
    Hub,
    SpokeGrpc,
    SpokeDoor,
}

impl Source {
    fn flag(self) -> &'static str {
        match self {
            Self::PageCache => "page",
            Self::Hub => "hub",
            Self::SpokeGrpc => "grpc",
            Self::SpokeDoor => "door",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::PageCache => "page cache (the readers read the files)",
            Self::Hub => "hub-server, same files, no cache",
            Self::SpokeGrpc => "spoke, gRPC",
            Self::SpokeDoor => "spoke, same-node door",
        }
    }
}

/// What the bench reads with.
struct Setup {
    dataset: PathBuf,
    cache_dir: PathBuf,
    hub: HubProcess,
    spoke: SpokeProcess,
    hub_client: Client,
    spoke_client: Client,
    from_disk: bool,
}

#[tokio::main]
async fn main() {
    let from_disk = std::env::args().any(|a| a == "--from-disk");
    let root = tempfile::tempdir().unwrap();
    let dataset = make_dataset(root.path(), "c4", SHARDS, SHARD_SIZE);
    let hub = HubProcess::start(root.path(), &["--link-compression-level", "0"]);
    let cache = tempfile::tempdir().unwrap();
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &[]);
    let shards: Vec<String> = (0..SHARDS).map(shardcache_cli::dataset_gen::shard_name).collect();
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    control.prefetch("c4", &shards, 0).await.unwrap().finish().await.unwrap();
    let status = control.status().await.unwrap();
    assert!(status.used_bytes >= u64::from(SHARDS) * SHARD_SIZE, "the spoke holds the dataset: {status:?}");
    let spoke_client = Client::connect(&spoke.endpoint).await.unwrap();
    // The first answer names the door; the client opens it on its next read.
    spoke_client.stat("c4", &shards[0]).await.unwrap();
    let setup = Setup {
        dataset,
        cache_dir: cache.path().to_owned(),
        hub_client: Client::connect(&hub.endpoint).await.unwrap(),
        hub,
        spoke_client,
        spoke,
        from_disk,
    };
    let gib = (u64::from(SHARDS) * SHARD_SIZE) as f64 / f64::from(1 << 30);
    println!(
        "{}",
        if from_disk { "Every row read from the disk (page cache dropped before it).\n" } else { "" }
    );
    println!(
        "| readers | source | GB/s | server CPU s/GiB | readers CPU s/GiB | 16 x 16 KiB batch p50 | p99 |"
    );
    println!("|---|---|---|---|---|---|---|");
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let sources = [Source::PageCache, Source::Hub, Source::SpokeGrpc, Source::SpokeDoor];
    let sources: Vec<Source> =
        sources.into_iter().filter(|s| only.as_deref().is_none_or(|o| s.flag() == o)).collect();
    for readers in [1usize, 4, 16] {
        for &source in &sources {
            let (placed, fetched) = (door_placed(&setup).await, upstream(&setup).await);
            let (rate, server_cpu, reader_cpu) = stream_row(&setup, source, readers).await;
            let streamed = door_placed(&setup).await - placed;
            check_door(source, streamed, gib);
            let (p50, p99) = batch_row(&setup, source, readers).await;
            let fetched = upstream(&setup).await - fetched;
            assert!(
                fetched == 0.0,
                "{}: the warm spoke fetched {fetched} chunks from its hub",
                source.name()
            );
            println!(
                "| {readers} | {} | {rate:.2} | {} | {:.3} | {p50:.0} us | {p99:.0} us |",
                source.name(),
                server_cpu.map_or("-".to_owned(), |c| format!("{:.3}", c / gib)),
                reader_cpu / gib,
            );
        }
    }
}

/// The door placed every byte of a door row and none of another's.
fn check_door(source: Source, placed_gib: f64, gib: f64) {
    if source == Source::SpokeDoor {
        assert!(placed_gib >= gib * 0.999, "the door row's bytes came through the door: {placed_gib} GiB");
    } else {
        assert!(placed_gib == 0.0, "{}: {placed_gib} GiB came through the door", source.name());
    }
}

/// GiB the spoke's door has placed so far (`shardcache_spoke_local_door_placed_bytes_total`).
async fn door_placed(setup: &Setup) -> f64 {
    spoke_metric(setup, "shardcache_spoke_local_door_placed_bytes_total").await / f64::from(1 << 30)
}

/// One of the spoke's metrics (a series without labels).
async fn spoke_metric(setup: &Setup, series: &str) -> f64 {
    let page = scrape_metrics(setup.spoke.metrics_addr.as_str()).await.unwrap();
    let value = page.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')));
    value.unwrap_or_else(|| panic!("no {series}")).trim().parse().unwrap()
}

/// Chunk fetches the spoke has sent its hub so far.
async fn upstream(setup: &Setup) -> f64 {
    spoke_metric(setup, "shardcache_spoke_upstream_requests_total").await
}

/// The server process a row's reads cost.
fn server_pid(setup: &Setup, source: Source) -> Option<u32> {
    match source {
        Source::PageCache => None,
        Source::Hub => Some(setup.hub.child.id()),
        Source::SpokeGrpc | Source::SpokeDoor => Some(setup.spoke.child.id()),
    }
}

/// The client a row reads with (`None`: the files themselves).
fn client(setup: &Setup, source: Source) -> Option<Client> {
    match source {
        Source::PageCache => None,
        Source::Hub => Some(setup.hub_client.clone()),
        Source::SpokeGrpc => Some(setup.spoke_client.over_grpc()),
        Source::SpokeDoor => Some(setup.spoke_client.clone()),
    }
}

/// With `--from-disk`: the page cache of the dataset's and the spoke's files dropped.
fn drop_page_cache(setup: &Setup) {
    if !setup.from_disk {
        return;
    }
    for dir in [&setup.dataset, &setup.cache_dir] {
        for entry in walk(dir) {
            if let Ok(file) = std::fs::File::open(&entry) {
                let _ = file.sync_all();
                let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
            }
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else if path.is_file() {
            files.push(path);
        }
    }
    files
}

/// `readers` read the whole dataset, whole shards each in turn: GB/s, the server's and
/// the readers' CPU seconds.
async fn stream_row(setup: &Setup, source: Source, readers: usize) -> (f64, Option<f64>, f64) {
    drop_page_cache(setup);
    let server = server_pid(setup, source);
    let (server_before, mine_before) = (server.map(cpu_seconds), cpu_seconds(std::process::id()));
    let started = Instant::now();
    let tasks = (0..readers).map(|reader| {
        let (client, dataset) = (client(setup, source), setup.dataset.clone());
        tokio::spawn(async move {
            let mut bytes = 0;
            for shard in (0..SHARDS as usize).skip(reader).step_by(readers) {
                let name = shardcache_cli::dataset_gen::shard_name(shard as u32);
                bytes += match &client {
                    Some(client) => stream_shard(client, &name).await,
                    None => read_file(dataset.join(&name)).await,
                };
            }
            bytes
        })
    });
    let bytes: u64 = join_all(tasks).await.into_iter().map(Result::unwrap).sum();
    let elapsed = started.elapsed();
    assert_eq!(bytes, u64::from(SHARDS) * SHARD_SIZE, "every byte was read");
    let server_cpu = server.zip(server_before).map(|(pid, before)| cpu_seconds(pid) - before);
    (bytes as f64 / elapsed.as_secs_f64() / 1e9, server_cpu, cpu_seconds(std::process::id()) - mine_before)
}

async fn stream_shard(client: &Client, shard: &str) -> u64 {
    let mut stream = client.stream_shard("c4", shard, 0, Some(SHARD_SIZE)).await.unwrap();
    let mut bytes = 0;
    while let Some(chunk) = stream.next_chunk().await.unwrap() {
        bytes += chunk.data.len() as u64;
    }
    bytes
}

/// A file read whole in pieces, as a reader of a local copy would.
async fn read_file(path: PathBuf) -> u64 {
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(path).unwrap();
        let mut buf = vec![0u8; PIECE as usize];
        let mut at = 0;
        loop {
            let n = file.read_at(&mut buf, at).unwrap();
            if n == 0 {
                return at;
            }
            at += n as u64;
        }
    })
    .await
    .unwrap()
}

/// Each of `readers` reads [`BATCHES`] batches of [`BATCH`] random samples: p50 and p99
/// of a batch, in microseconds.
async fn batch_row(setup: &Setup, source: Source, readers: usize) -> (f64, f64) {
    drop_page_cache(setup);
    let tasks = (0..readers).map(|reader| {
        let (client, dataset) = (client(setup, source), setup.dataset.clone());
        tokio::spawn(async move {
            let mut rng = 7 + reader as u64;
            let mut latencies = Vec::with_capacity(BATCHES);
            for _ in 0..BATCHES {
                let batch: Vec<Range> = (0..BATCH)
                    .map(|_| {
                        let shard = (next_random(&mut rng) % u64::from(SHARDS)) as u32;
                        let offset = next_random(&mut rng) % (SHARD_SIZE / SAMPLE) * SAMPLE;
                        Range::new("c4", shardcache_cli::dataset_gen::shard_name(shard), offset, SAMPLE)
                    })
                    .collect();
                let started = Instant::now();
                match &client {
                    Some(client) => drop(client.read_ranges(&batch).await.unwrap()),
                    None => read_samples(&dataset, batch).await,
                }
                latencies.push(started.elapsed());
            }
            latencies
        })
    });
    let latencies: Vec<Duration> = join_all(tasks).await.into_iter().flat_map(Result::unwrap).collect();
    percentiles(latencies)
}

async fn read_samples(dataset: &Path, batch: Vec<Range>) {
    let dataset = dataset.to_owned();
    tokio::task::spawn_blocking(move || {
        for range in batch {
            let file = std::fs::File::open(dataset.join(&range.shard)).unwrap();
            let mut buf = vec![0u8; range.length as usize];
            file.read_exact_at(&mut buf, range.offset).unwrap();
        }
    })
    .await
    .unwrap();
}
