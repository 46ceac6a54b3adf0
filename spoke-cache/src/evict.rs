//! Keeps the cache under its capacity: above the high watermark, evict least recently
//! used shards until under the low watermark, then compact the freed key range so the
//! disk usage of `--cache-dir` really goes down.
//!
//! Whole shards go first (a training epoch reads whole shards, so half a shard is worth
//! little); pinned shards never; shards held by a running prefetch only when nothing
//! else is left (a plan larger than the cache must not push it past its capacity).

use std::sync::{Arc, atomic::Ordering::Relaxed};

use crate::cache::{Cache, blocking};

impl Cache {
    /// Evicts until `used <= capacity x low_watermark`; returns (shards, bytes) evicted.
    pub async fn evict_to_low_watermark(self: &Arc<Self>) -> (u64, u64) {
        self.evicting.fetch_add(1, Relaxed);
        let evicted = self.evict_and_reclaim().await;
        self.evicting.fetch_sub(1, Relaxed);
        evicted
    }

    /// True while an eviction pass (and the compaction after it) is running.
    pub fn is_evicting(&self) -> bool {
        self.evicting.load(Relaxed) > 0
    }

    async fn evict_and_reclaim(self: &Arc<Self>) -> (u64, u64) {
        let target = (self.config.capacity as f64 * self.config.low_watermark) as u64;
        let (mut shards, mut bytes) = (0, 0);
        let (mut lowest_id, mut highest_id) = (u64::MAX, 0);
        while self.used_bytes() > target {
            let Some(victim) = self.eviction_victim() else {
                tracing::warn!(
                    used = self.used_bytes(),
                    target,
                    "over capacity but every cached shard is pinned"
                );
                break;
            };
            let freed = self.drop_entry(&victim, true).await;
            tracing::debug!(dataset = %victim.dataset, shard = %victim.shard, freed, "evicted");
            shards += 1;
            bytes += freed;
            lowest_id = lowest_id.min(victim.id);
            highest_id = highest_id.max(victim.id);
        }
        if shards > 0 {
            self.metrics.evicted_shards.fetch_add(shards, Relaxed);
            self.metrics.evicted_bytes.fetch_add(bytes, Relaxed);
            self.reclaim(lowest_id, highest_id + 1).await;
            tracing::info!(shards, bytes, used = self.used_bytes(), "evicted to the low watermark");
        }
        (shards, bytes)
    }

    /// Compacts the pages of ids `[from, to)` so their files leave the disk.
    pub(crate) async fn reclaim(&self, from: u64, to: u64) {
        let store = self.store.clone();
        if let Err(e) = blocking(move || store.reclaim(from, to)).await {
            tracing::error!(error = %e, "compaction after eviction failed");
        }
    }
}

/// Runs eviction whenever an admission crosses the high watermark, until `shutdown`.
pub async fn run_evictor(cache: Arc<Cache>, shutdown: impl std::future::Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = cache.evict_wakeup.notified() => {}
        }
        cache.evict_to_low_watermark().await;
    }
}
