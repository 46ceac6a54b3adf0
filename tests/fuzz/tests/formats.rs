//! The formats' readers fuzzed (a short run; `fuzz-bench` runs a million inputs a
//! format): every reference-written seed read whole, then mutated copies of it, each
//! refused with a clear error or read whole, never a panic, a hang or memory past the
//! budget. The harness is `shardcache_fuzz`.
#![allow(clippy::unwrap_used)]

use shardcache_fuzz::{self as fuzz, Counting, Outcome};

#[global_allocator]
static ALLOC: Counting = fuzz::counting();

/// Inputs a format in `make test`: a few seconds each on 2 cores.
const INPUTS: u64 = 3_000;

#[test]
fn every_seed_written_by_its_reference_writer_is_read_whole() {
    for target in fuzz::targets() {
        let seeds = fuzz::seeds(&fuzz::seeds_dir(), &target).unwrap();
        match fuzz::read_seeds(&target, &seeds) {
            Ok(Outcome::Read(samples)) => assert!(samples > 0, "{}: no samples", target.name),
            other => panic!("{}: {other:?}", target.name),
        }
    }
}

/// The hostile seeds (`tests/fuzz/seeds/hostile/`): what each is refused with.
const HOSTILE: [(&str, &str); 2] = [
    // index.json claims 4 GiB - 1 for a snappy shard of ~100 bytes: damaged, at open.
    ("hostile/mds-snappy-claim", "INVALID_ARGUMENT"),
    // Four zstd shards of ~32 KiB, each 1 GiB decompressed: past the budget, before any
    // is decompressed.
    ("hostile/mds-zstd-bombs", "RESOURCE_EXHAUSTED"),
];

#[test]
fn hostile_files_are_refused_within_the_budget_never_at_the_allocator() {
    for (seeds, code) in HOSTILE {
        let target =
            fuzz::Target { name: seeds, seeds, format: shardcache_formats::Format::Mds, structured: true };
        let files = fuzz::seeds(&fuzz::seeds_dir(), &target).unwrap();
        // An allocation past the budget and the harness's margin aborts this test (the
        // other tests of this binary set and lift the same limit: a guard, not the verdict).
        let baseline = ALLOC.allocated();
        let _ = ALLOC.set_limit(baseline + fuzz::SOFT_CAP as usize);
        let outcome = fuzz::read_seeds(&target, &files);
        let _ = ALLOC.set_limit(usize::MAX);
        assert_eq!(outcome, Ok(fuzz::Outcome::Refused(code)), "{seeds}");
    }
}

#[test]
fn damaged_files_are_refused_or_read_never_a_panic_a_hang_or_memory_past_the_budget() {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for (n, target) in fuzz::targets().iter().enumerate() {
        let seeds = fuzz::seeds(&fuzz::seeds_dir(), target).unwrap();
        let tally = fuzz::run(&ALLOC, n, target, &seeds, 0, INPUTS);
        report.push(format!(
            "{}: {} inputs, {} read whole, {} refused, {} parquet crate panics caught, peak {} KiB",
            target.name,
            tally.inputs,
            tally.read,
            tally.refused,
            tally.upstream.len(),
            tally.peak >> 10
        ));
        // Some inputs must get past the first check, or the run tests nothing but it.
        assert!(tally.read > 0 && (tally.refused > 0 || !target.structured), "{}: {tally:?}", target.name);
        failures.extend(tally.failures);
    }
    let hub = fuzz::run_hub(0, 20 * INPUTS);
    report.push(format!("hub-names: {} inputs, {} accepted, {} refused", hub.inputs, hub.read, hub.refused));
    failures.extend(hub.failures);
    println!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "{} failures, the first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(20)]
    );
}
