//! `wan-bench`: a cold fetch of 1 GiB into the spoke across the WAN emulator (60 ms RTT),
//! with tonic's default transport and with the tuned one, next to raw TCP through the same
//! emulator, once with the link capped at 2 Gbit/s and once uncapped. Prints a markdown
//! table, with the CPU seconds each process spent (where the time goes).
//!
//! ```sh
//! cargo build --release --bins && cargo run --release -p shardcache-tests --bin wan-bench
//! ```
//!
//! Extra arguments are passed to every spoke (e.g. `--shard-fetch-parallelism 16`), to
//! try settings without a rebuild.

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::time::Instant;

use shardcache_client::CacheClient;
use shardcache_tests::{
    HubProcess, ProxyProcess, SpokeProcess,
    bench::{cpu_seconds, mb_per_s, peak_rss_mib, raw_tcp_via},
    make_dataset,
};

const SHARDS: u32 = 16;
const SHARD_SIZE: u64 = 64 << 20;
const RTT: &str = "60ms";

#[tokio::main]
async fn main() {
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", SHARDS, SHARD_SIZE);
    let total = u64::from(SHARDS) * SHARD_SIZE;
    let hub = HubProcess::start(root.path(), &[]);
    let hub_addr = hub.endpoint.trim_start_matches("http://").parse().unwrap();
    if !extra.is_empty() {
        println!("spoke flags: {}\n", extra.join(" "));
    }

    println!("| link ({RTT} RTT) | transport | cold fetch of 1 GiB | % of raw TCP | CPU s: spoke / hub / proxy | spoke peak RSS |");
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
        for (transport, flags) in
            [("tonic defaults (1 connection)", vec!["--hub-transport-defaults"]), ("tuned", vec![])]
        {
            let cache = tempfile::tempdir().unwrap();
            let mut args = vec!["--capacity", "4GiB"];
            args.extend(flags);
            args.extend(&extra);
            let spoke = SpokeProcess::start(&proxy.endpoint, cache.path(), &args);
            let pids = [spoke.child.id(), hub.child.id(), proxy.child.id()];
            let cpu_before: Vec<f64> = pids.iter().map(|&p| cpu_seconds(p)).collect();
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
            assert_eq!(progress.bytes_fetched, total, "the whole dataset crossed the link");
            let cpu: Vec<String> =
                pids.iter().zip(&cpu_before).map(|(&p, before)| format!("{:.1}", cpu_seconds(p) - before)).collect();
            println!(
                "| {link} | {transport} | {mbs:.0} MB/s | {:.0}% | {} | {:.0} MiB |",
                mbs * 100.0 / raw,
                cpu.join(" / "),
                peak_rss_mib(spoke.child.id())
            );
        }
    }
}
