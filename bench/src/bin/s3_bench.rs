//! `s3-bench`: warm `GetObject`s of whole 16 MiB shards through the spoke's S3 door,
//! beside the SDK's stream over gRPC of the same shards from the same spoke, and beside
//! versitygw (the peer row: an S3 gateway serving the same files from its local-disk
//! backend, `go install github.com/versity/versitygw/cmd/versitygw@v1.8.0`) on the same
//! machine. Prints a markdown table (issue 60).
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/s3-bench
//! ```
//!
//! For 1 and 16 concurrent readers, each reads [`PER_READER`] whole objects (the
//! dataset's 16 shards in turn): GB/s, p50 and p99 of one object, the server's CPU
//! seconds per GiB. The bench checks what it measured: every object's bytes against the
//! file's CRC32C; the door rows served from the cache (the spoke's hit bytes grew by
//! what was read) with nothing fetched from the hub (link bytes per byte read: 0).
//! Then one 1 GiB object through the door: the spoke's memory high-water mark before and
//! after (a `GetObject` is streamed, not buffered).

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::time::{Duration, Instant};

use aws_sdk_s3::Client as S3Client;
use futures::future::join_all;
use shardcache_bench::{
    measure::{cpu_seconds, peak_rss_mib, percentiles},
    s3::{VERSITYGW_KEY, client as s3, versitygw},
};
use shardcache_client::{CacheClient, Client};
use shardcache_tests::{HubProcess, SpokeProcess, make_dataset, scrape_metrics};

const SHARDS: u32 = 16;
const SHARD_SIZE: u64 = 16 << 20;
/// Objects each reader reads per row.
const PER_READER: usize = 8;
const BIG: u64 = 1 << 30;

/// Where a row reads from.
#[derive(Clone)]
enum Source {
    Door(S3Client),
    Grpc(Client),
    Versitygw(S3Client),
}

impl Source {
    fn name(&self) -> &'static str {
        match self {
            Self::Door(_) => "spoke, S3 door (GetObject)",
            Self::Grpc(_) => "spoke, SDK stream over gRPC",
            Self::Versitygw(_) => "versitygw v1.8.0, local disk (peer)",
        }
    }

    /// One whole object: its bytes' CRC32C and length.
    async fn read(&self, shard: &str) -> (u32, u64) {
        match self {
            Self::Door(s3) | Self::Versitygw(s3) => {
                let object = s3.get_object().bucket("corpus").key(shard).send().await.unwrap();
                let data = object.body.collect().await.unwrap().into_bytes();
                (crc32c::crc32c(&data), data.len() as u64)
            }
            Self::Grpc(client) => {
                let mut stream = client.stream_shard("corpus", shard, 0, None).await.unwrap();
                let (mut crc, mut len) = (0u32, 0u64);
                while let Some(chunk) = stream.next_chunk().await.unwrap() {
                    crc = crc32c::crc32c_append(crc, &chunk.data);
                    len += chunk.data.len() as u64;
                }
                (crc, len)
            }
        }
    }
}

async fn spoke_metric(spoke: &SpokeProcess, series: &str) -> f64 {
    let page = scrape_metrics(spoke.metrics_addr.as_str()).await.unwrap();
    page.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// `readers` each read [`PER_READER`] whole objects: GB/s, p50 and p99 in ms, and the
/// server's CPU seconds.
async fn row(source: &Source, readers: usize, server: u32, crcs: &[u32]) -> (f64, f64, f64, f64, u64) {
    let cpu = cpu_seconds(server);
    let started = Instant::now();
    let tasks = (0..readers).map(|reader| {
        let (source, crcs) = (source.clone(), crcs.to_vec());
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut bytes = 0;
            for i in 0..PER_READER {
                let shard = (reader + i * readers) % SHARDS as usize;
                let began = Instant::now();
                let (crc, len) = source.read(&shardcache_cli::dataset_gen::shard_name(shard as u32)).await;
                latencies.push(began.elapsed());
                assert_eq!(crc, crcs[shard], "{}: shard {shard}'s bytes", source.name());
                bytes += len;
            }
            (latencies, bytes)
        })
    });
    let done: Vec<(Vec<Duration>, u64)> = join_all(tasks).await.into_iter().map(Result::unwrap).collect();
    let elapsed = started.elapsed();
    let bytes: u64 = done.iter().map(|d| d.1).sum();
    let (p50, p99) = percentiles(done.into_iter().flat_map(|d| d.0).collect());
    (bytes as f64 / elapsed.as_secs_f64() / 1e9, p50 / 1e3, p99 / 1e3, cpu_seconds(server) - cpu, bytes)
}

#[tokio::main]
async fn main() {
    let root = tempfile::tempdir().unwrap();
    let dataset = make_dataset(root.path(), "corpus", SHARDS, SHARD_SIZE);
    make_dataset(root.path(), "big", 1, BIG);
    let crcs: Vec<u32> = (0..SHARDS)
        .map(|i| {
            crc32c::crc32c(&std::fs::read(dataset.join(shardcache_cli::dataset_gen::shard_name(i))).unwrap())
        })
        .collect();
    let hub = HubProcess::start(root.path(), &["--link-compression-level", "0"]);
    let cache = tempfile::tempdir().unwrap();
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &["--s3-listen", "127.0.0.1:0"]);
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    let shards: Vec<String> = (0..SHARDS).map(shardcache_cli::dataset_gen::shard_name).collect();
    control.prefetch("corpus", &shards, 0).await.unwrap().finish().await.unwrap();
    control
        .prefetch("big", &[shardcache_cli::dataset_gen::shard_name(0)], 0)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let door = s3(format!("http://{}", spoke.s3_addr.clone().unwrap()), ("anykey", "anysecret")).await;
    let grpc = Client::connect(&spoke.endpoint).await.unwrap().over_grpc();
    let peer = versitygw(root.path());
    let mut sources =
        vec![(Source::Door(door.clone()), spoke.child.id()), (Source::Grpc(grpc), spoke.child.id())];
    if let Some(peer) = &peer {
        sources.push((Source::Versitygw(s3(peer.endpoint.clone(), VERSITYGW_KEY).await), peer.child.id()));
    }

    println!("| readers | source | GB/s | object p50 | p99 | server CPU s/GiB | link bytes per byte read |");
    println!("|---|---|---|---|---|---|---|");
    for readers in [1usize, 16] {
        for (source, server) in &sources {
            let (hits, fetched) = (
                spoke_metric(&spoke, "shardcache_spoke_hit_bytes_total{dataset=\"corpus\"}").await,
                spoke_metric(&spoke, "shardcache_spoke_upstream_wire_bytes_total{dataset=\"corpus\"}").await,
            );
            let (rate, p50, p99, cpu, bytes) = row(source, readers, *server, &crcs).await;
            let link = spoke_metric(&spoke, "shardcache_spoke_upstream_wire_bytes_total{dataset=\"corpus\"}")
                .await
                - fetched;
            let link = match source {
                Source::Versitygw(_) => "-".to_owned(),
                _ => {
                    let hit = spoke_metric(&spoke, "shardcache_spoke_hit_bytes_total{dataset=\"corpus\"}")
                        .await
                        - hits;
                    assert!(
                        hit >= bytes as f64,
                        "{}: served from the cache ({hit} of {bytes} bytes)",
                        source.name()
                    );
                    format!("{:.3}", link / bytes as f64)
                }
            };
            let gib = bytes as f64 / f64::from(1 << 30);
            println!(
                "| {readers} | {} | {rate:.2} | {p50:.1} ms | {p99:.1} ms | {:.3} | {link} |",
                source.name(),
                cpu / gib
            );
        }
    }

    big_object(&door, &spoke).await;
}

/// One 1 GiB object through the door: streamed, not held.
async fn big_object(door: &S3Client, spoke: &SpokeProcess) {
    let before = peak_rss_mib(spoke.child.id());
    let object =
        door.get_object().bucket("big").key(shardcache_cli::dataset_gen::shard_name(0)).send().await.unwrap();
    let mut body = object.body;
    let mut read = 0u64;
    while let Some(piece) = body.try_next().await.unwrap() {
        read += piece.len() as u64;
    }
    assert_eq!(read, BIG);
    let after = peak_rss_mib(spoke.child.id());
    println!(
        "\nOne 1 GiB GetObject through the door: the spoke's peak RSS {before:.0} MiB before, {after:.0} MiB after \
         (+{:.0} MiB).",
        after - before
    );
}
