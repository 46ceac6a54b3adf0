//! `policy-bench`: the admission policies the issue asked to measure, side by side on
//! the same recorded traces, in the spoke's own model of itself
//! (`spoke_cache::policy::simulate`: chunks stored whole or fetched as read, shards
//! evicted whole from the high watermark to the low one): the spoke before admission
//! (every miss stored, the rest of its shard fetched), every miss stored alone, S3-FIFO's
//! ghost (a miss stored the second time it misses), the spoke's frequency filter with its
//! speculation, and Belady's MIN with bypass (the most hits a cache of this size can have,
//! at chunk granularity, knowing the future); then the plan followed sample by sample
//! (`simulate::samples::planned`: each sample fetched as read, those read again kept
//! under the capacity less the window) beside Belady's MIN over samples (the whole
//! capacity, no window). Bytes over the link per byte read and hit ratio per phase.
//!
//! ```sh
//! cargo build --release -p shardcache-bench --bin policy-bench && target/release/policy-bench
//! ```

use spoke_cache::policy::{
    shares::Shares,
    simulate::{Model, Outcome, Policy, Read, belady, samples, simulate, traces},
};

const MIB: u64 = 1 << 20;
const RECORD: u64 = 16 << 10;

/// A named trace as phases, on a cache of `Model`.
struct Case {
    name: &'static str,
    model: Model,
    phases: Vec<Vec<Read>>,
    /// What each phase is.
    labels: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    let model = Model::new(128 * MIB, 4 * MIB, 16 * MIB);
    let halves = |trace: Vec<Read>| {
        let (a, b) = trace.split_at(trace.len() / 2);
        vec![a.to_vec(), b.to_vec()]
    };
    vec![
        Case {
            name: "random 16 KiB records, dataset 2x the cache",
            model,
            phases: halves(traces::shuffled_epochs(16, 16 * MIB, RECORD, 2, 1)),
            labels: &["epoch 1", "epoch 2"],
        },
        Case {
            name: "random 16 KiB records, dataset 4x the cache",
            model,
            phases: halves(traces::shuffled_epochs(32, 16 * MIB, RECORD, 2, 1)),
            labels: &["epoch 1", "epoch 2"],
        },
        Case {
            name: "zipf(1.0) 16 KiB records over 2x the cache",
            model,
            phases: vec![traces::zipf(16, 16 * MIB, RECORD, 40_000, 1.0, 3)],
            labels: &["40k reads"],
        },
        Case {
            name: "loop of 1.5x the cache, 1 MiB reads, 3 passes",
            model,
            phases: vec![traces::sequential(0, 0, 12, 16 * MIB, MIB, 3)],
            labels: &["3 passes"],
        },
        Case {
            name: "blocks of 4 shards' records shuffled (plan-bench's planless reader), 4 MiB shards, 2x the cache",
            model: Model::new(128 * MIB, 4 * MIB, 4 * MIB),
            phases: traces::block_shuffled_epochs((64, 4 * MIB, RECORD), 4, 3, 11),
            labels: &["epoch 1", "epoch 2", "epoch 3"],
        },
        Case {
            name: "uniform shuffle of 16 KiB records, dataset 2x the cache, 3 epochs",
            model,
            phases: traces::shuffled_epochs(16, 16 * MIB, RECORD, 3, 5)
                .chunks(16 * 1024)
                .map(<[Read]>::to_vec)
                .collect(),
            labels: &["epoch 1", "epoch 2", "epoch 3"],
        },
        Case {
            name: "blocks of 4 shards as large as the cache (8 x 4 MiB, a 16 MiB cache)",
            model: Model::new(16 * MIB, 4 * MIB, 4 * MIB),
            phases: traces::block_shuffled_epochs((8, 4 * MIB, RECORD), 4, 3, 9),
            labels: &["epoch 1", "epoch 2", "epoch 3"],
        },
        Case {
            name: "working set of half the cache, a scan of 3x, the next epoch",
            model,
            phases: traces::working_set_and_scan((0, false), 4, 24, 16 * MIB, (RECORD, MIB)),
            labels: &["epoch 1", "scan", "epoch 2"],
        },
    ]
}

fn cell(o: &Outcome) -> String {
    format!("{:.2} / {:.3}", o.amplification(), o.hit_ratio())
}

fn main() {
    let policies = [
        ("before (every miss + its shard)", Policy::StoreEvery { whole_shard: true }),
        ("every miss", Policy::StoreEvery { whole_shard: false }),
        ("S3-FIFO ghost (second miss)", Policy::SecondMiss),
        ("frequency filter (the spoke's)", Policy::Frequency),
    ];
    println!(
        "cache 128 MiB in 4 MiB chunks, shards of 16 MiB (unless the trace says); each cell: bytes over the link per byte read / hit ratio"
    );
    print!("| trace | phase |");
    for (name, _) in &policies {
        print!(" {name} |");
    }
    println!(" Belady's MIN | plan, sample by sample | Belady's MIN over samples |");
    println!("|---|---|{}---|---|---|", "---|".repeat(policies.len()));
    for case in cases() {
        let runs: Vec<Vec<Outcome>> = policies
            .iter()
            .map(|(_, policy)| simulate(case.model, *policy, &Shares::default(), &case.phases))
            .collect();
        let best = belady(case.model, &case.phases);
        let planned = samples::planned(case.model.capacity, &case.phases);
        let best_samples = samples::belady(case.model.capacity, &case.phases);
        for (phase, label) in case.labels.iter().enumerate() {
            print!("| {} | {label} |", case.name);
            for run in &runs {
                print!(" {} |", cell(&run[phase]));
            }
            println!(
                " {} | {} | {} |",
                cell(&best[phase]),
                cell(&planned[phase]),
                cell(&best_samples[phase])
            );
        }
    }
}
