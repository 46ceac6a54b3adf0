//! The spoke's policies over recorded traces of the readers a cache meets, against
//! Belady's MIN on the same trace and against the spoke before admission (store every
//! miss, fetch the rest of its shard): bytes over the link, and hits.

use super::{traces::*, *};

const MIB: u64 = 1 << 20;
const RECORD: u64 = 16 << 10;

/// A cache of 128 MiB in 4 MiB chunks, over shards of 16 MiB.
fn model() -> Model {
    Model::new(128 * MIB, 4 * MIB, 16 * MIB)
}

fn run(policy: Policy, phases: &[Vec<Read>]) -> Vec<Outcome> {
    simulate(model(), policy, &Shares::default(), phases)
}

const SPOKE: Policy = Policy::Frequency;
const BEFORE: Policy = Policy::StoreEvery { whole_shard: true };

#[test]
fn a_random_reader_of_twice_the_cache_brings_what_it_reads_plus_one_fill_and_less_the_next_epoch() {
    // A map-style dataset of 256 MiB (16 KiB records) under DataLoader(shuffle=True).
    let epochs = shuffled_epochs(16, 16 * MIB, RECORD, 2, 1);
    let (first, second) = epochs.split_at(epochs.len() / 2);
    let phases = [first.to_vec(), second.to_vec()];
    let spoke = run(SPOKE, &phases);
    assert!(spoke[0].link <= spoke[0].read + model().capacity, "epoch 1: {spoke:?}");
    assert!(spoke[1].link < spoke[0].link && spoke[1].link <= spoke[1].read, "epoch 2: {spoke:?}");
    let best = belady(model(), &phases);
    for (epoch, (ours, best)) in spoke.iter().zip(&best).enumerate() {
        assert!(ours.hit_ratio() >= 0.5 * best.hit_ratio(), "epoch {}: {ours:?} against {best:?}", epoch + 1);
    }
    let before = run(BEFORE, &phases);
    assert!(before[0].link > 50 * before[0].read, "the spoke before admission: {before:?}");
}

#[test]
fn a_loop_larger_than_the_cache_keeps_what_fits_rather_than_cycling() {
    // Three sequential passes over 192 MiB in 1 MiB reads: least recently used keeps
    // nothing that is read again (everything crosses every pass).
    let phases = [sequential(0, 0, 12, 16 * MIB, MIB, 3)];
    let (spoke, before, best) = (run(SPOKE, &phases), run(BEFORE, &phases), belady(model(), &phases));
    assert_eq!(before[0].link, before[0].read, "every pass crosses again");
    assert!(spoke[0].link * 10 <= before[0].read * 7, "{spoke:?}");
    assert!(spoke[0].link * 10 <= best[0].link * 12, "within 20% of Belady's bytes: {spoke:?} {best:?}");
    assert!(spoke[0].hit_ratio() >= 0.6 * best[0].hit_ratio(), "{spoke:?} against {best:?}");
}

#[test]
fn a_zipf_reader_keeps_the_popular_chunks() {
    let phases = [zipf(16, 16 * MIB, RECORD, 40_000, 1.0, 3)];
    let (spoke, before, best) = (run(SPOKE, &phases), run(BEFORE, &phases), belady(model(), &phases));
    assert!(spoke[0].link <= spoke[0].read, "no more than reading without a cache: {spoke:?}");
    assert!(before[0].link > 50 * before[0].read, "{before:?}");
    assert!(spoke[0].hit_ratio() >= 0.65 * best[0].hit_ratio(), "{spoke:?} against {best:?}");
    assert!(spoke[0].hit_ratio() > before[0].hit_ratio(), "{spoke:?} against {before:?}");
}

#[test]
fn a_scan_does_not_flush_a_working_set() {
    // One reader (an open spoke: one principal) trains on 64 MiB, half the cache; a scan
    // of three times the cache passes through; the next epoch of the training follows.
    let phases = working_set_and_scan((0, false), 4, 24, 16 * MIB, (RECORD, MIB));
    let working = |outcome: &Outcome| outcome.shards_hit_ratio(|s| s < 4);
    let spoke = run(SPOKE, &phases);
    assert!(working(&spoke[2]) >= 0.95, "{spoke:?}");
    assert!(spoke[2].link <= spoke[2].read / 20, "the next epoch brings nothing again: {spoke:?}");
    assert!(spoke[1].link <= spoke[1].read, "the scan costs what it reads: {spoke:?}");
    let best = belady(model(), &phases);
    assert!(spoke[1].link + spoke[2].link <= best[1].link + best[2].link, "{spoke:?} against {best:?}");
    // Storing every miss, least recently used first, the scan pushes the working set out:
    // the next epoch brings it all again (each chunk's first record a miss).
    let lru = run(Policy::StoreEvery { whole_shard: false }, &phases);
    assert!(lru[2].link >= lru[2].read * 9 / 10, "{lru:?}");
}

#[test]
fn another_tenants_scan_leaves_a_working_set_its_share_even_storing_every_miss() {
    // The scan is another principal's, at the same time as the next epoch: shares keep
    // the working set, with or without the filter.
    for together in [true, false] {
        let phases = working_set_and_scan((1, together), 4, 24, 16 * MIB, (RECORD, MIB));
        for policy in [SPOKE, Policy::StoreEvery { whole_shard: false }] {
            let outcome = run(policy, &phases);
            let next_epoch = outcome.last().map_or(0.0, |o| o.principal_hit_ratio(0));
            assert!(next_epoch >= 0.95, "{policy:?}, together {together}: {outcome:?}");
        }
    }
}

#[test]
fn a_cache_larger_than_the_data_stores_every_miss_as_before() {
    let epochs = shuffled_epochs(6, 16 * MIB, RECORD, 2, 5);
    let (first, second) = epochs.split_at(epochs.len() / 2);
    let phases = [first.to_vec(), second.to_vec()];
    let spoke = run(SPOKE, &phases);
    assert_eq!((spoke[0].link, spoke[1].link), (6 * 16 * MIB, 0), "{spoke:?}");
    assert_eq!(spoke[1].hit, spoke[1].read);
}

#[test]
fn speculation_follows_a_sequential_reader() {
    // Sequential 1 MiB reads of shards never seen: read-ahead keeps every chunk ahead
    // of the reader, and everything it brings is read.
    let phases = [sequential(0, 0, 4, 16 * MIB, MIB, 1)];
    let outcome = run(SPOKE, &phases);
    assert_eq!(outcome[0].link, outcome[0].read, "{outcome:?}");
    assert!(outcome[0].hit_ratio() > 0.9, "{outcome:?}");
}

#[test]
fn a_scan_of_four_times_the_cache_in_whole_chunks_costs_what_it_reads_and_keeps_what_fits() {
    // 1 GiB in 64 MiB shards and 1 MiB chunks, streamed twice in 1 MiB messages (one a
    // chunk) through 256 MiB: every chunk is read once a pass, and no collision of the
    // filter's counters makes one look read more.
    let model = Model::new(256 * MIB, MIB, 64 * MIB);
    let pass = sequential(0, 0, 16, 64 * MIB, MIB, 1);
    let out = simulate(model, SPOKE, &Shares::default(), &[pass.clone(), pass]);
    assert!(out[0].link <= out[0].read && out[1].link <= out[1].read, "{out:?}");
    let kept = (model.capacity as f64 * model.low_watermark) as u64;
    assert!(out[1].hit >= kept - 64 * MIB, "the second pass reads what the first kept: {out:?}");
}

#[test]
fn a_block_shuffled_reader_without_a_plan_brings_no_more_than_no_cache_in_chunk_sized_shards() {
    // plan-bench's planless reader: 256 MiB in 4 MiB shards (a chunk each), the records of
    // each block of 4 shards shuffled together, three epochs, through half the size.
    let model = Model::new(128 * MIB, 4 * MIB, 4 * MIB);
    let phases = block_shuffled_epochs((64, 4 * MIB, RECORD), 4, 3, 11);
    let spoke = simulate(model, SPOKE, &Shares::default(), &phases);
    for (epoch, outcome) in spoke.iter().enumerate().skip(1) {
        assert!(outcome.link <= outcome.read, "epoch {}: {spoke:?}", epoch + 1);
    }
    assert!(spoke[1].link < spoke[0].link, "{spoke:?}");
}
