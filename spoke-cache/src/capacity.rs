//! The bytes the cache holds against its capacity and watermarks: admissions add,
//! removals subtract, and crossing the high watermark wakes the evictor (`evict.rs`).
//!
//! The capacity in effect is `--capacity` until the cache's filesystem proves smaller
//! (another tenant of the disk, a wrong flag): when storing fails for lack of space, it
//! is lowered to what the filesystem holds (`Capacity::limit_to`) and the watermarks
//! with it, so the evictor makes room.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio::sync::Notify;

/// Eviction starts above 95% of the capacity and frees down to 85%: a 10% band means one
/// eviction pass (and one compaction) per ~10% of capacity written, not one per chunk.
pub const HIGH_WATERMARK: f64 = 0.95;
pub const LOW_WATERMARK: f64 = 0.85;

/// The bytes the cache holds against its capacity and watermarks.
#[derive(Debug)]
pub struct Capacity {
    /// `--capacity`.
    configured: u64,
    /// The capacity in effect: `configured`, or less once the filesystem filled first.
    capacity: AtomicU64,
    /// Eviction starts above this fraction of the capacity in effect...
    high_watermark: f64,
    /// ...and stops at or below this one.
    low_watermark: f64,
    used: AtomicU64,
    /// Bytes being fetched to be stored (not yet in `used`): what has room is decided
    /// before the bytes arrive, so concurrent misses must see each other's.
    reserved: AtomicU64,
    /// Evictions running (the evictor's pass, an `Evict` call).
    evicting: AtomicU64,
    wakeup: Notify,
}

impl Capacity {
    /// `capacity` bytes, eviction from `high_watermark` x capacity down to
    /// `low_watermark` x capacity, with `used` bytes already held.
    pub fn new(capacity: u64, high_watermark: f64, low_watermark: f64, used: u64) -> Self {
        Self {
            configured: capacity,
            capacity: AtomicU64::new(capacity),
            high_watermark,
            low_watermark,
            used: AtomicU64::new(used),
            reserved: AtomicU64::new(0),
            evicting: AtomicU64::new(0),
            wakeup: Notify::new(),
        }
    }

    /// The capacity in effect.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Relaxed)
    }

    /// `--capacity`.
    pub fn configured(&self) -> u64 {
        self.configured
    }

    /// Lowers the capacity in effect to `bytes` (what the filesystem holds) when that is
    /// less, and wakes the evictor; whether it was lowered.
    pub fn limit_to(&self, bytes: u64) -> bool {
        let lowered = self.capacity.fetch_min(bytes, Relaxed) > bytes;
        if lowered {
            self.wakeup.notify_one();
        }
        lowered
    }

    fn at(&self, fraction: f64) -> u64 {
        (self.capacity() as f64 * fraction) as u64
    }

    /// Bytes eviction stops at.
    pub fn low_watermark(&self) -> u64 {
        self.at(self.low_watermark)
    }

    /// Bytes above which eviction starts.
    pub fn high_watermark(&self) -> u64 {
        self.at(self.high_watermark)
    }

    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Bytes being fetched to be stored.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Relaxed)
    }

    /// Whether `bytes` more fit below the low watermark, with what is held and what is
    /// being fetched to be stored: while they do, every miss is stored (`policy::admit`).
    pub fn has_room(&self, bytes: u64) -> bool {
        self.used().saturating_add(self.reserved()).saturating_add(bytes) <= self.low_watermark()
    }

    /// Counts `bytes` as being fetched to be stored until the guard is dropped.
    pub fn reserve(self: &std::sync::Arc<Self>, bytes: u64) -> Reservation {
        self.reserved.fetch_add(bytes, Relaxed);
        Reservation { capacity: self.clone(), bytes }
    }

    /// Above the low watermark: eviction has work.
    pub fn over_low(&self) -> bool {
        self.used() > self.low_watermark()
    }

    /// `bytes` were admitted.
    pub fn added(&self, bytes: u64) {
        self.used.fetch_add(bytes, Relaxed);
        self.wake_if_over();
    }

    /// `bytes` added only if the cache then holds at most `limit`, decided and counted at
    /// once (two callers cannot both pass a check that only one of them fits): whether
    /// they were.
    pub fn added_within(&self, bytes: u64, limit: u64) -> bool {
        let fits =
            self.used.fetch_update(Relaxed, Relaxed, |used| used.checked_add(bytes).filter(|&u| u <= limit));
        if fits.is_ok() {
            self.wake_if_over();
        }
        fits.is_ok()
    }

    /// `bytes` left the cache.
    pub fn removed(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Relaxed);
    }

    /// Wakes the evictor when over the high watermark.
    pub fn wake_if_over(&self) {
        if self.used() > self.high_watermark() {
            self.wakeup.notify_one();
        }
    }

    /// Waits until the evictor is woken.
    pub async fn woken(&self) {
        self.wakeup.notified().await;
    }

    /// True while an eviction is running.
    pub fn is_evicting(&self) -> bool {
        self.evicting.load(Relaxed) > 0
    }

    /// Counts an eviction as running until the guard is dropped.
    pub fn evicting(&self) -> Evicting<'_> {
        self.evicting.fetch_add(1, Relaxed);
        Evicting(self)
    }
}

/// Bytes being fetched to be stored (see [`Capacity::reserve`]).
#[derive(Debug)]
pub struct Reservation {
    capacity: std::sync::Arc<Capacity>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.capacity.reserved.fetch_sub(self.bytes, Relaxed);
    }
}

/// An eviction in progress (see [`Capacity::evicting`]).
#[derive(Debug)]
pub struct Evicting<'a>(&'a Capacity);

impl Drop for Evicting<'_> {
    fn drop(&mut self) {
        self.0.evicting.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_added_within_a_limit_never_pass_it_from_many_threads() {
        // 64 threads each adding 16 KiB samples against a limit of 100 of them: exactly
        // 100 fit, whatever the interleaving (a check then an add let one more in).
        let capacity = std::sync::Arc::new(Capacity::new(1 << 30, 0.95, 0.9, 0));
        let limit = 100 * 16_384;
        let added: u64 = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..64)
                .map(|_| {
                    let capacity = capacity.clone();
                    scope.spawn(move || {
                        (0..10).filter(|_| capacity.added_within(16_384, limit)).count() as u64
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        assert_eq!((added, capacity.used()), (100, limit));
        assert!(!capacity.added_within(1, limit), "full");
    }
}
