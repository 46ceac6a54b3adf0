//! Keeps the cache under its capacity: [`Capacity`] counts the bytes the cache holds and
//! wakes the evictor when an admission crosses the high watermark; the evictor then
//! evicts shards until under the low watermark: by the jobs' access plans (the one read
//! again furthest in the future first, `plan.rs`), and least recently used where no
//! plan says. A shard's chunk
//! files leave the disk as it is evicted (see `store`), so nothing is compacted
//! afterwards.
//!
//! Whole shards go first (a training epoch reads whole shards, so half a shard is worth
//! little); pinned shards never; shards held by a running prefetch only when nothing
//! else is left (a plan larger than the cache must not push it past its capacity).

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering::Relaxed},
};

use tokio::sync::Notify;

use crate::cache::{Cache, CacheConfig};

/// The bytes the cache holds against its capacity and watermarks.
#[derive(Debug)]
pub struct Capacity {
    capacity: u64,
    /// Eviction starts above this...
    high: u64,
    /// ...and stops at or below this.
    low: u64,
    used: AtomicU64,
    /// Evictions running (the evictor's pass, an `Evict` call).
    evicting: AtomicU64,
    wakeup: Notify,
}

impl Capacity {
    /// `config`'s capacity, with `used` bytes already held.
    pub fn new(config: &CacheConfig, used: u64) -> Self {
        let at = |fraction: f64| (config.capacity as f64 * fraction) as u64;
        Self {
            capacity: config.capacity,
            high: at(config.high_watermark),
            low: at(config.low_watermark),
            used: AtomicU64::new(used),
            evicting: AtomicU64::new(0),
            wakeup: Notify::new(),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes eviction stops at.
    pub fn low_watermark(&self) -> u64 {
        self.low
    }

    /// Bytes above which eviction starts.
    pub fn high_watermark(&self) -> u64 {
        self.high
    }

    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// `bytes` were admitted.
    pub fn added(&self, bytes: u64) {
        self.used.fetch_add(bytes, Relaxed);
        self.wake_if_over();
    }

    /// `bytes` left the cache.
    pub fn removed(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Relaxed);
    }

    /// Wakes the evictor when over the high watermark.
    pub fn wake_if_over(&self) {
        if self.used() > self.high {
            self.wakeup.notify_one();
        }
    }

    /// True while an eviction is running.
    pub fn is_evicting(&self) -> bool {
        self.evicting.load(Relaxed) > 0
    }

    /// Counts an eviction as running until the guard is dropped.
    pub(crate) fn evicting(&self) -> Evicting<'_> {
        self.evicting.fetch_add(1, Relaxed);
        Evicting(self)
    }
}

/// An eviction in progress (see [`Capacity::evicting`]).
#[derive(Debug)]
pub(crate) struct Evicting<'a>(&'a Capacity);

impl Drop for Evicting<'_> {
    fn drop(&mut self) {
        self.0.evicting.fetch_sub(1, Relaxed);
    }
}

/// Evicts until the cache holds at most the low watermark; returns (shards, bytes).
pub async fn evict_to_low_watermark(cache: &Arc<Cache>) -> (u64, u64) {
    let capacity = cache.capacity();
    let _running = capacity.evicting();
    let (mut shards, mut bytes) = (0, 0);
    while capacity.used() > capacity.low {
        let Some(victim) = cache.eviction_victim() else {
            tracing::warn!(
                used = capacity.used(),
                target = capacity.low,
                "over capacity but every cached shard is pinned"
            );
            break;
        };
        let (evicted, freed) = cache.evict(std::slice::from_ref(&victim)).await;
        tracing::debug!(dataset = %victim.dataset, shard = %victim.shard, freed, "evicted");
        shards += evicted;
        bytes += freed;
    }
    if shards > 0 {
        tracing::info!(shards, bytes, used = capacity.used(), "evicted to the low watermark");
    }
    (shards, bytes)
}

/// Runs eviction whenever an admission crosses the high watermark, until `shutdown`.
pub async fn run_evictor(cache: Arc<Cache>, shutdown: impl std::future::Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = cache.capacity().wakeup.notified() => {}
        }
        evict_to_low_watermark(&cache).await;
    }
}
