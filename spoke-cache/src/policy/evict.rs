//! The eviction order: which of what the cache holds it gives up first. One pure
//! function of views of the candidates ([`Victims`]); the evictor (`store/evict.rs`) is
//! the I/O loop that applies it, and the simulator (`simulate.rs`) calls the same, so the
//! model tests what runs.
//!
//! The order, where no tenant's share says otherwise:
//! 1. never a pinned shard (not a candidate at all);
//! 2. shards held by a running prefetch last (a plan larger than the cache must not push
//!    it past its capacity);
//! 3. among the rest, the keep rule (`keep.rs`): shards no plan reads again first, least
//!    recently used first; then packs of kept samples (read next epoch, further away
//!    than any shard a plan is reading or reads next), least recently used first; then
//!    planned shards, the one whose next planned read is furthest away first (Belady).
//!
//! Shares (`shares.rs`) bend the order: the first candidate of a principal holding more
//! than its share goes first; else, for an admission by a principal, its own first (its
//! admission displaces its own bytes before another's within its share).
//!
//! Eviction starts above [`HIGH_WATERMARK`] of the capacity and frees down to
//! [`LOW_WATERMARK`].

use std::collections::HashMap;

use super::{
    keep::{self, Claim, NextUse},
    shares::Shares,
};

/// Eviction starts above 95% of the capacity and frees down to 85%: a 10% band means one
/// eviction pass (and one compaction) per ~10% of capacity written, not one per chunk.
pub const HIGH_WATERMARK: f64 = 0.95;
pub const LOW_WATERMARK: f64 = 0.85;

/// What eviction knows of one thing it may take (`key` names it to the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<K> {
    pub key: K,
    /// The principal whose share it counts in.
    pub holder: String,
    pub bytes: u64,
    /// Held by a running prefetch: taken last.
    pub prefetching: bool,
    /// When the plans read it again ([`NextUse::NextEpoch`] for a pack of kept samples).
    pub next_use: NextUse,
    /// When a read last used it (ms).
    pub last_access: u64,
}

impl<K> Candidate<K> {
    /// What the keep rule weighs of it.
    fn claim(&self) -> Claim {
        Claim { next_use: self.next_use, last_access: self.last_access }
    }
}

/// The candidates in the order eviction takes them, with the bytes each principal holds
/// among them.
#[derive(Debug, Clone)]
pub struct Victims<K> {
    order: Vec<Candidate<K>>,
    held: HashMap<String, u64>,
}

impl<K> Victims<K> {
    /// `candidates` in eviction's order (see the module's documentation).
    pub fn new(mut candidates: Vec<Candidate<K>>) -> Self {
        candidates.sort_by(|a, b| {
            a.prefetching.cmp(&b.prefetching).then_with(|| keep::before(&a.claim(), &b.claim()))
        });
        let mut held: HashMap<String, u64> = HashMap::new();
        for c in &candidates {
            *held.entry(c.holder.clone()).or_default() += c.bytes;
        }
        Self { order: candidates, held }
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Where eviction takes next with `shares` of `capacity` (for an admission by
    /// `principal`, the one it would displace): the first of a principal over its share,
    /// else the first of `principal`'s own, else the first.
    fn position(&self, shares: &Shares, capacity: u64, principal: Option<&str>) -> Option<usize> {
        if self.order.is_empty() {
            return None;
        }
        let over = shares.over(&self.held, capacity);
        self.order
            .iter()
            .position(|c| over.contains(&c.holder))
            .or_else(|| principal.and_then(|p| self.order.iter().position(|c| c.holder == p)))
            .or(Some(0))
    }

    /// The candidate eviction would take next, left in place.
    pub fn peek(&self, shares: &Shares, capacity: u64, principal: Option<&str>) -> Option<&Candidate<K>> {
        self.position(shares, capacity, principal).map(|at| &self.order[at])
    }

    /// The candidate eviction takes next, taken out (its bytes no longer held).
    pub fn take(&mut self, shares: &Shares, capacity: u64, principal: Option<&str>) -> Option<Candidate<K>> {
        let at = self.position(shares, capacity, principal)?;
        let victim = self.order.remove(at);
        if let Some(h) = self.held.get_mut(&victim.holder) {
            *h = h.saturating_sub(victim.bytes);
        }
        Some(victim)
    }

    /// Takes victims while the cache holds more than `target` of its `used` bytes; what
    /// it took, in order (the simulator's pass; the evictor's applies [`Self::take`] the
    /// same way, with its I/O between).
    pub fn take_until(
        &mut self,
        shares: &Shares,
        capacity: u64,
        mut used: u64,
        target: u64,
    ) -> Vec<Candidate<K>> {
        let mut taken = Vec::new();
        while used > target {
            let Some(victim) = self.take(shares, capacity, None) else { break };
            used = used.saturating_sub(victim.bytes);
            taken.push(victim);
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(key: u32, holder: &str, next_use: NextUse, last_access: u64) -> Candidate<u32> {
        Candidate { key, holder: holder.into(), bytes: 10, prefetching: false, next_use, last_access }
    }

    fn order(victims: &mut Victims<u32>, shares: &Shares, capacity: u64) -> Vec<u32> {
        std::iter::from_fn(|| victims.take(shares, capacity, None).map(|c| c.key)).collect()
    }

    #[test]
    fn unplanned_lru_first_then_packs_then_the_furthest_planned_read_and_prefetches_last() {
        let mut prefetched = candidate(1, "a", NextUse::Never, 0);
        prefetched.prefetching = true;
        let mut victims = Victims::new(vec![
            prefetched,
            candidate(2, "a", NextUse::Reads(3), 0),
            candidate(3, "a", NextUse::Never, 20),
            candidate(4, "a", NextUse::NextEpoch, 5),
            candidate(5, "a", NextUse::Reads(9), 0),
            candidate(6, "a", NextUse::Never, 10),
        ]);
        assert_eq!(order(&mut victims, &Shares::default(), 1_000), [6, 3, 4, 5, 2, 1]);
    }

    #[test]
    fn eviction_takes_from_those_over_their_share_then_the_admitter_then_in_order() {
        let shares = Shares::default();
        let held = |bob: u64| {
            let mut v = vec![candidate(0, "alice", NextUse::Never, 0)];
            v.extend((1..=bob).map(|i| candidate(i as u32, "bob", NextUse::Never, i)));
            v.push(candidate(99, "carol", NextUse::Never, 100));
            Victims::new(v)
        };
        // bob holds 60 of 80 bytes: over a third; he loses his first.
        assert_eq!(held(6).peek(&shares, 100, None).map(|c| c.key), Some(1));
        // even: in order, or carol's own for an admission of hers.
        let even = held(1);
        assert_eq!(even.peek(&shares, 100, None).map(|c| c.key), Some(0));
        assert_eq!(even.peek(&shares, 100, Some("carol")).map(|c| c.key), Some(99));
        assert!(Victims::<u32>::new(Vec::new()).peek(&shares, 100, None).is_none());
        // Taking updates what is held: bob's bytes go until he is within his share.
        let mut bob = held(6);
        let taken = order(&mut bob, &shares, 100);
        assert_eq!(taken[..3], [1, 2, 3], "{taken:?}");
    }
}
