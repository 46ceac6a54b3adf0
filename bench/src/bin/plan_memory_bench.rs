//! `plan-memory-bench`: what a plan position costs a spoke's memory. A spoke over a
//! hub's 4096 shards takes a plan naming every shard once (so that its index holds an
//! entry per shard before anything is measured), then one principal's 16 plans of 250k
//! positions each (the default `--max-plan-positions-per-principal`, 4M positions in
//! all), sent by the SDK as a real trainer sends them: shuffled epochs, shard after
//! shard, and again with blocks of 4 shards read together (`until`). The spoke's
//! resident memory (`VmRSS`) is read before and after; the growth per position is the
//! row. A 17th plan is refused by the quota, as it says.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/plan-memory-bench
//! ```

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use shardcache_client::{CacheClient, PlannedEpoch};
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
}
