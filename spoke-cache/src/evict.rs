//! Keeps the cache under its capacity: when an admission crosses the high watermark
//! (`capacity.rs`), the evictor evicts shards until under the low watermark: by the
//! jobs' access plans (the one read again furthest in the future first, `plan.rs`), and
//! least recently used where no plan says. A shard's chunk files leave the disk as it is
//! evicted (see `store`), so nothing is compacted afterwards.
//!
//! Whole shards go first (a training epoch reads whole shards, so half a shard is worth
//! little); pinned shards never; shards held by a running prefetch only when nothing
//! else is left (a plan larger than the cache must not push it past its capacity).

use std::sync::Arc;

use crate::{admission::Admission, capacity::Capacity, entry::Entry, index::Index, plan::Plans};

/// What eviction uses: the capacity, the index and the plans to choose, the admission
/// sink to remove.
#[derive(Debug, Clone)]
pub struct Evictor {
    pub capacity: Arc<Capacity>,
    pub index: Arc<Index>,
    pub plans: Arc<Plans>,
    pub admission: Arc<Admission>,
}

impl Evictor {
    /// The entry to evict next: never a pinned one; one held by a prefetch only when
    /// nothing else is left; among the rest, shards no plan reads again first, least
    /// recently used first, then the one whose next planned read is furthest away (see
    /// `plan::evict_before`).
    pub fn victim(&self) -> Option<Arc<Entry>> {
        let candidates = self.index.entries().into_iter().filter_map(|e| {
            let (held, last_access) = {
                let state = e.state();
                let evictable = !state.record.pinned && !state.evicted && state.record.cached_bytes() > 0;
                if !evictable {
                    return None;
                }
                (state.prefetching > 0, state.last_access)
            };
            let next_use = self.plans.next_use(&(e.dataset.clone(), e.shard.clone()));
            Some((held, (next_use, last_access), e))
        });
        candidates
            .min_by(|a, b| a.0.cmp(&b.0).then_with(|| crate::plan::evict_before(a.1, b.1)))
            .map(|(_, _, e)| e)
    }

    /// Evicts until the cache holds at most the low watermark; returns (shards, bytes).
    pub async fn to_low_watermark(&self) -> (u64, u64) {
        let _running = self.capacity.evicting();
        self.admission.retry_deletions().await;
        self.plans.expire();
        let (mut shards, mut bytes) = (0, 0);
        while self.capacity.over_low() {
            let Some(victim) = self.victim() else {
                tracing::warn!(
                    used = self.capacity.used(),
                    target = self.capacity.low_watermark(),
                    "over capacity but every cached shard is pinned"
                );
                break;
            };
            let (evicted, freed) = self.admission.evict(std::slice::from_ref(&victim)).await;
            tracing::debug!(dataset = %victim.dataset, shard = %victim.shard, freed, "evicted");
            shards += evicted;
            bytes += freed;
        }
        if shards > 0 {
            tracing::info!(shards, bytes, used = self.capacity.used(), "evicted to the low watermark");
        }
        (shards, bytes)
    }

    /// Runs eviction whenever an admission crosses the high watermark, until `shutdown`.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = self.capacity.woken() => {}
            }
            self.to_low_watermark().await;
        }
    }
}
