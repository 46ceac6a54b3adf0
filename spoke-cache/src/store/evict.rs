//! Keeps the cache under its capacity: when an admission crosses the high watermark
//! (`capacity.rs`), the evictor evicts until under the low watermark, in the order
//! `policy::evict` gives (plan distance, tenant shares, packs of kept samples, recency:
//! the decision is there, tested beside its model; this is the I/O that applies it). A
//! shard's chunk files leave the disk as it is evicted (see `store`), so nothing is
//! compacted afterwards; a pack of kept samples leaves through the keeper (`kept/`).
//!
//! The plans are seen through [`NextUses`] (the store sits below the plans).

use std::{fmt::Debug, sync::Arc};

use crate::{
    policy::{
        evict::{Candidate, PACK_DISTANCE, Victims},
        shares::Shares,
    },
    store::{
        admission::Admission,
        capacity::Capacity,
        catalog::Catalog,
        entry::{Entry, ShardKey},
        kept::Keeper,
    },
};

/// What eviction asks of the jobs' plans (`plans::shards::Plans`): how far away a shard's
/// next planned read is, and to drop the plans no job follows any more before a pass.
pub trait NextUses: Debug + Send + Sync {
    /// Reads away of the next planned read of `key`; `None`: no plan reads it again.
    fn next_use(&self, key: &ShardKey) -> Option<usize>;
    fn expire(&self);
}

/// What eviction uses: the capacity, the catalog, the plans and the shares to choose, the
/// admission sink and the keeper to remove.
#[derive(Debug, Clone)]
pub struct Evictor {
    pub capacity: Arc<Capacity>,
    pub catalog: Arc<Catalog>,
    pub plans: Arc<dyn NextUses>,
    pub admission: Arc<Admission>,
    /// Packs of kept samples are evicted too (`kept/`).
    pub keeper: Arc<Keeper>,
    pub shares: Arc<Shares>,
}

/// What eviction may take.
#[derive(Debug, Clone)]
pub enum Target {
    Shard(Arc<Entry>),
    /// A pack of kept samples, by id.
    Pack(u64),
}

impl Evictor {
    /// Every shard and pack eviction may take (never a pinned shard), in the order it
    /// takes them (`policy::evict`).
    pub fn victims(&self) -> Victims<Target> {
        let mut candidates: Vec<Candidate<Target>> = self
            .catalog
            .entries()
            .into_iter()
            .filter_map(|e| {
                let state = e.state();
                let bytes = state.record.cached_bytes();
                if state.record.pinned || state.evicted || bytes == 0 {
                    return None;
                }
                let (prefetching, last_access, holder) =
                    (state.prefetching > 0, state.last_access, state.record.holder.clone());
                drop(state);
                let next_use = self.plans.next_use(&(e.dataset.clone(), e.shard.clone()));
                Some(Candidate { key: Target::Shard(e), holder, bytes, prefetching, next_use, last_access })
            })
            .collect();
        candidates.extend(self.keeper.samples().candidates().into_iter().map(|pack| Candidate {
            key: Target::Pack(pack.pack),
            holder: pack.holder,
            bytes: pack.bytes,
            prefetching: false,
            next_use: Some(PACK_DISTANCE),
            last_access: pack.last_access,
        }));
        Victims::new(candidates)
    }

    /// The shard eviction would take next: for an admission by `principal`, the one its
    /// admission would displace (`policy::admit` weighs the two); `None` when it would
    /// take a pack of kept samples (read once a pass each: worth no more than what
    /// displaces them) or nothing.
    pub fn victim_for(&self, principal: Option<&str>) -> Option<Arc<Entry>> {
        match &self.victims().peek(&self.shares, self.capacity.capacity(), principal)?.key {
            Target::Shard(entry) => Some(entry.clone()),
            Target::Pack(_) => None,
        }
    }

    /// The entry to evict next.
    pub fn victim(&self) -> Option<Arc<Entry>> {
        self.victim_for(None)
    }

    /// Evicts until the cache holds at most the low watermark; returns (shards, bytes).
    pub async fn to_low_watermark(&self) -> (u64, u64) {
        let _running = self.capacity.evicting();
        self.admission.retry_deletions().await;
        self.plans.expire();
        let (mut shards, mut bytes) = (0, 0);
        let mut victims = self.victims();
        while self.capacity.over_low() {
            if victims.is_empty() {
                // Taken since the pass began (or admitted meanwhile): look again.
                victims = self.victims();
            }
            let Some(victim) = victims.take(&self.shares, self.capacity.capacity(), None) else {
                tracing::warn!(
                    used = self.capacity.used(),
                    target = self.capacity.low_watermark(),
                    "over capacity but every cached shard is pinned"
                );
                break;
            };
            match &victim.key {
                Target::Shard(entry) => {
                    let (evicted, freed) = self.admission.evict(std::slice::from_ref(entry)).await;
                    tracing::debug!(dataset = %entry.dataset, shard = %entry.shard, freed, "evicted");
                    shards += evicted;
                    bytes += freed;
                }
                Target::Pack(pack) => bytes += self.keeper.evict_pack(*pack).await,
            }
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
