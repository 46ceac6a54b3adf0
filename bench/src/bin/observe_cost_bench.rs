//! `observe-cost-bench`: what a job's observability (issue 49) costs the reads it
//! observes, measured as the issue asks: runs with it on and off alternating, the median
//! of 5 each, with the CPU seconds per GiB beside the speed.
//!
//! ```sh
//! cargo build --release --workspace --bins && scripts/build-otelcol.sh && target/release/observe-cost-bench
//! ```
//!
//! - **Step summaries**: the warm demo epoch's loop (`make demo`'s trainer: 16 ranks x
//!   24 samples of 16 KiB a step, each rank's loader 4 batches ahead) through a warm
//!   spoke, with and without each rank's `StepTimer` sending its summaries to the spoke.
//!   Twice: with the demo's 50 ms of compute a step (GPU-bound, as the demo runs) and with
//!   none (the loop only reads: the strictest measure of what the timers cost).
//! - **Tracing**: spoke-bench's warm stream (16 clients each streaming a 64 MiB shard),
//!   with the spoke exporting every span to a real collector
//!   (`tools/otelcol` with `deploy/otel/collector.yaml`: the default sampling, 5% of
//!   unmarked traces kept) and without (the spoke restarted either way before each run,
//!   on the same warm cache); and the demo's epoch, with and without compute.

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use shardcache_bench::{
    demo::{
        readers,
        trainer::{JobShape, Layout, epoch_order, run_epoch_timed},
    },
    measure::{cpu_seconds, mb_per_s, stream_shards},
};
use shardcache_client::{CacheClient, Client, StepTimer};
use shardcache_tests::{HubProcess, SpokeProcess, make_dataset, otel::Collector};

const SHARDS: u32 = 16;
const SHARD_SIZE: u64 = 64 << 20;
const SAMPLE: u64 = 16 << 10;
const RUNS: usize = 5;

/// One run's speed and the CPU it cost.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Samples/s (the epoch) or MB/s (the stream).
    speed: f64,
    /// CPU seconds per GiB read, of the spoke and of this process (the clients).
    spoke_cpu: f64,
    clients_cpu: f64,
}

/// What is measured, with its switch off and on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Workload {
    /// The demo's epoch loop with this compute per step; timers or not.
    Epoch { compute: Duration, timers: bool },
    /// The 16-client warm stream.
    Stream,
}

#[tokio::main]
async fn main() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", SHARDS, SHARD_SIZE);
    let hub = HubProcess::start(root.path(), &["--link-compression-level", "0"]);
    let cache = tempfile::tempdir().unwrap();
    let collector = Collector::start_with_sampling("10s", None);
    let warm = SpokeProcess::start(&hub.endpoint, cache.path(), &[]);
    let names: Vec<String> = (0..SHARDS).map(shardcache_cli::dataset_gen::shard_name).collect();
    let control = CacheClient::connect(&warm.endpoint).await.unwrap();
    control.prefetch("c4", &names, 0).await.unwrap().finish().await.unwrap();
    drop(warm);
    let start_spoke = |traced: bool| {
        let exporting = [("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str())];
        let env: &[(&str, &str)] = if traced { &exporting } else { &[] };
        SpokeProcess::start_at_with_env(&hub.endpoint, cache.path(), "127.0.0.1:0", &[], env)
    };

    println!(
        "| workload | off (median of {RUNS}) | on (median of {RUNS}) | on / off | CPU s/GiB off -> on (spoke, clients) |"
    );
    println!("|---|---|---|---|---|");
    for compute in [Duration::from_millis(50), Duration::ZERO] {
        let mut results = [Vec::new(), Vec::new()];
        for _ in 0..RUNS {
            for (i, timers) in [false, true].into_iter().enumerate() {
                let spoke = start_spoke(false);
                results[i].push(measure(&spoke, Workload::Epoch { compute, timers }).await);
            }
        }
        row(&format!("warm demo epoch, compute {compute:?}/step: step summaries"), "samples/s", &results);
    }
    for (name, workload, unit) in [
        ("warm stream, 16 clients, 1 GiB: tracing", Workload::Stream, "MB/s"),
        (
            "warm demo epoch, compute 50ms/step: tracing",
            Workload::Epoch { compute: Duration::from_millis(50), timers: true },
            "samples/s",
        ),
        (
            "warm demo epoch, compute 0/step: tracing",
            Workload::Epoch { compute: Duration::ZERO, timers: true },
            "samples/s",
        ),
    ] {
        let mut results = [Vec::new(), Vec::new()];
        for _ in 0..RUNS {
            for (i, traced) in [false, true].into_iter().enumerate() {
                let spoke = start_spoke(traced);
                results[i].push(measure(&spoke, workload).await);
            }
        }
        row(name, unit, &results);
    }
    // What the collector kept: a trace a spoke exported reached it (the runs "on" were
    // traced), and it kept a share of them, not all.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let spans = collector.spans();
    assert!(!spans.is_empty(), "the traced runs' spans reached the collector");
    let mut traces: Vec<&str> = spans.iter().map(|s| s.trace_id.as_str()).collect();
    traces.sort_unstable();
    traces.dedup();
    println!(
        "\nThe collector kept {} traces ({} spans) of the traced runs' reads (5% of unmarked ones, and those marked slow).",
        traces.len(),
        spans.len()
    );
}

/// One run of `workload` against `spoke` (warm): its speed and the CPU it cost.
async fn measure(spoke: &SpokeProcess, workload: Workload) -> Run {
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    let (spoke_before, clients_before) = (cpu_seconds(spoke.child.id()), cpu_seconds(std::process::id()));
    let (speed, bytes) = match workload {
        Workload::Stream => stream(&client).await,
        Workload::Epoch { compute, timers } => epoch(&client, &spoke.endpoint, compute, timers).await,
    };
    let status = CacheClient::connect(&spoke.endpoint).await.unwrap().status().await.unwrap();
    let misses: u64 = status.datasets.iter().map(|d| d.miss_requests).sum();
    assert_eq!(misses, 0, "every read of the run was a hit (a warm run)");
    let gib = bytes as f64 / f64::from(1 << 30);
    Run {
        speed,
        spoke_cpu: (cpu_seconds(spoke.child.id()) - spoke_before) / gib,
        clients_cpu: (cpu_seconds(std::process::id()) - clients_before) / gib,
    }
}

/// 16 clients each streaming one shard: MB/s and the bytes read.
async fn stream(client: &Client) -> (f64, u64) {
    let (bytes, elapsed) = stream_shards(client, "c4", SHARDS).await;
    assert_eq!(bytes, u64::from(SHARDS) * SHARD_SIZE, "every byte streamed");
    (mb_per_s(bytes, elapsed), bytes)
}

/// The demo's epoch loop over the whole dataset (a block shuffle, 4 shards a block), its
/// 16 ranks timed by `StepTimer`s when `timers`: samples/s and the bytes read.
async fn epoch(client: &Client, endpoint: &str, compute: Duration, timers: bool) -> (f64, u64) {
    let layout = Layout { shards: SHARDS, samples_per_shard: SHARD_SIZE / SAMPLE, sample_bytes: SAMPLE };
    let shape = JobShape { ranks: 16, batch_per_rank: 24, compute, read_ahead: 4, steps: usize::MAX };
    let order = epoch_order(layout, 4, 7);
    let steps = shape.steps_over(&order);
    let names = Arc::new((0..SHARDS).map(shardcache_cli::dataset_gen::shard_name).collect::<Vec<_>>());
    let job = "observed";
    let client = client.for_job(job, 0).unwrap();
    let read = readers::grpc(client, "c4", names, SAMPLE);
    let mut timed = Vec::new();
    if timers {
        let control = CacheClient::connect(endpoint).await.unwrap();
        for rank in 0..shape.ranks {
            let mut timer = StepTimer::new(control.clone(), job, rank as u32, shape.ranks as u32);
            timer.start_epoch(0);
            timed.push(timer);
        }
    }
    let started = Instant::now();
    let run = run_epoch_timed(&order, shape, read, Duration::ZERO, |_| Box::pin(async {}), &mut timed)
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(run.steps.len(), steps);
    let samples = steps * shape.ranks * shape.batch_per_rank;
    (samples as f64 / elapsed.as_secs_f64(), run.steps.iter().map(|s| s.bytes).sum())
}

/// The markdown row of `results` (`[off, on]` runs).
fn row(name: &str, unit: &str, results: &[Vec<Run>; 2]) {
    let median = |runs: &[Run], f: fn(&Run) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [off, on] = results;
    let (speed_off, speed_on) = (median(off, |r| r.speed), median(on, |r| r.speed));
    let all = |runs: &[Run]| runs.iter().map(|r| format!("{:.0}", r.speed)).collect::<Vec<_>>().join(", ");
    println!(
        "| {name} | {speed_off:.0} {unit} ({}) | {speed_on:.0} {unit} ({}) | {:.3} | {:.2} -> {:.2}, {:.2} -> {:.2} |",
        all(off),
        all(on),
        speed_on / speed_off,
        median(off, |r| r.spoke_cpu),
        median(on, |r| r.spoke_cpu),
        median(off, |r| r.clients_cpu),
        median(on, |r| r.clients_cpu),
    );
}
