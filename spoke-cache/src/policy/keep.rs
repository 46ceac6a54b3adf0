//! The keep rule: what the cache holds on to, for shards and samples alike. One order,
//! [`before`]: of two things, the one the plans need again later is given up first
//! (Belady's MIN: shards by the reads away of their next planned read; a kept sample is
//! read again next epoch, further away than any shard a plan is reading or reads next);
//! what no plan reads again goes before anything planned; between equals, the least
//! recently used goes first.
//!
//! The evictor and the simulator order what they give up by it (`evict.rs`). A sample
//! offered as it is read ([`keeps`]) is read again next epoch, as every kept sample is:
//! keeping it in place of one would gain nothing, so it never displaces one and is kept
//! only while it fits under the keep limit (the capacity less the samples' window: `window::keep_limit`).
//! Under an order that reads every sample once an epoch (a permutation), any set of
//! samples kept until their next read is read once each the next epoch, so keeping the
//! first that come hits as often as Belady's MIN over samples does once the cache is full
//! (it too ends each epoch holding as many samples, each read once the next), and writes
//! each kept sample once instead of churning (`simulate/samples.rs` holds the rule
//! against Belady over samples). The link then carries each epoch what was read less what
//! was kept, never more than the reads: the first epoch 1.0x the dataset, later ones 1 -
//! keep limit / dataset.

use std::cmp::Ordering;

/// When the plans read something again: what the keep rule orders by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NextUse {
    /// No plan reads it again.
    Never,
    /// A shard a plan reads again, this many reads away.
    Reads(usize),
    /// A sample kept for the next epoch (a pack of them): further away than any shard a
    /// plan is reading or reads next.
    NextEpoch,
}

impl NextUse {
    /// A shard's, from the reads away of its next planned read (`None`: none).
    pub fn of_shard(reads_away: Option<usize>) -> Self {
        reads_away.map_or(NextUse::Never, NextUse::Reads)
    }

    /// A sample's as it is read, from its next planned read (`None`: none).
    pub fn of_sample(next_read: Option<u64>) -> Self {
        next_read.map_or(NextUse::Never, |_| NextUse::NextEpoch)
    }

    /// How far away, for the order: `None` never.
    fn distance(self) -> Option<usize> {
        match self {
            NextUse::Never => None,
            NextUse::Reads(reads) => Some(reads),
            NextUse::NextEpoch => Some(usize::MAX),
        }
    }
}

/// One thing the keep rule weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub next_use: NextUse,
    /// When a read last used it (ms).
    pub last_access: u64,
}

/// The keep rule: whether `a` is given up before `b` (see the module's documentation).
pub fn before(a: &Claim, b: &Claim) -> Ordering {
    match (a.next_use.distance(), b.next_use.distance()) {
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        // The furthest planned read first, then the least recently used.
        (x, y) => y.cmp(&x).then(a.last_access.cmp(&b.last_access)),
    }
}

/// Whether a sample of `length` bytes read with `next_read` (its next read planned, or
/// `None`) is kept, with `held` bytes held (kept, stored and being stored) under a keep
/// limit of `limit` bytes.
pub fn keeps(next_read: Option<u64>, length: u64, held: u64, limit: u64) -> bool {
    keeps_within(next_read, || held.saturating_add(length) <= limit)
}

/// [`keeps`] where `fits()` says whether the sample fits under the keep limit: the
/// spoke's check takes the sample's room in the same step (`Capacity::added_within`), so
/// that concurrent reads cannot each see room for one more.
pub fn keeps_within(next_read: Option<u64>, fits: impl FnOnce() -> bool) -> bool {
    // Read again next epoch, as every kept sample is: kept where it displaces none, under
    // the limit.
    NextUse::of_sample(next_read) == NextUse::NextEpoch && fits()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn claim(next_use: NextUse, last_access: u64) -> Claim {
        Claim { next_use, last_access }
    }

    #[test]
    fn unplanned_first_least_recently_used_first_then_the_furthest_read_and_kept_samples_before_shards() {
        let mut all = [
            claim(NextUse::Reads(3), 0),
            claim(NextUse::Never, 20),
            claim(NextUse::NextEpoch, 5),
            claim(NextUse::Reads(9), 0),
            claim(NextUse::Never, 10),
            claim(NextUse::NextEpoch, 1),
        ];
        all.sort_by(before);
        let order: Vec<(NextUse, u64)> = all.iter().map(|c| (c.next_use, c.last_access)).collect();
        assert_eq!(
            order,
            [
                (NextUse::Never, 10),
                (NextUse::Never, 20),
                (NextUse::NextEpoch, 1),
                (NextUse::NextEpoch, 5),
                (NextUse::Reads(9), 0),
                (NextUse::Reads(3), 0)
            ]
        );
    }

    #[test]
    fn a_sample_read_again_is_kept_first_come_under_the_limit() {
        assert!(keeps(Some(7), MIB, 0, 100 * MIB) && !keeps(None, MIB, 0, 100 * MIB));
        assert!(keeps(Some(7), MIB, 99 * MIB, 100 * MIB));
        assert!(!keeps(Some(7), MIB, 100 * MIB, 100 * MIB), "full: it displaces no kept sample");
    }
}
