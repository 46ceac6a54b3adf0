//! `cold-start-bench`: a job's cold start through a spoke, beside the same readers with no
//! cache (issue 58). Eight readers of a block shuffle (`StreamingShardDataset`'s default
//! of 4 shards a block, rank `r` taking the epoch's records `k % 8 == r`), each with its
//! plan, start at once through a cold spoke whose hub is behind the WAN emulator (60 ms
//! RTT) at each rate; then the same readers straight to the hub through an identical
//! emulator. Per rate, first its ceilings: raw TCP through the same emulator (8 streams),
//! and the hub's CPU per GiB served plain and with zstd asked for.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/cold-start-bench [--runs N] [RATE ...]
//! target/release/cold-start-bench --adapt
//! ```
//!
//! `--adapt` instead shows the link gate's bound following the link: one cold epoch at
//! 1 Gbit/s whose link the emulator throttles for 4 s after the first 1.5 s and frees
//! again (`--faults none:1500ms,throttle=40Mbit:4s`, per connection), printing every
//! 250 ms the link's MB/s at the wire beside the spoke's measured rate and bound
//! (`shardcache_spoke_link_delivery_rate_bytes`, `..._in_flight_bound_bytes`).
//!
//! `COLD_START_SPOKE_ARGS="--flag value ..."` passes flags to the spoke (to see what a
//! setting does; the recorded tables use the defaults); `COLD_START_VERBOSE=1` prints each
//! run's first batches.
//!
//! RATEs are wan-proxy's (`200Mbit`, `1Gbit`) or `uncapped`; by default those three. The
//! dataset is random bytes (images: nothing to compress), 16 shards of 16 MiB of 16 KiB
//! records. Printed: each reader's time to its first batch (median and max over the runs'
//! readers), the cold epoch's time, and its bytes per second over the link (the emulator's
//! counters, once the link is quiet) against the rate and against raw TCP. Checked: every
//! byte each reader got against the files, every dataset byte crossed the link in a cold
//! epoch, and the spoke's count of what its hub connections read agrees with the wire.
//! Last, the chunk fetches the cold spokes asked of the hub as they are and for zstd
//! (`--hub-compression auto` on bytes that do not shrink: zstd only in its probe, checked).

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{sync::OnceLock, time::Instant};

use futures::future::join_all;
use shardcache_bench::{
    measure,
    orders::{self, Epoch, Layout, Order, Plan, Reader},
};
use shardcache_client::{CacheClient, Client, Range};
use shardcache_tests::{HubProcess, ProxyProcess, SpokeProcess, wire};
use spoke_cache::fetch::suppliers::compression::PROBE_FETCHES;

const READERS: usize = 8;
const LAYOUT: Layout = Layout { shards: 16, shard: 16 << 20, record: 16 << 10 };
const DATASET: &str = "images";
const SEED: u64 = 58;

/// Bytes per second of a wan-proxy rate (`200Mbit`, `1Gbit`); `None`: uncapped.
fn rate_bytes(rate: &str) -> Option<f64> {
    let (number, unit) = rate.split_at(rate.find(|c: char| c.is_ascii_alphabetic())?);
    let scale = match unit {
        "Kbit" => 1e3,
        "Mbit" => 1e6,
        "Gbit" => 1e9,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale / 8.0)
}

fn link_args(rate: &str) -> Vec<&str> {
    let mut args = vec!["--rtt", "60ms"];
    if rate != "uncapped" {
        args.extend(["--rate", rate]);
    }
    args
}

/// Rank `rank`'s share of `epoch`: its records and where each is read next.
fn share(epoch: &Epoch, rank: usize) -> Epoch {
    let mine =
        |v: &[u64]| v.iter().enumerate().filter(|(k, _)| k % READERS == rank).map(|(_, &x)| x).collect();
    Epoch { records: mine(&epoch.records), next: mine(&epoch.next) }
}

/// One cold start: (each reader's first batch in seconds, the epoch's seconds, the link's
/// bytes toward the readers).
async fn run(link: &ProxyProcess, spoke: Option<&SpokeProcess>, files: &[Vec<u8>]) -> (Vec<f64>, f64, u64) {
    let endpoint = spoke.map_or(link.endpoint.clone(), |s| s.endpoint.clone());
    let control = match spoke {
        Some(s) => Some(CacheClient::connect(&s.endpoint).await.unwrap()),
        None => None,
    };
    let (this, next) =
        (orders::epoch(LAYOUT, Order::Blocks(4), SEED, 0), orders::epoch(LAYOUT, Order::Blocks(4), SEED, 1));
    let jobs: Vec<String> = (0..READERS).map(|r| format!("cold/rank{r}")).collect();
    let shares: Vec<(Epoch, Epoch)> = (0..READERS).map(|r| (share(&this, r), share(&next, r))).collect();
    let mut readers = Vec::new();
    for job in &jobs {
        readers.push(Reader {
            client: Client::connect(&endpoint).await.unwrap(),
            control: control.clone(),
            dataset: DATASET,
            job,
            layout: LAYOUT,
            files,
            batch: 32,
            in_flight: 2,
        });
    }
    let plan = if spoke.is_some() { Plan::Plan } else { Plan::None };
    let firsts: Vec<OnceLock<Instant>> = (0..READERS).map(|_| OnceLock::new()).collect();
    let started = Instant::now();
    let ends = join_all(readers.iter().zip(&shares).zip(&firsts).map(
        |((reader, (this, next)), first)| async move {
            reader.epoch_timed(0, (this, next), plan, first).await;
            started.elapsed().as_secs_f64()
        },
    ))
    .await;
    let epoch = ends.iter().copied().fold(0.0, f64::max);
    let wire = match &control {
        Some(control) => {
            let (count, received) = wire::settled_spoke(link, control).await;
            assert!(wire::agrees(received, count.to_client), "the spoke read {received}, the wire {count:?}");
            count.to_client
        }
        None => wire::settled_link(link).await.to_client,
    };
    assert!(wire >= LAYOUT.bytes(), "a cold epoch brings every byte over the link: {wire}");
    let firsts = firsts.iter().map(|f| f.get().unwrap().duration_since(started).as_secs_f64()).collect();
    (firsts, epoch, wire)
}

/// GiB-seconds of the hub's CPU per GiB served, reading the dataset straight from it
/// (plain, then asking for zstd).
async fn hub_cpu(hub: &HubProcess) -> (f64, f64) {
    let client = Client::connect(&hub.endpoint).await.unwrap();
    let mut out = [0.0; 2];
    for (i, reader) in [client.plain(), client.clone()].into_iter().enumerate() {
        let before = measure::cpu_seconds(hub.child.id());
        for shard in 0..LAYOUT.shards {
            for at in (0..LAYOUT.shard).step_by(4 << 20) {
                let name = shardcache_cli::dataset_gen::shard_name(shard);
                reader.read_range(&Range::new(DATASET, name, at, 4 << 20)).await.unwrap();
            }
        }
        out[i] =
            (measure::cpu_seconds(hub.child.id()) - before) / (LAYOUT.bytes() as f64 / (1u64 << 30) as f64);
    }
    (out[0], out[1])
}

/// `--adapt`: the bound following a link throttled mid-epoch (see the top of the file).
async fn adapt(hub_addr: std::net::SocketAddr, files: &[Vec<u8>]) {
    use shardcache_tests::wire::LinkMeter as _;
    let link = ProxyProcess::start(
        hub_addr,
        &["--rtt", "60ms", "--rate", "1Gbit", "--faults", "none:1500ms,throttle=40Mbit:4s"],
    );
    let started = Instant::now();
    let cache = tempfile::tempdir().unwrap();
    let spoke = SpokeProcess::start(&link.endpoint, cache.path(), &[]);
    let done = std::sync::atomic::AtomicBool::new(false);
    let sampler = async {
        let mut rows = Vec::new();
        let mut last = (link.read().0.to_client, Instant::now());
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            let (count, now) = (link.read().0.to_client, Instant::now());
            let wire = (count - last.0) as f64 / now.duration_since(last.1).as_secs_f64() / 1e6;
            last = (count, now);
            let page = shardcache_tests::scrape_metrics(&spoke.metrics_addr).await.unwrap();
            let rate = gauge(&page, "shardcache_spoke_link_delivery_rate_bytes") / 1e6;
            let bound = gauge(&page, "shardcache_spoke_link_in_flight_bound_bytes") / f64::from(1 << 20);
            rows.push((now.duration_since(started).as_secs_f64(), wire, rate, bound));
        }
        rows
    };
    let reads = async {
        let result = run(&link, Some(&spoke), files).await;
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        result
    };
    let ((_, epoch, wire), rows) = futures::future::join(reads, sampler).await;
    println!(
        "One cold epoch through a spoke, link 1 Gbit/s with 60 ms RTT, throttled to 40 Mbit/s per connection from 1.5 s to 5.5 s after the emulator started: {epoch:.2} s, {:.3} of the dataset over the link",
        wire as f64 / LAYOUT.bytes() as f64
    );
    println!();
    println!(
        "| t (s) | link MB/s at the wire (last 250 ms) | spoke's measured rate MB/s | spoke's in-flight bound MiB |"
    );
    println!("|---|---|---|---|");
    for (t, wire, rate, bound) in rows {
        println!("| {t:.2} | {wire:.1} | {rate:.1} | {bound:.1} |");
    }
}

/// The chunk fetches the cold spokes asked of the hub as they are and for zstd, per rate
/// (all runs), checked: on bytes that do not shrink, zstd only in each run's probe.
fn print_compression_asks(asked_by_rate: &[(&String, (u64, u64))], runs: usize) {
    println!();
    println!(
        "Chunk fetches the cold spokes asked of the hub (`--hub-compression auto`, random bytes), all runs:"
    );
    println!();
    println!("| link | as they are | asked for zstd | zstd asks per run (the probe: {PROBE_FETCHES}) |");
    println!("|---|---|---|---|");
    for &(rate, (plain, zstd)) in asked_by_rate {
        println!("| {rate} | {plain} | {zstd} | {:.1} |", zstd as f64 / runs as f64);
        // What the table claims: past its probe, no fetch of bytes that do not shrink asks.
        assert!(
            zstd <= (PROBE_FETCHES * runs) as u64,
            "{rate}: {zstd} zstd asks in {runs} runs, past each run's probe of {PROBE_FETCHES}"
        );
    }
}

/// The dataset's shards, random bytes, written to `dir`; their bytes.
fn write_dataset(dir: &std::path::Path) -> Vec<Vec<u8>> {
    std::fs::create_dir_all(dir).unwrap();
    (0..LAYOUT.shards)
        .map(|s| {
            let bytes = shardcache_tests::incompressible(
                LAYOUT.shard as usize,
                0x9e37_79b9_7f4a_7c15 ^ u64::from(s + 1),
            );
            std::fs::write(dir.join(shardcache_cli::dataset_gen::shard_name(s)), &bytes).unwrap();
            bytes
        })
        .collect()
}

/// The chunk fetches `spoke` has asked of its hubs as they are and for zstd.
async fn hub_fetches(spoke: &SpokeProcess) -> (u64, u64) {
    let page = shardcache_tests::scrape_metrics(&spoke.metrics_addr).await.unwrap();
    let series = |encoding: &str| format!("shardcache_spoke_hub_fetches_total{{encoding=\"{encoding}\"}}");
    (gauge(&page, &series("plain")) as u64, gauge(&page, &series("zstd")) as u64)
}

/// The value of series `name` (with its labels, if any) on a metrics page; 0 if absent.
fn gauge(page: &str, name: &str) -> f64 {
    let line = page.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `(--runs N, --adapt, the rates)`.
fn arguments() -> (usize, bool, Vec<String>) {
    let mut runs = 5;
    let mut adapting = false;
    let mut rates: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().and_then(|n| n.parse().ok()).expect("--runs N"),
            "--adapt" => adapting = true,
            rate => rates.push(rate.to_owned()),
        }
    }
    if rates.is_empty() {
        rates = ["200Mbit", "1Gbit", "uncapped"].map(String::from).to_vec();
    }
    (runs, adapting, rates)
}

#[tokio::main]
async fn main() {
    let (runs, adapting, rates) = arguments();
    // Extra spoke flags, to see what a setting does to the cold start (not for the table).
    let spoke_args: Vec<String> = std::env::var("COLD_START_SPOKE_ARGS")
        .map(|args| args.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let spoke_args: Vec<&str> = spoke_args.iter().map(String::as_str).collect();
    let root = tempfile::tempdir().unwrap();
    let files = write_dataset(&root.path().join(DATASET));
    let hub = HubProcess::start(root.path(), &[]);
    let hub_addr = hub.endpoint.trim_start_matches("http://").parse().unwrap();
    if adapting {
        adapt(hub_addr, &files).await;
        return;
    }
    let (plain_cpu, zstd_cpu) = hub_cpu(&hub).await;
    println!(
        "{} MiB of random 16 KiB records ({} shards), {READERS} readers of a block shuffle (4 shards a block) with plans, 60 ms link; {runs} runs per row; hub CPU per GiB served: {plain_cpu:.2} s plain, {zstd_cpu:.2} s with zstd asked for",
        LAYOUT.bytes() >> 20,
        LAYOUT.shards
    );
    println!();
    println!(
        "| link | raw TCP through it | readers | first batch, median / max | cold epoch | link MB/s | / rate | / raw TCP | link bytes / dataset |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    // Chunk fetches the cold spokes asked of the hub as they are and for zstd, per rate:
    // on random bytes `auto` asks for zstd only in its probe (`suppliers/compression.rs`).
    let mut asked_by_rate = Vec::new();
    for rate in &rates {
        let mut asked = (0u64, 0u64);
        let args = link_args(rate);
        let seconds = rate_bytes(rate).map_or(1.0, |bytes| (4.0 * 1e6 * 25.0 / bytes).clamp(1.0, 4.0));
        let raw_bytes = (rate_bytes(rate).unwrap_or(1e9) * seconds) as u64;
        let raw = measure::raw_tcp_via(8, raw_bytes, |sink| {
            let proxy = ProxyProcess::start(sink, &args);
            (proxy.addr, proxy)
        })
        .await;
        for cached in [true, false] {
            let (mut firsts, mut epochs, mut rates_seen, mut wires) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..runs {
                let link = ProxyProcess::start(hub_addr, &args);
                let cache = tempfile::tempdir().unwrap();
                let spoke = cached.then(|| SpokeProcess::start(&link.endpoint, cache.path(), &spoke_args));
                let (first, epoch, wire) = run(&link, spoke.as_ref(), &files).await;
                if let Some(spoke) = &spoke {
                    let (plain, zstd) = hub_fetches(spoke).await;
                    asked = (asked.0 + plain, asked.1 + zstd);
                }
                if std::env::var_os("COLD_START_VERBOSE").is_some() {
                    let mut ms: Vec<u64> = first.iter().map(|s| (s * 1e3) as u64).collect();
                    ms.sort_unstable();
                    eprintln!("{rate} cached={cached}: first batches {ms:?} ms, epoch {epoch:.2} s");
                }
                firsts.extend(first);
                epochs.push(epoch);
                rates_seen.push(wire as f64 / epoch / 1e6);
                wires.push(wire as f64 / LAYOUT.bytes() as f64);
            }
            let max_first = firsts.iter().copied().fold(0.0, f64::max);
            let link_mb_s = median(rates_seen);
            let of_rate =
                rate_bytes(rate).map_or("-".to_owned(), |bytes| format!("{:.2}", link_mb_s * 1e6 / bytes));
            println!(
                "| {rate} | {raw:.0} MB/s | {} | {:.0} / {:.0} ms | {:.2} s | {link_mb_s:.1} | {of_rate} | {:.2} | {:.3} |",
                if cached { "through a cold spoke" } else { "no cache" },
                median(firsts) * 1e3,
                max_first * 1e3,
                median(epochs),
                link_mb_s / raw,
                median(wires),
            );
        }
        asked_by_rate.push((rate, asked));
    }
    print_compression_asks(&asked_by_rate, runs);
}
