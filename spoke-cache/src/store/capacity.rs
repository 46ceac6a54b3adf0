//! The bytes the cache holds against its capacity and watermarks: admissions add,
//! removals subtract, and crossing the high watermark wakes the evictor (`store/evict.rs`).
//!
//! `--capacity` bounds the cache directory at every instant, not only between
//! evictions: a chunk claims its bytes ([`Capacity::claim`]) before its file is written,
//! and the bytes of a removed shard whose files a reader still held count until the
//! files leave the disk ([`Capacity::removed_lingering`]). Claims stop short of the capacity by
//! what the chunk files hold beside the data ([`Capacity::room`]): the bound holds for
//! shards of at least a chunk; a shard smaller than a chunk is a file of its own, up to
//! [`FILE_FRAMING`] beyond its data. RocksDB's log and MANIFEST are beside it (a few
//! hundred KiB, `Status.store_own_bytes`).
//!
//! The capacity in effect is `--capacity` until the cache's filesystem proves smaller
//! (another tenant of the disk, a wrong flag): when storing fails for lack of space, it
//! is lowered to what the filesystem holds (`Capacity::limit_to`) and the watermarks
//! with it, so the evictor makes room.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio::sync::Notify;

/// What a chunk file holds beside its data: a CRC32C per 64 KiB page and keys, under
/// 1/256 of the data...
pub const FRAMING_SHARE: u64 = 256;
/// ...and per file, its index, footer and the last filesystem block it fills in part:
/// at most this (a 256 KiB chunk's file takes 260 KiB of blocks, a 4 MiB one's 4.01 MiB).
pub const FILE_FRAMING: u64 = 8 << 10;

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
    /// Bytes claimed by chunks being written (in `used`, not yet stored).
    writing: AtomicU64,
    /// Bytes of removed shards whose files are still on the disk (a reader held them as
    /// they were deleted): not in `used`, so the evictor does not evict more for them,
    /// but claims count them.
    lingering: AtomicU64,
    /// Chunk size of the files claims are for ([`Capacity::room`]).
    chunk_size: u64,
    /// Evictions running (the evictor's pass, an `Evict` call).
    evicting: AtomicU64,
    wakeup: Notify,
    /// Woken whenever bytes leave (removed, or lingering files gone): claims waiting
    /// for room look again.
    freed: Notify,
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
            writing: AtomicU64::new(0),
            lingering: AtomicU64::new(0),
            chunk_size: u64::MAX,
            evicting: AtomicU64::new(0),
            wakeup: Notify::new(),
            freed: Notify::new(),
        }
    }

    /// Claims are for chunk files of `chunk_size` bytes (each one's [`FILE_FRAMING`]
    /// is left out of [`Capacity::room`]).
    pub fn with_chunk_files(mut self, chunk_size: u64) -> Self {
        self.chunk_size = chunk_size.max(1);
        self
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
        self.freed.notify_waiters();
    }

    /// The chunk data claims may hold: the capacity less what its files hold beside
    /// the data (1/[`FRAMING_SHARE`] of it, and [`FILE_FRAMING`] per chunk-sized file),
    /// so that the files fit in the capacity.
    pub fn room(&self) -> u64 {
        let capacity = self.capacity();
        let files = capacity / self.chunk_size + 1;
        capacity.saturating_sub(capacity / FRAMING_SHARE + files.saturating_mul(FILE_FRAMING))
    }

    /// Counts `bytes` (a chunk about to be written) if they fit in [`Capacity::room`]
    /// beside what is held and what lingers, decided and counted at once; whether they
    /// were. Wakes the evictor when over the high watermark, and when they did not fit.
    /// Counted as being written until [`Capacity::written`] (or [`Capacity::unclaim`]).
    pub fn claim(&self, bytes: u64) -> bool {
        let room = self.room().saturating_sub(self.lingering());
        if self.added_within(bytes, room) {
            self.writing.fetch_add(bytes, Relaxed);
            return true;
        }
        self.wakeup.notify_one();
        false
    }

    /// A claimed chunk's file is stored: its bytes are held, no longer being written.
    pub fn written(&self, bytes: u64) {
        self.writing.fetch_sub(bytes, Relaxed);
    }

    /// A claimed chunk was not stored (its write failed): its bytes leave.
    pub fn unclaim(&self, bytes: u64) {
        self.writing.fetch_sub(bytes, Relaxed);
        self.removed(bytes);
    }

    /// Bytes held and stored: `used` less the claims being written (what `Status` and
    /// the metrics report, and what a restart finds).
    pub fn stored(&self) -> u64 {
        self.used().saturating_sub(self.writing.load(Relaxed))
    }

    /// Bytes of removed shards whose files are still on the disk.
    pub fn lingering(&self) -> u64 {
        self.lingering.load(Relaxed)
    }

    /// `bytes` left the cache but their files are still on the disk: out of `used`,
    /// counted by claims until [`Capacity::gone`] (lingering first, so that no claim
    /// sees them in neither).
    pub fn removed_lingering(&self, bytes: u64) {
        self.lingering.fetch_add(bytes, Relaxed);
        self.used.fetch_sub(bytes, Relaxed);
    }

    /// Lingering `bytes` left the disk.
    pub fn gone(&self, bytes: u64) {
        self.lingering.fetch_sub(bytes, Relaxed);
        self.freed.notify_waiters();
    }

    /// Resolves when bytes next leave (a claim that did not fit waits on it).
    pub fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
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

    #[test]
    fn claims_leave_room_for_the_files_framing_and_count_lingering_bytes_until_gone() {
        const MIB: u64 = 1 << 20;
        // 16 MiB of 256 KiB chunk files: 1/256 and 8 KiB for each of 65 files are left out.
        let capacity = Capacity::new(16 * MIB, 0.95, 0.85, 0).with_chunk_files(256 << 10);
        assert_eq!(capacity.room(), 16 * MIB - 64 * 1024 - 65 * 8192);
        let claimed = std::iter::repeat_n(256 << 10, 100).take_while(|&chunk| capacity.claim(chunk)).count();
        assert_eq!(claimed, 61, "61 chunks of 256 KiB fit in the room, the 62nd does not");
        assert_eq!(capacity.stored(), 0, "claimed, not yet stored");
        capacity.written(61 * (256 << 10));
        assert_eq!(capacity.stored(), capacity.used());
        // Four chunks' files a reader still holds: out of `used`, still counted by claims.
        capacity.removed_lingering(MIB);
        assert!(!capacity.claim(256 << 10), "the lingering files still take their room");
        capacity.gone(MIB);
        assert!(capacity.claim(256 << 10), "their room is back once they are gone");
        assert_eq!(capacity.used(), 58 * (256 << 10));
    }
}
