//! The spoke following a plan sample by sample (`policy::keep`), and Belady's MIN over
//! samples, on the traces of `simulate.rs`: what an order whose blocks of shards do not
//! fit the cache (a uniform shuffle, a map-style sampler) costs the link when the cache
//! knows the plan's samples, against the best any cache of samples could do.
//!
//! The model: every read of a sample not kept crosses the link as read (fetched ahead
//! in the plan's window, which comes out of the capacity: `window::samples_bound`); a read
//! sample whose next read is planned is kept while what is held stays under
//! `window::keep_limit`, and stays until read again.

use std::collections::{BTreeSet, HashMap};

use super::{Outcome, Read};
use crate::policy::{keep, window};

/// A sample: its shard and offset (a trace reads each sample with one length).
type Sample = (u32, u64);

/// For each read of `trace`, the index of the next read of its sample (`usize::MAX`:
/// none): what the plan tells the spoke.
fn next_reads(trace: &[Read]) -> Vec<usize> {
    let mut next = vec![usize::MAX; trace.len()];
    let mut seen: HashMap<Sample, usize> = HashMap::new();
    for (i, read) in trace.iter().enumerate().rev() {
        if let Some(later) = seen.insert((read.shard, read.offset), i) {
            next[i] = later;
        }
    }
    next
}

/// The index of the phase each read of `phases` (run one after another) is in.
fn phase_of(phases: &[Vec<Read>]) -> Vec<usize> {
    phases.iter().enumerate().flat_map(|(phase, reads)| std::iter::repeat_n(phase, reads.len())).collect()
}

/// What each of `phases` costs a spoke of `capacity` following their plan sample by
/// sample (see the module's documentation).
pub fn planned(capacity: u64, phases: &[Vec<Read>]) -> Vec<Outcome> {
    let trace = phases.concat();
    let (next, phase) = (next_reads(&trace), phase_of(phases));
    let mut outcomes = vec![Outcome::default(); phases.len()];
    let mut kept: HashMap<Sample, u64> = HashMap::new();
    let mut held = 0;
    for (i, read) in trace.iter().enumerate() {
        let (key, who) = ((read.shard, read.offset), (read.principal, read.shard));
        let again = (next[i] != usize::MAX).then_some(next[i] as u64);
        let outcome = &mut outcomes[phase[i]];
        if kept.contains_key(&key) {
            outcome.count(who, read.length, true, 0);
            if again.is_none() {
                // Read for the last time the plan knows of: its room is free.
                held -= kept.remove(&key).unwrap_or(0);
            }
            continue;
        }
        outcome.count(who, read.length, false, read.length);
        if keep::keeps(again, read.length, held, window::keep_limit(capacity)) {
            kept.insert(key, read.length);
            held += read.length;
        }
    }
    outcomes
}

/// Belady's MIN over samples, with bypass, on `phases` run one after another: a cache of
/// `capacity` bytes of samples (all of it: no window) that knows the future; a miss is
/// stored unless its next read is later than every stored sample's (evicting those read
/// again furthest away to make room), and crosses the link as read either way. The most
/// hits any cache of this size can have.
pub fn belady(capacity: u64, phases: &[Vec<Read>]) -> Vec<Outcome> {
    let trace = phases.concat();
    let (next, phase) = (next_reads(&trace), phase_of(phases));
    let mut outcomes = vec![Outcome::default(); phases.len()];
    // Stored samples by their next read, and each one's (next read, length).
    let mut by_next: BTreeSet<(usize, Sample)> = BTreeSet::new();
    let mut stored: HashMap<Sample, (usize, u64)> = HashMap::new();
    let mut held = 0;
    for (i, read) in trace.iter().enumerate() {
        let (key, who) = ((read.shard, read.offset), (read.principal, read.shard));
        let outcome = &mut outcomes[phase[i]];
        if let Some((was, length)) = stored.remove(&key) {
            outcome.count(who, read.length, true, 0);
            by_next.remove(&(was, key));
            stored.insert(key, (next[i], length));
            by_next.insert((next[i], key));
            continue;
        }
        outcome.count(who, read.length, false, read.length);
        if next[i] == usize::MAX {
            continue;
        }
        // Evict what is read again later than this sample until it fits; if it does not
        // fit that way, it is not stored (and nothing is evicted).
        let mut freed = 0;
        let victims: Vec<(usize, Sample)> = by_next
            .iter()
            .rev()
            .take_while(|&&(far, _)| far > next[i])
            .take_while(|&&(_, sample)| {
                let fits = held - freed + read.length <= capacity;
                if !fits {
                    freed += stored[&sample].1;
                }
                !fits
            })
            .copied()
            .collect();
        if held - freed + read.length > capacity {
            continue;
        }
        for (far, sample) in victims {
            by_next.remove(&(far, sample));
            held -= stored.remove(&sample).map_or(0, |(_, length)| length);
        }
        stored.insert(key, (next[i], read.length));
        by_next.insert((next[i], key));
        held += read.length;
    }
    outcomes
}

#[cfg(test)]
mod tests {
    //! A plan followed sample by sample against Belady's MIN over samples (computed here,
    //! on the same trace), and against the spoke's chunk policies, over the orders a
    //! cache of shards cannot serve: a uniform shuffle, a map-style sampler over ranks, a
    //! block shuffle whose blocks are as large as the cache.

    use super::{
        super::{Model, Policy, Shares, simulate, traces::*},
        *,
    };

    const MIB: u64 = 1 << 20;
    const RECORD: u64 = 16 << 10;

    fn ratio(outcomes: &[Outcome]) -> Vec<f64> {
        outcomes.iter().map(Outcome::amplification).collect()
    }

    /// `epochs` shuffled epochs, one phase each.
    fn by_epoch(trace: Vec<Read>, epochs: usize) -> Vec<Vec<Read>> {
        let per = trace.len() / epochs;
        trace.chunks(per).map(<[Read]>::to_vec).collect()
    }

    #[test]
    fn a_uniform_shuffle_through_half_its_size_brings_its_reads_then_less_as_belady_would() {
        // 256 MiB of 16 KiB samples, every sample once an epoch in one random order, a
        // cache of 128 MiB.
        let capacity = 128 * MIB;
        let phases = by_epoch(shuffled_epochs(16, 16 * MIB, RECORD, 3, 5), 3);
        let ours = planned(capacity, &phases);
        let best = belady(capacity, &phases);
        let link = ratio(&ours);
        assert!((link[0] - 1.0).abs() < 1e-9, "epoch 1 brings what it reads, no more: {link:?}");
        assert!(link[1] <= 0.6 && link[2] <= 0.6, "later epochs: {link:?}");
        for epoch in 1..3 {
            let (hits, bound) = (ours[epoch].hit_ratio(), best[epoch].hit_ratio());
            assert!(hits >= 0.8 * bound, "epoch {}: {hits:.3} hits against Belady's {bound:.3}", epoch + 1);
            assert!(bound <= 0.5 + 1e-9, "no cache of half the data hits more than half: {bound}");
        }
        // The same order through the spoke's chunk policies (4 MiB chunks of 16 MiB
        // shards), the plan unused: every miss a chunk, or a chunk declined and read as read.
        let chunks =
            simulate(Model::new(capacity, 4 * MIB, 16 * MIB), Policy::Frequency, &Shares::default(), &phases);
        let chunk_hits: f64 = chunks[1..].iter().map(Outcome::hit_ratio).sum::<f64>() / 2.0;
        let sample_hits: f64 = ours[1..].iter().map(Outcome::hit_ratio).sum::<f64>() / 2.0;
        assert!(sample_hits > chunk_hits, "samples kept: {sample_hits:.3}, chunks kept: {chunk_hits:.3}");
    }

    #[test]
    fn a_distributed_sampler_over_ranks_padded_to_them_is_served_as_belady_would() {
        // 20,000 samples of 16 KiB (312 MiB) over 3 ranks (drop_last=False: 20,001 places,
        // the first sample read twice an epoch), 4 epochs, a cache of a third of the data.
        let (samples, ranks) = (20_000, 3);
        let capacity = samples * RECORD / 3;
        let phases: Vec<Vec<Read>> =
            (0..4).map(|epoch| distributed_sampler_epoch(samples, ranks, epoch)).collect();
        assert_eq!(phases[0].len(), 20_001);
        let ours = planned(capacity, &phases);
        // Against Belady with what the window leaves (the window is the reads' speed), and
        // with the whole capacity.
        let (kept, whole) = (belady(window::keep_limit(capacity), &phases), belady(capacity, &phases));
        let link = ratio(&ours);
        assert!(link[0] <= 1.0, "epoch 1: {link:?}");
        for epoch in 1..4 {
            let (hits, bound, most) =
                (ours[epoch].hit_ratio(), kept[epoch].hit_ratio(), whole[epoch].hit_ratio());
            assert!(hits >= 0.9 * bound, "epoch {}: {hits:.3} against Belady's {bound:.3}", epoch + 1);
            assert!(
                hits >= 0.75 * most,
                "epoch {}: {hits:.3} against Belady's {most:.3} with no window",
                epoch + 1
            );
            assert!(link[epoch] <= 1.0 - hits + 1e-9, "epoch {}: {link:?}", epoch + 1);
        }
    }

    #[test]
    fn a_block_shuffle_whose_block_is_the_cache_never_brings_more_than_it_reads() {
        // 8 shards of 4 MiB in blocks of 4 (16 MiB, the whole capacity), 3 epochs.
        let capacity = 16 * MIB;
        let phases = block_shuffled_epochs((8, 4 * MIB, RECORD), 4, 3, 9);
        let ours = planned(capacity, &phases);
        assert!(ratio(&ours).iter().all(|&r| r <= 1.0), "{:?}", ratio(&ours));
        // A cache this small gives most of itself to the window (`window::samples_bound`):
        // against Belady with what it leaves.
        let best = belady(window::keep_limit(capacity), &phases);
        for epoch in 1..3 {
            assert!(ours[epoch].hit_ratio() >= 0.9 * best[epoch].hit_ratio(), "{ours:?} {best:?}");
        }
        assert!(ours[1].hit > 0 && ours[1].link < ours[0].link, "what it kept is read again: {ours:?}");
    }

    #[test]
    fn belady_over_samples_keeps_what_is_read_again_soonest() {
        // Capacity for two samples; A B C A B C ... : MIN keeps A and B, then evicts
        // the one read furthest away; it never stores a sample read again after all it holds.
        let read = |offset| Read { principal: 0, shard: 0, offset, length: 10 };
        let trace: Vec<Read> = [0, 10, 20, 0, 10, 20, 0].into_iter().map(read).collect();
        let best = belady(20, std::slice::from_ref(&trace));
        // Misses: A, B, C (bypassed: read after A and B), then A hit, B hit, C miss
        // (stored over A? A is read next at 6, C never again: bypassed), A hit.
        assert_eq!((best[0].read, best[0].hit), (70, 30), "{best:?}");
        let ours = planned(1 << 30, &[trace]);
        assert_eq!(ours[0].hit, 40, "a cache holding everything hits every read again");
    }
}
