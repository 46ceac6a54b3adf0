//! `compress-bench`: what compression on the long link saves and costs, on real data
//! (issue 28). Two tables:
//!
//! 1. Per zstd level, over every 4 MiB shard of each dataset: bytes / bytes on the link,
//!    and one core's compression and decompression rates, through
//!    `shardcache_proto::encoding::compress` (the hub's code: the sample check included).
//! 2. A cold fill through a spoke (Prefetch of every shard) from a hub behind
//!    `wan-proxy --rtt 60ms --rate 2Gbit`, with the hub's compression off, at level 1
//!    (the default) and at level 3, beside the same fill without the link: seconds, MB/s
//!    of the dataset, bytes on the link / dataset (the emulator's count, read once the
//!    spoke has nothing in flight and the link is still, and checked against the spoke's
//!    count of what its hub connections read; without the emulator, the hub's
//!    `shardcache_hub_bytes_sent_total`), and the hub's CPU seconds (`/proc/PID/stat`).
//!
//! ```sh
//! python bench/compress/make_data.py /tmp/cdata     # real text, tokenised; random bytes
//! cargo build --release --workspace --bins && target/release/compress-bench /tmp/cdata
//! ```
//!
//! 3. `--hub-compression auto` (the spoke's default) beside `off` and `zstd`, each a cold
//!    fill of token data (`gen --tokens zipf`: uint32 ids, Zipf over LLaMA 3's vocabulary)
//!    through a spoke from a hub at its default level, over a 60 ms link capped at
//!    1 Gbit/s (the link bounds delivery: auto should compress) and uncapped (the cores
//!    bound it: auto should not), three runs each: seconds, bytes on the link / dataset
//!    (the emulator's count), and the fetches asked each way (the spoke's `status`). `compress-bench --auto` runs
//!    this table alone (no DATA_DIR).
//!
//! `COMPRESS_BENCH_IN_FLIGHT=256MiB` runs the spokes with that `--upstream-bytes-in-flight`,
//! `COMPRESS_BENCH_PARALLELISM=64` prefetches that many shards at once.
//! The bench checks that each fill stored the whole dataset (the spoke's upstream bytes
//! are the dataset's) and that the hub with compression off sent every byte as it is.

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{path::Path, time::Instant};

use hub_server::config::DEFAULT_COMPRESSION_LEVEL;
use shardcache_cli::dataset_gen::{GenSpec, Tokens, generate};
use shardcache_client::CacheClient;
use shardcache_proto::encoding;
use shardcache_tests::{HubProcess, ProxyProcess, SpokeProcess, wire};

const DATASETS: [&str; 3] = ["text-u32", "text-u16", "random"];
const LEVELS: [i32; 6] = [-5, -1, 1, 3, 6, 9];
/// Shards fetched at once by the fill: enough 4 MiB shards in flight (32 x 4 MiB = 128 MiB
/// per 60 ms round trip) that the link's 2 Gbit/s, not the round trip, bounds it;
/// `COMPRESS_BENCH_PARALLELISM=N` another.
fn parallelism() -> u32 {
    std::env::var("COMPRESS_BENCH_PARALLELISM").ok().and_then(|v| v.parse().ok()).unwrap_or(32)
}

fn shards(root: &Path, dataset: &str) -> Vec<Vec<u8>> {
    let mut paths: Vec<_> =
        std::fs::read_dir(root.join(dataset)).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// (bytes / on the link, compress MB/s, decompress MB/s: None when nothing was
/// compressed) at `level`.
fn level_row(data: &[Vec<u8>], level: i32) -> (f64, f64, Option<f64>) {
    let total: usize = data.iter().map(Vec::len).sum();
    let started = Instant::now();
    let packed: Vec<Option<bytes::Bytes>> = data.iter().map(|d| encoding::compress(d, level)).collect();
    let compress_s = started.elapsed().as_secs_f64();
    let on_link: usize = data.iter().zip(&packed).map(|(d, p)| p.as_ref().map_or(d.len(), |p| p.len())).sum();
    let started = Instant::now();
    for (d, p) in data.iter().zip(&packed) {
        if let Some(p) = p {
            assert_eq!(zstd::bulk::decompress(p, d.len()).unwrap().len(), d.len());
        }
    }
    let decompress_s = started.elapsed().as_secs_f64();
    let mb = total as f64 / 1e6;
    let decompressed = packed.iter().any(Option::is_some).then(|| mb / decompress_s);
    (total as f64 / on_link as f64, mb / compress_s, decompressed)
}

/// CPU seconds (user + system) `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0 // USER_HZ
}

/// What one cold fill measured.
struct Fill {
    seconds: f64,
    upstream: u64,
    wire: u64,
    hub_cpu: f64,
    /// Chunk fetches the spoke asked as they are, and for zstd.
    asked: (u64, u64),
}

/// A cold fill of `dataset` through a fresh spoke.
/// Without `link`, the spoke talks to the hub directly: the fill's ceiling on this
/// machine (the spoke's store and the CPU the processes share).
/// `link`: the emulator's flags, or none (no emulator).
async fn cold_fill(root: &Path, dataset: &str, level: i32, link: Option<&[&str]>, mode: &str) -> Fill {
    let level = level.to_string();
    let hub =
        HubProcess::start(root, &["--link-compression-level", &level, "--metrics-listen", "127.0.0.1:0"]);
    let hub_addr = hub.endpoint.trim_start_matches("http://").parse().unwrap();
    let proxy = link.map(|flags| ProxyProcess::start(hub_addr, flags));
    let upstream = proxy.as_ref().map_or(&hub.endpoint, |p| &p.endpoint);
    let cache = tempfile::tempdir().unwrap();
    // COMPRESS_BENCH_IN_FLIGHT=SIZE: the spoke's --upstream-bytes-in-flight (decoded bytes
    // fetched and not yet stored), to see whether it bounds the fill.
    let in_flight = std::env::var("COMPRESS_BENCH_IN_FLIGHT").ok();
    let mut args: Vec<&str> =
        in_flight.iter().flat_map(|v| ["--upstream-bytes-in-flight", v.as_str()]).collect();
    args.extend(["--hub-compression", mode]);
    let spoke = SpokeProcess::start(upstream, cache.path(), &args);
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    let cpu = cpu_seconds(hub.child.id());
    let started = Instant::now();
    control.prefetch(dataset, &[], parallelism()).await.unwrap().finish().await.unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let hub_cpu = cpu_seconds(hub.child.id()) - cpu;
    // What crossed: the emulator's count once the link is still (checked against the
    // spoke's own); with no emulator, what the hub sent.
    let wire = match &proxy {
        Some(proxy) => {
            let (count, received) = wire::settled_spoke(proxy, &control).await;
            assert!(
                wire::agrees(received, count.to_client),
                "the spoke {received}, the wire {}",
                count.to_client
            );
            count.to_client
        }
        None => hub.bytes_sent().await,
    };
    let status = control.status().await.unwrap();
    let row = status.datasets.iter().find(|d| d.dataset == dataset).unwrap();
    let result = Fill {
        seconds: elapsed,
        upstream: row.upstream_bytes,
        wire,
        hub_cpu,
        asked: (status.hub_fetches_plain, status.hub_fetches_zstd),
    };
    spoke.kill();
    result
}

/// Table 3: `--hub-compression auto` beside `off` and `zstd` on token data, over a link
/// that bounds delivery (1 Gbit/s) and one that does not.
async fn auto_rows() {
    const SHARDS: u32 = 256;
    const SHARD_SIZE: u64 = 4 << 20;
    let root = tempfile::tempdir().unwrap();
    let spec = GenSpec {
        dir: root.path().to_owned(),
        dataset: "tokens".into(),
        shards: SHARDS,
        shard_size: SHARD_SIZE,
        record_size: 16 << 10,
        seed: 0,
        tokens: Tokens::Zipf,
    };
    generate(&spec).unwrap();
    let size = u64::from(SHARDS) * SHARD_SIZE;
    println!(
        "\n`--hub-compression` on token data (gen --tokens zipf, {} MiB), a cold fill through a spoke \
         (Prefetch, {} shards at once), hub at its default level, 60 ms link",
        size >> 20,
        parallelism()
    );
    println!(
        "| link | --hub-compression | run | seconds | MB/s of the dataset | on the link / dataset | fetches plain / zstd |"
    );
    println!("|---|---|---|---|---|---|---|");
    let links: [(&[&str], &str); 2] =
        [(&["--rtt", "60ms", "--rate", "1Gbit"], "1 Gbit/s"), (&["--rtt", "60ms"], "uncapped")];
    for (flags, link) in links {
        for run in 1..=3 {
            for mode in ["off", "zstd", "auto"] {
                let fill =
                    cold_fill(root.path(), "tokens", DEFAULT_COMPRESSION_LEVEL, Some(flags), mode).await;
                assert_eq!(fill.upstream, size, "{mode}: the whole dataset was fetched, once");
                let (plain, zstd) = fill.asked;
                match mode {
                    "off" => assert!(zstd == 0 && fill.wire >= size, "off: {zstd} fetches asked zstd"),
                    "zstd" => assert_eq!(plain, 0, "zstd: {plain} fetches asked plain"),
                    _ => {}
                }
                let (mbs, share) = (size as f64 / 1e6 / fill.seconds, fill.wire as f64 / size as f64);
                println!(
                    "| {link} | {mode} | {run} | {:.2} | {mbs:.0} | {share:.3} | {plain} / {zstd} |",
                    fill.seconds
                );
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let arg = std::env::args().nth(1).expect("usage: compress-bench DATA_DIR | --auto");
    if arg == "--auto" {
        auto_rows().await;
        return;
    }
    let root = std::path::PathBuf::from(arg);
    println!("| dataset | zstd level | bytes / on the link | compress MB/s (1 core) | decompress MB/s |");
    println!("|---|---|---|---|---|");
    let mut sizes = Vec::new();
    for dataset in DATASETS {
        let data = shards(&root, dataset);
        sizes.push(data.iter().map(Vec::len).sum::<usize>() as u64);
        for level in LEVELS {
            let (ratio, c, d) = level_row(&data, level);
            let d = d.map_or("- (sent as it is)".to_owned(), |d| format!("{d:.0}"));
            println!("| {dataset} | {level} | {ratio:.2} | {c:.0} | {d} |");
        }
    }
    println!();
    let default = DEFAULT_COMPRESSION_LEVEL;
    println!(
        "Cold fill through a spoke, hub behind wan-proxy --rtt 60ms --rate 2Gbit (Prefetch of every shard, {} at once)",
        parallelism()
    );
    println!(
        "| dataset | hub compression | seconds | MB/s of the dataset | on the link / dataset | hub CPU s |"
    );
    println!("|---|---|---|---|---|---|");
    let runs = [(0, false), (0, true), (1, true), (3, true)];
    for (dataset, size) in DATASETS.iter().zip(sizes) {
        for (level, link) in runs.into_iter().filter(|&(level, _)| level == 0 || LEVELS.contains(&level)) {
            // Every fetch asks for zstd: what the hub's level does, not what `auto` would choose.
            let flags: &[&str] = &["--rtt", "60ms", "--rate", "2Gbit"];
            let Fill { seconds: s, upstream, wire, hub_cpu: cpu, .. } =
                cold_fill(&root, dataset, level, link.then_some(flags), "zstd").await;
            assert_eq!(upstream, size, "{dataset}: the whole dataset was fetched, once");
            if level == 0 {
                assert!(wire >= upstream, "{dataset}: without compression every byte goes as it is");
            }
            let label = match (level, link) {
                (_, false) => "off, no emulated link (the ceiling)".to_owned(),
                (0, true) => "off".to_owned(),
                (level, true) if level == default => format!("zstd {level} (the default)"),
                (level, true) => format!("zstd {level}"),
            };
            let (mbs, share) = (size as f64 / 1e6 / s, wire as f64 / size as f64);
            println!("| {dataset} | {label} | {s:.2} | {mbs:.0} | {share:.3} | {cpu:.2} |");
        }
    }
    auto_rows().await;
}
