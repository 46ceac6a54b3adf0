//! A shard's entry: the cached one while its version is fresh, else one `StatShard` to
//! the hubs, shared by concurrent callers, after which the entry is confirmed (kept),
//! replaced (a new version: the old one's bytes are removed) or dropped (gone from the
//! hub).
//!
//! When the hub cannot answer a revalidation (`revalidation.rs`), the cached version is
//! served: within [`REVALIDATION_WAIT`] whatever the hub does, and at once while
//! revalidation is paused after failures.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, atomic::Ordering::Relaxed},
};

use futures::future::{BoxFuture, Shared};
use shardcache_proto::names::{DatasetName, ShardName};

use super::link_gate::LinkGate;
use crate::{
    Result,
    fetch::revalidation::{REVALIDATION_WAIT, Revalidation},
    fetch::shared::spawn_shared,
    fetch::suppliers::Supply,
    observe::metrics::Metrics,
    store::admission::Admission,
    store::catalog::Catalog,
    store::entry::{Entry, ShardKey},
    store::kept::Keeper,
};

type SharedLookup = Shared<BoxFuture<'static, Result<Arc<Entry>>>>;

/// Shard lookups: entries from the catalog, checked with the hubs.
#[derive(Debug)]
pub struct Lookups {
    catalog: Arc<Catalog>,
    supply: Arc<dyn Supply>,
    admission: Arc<Admission>,
    /// Kept samples of a version the hub replaced are forgotten with it.
    keeper: Arc<Keeper>,
    metrics: Arc<Metrics>,
    /// The cache's unit of fetching, recorded in new entries.
    chunk_size: u64,
    /// Lookups (StatShard) in progress, shared by concurrent callers.
    running: Mutex<HashMap<ShardKey, SharedLookup>>,
    revalidation: Revalidation,
    /// Room for [`STATS_IN_FLIGHT`] stats to the hubs: a batch naming thousands of cold
    /// shards asks them a few dozen at a time, not all at once.
    stats: tokio::sync::Semaphore,
    /// The link gate, which each stat's answer time tells the link's round trip (a stat is
    /// the smallest request there is: the first answers of a job's cold start are large,
    /// and queued behind each other, and alone would make the round trip seem longer).
    gate: Option<Arc<LinkGate>>,
    /// Entries that hold no bytes kept at most (`CacheConfig::empty_entries_kept`).
    empty_kept: usize,
    /// Entries installed, to sweep the empty ones every `empty_kept / 8` installs.
    installs: std::sync::atomic::AtomicUsize,
}

/// `StatShard`s to the hubs at once, over all requests: as many as chunk fetches
/// (`fetch::UPSTREAM_REQUESTS_IN_FLIGHT`), so a spoke never has more than 64 requests at
/// a hub, whatever its clients send (before, a batch over 100 cold shards sent 100 stats
/// at once and a hub at `--max-concurrency 64` shed them). 32 per 60 ms round trip is
/// ~500 new shards a second.
pub const STATS_IN_FLIGHT: usize = 32;

impl Lookups {
    pub fn new(
        catalog: Arc<Catalog>,
        supply: Arc<dyn Supply>,
        (admission, keeper): (Arc<Admission>, Arc<Keeper>),
        metrics: Arc<Metrics>,
        chunk_size: u64,
        empty_kept: usize,
    ) -> Self {
        Self {
            catalog,
            supply,
            admission,
            keeper,
            metrics,
            chunk_size,
            running: Mutex::default(),
            revalidation: Revalidation::default(),
            stats: tokio::sync::Semaphore::new(STATS_IN_FLIGHT),
            gate: None,
            empty_kept,
            installs: Default::default(),
        }
    }

    /// These lookups with their stats' answer times told to `gate`.
    pub fn with_link_gate(mut self, gate: Arc<LinkGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The cached entry of a shard, checked with the hub when its TTL has passed, or a
    /// new entry from the hub's `StatShard`.
    ///
    /// Concurrent callers for one shard share one lookup (one `StatShard`): a trainer's
    /// first batch touches a shard from hundreds of reads at once, and without this
    /// each asked the hub, which shed them (seed-demo, 1536 reads in flight).
    pub async fn entry(self: &Arc<Self>, dataset: &DatasetName, shard: &ShardName) -> Result<Arc<Entry>> {
        let key = (dataset.to_string(), shard.to_string());
        if let Some(entry) = self.catalog.fresh(&key) {
            return Ok(entry);
        }
        let cached = self.catalog.get(&key);
        if let Some(entry) = cached.as_ref().filter(|_| self.revalidation.paused()) {
            // The hub did not answer lately: serve what is cached without asking.
            self.catalog.touch(entry);
            return Ok(entry.clone());
        }
        let lookup = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            running
                .entry(key.clone())
                .or_insert_with(|| {
                    let (lookups, dataset, shard) = (self.clone(), dataset.clone(), shard.clone());
                    let (done, done_key) = (self.clone(), key.clone());
                    spawn_shared(
                        "shard lookup",
                        async move { lookups.lookup(&dataset, &shard).await },
                        move || {
                            done.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&done_key);
                        },
                    )
                })
                .clone()
        };
        let Some(entry) = cached else { return lookup.await };
        // A cached shard is served within REVALIDATION_WAIT whatever the hub does; the
        // lookup carries on (bounded by --hub-timeout) for the readers after.
        // (The lookup itself counts the failure and pauses revalidation.)
        match tokio::time::timeout(REVALIDATION_WAIT, lookup).await {
            Ok(answer) => answer,
            Err(_) => {
                self.catalog.touch(&entry);
                Ok(entry)
            }
        }
    }

    /// The entry of `key` once the lookup of it running now (a first read's `StatShard`)
    /// is done; `None` when none is running.
    pub async fn running(&self, key: &ShardKey) -> Option<Arc<Entry>> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned()?;
        running.await.ok()
    }

    /// The slow path of [`Lookups::entry`]: ask the hub.
    async fn lookup(&self, dataset: &DatasetName, shard: &ShardName) -> Result<Arc<Entry>> {
        let key = (dataset.to_string(), shard.to_string());
        // Another lookup may have refreshed it since the caller looked.
        if let Some(entry) = self.catalog.fresh(&key) {
            return Ok(entry);
        }
        let Some(entry) = self.catalog.get(&key) else {
            let info = self.stat(dataset, shard).await?;
            return Ok(self.install(key, &info).await);
        };
        // Readers are served the cached version after REVALIDATION_WAIT; past it, the
        // hub counts as not answering (once per lookup, not once per waiting reader), so
        // revalidation pauses while this stat carries on to --hub-timeout.
        let stat = self.stat(dataset, shard);
        tokio::pin!(stat);
        let (answer, slow) = match tokio::time::timeout(REVALIDATION_WAIT, &mut stat).await {
            Ok(answer) => (answer, false),
            Err(_) => {
                self.revalidation_failed(&format_args!("no answer within {REVALIDATION_WAIT:?}"));
                (stat.await, true)
            }
        };
        match &answer {
            Err(e) if e.hub_cannot_answer() => {
                if !slow {
                    self.revalidation_failed(e);
                }
            }
            _ => self.revalidation.answered(),
        }
        match answer {
            Ok(info) if info.version == entry.version && info.size == entry.size => {
                if let Err(e) = self.catalog.revalidated(&entry).await {
                    self.admission.storing_failed("a shard record", &e);
                }
                Ok(entry)
            }
            Ok(info) => {
                tracing::info!(dataset = %dataset, shard = %shard, old = %entry.version, new = %info.version, "shard changed on the hub");
                self.admission.remove(&entry, false).await;
                self.keeper.forget_version(&entry).await;
                Ok(self.install(key, &info).await)
            }
            Err(e) if e.hub_cannot_answer() => {
                // Whatever the trouble (down, hung, overloaded, refusing us, garbled),
                // the verified bytes on disk are still the version the hub served.
                self.catalog.touch(&entry);
                Ok(entry)
            }
            Err(e) if e.code() == tonic::Code::NotFound => {
                self.admission.remove(&entry, true).await;
                self.keeper.forget_version(&entry).await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// The entry of the version `info` describes; one whose record cannot be written
    /// (a full disk) is served all the same (`Catalog::install`).
    async fn install(&self, key: ShardKey, info: &shardcache_proto::v1::ShardInfo) -> Arc<Entry> {
        let (entry, recorded) = self.catalog.install(key, info, self.chunk_size).await;
        if let Err(e) = recorded {
            self.admission.storing_failed("a shard record", &e);
        }
        if self.installs.fetch_add(1, Relaxed).is_multiple_of((self.empty_kept / 8).max(1)) {
            self.sweep_empty(&entry).await;
        }
        entry
    }

    /// Removes the least recently used entries that hold no bytes (made by a stat, a
    /// plan's or a prefetch's lookups, never read) beyond `empty_kept`: eviction frees
    /// bytes, and these hold none, so without this a client that stats every shard of
    /// every dataset would grow the catalog (and its records) without bound. Pinned ones,
    /// those a prefetch holds and `keep` (the entry just installed) stay.
    async fn sweep_empty(&self, keep: &Arc<Entry>) {
        let mut empty: Vec<(u64, Arc<Entry>)> = self
            .catalog
            .entries()
            .into_iter()
            .filter(|e| e.id != keep.id)
            .filter_map(|e| {
                let state = e.state();
                let idle = !state.record.pinned && !state.evicted && state.prefetching == 0;
                let last_access = state.last_access;
                let empty = idle && state.record.cached_bytes() == 0;
                drop(state);
                empty.then_some((last_access, e))
            })
            .collect();
        let over = empty.len().saturating_sub(self.empty_kept);
        if over == 0 {
            return;
        }
        empty.sort_by_key(|(last_access, _)| *last_access);
        for (_, entry) in &empty[..over] {
            self.admission.remove(entry, true).await;
        }
        tracing::debug!(removed = over, kept = self.empty_kept, "removed index entries that hold no bytes");
    }

    /// The hubs' `StatShard`, within [`STATS_IN_FLIGHT`].
    async fn stat(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
    ) -> Result<shardcache_proto::v1::ShardInfo> {
        // The semaphore is never closed.
        let _room = self.stats.acquire().await.ok();
        let mark = self.gate.as_ref().map(|gate| gate.asking());
        let info = self.supply.stat(dataset.as_str(), shard.as_str()).await;
        if let (Some(gate), Some(mark), Ok(_)) = (&self.gate, mark, &info) {
            gate.round_trip(mark);
        }
        info
    }

    fn revalidation_failed(&self, why: &dyn std::fmt::Display) {
        self.metrics.revalidation_failures.fetch_add(1, Relaxed);
        self.revalidation.failed(why);
    }
}

#[cfg(test)]
mod tests {
    //! Lookups against a fake supplier (`crate::testing`).

    use std::{sync::atomic::Ordering::SeqCst, time::Duration};

    use crate::{
        fetch::FetchFor,
        observe::job_counters::JobRow,
        store::entry::ChunkIndex,
        testing::{parts, pattern},
    };

    const CHUNK: u64 = 64 << 10;

    #[tokio::test]
    async fn concurrent_first_lookups_of_a_shard_stat_it_once() {
        let parts = parts(CHUNK, 1 << 30, 1 << 30);
        parts.supply.put("ds", "s", "v1", pattern(100_000, 1));
        parts.supply.set_latency(Duration::from_millis(20));
        let lookups = (0..16).map(|_| parts.entry("ds", "s"));
        let entries: Vec<_> =
            futures::future::join_all(lookups).await.into_iter().map(Result::unwrap).collect();
        assert_eq!(parts.supply.stats.load(SeqCst), 1, "sixteen readers, one StatShard");
        assert!(entries.iter().all(|e| e.id == entries[0].id && e.size == 100_000 && e.version == "v1"));
        parts.entry("ds", "s").await.unwrap();
        assert_eq!(parts.supply.stats.load(SeqCst), 1, "fresh: answered from the catalog");
    }

    #[tokio::test]
    async fn a_new_version_replaces_the_entry_and_removes_the_old_bytes() {
        let parts = parts(CHUNK, 1 << 30, 1 << 30);
        parts.supply.put("ds", "s", "v1", pattern(CHUNK as usize, 2));
        let old = parts.entry("ds", "s").await.unwrap();
        let row = JobRow::default();
        parts.fetch.chunk(&old, ChunkIndex(0), FetchFor::read(&row, "t", &[])).unwrap().stored.await.unwrap();
        assert_eq!(parts.capacity.used(), CHUNK);
        parts.supply.put("ds", "s", "v2", pattern(CHUNK as usize, 3));
        old.expire();
        let new = parts.entry("ds", "s").await.unwrap();
        assert_eq!(new.version, "v2");
        assert_ne!(new.id, old.id, "a new version is a new entry: its bytes never mix with the old");
        assert!(!new.has_chunk(ChunkIndex(0)));
        assert!(parts.stored(&old, 0, CHUNK).is_none(), "v1's bytes are gone from the store");
        assert_eq!(parts.capacity.used(), 0);
    }

    #[tokio::test]
    async fn a_hub_that_cannot_answer_leaves_the_cached_version_served() {
        let parts = parts(CHUNK, 1 << 30, 1 << 30);
        parts.supply.put("ds", "s", "v1", pattern(1000, 4));
        let entry = parts.entry("ds", "s").await.unwrap();
        entry.expire();
        parts.supply.fail_next(1);
        let served = parts.entry("ds", "s").await.unwrap();
        assert_eq!(served.id, entry.id, "the verified bytes on disk are still the hub's version");
        assert_eq!(parts.metrics.revalidation_failures.load(SeqCst), 1);
        let stats = parts.supply.stats.load(SeqCst);
        assert_eq!(parts.entry("ds", "s").await.unwrap().id, entry.id);
        assert_eq!(parts.supply.stats.load(SeqCst), stats, "revalidation pauses after a failure");
    }

    #[tokio::test]
    async fn a_shard_gone_from_the_hub_is_not_found_and_forgotten() {
        let parts = parts(CHUNK, 1 << 30, 1 << 30);
        parts.supply.put("ds", "s", "v1", pattern(1000, 5));
        let entry = parts.entry("ds", "s").await.unwrap();
        assert!(parts.catalog.get(&("ds".into(), "s".into())).is_some());
        parts.supply.shards_mut().clear();
        entry.expire();
        let error = parts.entry("ds", "s").await.unwrap_err();
        assert_eq!(error.code(), tonic::Code::NotFound, "{error}");
        assert!(parts.catalog.get(&("ds".into(), "s".into())).is_none(), "its entry is removed");
        let unknown = parts.entry("ds", "never").await.unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
    }
}
