//! What a spoke following a job's samples (a plan whose blocks do not fit its capacity:
//! a uniform shuffle, a map-style sampler) holds, and what it keeps.
//!
//! - The *window*: samples fetched ahead of their reads, in batches of ranges, held in
//!   memory until read. It must hold what the link carries in one fetch's time (the
//!   bandwidth-delay product: ~15 MB at 2 Gbit/s and 60 ms), and it comes out of the
//!   capacity: [`window_bound`].
//! - What is *kept* for a later epoch: a sample read is stored when the plan says it is
//!   read again and it fits below [`keep_limit`] (the capacity less the window); a
//!   sample kept stays until it is read again. Under an order that reads every sample once
//!   an epoch (a permutation), any set of samples kept until their next read is read
//!   once each the next epoch, so keeping the first that come, never displacing one kept
//!   for one read later, hits as often as Belady's MIN does once the cache is full (it
//!   too ends each epoch holding as many samples, each read once the next), and writes
//!   each kept sample once instead of churning (`simulate.rs` holds the rule against
//!   Belady over samples).
//!
//! The link then carries each epoch what was read less what was kept, never more than
//! the reads: the first epoch 1.0x the dataset, later ones 1 - keep limit / dataset.

/// The window's least share of the capacity: what the watermarks leave above the low one,
/// so that a cache full of kept samples and a full window is at its capacity.
pub const WINDOW_SHARE: f64 = 1.0 - crate::policy::evict::LOW_WATERMARK;

/// The window a small cache gives at least: what fills the link for one round trip (16
/// MiB in flight carry ~250 MB/s over 60 ms: `link-bench`), but never more than
/// [`WINDOW_MAX_SHARE`] of the capacity. A cache a tenth of the data's size keeps a tenth
/// at best: its reads are worth more than its keeps.
pub const WINDOW_FILL: u64 = 16 << 20;
pub const WINDOW_MAX_SHARE: f64 = 0.6;

/// Bytes of samples a spoke of `capacity` holds fetched ahead of their reads.
pub fn window_bound(capacity: u64) -> u64 {
    let least = (capacity as f64 * WINDOW_SHARE) as u64;
    let most = (capacity as f64 * WINDOW_MAX_SHARE) as u64;
    least.max(WINDOW_FILL.min(most))
}

/// Bytes a spoke of `capacity` holds at most, kept samples and chunks, while it follows
/// samples: the capacity less the window.
pub fn keep_limit(capacity: u64) -> u64 {
    capacity.saturating_sub(window_bound(capacity))
}

/// Whether a sample of `length` bytes read with `next_use` (its next read planned, or
/// `None`) is kept, with `held` bytes held (kept, stored and being stored) of a cache of
/// `capacity`.
pub fn keeps(next_use: Option<u64>, length: u64, held: u64, capacity: u64) -> bool {
    keeps_within(next_use, capacity, |limit| held.saturating_add(length) <= limit)
}

/// [`keeps`] where `fits(limit)` says whether the sample fits under the keep limit: the
/// spoke's check takes the sample's room in the same step (`Capacity::added_within`), so
/// that concurrent reads cannot each see room for one more.
pub fn keeps_within(next_use: Option<u64>, capacity: u64, fits: impl FnOnce(u64) -> bool) -> bool {
    next_use.is_some() && fits(keep_limit(capacity))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_window_fills_the_link_where_the_cache_can_spare_it_and_the_rest_is_kept() {
        // Half of 256 MiB: the watermarks' 15% (19.2 MiB) is more than a fill.
        assert_eq!(window_bound(128 * MIB), (128.0 * MIB as f64 * 0.15) as u64);
        assert_eq!(keep_limit(128 * MIB), 128 * MIB - window_bound(128 * MIB));
        // An eighth of it: a fill of the link, not 15% (4.8 MiB would starve the reads).
        assert_eq!(window_bound(32 * MIB), 16 * MIB);
        // Tiny: at most 60%.
        assert_eq!(window_bound(10 * MIB), 6 * MIB);
        assert!(keeps(Some(7), MIB, 0, 128 * MIB) && !keeps(None, MIB, 0, 128 * MIB));
        assert!(!keeps(Some(7), MIB, keep_limit(128 * MIB), 128 * MIB), "full");
    }
}
