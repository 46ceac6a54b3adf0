//! `fuzz-bench`: the long run of the formats' fuzz harness (`shardcache_fuzz`;
//! `make test` runs 3,000 inputs a format): mutated copies of reference-written seeds read
//! whole, index and samples, in memory, each under a 64 MiB budget and a time limit.
//! Prints a markdown table: inputs run, read whole, refused with a clear error, failures
//! (a panic, a hang, memory past the budget, samples of the wrong shape), the parquet
//! crate's own panics (caught where it is called and refused: an upstream bug, counted
//! apart), the most memory one input held, inputs per second.
//!
//! ```sh
//! cargo build --release -p shardcache-fuzz
//! target/release/fuzz-bench                     # 1,000,000 inputs each target
//! target/release/fuzz-bench --inputs 10000 --target parquet
//! target/release/fuzz-bench --target mds --from 123456 --inputs 1   # one input again
//! target/release/fuzz-bench --target parquet --from 1129 --inputs 1 --save /tmp/repro
//! ```
//!
//! A hang (past 20 s) or an allocation past the cap (96 MiB held by one input) aborts the
//! process with the target's number and the input's on stderr (inputs are numbered: the
//! same number is the same file).

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::path::Path;

use clap::Parser;
use shardcache_fuzz::{self as fuzz, Counting};

#[global_allocator]
static ALLOC: Counting = fuzz::counting();

#[derive(Parser)]
struct Args {
    /// Inputs per target.
    #[arg(long, default_value_t = 1_000_000)]
    inputs: u64,
    /// The first input's number.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Targets to run (all when none): npy, raw-tokens, megatron, megatron-gpt, mds,
    /// mds-zstd, mds-gz, mds-snappy, webdataset, webdataset-gnu, parquet, hub-names.
    #[arg(long, value_delimiter = ',')]
    target: Vec<String>,
    /// Write each input's files under this folder (`TARGET-INPUT/NAME`) instead of
    /// running them: a reproducer to attach to a report.
    #[arg(long)]
    save: Option<std::path::PathBuf>,
    /// Write inputs read whole (`--keep` a target, spread over the run) under this
    /// folder as `TARGET-INPUT/NAME`, for `tests/fuzz/differential.py` to compare with
    /// the formats' reference readers.
    #[arg(long)]
    accepted: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 200)]
    keep: usize,
    /// The reference-written seeds (default: [`fuzz::seeds_dir`]; the Python tests pass
    /// their checkout's).
    #[arg(long, default_value_os_t = fuzz::seeds_dir())]
    seeds: std::path::PathBuf,
}

/// Writes input `input` of target number `n` under `dir` as `TARGET-INPUT/NAME`.
fn save(dir: &Path, n: usize, target: &fuzz::Target, seeds: &[(String, bytes::Bytes)], input: u64) {
    let dir = dir.join(format!("{}-{input}", target.name));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in fuzz::Mutator::new(n as u64, input).mutate(seeds) {
        std::fs::write(dir.join(name), data).unwrap();
    }
}

fn main() {
    let args = Args::parse();
    let root = args.seeds.as_path();
    let wanted = |name: &str| args.target.is_empty() || args.target.iter().any(|t| t == name);
    println!(
        "| target | inputs | read whole | refused (clear error) | failures | parquet crate panics caught | peak memory of an input | inputs/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    let mut upstream = Vec::new();
    let mut times = Vec::new();
    let row = |name: &str, t: &fuzz::Tally| {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {:.1} MiB | {:.0} |",
            t.inputs,
            t.read,
            t.refused,
            t.failures.len(),
            t.upstream.len(),
            t.peak as f64 / (1 << 20) as f64,
            t.inputs as f64 / t.elapsed.as_secs_f64()
        )
    };
    for (n, target) in fuzz::targets().iter().enumerate().filter(|(_, t)| wanted(t.name)) {
        let seeds = fuzz::seeds(root, target).unwrap();
        if let Some(dir) = &args.save {
            for input in args.from..args.from + args.inputs {
                save(dir, n, target, &seeds, input);
            }
            continue;
        }
        let tally = fuzz::run(&ALLOC, n, target, &seeds, args.from, args.inputs);
        row(target.name, &tally);
        // The slowest input timed again beside the seeds (a one-off slow read is the
        // scheduler's): no input may cost much more than a valid file of its size.
        let (_, slowest) = tally.slowest;
        let again = fuzz::read_time(target, &fuzz::Mutator::new(n as u64, slowest).mutate(&seeds), 11);
        times.push((target.name, fuzz::read_time(target, &seeds, 101), slowest, again));
        if let Some(dir) = &args.accepted {
            let step = tally.accepted.len().div_ceil(args.keep).max(1);
            for &input in tally.accepted.iter().step_by(step) {
                save(dir, n, target, &seeds, input);
            }
        }
        if !tally.upstream.is_empty() {
            upstream.push((target.name, tally.upstream.iter().take(20).copied().collect::<Vec<_>>()));
        }
        failures.extend(tally.failures);
    }
    if args.save.is_none() && wanted("hub-names") {
        let tally = fuzz::run_hub(args.from, args.inputs);
        row("hub-names", &tally);
        failures.extend(tally.failures);
    }
    if !times.is_empty() {
        println!(
            "\n| target | seeds read (median of 101) | slowest input | it again (median of 11) | ratio |"
        );
        println!("|---|---|---|---|---|");
        for (name, seeds, input, again) in &times {
            let ratio = again.as_secs_f64() / seeds.as_secs_f64();
            println!("| {name} | {seeds:.1?} | {input} | {again:.1?} | {ratio:.2} |");
        }
    }
    for (target, inputs) in &upstream {
        println!("parquet crate panics caught ({target}): inputs {inputs:?}");
    }
    for failure in failures.iter().take(50) {
        println!("FAILURE {} input {}: {}", failure.target, failure.input, failure.what);
    }
    assert!(failures.is_empty(), "{} failures", failures.len());
}
