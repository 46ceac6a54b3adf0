//! Keeps the cache under its capacity: above the high watermark, evict least recently
//! used shards until under the low watermark. A shard's chunk files leave the disk as
//! it is evicted (see `store`), so nothing is compacted afterwards.
//!
//! Whole shards go first (a training epoch reads whole shards, so half a shard is worth
//! little); pinned shards never; shards held by a running prefetch only when nothing
//! else is left (a plan larger than the cache must not push it past its capacity).

use std::sync::{Arc, atomic::Ordering::Relaxed};

use crate::cache::Cache;

impl Cache {
    /// Evicts until `used <= capacity x low_watermark`; returns (shards, bytes) evicted.
    pub async fn evict_to_low_watermark(self: &Arc<Self>) -> (u64, u64) {
        self.evicting.fetch_add(1, Relaxed);
        let evicted = self.evict_least_recently_used().await;
        self.evicting.fetch_sub(1, Relaxed);
        evicted
    }

    /// True while an eviction pass is running.
    pub fn is_evicting(&self) -> bool {
        self.evicting.load(Relaxed) > 0
    }

    async fn evict_least_recently_used(self: &Arc<Self>) -> (u64, u64) {
        let target = (self.config.capacity as f64 * self.config.low_watermark) as u64;
        let (mut shards, mut bytes) = (0, 0);
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
        }
        if shards > 0 {
            self.metrics.evicted_shards.fetch_add(shards, Relaxed);
            self.metrics.evicted_bytes.fetch_add(bytes, Relaxed);
            tracing::info!(shards, bytes, used = self.used_bytes(), "evicted to the low watermark");
        }
        (shards, bytes)
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
