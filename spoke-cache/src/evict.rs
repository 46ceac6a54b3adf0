//! Keeps the cache under its capacity: when an admission crosses the high watermark
//! (`capacity.rs`), the evictor evicts shards until under the low watermark: by the
//! jobs' access plans (the one read again furthest in the future first, `plan.rs`), and
//! least recently used where no plan says, taking from the principals that hold more
//! than their share of the capacity first (`policy::shares`), so one tenant's scan
//! cannot push another's working set below its share. A shard's chunk files leave the
//! disk as it is evicted (see `store`), so nothing is compacted afterwards.
//!
//! Whole shards go first (a training epoch reads whole shards, so half a shard is worth
//! little); pinned shards never; shards held by a running prefetch only when nothing
//! else is left (a plan larger than the cache must not push it past its capacity).
//! Packs of kept samples (`kept.rs`) are read next epoch: they go after every shard no
//! plan reads again and before every shard a plan reads (its block or the next), least
//! recently used first.

use std::{collections::HashMap, sync::Arc};

use crate::{
    admission::Admission, capacity::Capacity, catalog::Catalog, entry::Entry, plan::Plans,
    policy::shares::Shares,
};

/// What eviction uses: the capacity, the catalog, the plans and the shares to choose, the
/// admission sink to remove.
#[derive(Debug, Clone)]
pub struct Evictor {
    pub capacity: Arc<Capacity>,
    pub catalog: Arc<Catalog>,
    pub plans: Arc<Plans>,
    pub admission: Arc<Admission>,
    pub shares: Arc<Shares>,
}

/// What eviction may take.
enum Target {
    Shard(Arc<Entry>),
    /// A pack of kept samples, by id.
    Pack(u64),
}

/// A shard or pack eviction may take.
struct Candidate {
    target: Target,
    holder: String,
    bytes: u64,
}

/// Where packs of kept samples stand among planned shards (`plan::evict_before`): read
/// again further away than any shard a plan is reading or reads next.
const PACK_DISTANCE: usize = usize::MAX;

impl Evictor {
    /// Every entry eviction may take, in the order it takes them where no share says
    /// otherwise: never a pinned one; one held by a prefetch last; among the rest, shards
    /// no plan reads again first, least recently used first, then the one whose next
    /// planned read is furthest away (see `plan::evict_before`).
    fn candidates(&self) -> Vec<Candidate> {
        let mut candidates: Vec<_> = self
            .catalog
            .entries()
            .into_iter()
            .filter_map(|e| {
                let (held, last_access, holder, bytes) = {
                    let state = e.state();
                    let bytes = state.record.cached_bytes();
                    if state.record.pinned || state.evicted || bytes == 0 {
                        return None;
                    }
                    (state.prefetching > 0, state.last_access, state.record.holder.clone(), bytes)
                };
                let next_use = self.plans.next_use(&(e.dataset.clone(), e.shard.clone()));
                Some(((held, (next_use, last_access)), Candidate { target: Target::Shard(e), holder, bytes }))
            })
            .collect();
        candidates.extend(self.admission.kept().candidates().into_iter().map(|pack| {
            let target = Target::Pack(pack.pack);
            (
                (false, (Some(PACK_DISTANCE), pack.last_access)),
                Candidate { target, holder: pack.holder, bytes: pack.bytes },
            )
        }));
        candidates.sort_by(|(a, _), (b, _)| a.0.cmp(&b.0).then_with(|| crate::plan::evict_before(a.1, b.1)));
        candidates.into_iter().map(|(_, c)| c).collect()
    }

    /// Bytes each principal holds among `candidates`.
    fn held(candidates: &[Candidate]) -> HashMap<String, u64> {
        let mut held: HashMap<String, u64> = HashMap::new();
        for c in candidates {
            *held.entry(c.holder.clone()).or_default() += c.bytes;
        }
        held
    }

    /// Where in `candidates` eviction takes next, `held` bytes per principal: the first
    /// of a principal over its share, else (`principal`: for an admission of its) the
    /// first of its own, else the first.
    fn pick(
        &self,
        candidates: &[Candidate],
        held: &HashMap<String, u64>,
        principal: Option<&str>,
    ) -> Option<usize> {
        let over = self.shares.over(held, self.capacity.capacity());
        candidates
            .iter()
            .position(|c| over.contains(&c.holder))
            .or_else(|| principal.and_then(|p| candidates.iter().position(|c| c.holder == p)))
            .or(if candidates.is_empty() { None } else { Some(0) })
    }

    /// The shard eviction would take next: for an admission by `principal`, the one its
    /// admission would displace (`policy::admit` weighs the two); `None` when it would
    /// take a pack of kept samples (read once a pass each: worth no more than what
    /// displaces them) or nothing.
    pub fn victim_for(&self, principal: Option<&str>) -> Option<Arc<Entry>> {
        let candidates = self.candidates();
        let held = Self::held(&candidates);
        match &candidates[self.pick(&candidates, &held, principal)?].target {
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
        let mut candidates = self.candidates();
        let mut held = Self::held(&candidates);
        while self.capacity.over_low() {
            if candidates.is_empty() {
                // Taken since the pass began (or admitted meanwhile): look again.
                candidates = self.candidates();
                held = Self::held(&candidates);
            }
            let Some(at) = self.pick(&candidates, &held, None) else {
                tracing::warn!(
                    used = self.capacity.used(),
                    target = self.capacity.low_watermark(),
                    "over capacity but every cached shard is pinned"
                );
                break;
            };
            let victim = candidates.remove(at);
            if let Some(h) = held.get_mut(&victim.holder) {
                *h = h.saturating_sub(victim.bytes);
            }
            match &victim.target {
                Target::Shard(entry) => {
                    let (evicted, freed) = self.admission.evict(std::slice::from_ref(entry)).await;
                    tracing::debug!(dataset = %entry.dataset, shard = %entry.shard, freed, "evicted");
                    shards += evicted;
                    bytes += freed;
                }
                Target::Pack(pack) => bytes += self.admission.evict_pack(*pack).await,
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
