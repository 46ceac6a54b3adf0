//! `plan-memory-bench`: what a plan position costs a spoke's memory. A spoke over a
//! hub's 4096 shards takes a plan naming every shard once (so that its index holds an
//! entry per shard before anything is measured), then one principal's 16 plans of 250k
//! positions each (the default `--max-plan-positions-per-principal`, 4M positions in
//! all), sent by the SDK as a real trainer sends them: shuffled epochs, shard after
//! shard, and again with blocks of 4 shards read together (`until`). The spoke's
//! resident memory (`VmRSS`) is read before and after; the growth per position is the
//! row. A 17th plan is refused by the quota, as it says.
//!
//! Then plans followed sample by sample (issue 47): 16 jobs of one principal each send
//! the window of an epoch of 10^8 samples (a uniform shuffle, `order::Permutation`, each
//! read with its next epoch's position) as the SDK sends it, 16k reads a request, to
//! the spoke's bound of 2^17 planned reads a job (`samples::MAX_PLANNED_PER_JOB`), then a
//! second window past it to every job (trimmed: the nearest stay). The dataset is 4096
//! sparse shards of 64 MiB (the samples 4 KiB apart, every read a different range; no
//! disk used), so the follower fetches the window's first bytes as it would (those held
//! are the `staged` column, taken out of the growth) and no more.
//!
//! Last, the jobs' tables (issue 49): 256 jobs of 16 ranks reporting their steps, then one
//! job of 4096 ranks.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/plan-memory-bench
//! ```

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use shardcache_client::{CacheClient, PlannedEpoch, PlannedSample, order::Permutation};
use shardcache_tests::{HubProcess, SpokeProcess, make_dataset, next_random};

const SHARDS: u32 = 4096;
const PLANS: usize = 16;
const POSITIONS: usize = 250_000;

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Epochs of every shard in a shuffled order, `block` shards read together, until
/// `positions` are planned.
fn plan(seed: u64, block: usize, positions: usize) -> Vec<PlannedEpoch> {
    let mut rng = seed;
    let mut epochs = Vec::new();
    let mut planned = 0;
    while planned < positions {
        let mut shards: Vec<u32> = (0..SHARDS).collect();
        for i in (1..shards.len()).rev() {
            shards.swap(i, (next_random(&mut rng) % (i as u64 + 1)) as usize);
        }
        shards.truncate(positions - planned);
        let until = if block > 1 {
            (0..shards.len()).map(|i| ((i / block + 1) * block - 1).min(shards.len() - 1) as u32).collect()
        } else {
            Vec::new()
        };
        planned += shards.len();
        epochs.push(PlannedEpoch {
            shards: shards.into_iter().map(shardcache_cli::dataset_gen::shard_name).collect(),
            until,
        });
    }
    epochs
}

#[tokio::main]
async fn main() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", SHARDS, 16 << 10);
    let hub = HubProcess::start(root.path(), &[]);
    println!(
        "{SHARDS} shards; one principal's {PLANS} plans of {POSITIONS} positions ({} in all)",
        PLANS * POSITIONS
    );
    println!("| plans | RSS before | RSS after | growth | bytes per position |");
    println!("|---|---|---|---|---|");
    for (label, block) in [("shard after shard", 1), ("blocks of 4 shards (until)", 4)] {
        let cache = tempfile::tempdir().unwrap();
        let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &["--plan-window", "0"]);
        let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
        // Every shard's entry first, and the code paths of a plan warm.
        control.set_plan("warm-up", 0, "c4", &plan(1, 1, SHARDS as usize)).await.unwrap();
        control.set_plan("warm-up", 0, "c4", &[]).await.unwrap();
        let pid = spoke.child.id();
        let before = rss(pid);
        for job in 0..PLANS {
            let epochs = plan(job as u64 + 7, block, POSITIONS);
            control.set_plan(&format!("job-{job}"), 0, "c4", &epochs).await.unwrap();
        }
        let after = rss(pid);
        let refused = control.set_plan("one-more", 0, "c4", &plan(99, 1, POSITIONS)).await.unwrap_err();
        assert!(refused.to_string().contains("--max-plan-positions-per-principal"), "{refused}");
        let status = control.status().await.unwrap();
        assert_eq!(status.plans.iter().map(|p| p.positions as usize).sum::<usize>(), PLANS * POSITIONS);
        let growth = after.saturating_sub(before);
        println!(
            "| {label} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} |",
            before as f64 / (1 << 20) as f64,
            after as f64 / (1 << 20) as f64,
            growth as f64 / (1 << 20) as f64,
            growth as f64 / (PLANS * POSITIONS) as f64
        );
    }
    sample_windows().await;
    job_tables().await;
}

/// What the spoke's jobs' tables cost (issue 49): 256 jobs (the bound) of 16 ranks, each
/// rank reporting two epochs of 300 batches as the SDK's timer does; then one job of 4096
/// ranks (the rank bound) reporting one epoch of 200 batches. RSS before and after.
async fn job_tables() {
    use shardcache_proto::v1::StepReport;
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 1, 16 << 10);
    let hub = HubProcess::start(root.path(), &[]);
    let cache = tempfile::tempdir().unwrap();
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &[]);
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    let report = |job: &str, rank: u32, ranks: u32, epoch: u64, batches: usize| StepReport {
        job: job.to_owned(),
        rank,
        ranks,
        epoch,
        first_batch: 0,
        wait_us: vec![1000; batches],
        busy_us: vec![50_000; batches],
        samples: vec![24; batches],
        started_ms: 1_700_000_000_000 + epoch * 20_000,
    };
    let pid = spoke.child.id();
    println!();
    println!("| jobs' tables | RSS before | RSS after | growth | per job |");
    println!("|---|---|---|---|---|");
    let before = rss(pid);
    for job in 0..256 {
        for epoch in 0..2 {
            for rank in 0..16 {
                control.report_steps(report(&format!("job-{job}"), rank, 16, epoch, 300)).await.unwrap();
            }
        }
    }
    let after = rss(pid);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let growth = after.saturating_sub(before);
    println!(
        "| 256 jobs x 16 ranks x 2 epochs of 300 batches | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} KiB |",
        mib(before),
        mib(after),
        mib(growth),
        growth as f64 / 256.0 / 1024.0
    );
    let before = rss(pid);
    for rank in 0..4096 {
        control.report_steps(report("wide", rank, 4096, 0, 200)).await.unwrap();
    }
    let after = rss(pid);
    let growth = after.saturating_sub(before);
    println!(
        "| one job of 4096 ranks x 200 batches (and the least recent job dropped) | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} KiB |",
        mib(before),
        mib(after),
        mib(growth),
        growth as f64 / 1024.0
    );
    let table = control.job_report("wide", "").await.unwrap();
    assert_eq!(table.phases.iter().map(|p| p.steps).sum::<u64>(), 200, "every step folded once");
}

const EPOCH_SAMPLES: u64 = 100_000_000;
const SAMPLE_JOBS: usize = 16;
const WINDOW: u64 = 1 << 17;
const SPARSE_SHARD: u64 = 64 << 20;
const SAMPLE_BYTES: u64 = 4096;

/// Sample `s` of the sparse dataset: shard `s % 4096`, 4 KiB at a place of its own.
fn sample_read(sample: u64, position: u64, next_use: u64) -> PlannedSample {
    let shard = sample % u64::from(SHARDS);
    let slot = (sample / u64::from(SHARDS)) % (SPARSE_SHARD / SAMPLE_BYTES);
    PlannedSample {
        position,
        shard: shardcache_cli::dataset_gen::shard_name(shard as u32),
        offset: slot * SAMPLE_BYTES,
        length: SAMPLE_BYTES,
        next_use: Some(next_use),
    }
}

/// Sends `job`'s planned reads at epoch places `from..from + WINDOW` of a uniform
/// shuffle of `EPOCH_SAMPLES`, 16k reads a request.
async fn send_window(control: &CacheClient, job: &str, from: u64) {
    let this = Permutation::new(EPOCH_SAMPLES, &format!("{job}:0"));
    let next = Permutation::new(EPOCH_SAMPLES, &format!("{job}:1"));
    let places: Vec<u64> = (from..from + WINDOW).collect();
    for batch in places.chunks(16 << 10) {
        let reads: Vec<PlannedSample> = batch
            .iter()
            .map(|&place| {
                let sample = this.at(place);
                sample_read(sample, place, EPOCH_SAMPLES + next.position_of(sample))
            })
            .collect();
        control.plan_samples(job, "sparse", EPOCH_SAMPLES, &reads).await.unwrap();
    }
}

/// The sample windows' rows: RSS before, after every job's window, after a second window
/// to every job.
async fn sample_windows() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("sparse");
    std::fs::create_dir(&dir).unwrap();
    for shard in 0..SHARDS {
        let file = std::fs::File::create(dir.join(shardcache_cli::dataset_gen::shard_name(shard))).unwrap();
        file.set_len(SPARSE_SHARD).unwrap();
    }
    let hub = HubProcess::start(root.path(), &[]);
    let cache = tempfile::tempdir().unwrap();
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &["--capacity", "64MiB"]);
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    // The code paths warm, and the follower's lookups of every shard done.
    send_window(&control, "warm-up", 0).await;
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let pid = spoke.child.id();
    println!();
    println!(
        "{SAMPLE_JOBS} jobs following samples, each an epoch of {EPOCH_SAMPLES} samples, \
         a window of {WINDOW} planned reads a job"
    );
    println!("| step | planned reads | RSS | staged | growth less staged | bytes per planned read |");
    println!("|---|---|---|---|---|---|");
    let before = rss(pid);
    let staged_before = control.status().await.unwrap().staged_sample_bytes;
    let row = |step: &str, planned: u64, now: u64, staged: u64| {
        let growth = (now.saturating_sub(before) as f64) - (staged as f64 - staged_before as f64);
        println!(
            "| {step} | {planned} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} |",
            now as f64 / (1 << 20) as f64,
            staged as f64 / (1 << 20) as f64,
            growth / (1 << 20) as f64,
            if planned == 0 { 0.0 } else { growth / planned as f64 }
        );
    };
    row("before (a warm-up job's window planned)", 0, before, staged_before);
    for (step, from) in [("every job's first window", 0), ("a second window past it to every job", WINDOW)] {
        for job in 0..SAMPLE_JOBS {
            send_window(&control, &format!("job-{job}"), from).await;
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let status = control.status().await.unwrap();
        let planned = SAMPLE_JOBS as u64 * WINDOW;
        row(step, planned, rss(pid), status.staged_sample_bytes);
    }
}
