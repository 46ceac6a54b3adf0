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
        evict::{Candidate, Victims},
        keep::NextUse,
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

/// What eviction asks of the jobs' plans (`plans::Plans`): how far away a shard's
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
                let next_use = NextUse::of_shard(self.plans.next_use(&(e.dataset.clone(), e.shard.clone())));
                Some(Candidate { key: Target::Shard(e), holder, bytes, prefetching, next_use, last_access })
            })
            .collect();
        candidates.extend(self.keeper.samples().candidates().into_iter().map(|pack| Candidate {
            key: Target::Pack(pack.pack),
            holder: pack.holder,
            bytes: pack.bytes,
            prefetching: false,
            next_use: NextUse::NextEpoch,
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

#[cfg(test)]
mod tests {
    //! The evictor against the model: the same random candidates (plan distance, shares,
    //! packs, recency, pins, prefetches) given to the real evictor over an in-memory
    //! catalog and a real store, and to the simulator's pass over the same candidates as
    //! it sees them (`Victims::take_until`): the evictor takes what the model takes, and
    //! would displace what it would.

    use std::{
        collections::HashMap,
        sync::{
            Arc,
            atomic::{AtomicU64, Ordering::Relaxed},
        },
        time::Duration,
    };

    use proptest::prelude::*;

    use super::*;
    use crate::{
        observe::metrics::Metrics,
        policy::{evict::LOW_WATERMARK, speculation::Speculation},
        store::{PackedSample, Store, StoreOptions, kept::index::KeptSamples, layout::ShardRecord},
    };

    const CHUNK: u64 = 64 << 10;
    const HOLDERS: [&str; 3] = ["alice", "bob", "carol"];

    /// Plan distances, as the plans would give them.
    #[derive(Debug, Default)]
    struct Distances(HashMap<ShardKey, usize>);

    impl NextUses for Distances {
        fn next_use(&self, key: &ShardKey) -> Option<usize> {
            self.0.get(key).copied()
        }

        fn expire(&self) {}
    }

    /// One generated shard.
    #[derive(Debug, Clone)]
    struct Shard {
        holder: usize,
        chunks: u8,
        pinned: bool,
        prefetching: bool,
        /// Its next planned read, reads away.
        planned: Option<u16>,
        last_access: u16,
    }

    impl Shard {
        /// Recency and plan distances made unique by the shard's place (no ties: the
        /// order of equals is the catalog's, a hash map's).
        fn last_access(&self, i: usize) -> u64 {
            u64::from(self.last_access) * 16 + i as u64
        }

        fn next_use(&self, i: usize) -> Option<usize> {
            self.planned.map(|reads_away| usize::from(reads_away) * 16 + i)
        }
    }

    fn shard() -> impl Strategy<Value = Shard> {
        (
            0..HOLDERS.len(),
            1u8..=4,
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.15),
            prop::option::weighted(0.5, 0u16..500),
            0u16..1000,
        )
            .prop_map(|(holder, chunks, pinned, prefetching, planned, last_access)| Shard {
                holder,
                chunks,
                pinned,
                prefetching,
                planned,
                last_access,
            })
    }

    /// A case: the shards, a pack of kept samples (chunks' worth of bytes), the tenants'
    /// weights, the capacity as a share of what the cache holds, and who admits.
    #[derive(Debug, Clone)]
    struct Case {
        shards: Vec<Shard>,
        pack: Option<u8>,
        weights: [u8; 3],
        room: f64,
        admitter: Option<usize>,
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            prop::collection::vec(shard(), 1..10),
            prop::option::of(1u8..=4),
            [1u8..4, 1u8..4, 1u8..4],
            0.5f64..1.4,
            prop::option::of(0..HOLDERS.len()),
        )
            .prop_map(|(shards, pack, weights, room, admitter)| Case {
                shards,
                pack,
                weights,
                room,
                admitter,
            })
    }

    thread_local! {
        /// One store for the cases of a thread (each case's shards have ids of their own).
        static STORE: (Arc<Store>, Arc<tempfile::TempDir>) = {
            let dir = tempfile::tempdir().unwrap();
            (Arc::new(Store::open(dir.path(), &StoreOptions::default()).unwrap()), Arc::new(dir))
        };
    }

    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    /// Cases whose pass took something (the generator must reach the evictor's work).
    static PASSES_THAT_TOOK: AtomicU64 = AtomicU64::new(0);

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        #[test]
        fn the_evictor_takes_what_the_model_takes(case in case()) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let (store, _dir) = STORE.with(|s| s.clone());
            runtime.block_on(check(&store, &case))?;
        }
    }

    #[test]
    fn the_generated_cases_make_the_evictor_work() {
        // Run here too, so that this test does not depend on the order tests run in.
        let (store, _dir) = STORE.with(|s| s.clone());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut runner =
            proptest::test_runner::TestRunner::new(ProptestConfig { cases: 200, ..Default::default() });
        let before = PASSES_THAT_TOOK.load(Relaxed);
        runner.run(&case(), |case| runtime.block_on(check(&store, &case))).unwrap();
        let took = PASSES_THAT_TOOK.load(Relaxed) - before;
        assert!(took > 50, "only {took} of 200 passes took anything");
    }

    /// The model's candidates: the case as the simulator sees it.
    fn model(case: &Case) -> Victims<String> {
        let mut candidates: Vec<Candidate<String>> = case
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.pinned)
            .map(|(i, s)| Candidate {
                key: format!("s{i}"),
                holder: HOLDERS[s.holder].into(),
                bytes: u64::from(s.chunks) * CHUNK,
                prefetching: s.prefetching,
                next_use: NextUse::of_shard(s.next_use(i)),
                last_access: s.last_access(i),
            })
            .collect();
        candidates.extend(case.pack.map(|chunks| Candidate {
            key: "pack".into(),
            holder: String::new(), // a pack loaded at startup counts in no one's share
            bytes: u64::from(chunks) * CHUNK,
            prefetching: false,
            next_use: NextUse::NextEpoch,
            last_access: 0,
        }));
        Victims::new(candidates)
    }

    async fn check(store: &Arc<Store>, case: &Case) -> Result<(), TestCaseError> {
        let (catalog, _) = Catalog::load(store.clone(), CHUNK, Duration::from_secs(60)).unwrap();
        let catalog = Arc::new(catalog);
        let mut distances = Distances::default();
        let mut used = 0;
        for (i, s) in case.shards.iter().enumerate() {
            let record = ShardRecord {
                id: NEXT_ID.fetch_add(1, Relaxed),
                version: "v".into(),
                size: u64::from(s.chunks) * CHUNK,
                chunk_size: CHUNK as u32,
                present: vec![(1u8 << s.chunks) - 1],
                pinned: s.pinned,
                holder: HOLDERS[s.holder].into(),
                ..Default::default()
            };
            used += record.cached_bytes();
            let entry = Entry::new("ds".into(), format!("s{i}"), record, s.last_access(i));
            entry.hold_for_prefetch(s.prefetching);
            if let Some(next_use) = s.next_use(i) {
                distances.0.insert(("ds".into(), format!("s{i}")), next_use);
            }
            catalog.insert(Arc::new(entry));
        }
        let packs = case.pack.map(|chunks| {
            let sample = PackedSample {
                dataset: "ds".into(),
                shard: "kept".into(),
                version: "v".into(),
                offset: 0,
                length: u64::from(chunks) * CHUNK,
            };
            (NEXT_ID.fetch_add(1, Relaxed), vec![sample])
        });
        let (samples, kept_bytes) = KeptSamples::load(packs.into_iter().collect());
        used += kept_bytes;
        let capacity = (used as f64 / LOW_WATERMARK * case.room) as u64;
        let metrics = Arc::new(Metrics::default());
        let counted = Arc::new(Capacity::new(capacity, 0.95, LOW_WATERMARK, used));
        let admission = Arc::new(Admission::new(
            store.clone(),
            catalog.clone(),
            (counted.clone(), Arc::new(Speculation::new(capacity))),
            metrics.clone(),
        ));
        let weights: Vec<String> =
            HOLDERS.iter().zip(case.weights).map(|(h, w)| format!("{h}={w}")).collect();
        let shares = Shares::parse(&weights.join(",")).unwrap();
        let evictor = Evictor {
            capacity: counted.clone(),
            catalog: catalog.clone(),
            plans: Arc::new(distances),
            keeper: Arc::new(Keeper::new(samples, admission.clone(), metrics)),
            admission,
            shares: Arc::new(shares.clone()),
        };
        let admitter = case.admitter.map(|a| HOLDERS[a]);

        // What the model would displace for the admitter, and what its pass takes.
        let displaced = model(case).peek(&shares, capacity, admitter).map(|c| c.key.clone());
        let expected: Vec<String> = model(case)
            .take_until(&shares, capacity, used, counted.low_watermark())
            .into_iter()
            .map(|c| c.key)
            .collect();

        // The evictor: what it would displace (a shard, never a pack), then a pass.
        let victim = evictor.victim_for(admitter).map(|e| e.shard.clone());
        prop_assert_eq!(victim, displaced.filter(|d| d != "pack"));
        evictor.to_low_watermark().await;
        let left: Vec<String> = catalog.entries().iter().map(|e| e.shard.clone()).collect();
        let mut taken: Vec<String> =
            (0..case.shards.len()).map(|i| format!("s{i}")).filter(|s| !left.contains(s)).collect();
        if case.pack.is_some() && evictor.keeper.samples().candidates().is_empty() {
            taken.push("pack".into());
        }
        let mut in_order = expected.clone();
        in_order.sort();
        taken.sort();
        prop_assert_eq!(taken, in_order, "the model's order: {:?}", expected);
        PASSES_THAT_TOOK.fetch_add(u64::from(!expected.is_empty()), Relaxed);
        Ok(())
    }
}
