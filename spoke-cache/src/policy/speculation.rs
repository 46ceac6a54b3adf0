//! Speculation under feedback: read-ahead and whole-shard fetches store chunks no read has
//! asked for yet, a bet that they will be read before they are evicted. Each such chunk
//! is counted when a read uses it (useful) or when it leaves the cache unread (wasted),
//! and the bets are sized by how they have gone, as Linux's readahead shrinks its window
//! on a miss and Mountpoint's prefetcher starts small again after a seek:
//!
//! - read-ahead follows sequential readers only (a read that begins where the last read
//!   of its shard ended), its window doubling with the run up to `--read-ahead-chunks`,
//!   and one chunk at most while the useful share is low;
//! - a shard's first miss fetches the rest of it only while the useful share is at least
//!   [`MIN_USEFUL_SHARE`], and once every [`PROBE_EVERY`] chances below it (to see whether
//!   the readers changed);
//! - speculation never holds more than [`SPECULATION_SHARE`] of the capacity unread.
//!
//! The counts halve once they add up to the capacity, so the share is that of the last
//! cache-full or so of speculation. Planned prefetch is not speculation: the plans say
//! what will be read.

use std::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering::Relaxed},
};

/// Useful share below which whole-shard fetches stop and read-ahead shrinks to a chunk:
/// below it, speculation brings more bytes that are evicted unread than bytes read.
pub const MIN_USEFUL_SHARE: f64 = 0.5;

/// Below [`MIN_USEFUL_SHARE`], one whole-shard fetch in this many chances still runs.
pub const PROBE_EVERY: u64 = 16;

/// Most of the capacity speculation may hold unread: the rest is for what readers read.
pub const SPECULATION_SHARE: f64 = 0.25;

#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Counts {
    useful: f64,
    wasted: f64,
}

/// What speculation brought and what came of it (see the module's documentation).
#[derive(Debug)]
pub struct Speculation {
    counts: Mutex<Counts>,
    /// Bytes stored by speculation that no read has used yet.
    unread: AtomicU64,
    capacity: u64,
    chances: AtomicU64,
}

impl Speculation {
    /// Speculation in a cache of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self { counts: Mutex::default(), unread: AtomicU64::new(0), capacity, chances: AtomicU64::new(0) }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, useful: u64, wasted: u64) {
        let mut counts = self.counts();
        counts.useful += useful as f64;
        counts.wasted += wasted as f64;
        if counts.useful + counts.wasted > self.capacity as f64 {
            counts.useful /= 2.0;
            counts.wasted /= 2.0;
        }
    }

    fn take_unread(&self, bytes: u64) {
        let _ = self.unread.fetch_update(Relaxed, Relaxed, |unread| Some(unread.saturating_sub(bytes)));
    }

    /// A speculative chunk of `bytes` was stored.
    pub fn stored(&self, bytes: u64) {
        self.unread.fetch_add(bytes, Relaxed);
    }

    /// A read used a speculative chunk of `bytes`.
    pub fn used(&self, bytes: u64) {
        self.take_unread(bytes);
        self.add(bytes, 0);
    }

    /// A speculative chunk of `bytes` left the cache unread (evicted).
    pub fn wasted(&self, bytes: u64) {
        self.take_unread(bytes);
        self.add(0, bytes);
    }

    /// A speculative chunk of `bytes` left for another reason (damaged, replaced by a
    /// new version): it says nothing about the bets.
    pub fn forgotten(&self, bytes: u64) {
        self.take_unread(bytes);
    }

    /// Bytes held unread.
    pub fn unread(&self) -> u64 {
        self.unread.load(Relaxed)
    }

    /// The share of speculative bytes that reads used, lately (1 before any counted).
    pub fn useful_share(&self) -> f64 {
        let counts = *self.counts();
        let total = counts.useful + counts.wasted;
        if total == 0.0 { 1.0 } else { counts.useful / total }
    }

    /// Whether `bytes` more may be stored by speculation, `in_flight` more being fetched.
    pub fn has_room(&self, bytes: u64, in_flight: u64) -> bool {
        let held = self.unread().saturating_add(in_flight).saturating_add(bytes);
        held as f64 <= self.capacity as f64 * SPECULATION_SHARE
    }

    /// Whether a shard's first miss may fetch the rest of it.
    pub fn whole_shards(&self) -> bool {
        self.useful_share() >= MIN_USEFUL_SHARE
            || self.chances.fetch_add(1, Relaxed).is_multiple_of(PROBE_EVERY)
    }

    /// Chunks to read ahead of a read that continued a run of `run` sequential reads
    /// (`configured`: `--read-ahead-chunks`): none for a read that did not, then 1, 2, 4,
    /// ... up to `configured`; at most 1 while the useful share is low.
    pub fn read_ahead(&self, configured: u64, run: u32) -> u64 {
        if run == 0 {
            return 0;
        }
        let window = 1u64.checked_shl(run - 1).unwrap_or(u64::MAX).min(configured);
        if self.useful_share() < MIN_USEFUL_SHARE { window.min(1) } else { window }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn wasted_bets_stop_whole_shard_fetches_and_shrink_read_ahead() {
        let speculation = Speculation::new(1024 * MIB);
        assert!(speculation.whole_shards(), "no evidence yet");
        assert_eq!([0, 1, 2, 3, 4].map(|run| speculation.read_ahead(4, run)), [0, 1, 2, 4, 4]);
        for _ in 0..10 {
            speculation.stored(4 * MIB);
        }
        speculation.used(4 * MIB);
        for _ in 0..9 {
            speculation.wasted(4 * MIB);
        }
        assert_eq!(speculation.unread(), 0);
        assert!((speculation.useful_share() - 0.1).abs() < 1e-9);
        let allowed = (0..PROBE_EVERY * 2).filter(|_| speculation.whole_shards()).count();
        assert_eq!(allowed, 2, "a probe in every {PROBE_EVERY} chances");
        assert_eq!(speculation.read_ahead(4, 3), 1, "one chunk while the bets are lost");
        // The readers turn sequential again: bets are won, and the share recovers.
        for _ in 0..40 {
            speculation.stored(4 * MIB);
            speculation.used(4 * MIB);
        }
        assert!(speculation.useful_share() > MIN_USEFUL_SHARE && speculation.whole_shards());
    }

    #[test]
    fn speculation_holds_at_most_its_share_of_the_capacity() {
        let speculation = Speculation::new(400 * MIB);
        assert!(speculation.has_room(100 * MIB, 0));
        speculation.stored(96 * MIB);
        assert!(!speculation.has_room(4 * MIB + 1, 0) && speculation.has_room(4 * MIB, 0));
        assert!(!speculation.has_room(0, 8 * MIB), "bytes on their way count too");
        speculation.forgotten(96 * MIB);
        assert_eq!(speculation.unread(), 0);
        assert_eq!(speculation.useful_share(), 1.0, "a forgotten chunk was no bet lost");
    }
}
