//! `wan-bench`: a cold fetch of 1 GiB into the spoke across the WAN emulator (60 ms RTT),
//! with tonic's default transport and with the tuned one, next to raw TCP through the same
//! emulator, once with the link capped at 2 Gbit/s and once uncapped. Prints a markdown
//! table, with the CPU seconds each process spent (where the time goes).
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/wan-bench
//! ```
//!
//! `--cold-read-only` runs only the last table (a cold 16 MiB ReadRange, and a cold
//! `shardcache cat` of 16 MiB as a new process, in round trips).
//! `--perf` also records a CPU profile (`perf record`) of the spoke, hub and proxy during
//! the uncapped tuned fetch and prints where their time went, by category. Other
//! arguments are passed to every spoke (e.g. `--shard-fetch-parallelism 16`), to try
//! settings without a rebuild.

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response
#![allow(clippy::too_many_lines)] // a benchmark's main reads as its script; benches are exempt from the 80-line rule

use std::time::Instant;

use shardcache_bench::{
    measure::{cpu_seconds, mb_per_s, peak_rss_mib, raw_tcp_via},
    profile::Profile,
};
use shardcache_client::{CacheClient, Client};
use shardcache_tests::{HubProcess, ProxyProcess, SpokeProcess, make_dataset};

const SHARDS: u32 = 16;
const SHARD_SIZE: u64 = 64 << 20;
const RTT: &str = "60ms";

#[tokio::main]
async fn main() {
    let mut extra: Vec<String> = std::env::args().skip(1).collect();
    let perf = extra.iter().any(|a| a == "--perf");
    let cold_read_only = extra.iter().any(|a| a == "--cold-read-only");
    extra.retain(|a| a != "--perf" && a != "--cold-read-only");
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut breakdown = None;
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", SHARDS, SHARD_SIZE);
    let total = u64::from(SHARDS) * SHARD_SIZE;
    // Transport measured against raw TCP: the bytes as they are (compression measured
    // apart, compress-bench).
    let hub = HubProcess::start(root.path(), &["--link-compression-level", "0"]);
    let hub_addr = hub.endpoint.trim_start_matches("http://").parse().unwrap();
    if !extra.is_empty() {
        println!("spoke flags: {}\n", extra.join(" "));
    }

    if cold_read_only {
        cold_read_round_trips(hub_addr, &extra).await;
        return;
    }
    println!(
        "| link ({RTT} RTT) | transport | cold fetch of 1 GiB | % of raw TCP | CPU s: spoke / hub / proxy | spoke peak RSS |"
    );
    println!("|---|---|---|---|---|---|");
    for (link, rate) in [("2 Gbit/s", Some("2Gbit")), ("uncapped", None)] {
        let mut link_args = vec!["--rtt", RTT];
        if let Some(rate) = rate {
            link_args.extend(["--rate", rate]);
        }
        let raw = raw_tcp_via(4, total, |sink| {
            let proxy = ProxyProcess::start(sink, &link_args);
            (proxy.addr, proxy)
        })
        .await;
        println!("| {link} | raw TCP, 4 streams | {raw:.0} MB/s | 100% | - | - |");
        let proxy = ProxyProcess::start(hub_addr, &link_args);
        // The transport alone: the same 1 GiB streamed by the SDK (tuned windows, CRC
        // checked) over 4 connections and dropped. Nothing is stored, so this is the
        // ceiling for the spoke's cold fetch on this machine: hub and emulator as above.
        let cpu = CpuMeter::start([std::process::id(), hub.child.id(), proxy.child.id()]);
        let started = Instant::now();
        let bytes = stream_and_drop(&proxy.endpoint, 4).await;
        let mbs = mb_per_s(bytes, started.elapsed());
        assert_eq!(bytes, total, "the whole dataset crossed the link");
        println!(
            "| {link} | tuned, nothing stored (SDK, 4 connections; CPU: client) | {mbs:.0} MB/s | {:.0}% | {} | - |",
            mbs * 100.0 / raw,
            cpu.spent()
        );
        for (transport, flags) in
            [("tonic defaults (1 connection)", vec!["--hub-transport-defaults"]), ("tuned", vec![])]
        {
            let cache = tempfile::tempdir().unwrap();
            let mut args = vec!["--capacity", "4GiB"];
            args.extend(flags);
            args.extend(&extra);
            let spoke = SpokeProcess::start(&proxy.endpoint, cache.path(), &args);
            let pids = [spoke.child.id(), hub.child.id(), proxy.child.id()];
            let cpu = CpuMeter::start(pids);
            let names = [(pids[0], "spoke"), (pids[1], "hub"), (pids[2], "wan-proxy")];
            let profiling = (perf && rate.is_none() && transport == "tuned").then(|| Profile::start(&names));
            let started = Instant::now();
            let progress = CacheClient::connect(&spoke.endpoint)
                .await
                .unwrap()
                .prefetch("c4", &[], 0)
                .await
                .unwrap()
                .finish()
                .await
                .unwrap();
            let mbs = mb_per_s(progress.bytes_fetched, started.elapsed());
            breakdown = profiling.map(Profile::finish).or(breakdown);
            assert_eq!(progress.bytes_fetched, total, "the whole dataset crossed the link");
            println!(
                "| {link} | {transport} | {mbs:.0} MB/s | {:.0}% | {} | {:.0} MiB |",
                mbs * 100.0 / raw,
                cpu.spent(),
                peak_rss_mib(spoke.child.id())
            );
        }
    }
    cold_read_round_trips(hub_addr, &extra).await;
    if let Some(breakdown) = breakdown {
        println!(
            "\nCPU profile of the uncapped tuned fetch (perf at 999 Hz; leaf symbols by category):\n\n{breakdown}"
        );
    }
}

/// A cold 16 MiB ReadRange through a fresh spoke over the uncapped 60 ms link, in round
/// trips. The spoke's connections to the hub are opened first, by a StatShard of other
/// shards on each (a read would start a whole-shard fetch that runs during the timed
/// read), so what is counted is the read itself: one StatShard and the fetch of its
/// chunks, which all start at once.
async fn cold_read_round_trips(hub_addr: std::net::SocketAddr, extra: &[&str]) {
    const READ: u64 = 16 << 20;
    let rtt_ms = humantime::parse_duration(RTT).unwrap().as_secs_f64() * 1e3;
    let proxy = ProxyProcess::start(hub_addr, &["--rtt", RTT]);
    let cache = tempfile::tempdir().unwrap();
    let mut args = vec!["--capacity", "4GiB", "--max-read", "16MiB"];
    args.extend(extra);
    let spoke = SpokeProcess::start(&proxy.endpoint, cache.path(), &args);
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    for shard in 1..=8 {
        client.stat("c4", &format!("shard-{shard:05}.bin")).await.unwrap();
    }
    let started = Instant::now();
    let chunk =
        client.read_range(&shardcache_client::Range::new("c4", "shard-00000.bin", 0, READ)).await.unwrap();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    assert_eq!(chunk.data.len() as u64, READ);
    let status = CacheClient::connect(&spoke.endpoint).await.unwrap().status().await.unwrap();
    let misses: u64 = status.datasets.iter().map(|d| d.miss_requests).sum();
    assert_eq!(misses, 1, "the read was cold (served by fetches from the hub)");
    // As a user runs it: `shardcache cat` of 16 MiB of a shard the spoke has not seen
    // (a new process: its connection to the spoke, the shard's stat at the hub, the
    // stream), timed from its start to its exit.
    let started = Instant::now();
    let cat = std::process::Command::new(shardcache_tests::binary("shardcache"))
        .args(["--endpoint", &spoke.endpoint, "cat", "c4", "shard-00010.bin", "--length", &READ.to_string()])
        .output()
        .unwrap();
    let cat_ms = started.elapsed().as_secs_f64() * 1e3;
    assert!(cat.status.success(), "{}", String::from_utf8_lossy(&cat.stderr));
    assert_eq!(cat.stdout.len() as u64, READ);
    let status = CacheClient::connect(&spoke.endpoint).await.unwrap().status().await.unwrap();
    let (after, hits): (u64, u64) =
        status.datasets.iter().fold((0, 0), |(m, h), d| (m + d.miss_requests, h + d.hit_requests));
    assert!(after > misses && hits == 0, "the cat was cold too (its stream's parts all missed)");
    println!("\n| uncapped {RTT} RTT | cold 16 MiB through the spoke | round trips |");
    println!("|---|---|---|");
    println!("| ReadRange, connections open, shard stat'ed | {ms:.0} ms | {:.1} |", ms / rtt_ms);
    println!(
        "| `shardcache cat --length 16MiB`, a new process, shard never seen | {cat_ms:.0} ms | {:.1} |",
        cat_ms / rtt_ms
    );
}

/// CPU seconds spent by some processes since `start`.
struct CpuMeter {
    before: Vec<(u32, f64)>,
}

impl CpuMeter {
    fn start(pids: [u32; 3]) -> Self {
        Self { before: pids.iter().map(|&pid| (pid, cpu_seconds(pid))).collect() }
    }

    /// "a / b / c": each process's CPU seconds since `start`, in the order given.
    fn spent(&self) -> String {
        let spent: Vec<String> =
            self.before.iter().map(|&(pid, before)| format!("{:.1}", cpu_seconds(pid) - before)).collect();
        spent.join(" / ")
    }
}

/// Streams every shard of `c4` from `endpoint` with the SDK over `connections`
/// connections, all shards at once, verifying and dropping each chunk; returns the bytes.
async fn stream_and_drop(endpoint: &str, connections: usize) -> u64 {
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(Client::connect(endpoint).await.unwrap());
    }
    let shards = clients[0].list_shards("c4").await.unwrap();
    let streams = shards.into_iter().enumerate().map(|(i, shard)| {
        let client = clients[i % connections].clone();
        async move {
            let mut stream = client.stream_shard("c4", &shard.shard, 0, None).await.unwrap();
            let mut bytes = 0;
            while let Some(chunk) = stream.next_chunk().await.unwrap() {
                bytes += chunk.data.len() as u64;
            }
            bytes
        }
    });
    futures::future::join_all(streams).await.into_iter().sum()
}
