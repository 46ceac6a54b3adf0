//! Samples fetched ahead of their reads, held until read: each a shared fetch (a read
//! that comes while it is in flight waits for it, one that comes after takes its bytes),
//! its bytes counted against the capacity while held (`Capacity::reserve`), and at most
//! the window's worth in all (`policy::window`, `follow.rs`). A sample no
//! read takes within [`STAGED_TTL`] is dropped (its job went another way).

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard, atomic::Ordering::Relaxed},
    time::{Duration, Instant},
};

use crate::{fetch::SharedFetch, store::capacity::Reservation};

/// How long a sample fetched ahead waits for its read: a job reads its window within
/// seconds; one that has not read it in a minute has moved on (a restarted job, a read
/// of another range).
pub const STAGED_TTL: Duration = Duration::from_secs(60);

/// (shard store id, offset, length): what a staged sample is.
pub type StagedKey = (u64, u64, u64);

#[derive(Debug)]
struct Held {
    bytes: SharedFetch,
    length: u64,
    since: Instant,
    _reserved: Reservation,
}

/// The samples held for their reads.
#[derive(Debug, Default)]
pub struct Staged {
    held: Mutex<HashMap<StagedKey, Held>>,
    /// Samples held: a read looks no further while there are none.
    count: std::sync::atomic::AtomicUsize,
}

impl Staged {
    fn held(&self) -> MutexGuard<'_, HashMap<StagedKey, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `bytes` (a fetch running or done) of `key` for its read, `reserved` in the
    /// capacity until then.
    pub fn hold(&self, key: StagedKey, bytes: SharedFetch, reserved: Reservation) {
        let held = Held { bytes, length: key.2, since: Instant::now(), _reserved: reserved };
        let mut all = self.held();
        all.insert(key, held);
        self.count.store(all.len(), Relaxed);
    }

    /// Whether `key` is held.
    pub fn has(&self, key: &StagedKey) -> bool {
        self.held().contains_key(key)
    }

    /// The fetch of `key` for its read, taken out.
    pub fn take(&self, key: &StagedKey) -> Option<SharedFetch> {
        if self.count.load(Relaxed) == 0 {
            return None;
        }
        let mut all = self.held();
        let taken = all.remove(key).map(|held| held.bytes);
        self.count.store(all.len(), Relaxed);
        taken
    }

    /// Bytes held (fetched or being fetched).
    pub fn bytes(&self) -> u64 {
        self.held().values().map(|h| h.length).sum()
    }

    /// Drops what waited past [`STAGED_TTL`]; the bytes dropped.
    pub fn expire(&self) -> u64 {
        let mut dropped = 0;
        let mut all = self.held();
        all.retain(|_, held| {
            let keep = held.since.elapsed() < STAGED_TTL;
            if !keep {
                dropped += held.length;
            }
            keep
        });
        self.count.store(all.len(), Relaxed);
        dropped
    }
}
