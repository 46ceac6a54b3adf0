//! The cache: the facade over its parts, through which the read service, cache control
//! and the server reach them. Data flows one way:
//!
//! ```text
//!   read ──> Index (entries) ──hit──> Store (pages, CRC-checked)
//!     │          │ miss/stale
//!     │          └──> Lookups (StatShard to the hubs, shared; revalidation)
//!     └─ absent chunk ──> FetchOwner (coalescing, byte and request bounds, counting)
//!                            ├──> Chain of suppliers: peers ranked before, peers
//!                            │    holding it, hubs (hedged)
//!                            └──> Admission (store + index + capacity) ──> Evictor
//! ```
//!
//! - [`Index`] (`index.rs`): which shard versions are cached, their records, LRU order;
//! - [`Lookups`] (`lookup.rs`): entries checked with the hubs (one stat per shard);
//! - [`FetchOwner`] (`fetch/`): the fetches of missing chunks from the suppliers;
//! - [`Admission`] (`admission.rs`): chunks into the store, shards out of it;
//! - [`Capacity`] (`capacity.rs`) and the [`Evictor`] (`evict.rs`); the [`PlanFetcher`]
//!   (`plan_fetch.rs`), each given the parts it uses.
//!
//! Here: entries, chunks asked for alongside a first stat, pins, joins; in
//! `cache/read.rs` the read path; in `cache/speculate.rs` which misses are stored (the
//! admission, `policy::admit`) and the read-ahead and whole-shard fetches after a read
//! under their feedback (`policy::speculation`).
//!
//! - An [`Entry`] is one shard *version* with its own store id. A new version found at
//!   revalidation replaces the entry (new id), so bytes of two versions never mix.
//! - When the hub cannot be reached, cached shards are served as they are and misses
//!   fail with UNAVAILABLE.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use shardcache_proto::names::{DatasetName, ShardName};

mod index_reads;
mod read;
mod speculate;

pub use speculate::{VICTIM_REFRESH, WHOLE_SHARD_FETCHES};

pub use read::{ReadFor, SPECULATIVE_SHARDS_PER_CALL};

use crate::{
    Error, Result,
    admission::Admission,
    capacity::Capacity,
    entry::Entry,
    evict::Evictor,
    fetch::{FetchFor, FetchOwner},
    index::Index,
    jobs::JobRow,
    lookup::Lookups,
    metrics::Metrics,
    plan::{PlanLimits, PlanWindow, Plans},
    plan_fetch::PlanFetcher,
    policy::{admit::AdmissionFilter, shares::Shares, speculation::Speculation},
    store::Store,
    suppliers::{Chain, Supply, hubs::Hubs},
};

/// How the cache behaves; see `config.rs` for the flags.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub capacity: u64,
    /// Eviction starts above `capacity x high_watermark`...
    pub high_watermark: f64,
    /// ...and stops below `capacity x low_watermark`.
    pub low_watermark: f64,
    /// The cache's unit of fetching and of presence (`--chunk-size`); a multiple of the
    /// store's page size.
    pub chunk_size: u64,
    /// Time after which a cached shard's version is checked with the hub again.
    pub revalidate_after: Duration,
    /// On the first miss in a shard, fetch the whole shard in the background.
    pub fetch_whole_shard: bool,
    /// After reading chunk `i`, fetch chunks `i+1..=i+n` in the background.
    pub read_ahead_chunks: u64,
    /// Chunk fetches in flight for one shard's background fetch.
    pub shard_fetch_parallelism: usize,
    /// Bytes fetched upstream and not yet stored, across all fetches: bounds memory when
    /// the link is faster than the disk path; too small, it bounds the link (each chunk
    /// holds its room for a round trip plus its admission, an fsync). The default is
    /// chosen by `wan-bench` (BENCHMARKS.md).
    pub upstream_bytes_in_flight: u64,
    /// How far ahead of the jobs' reads their plans are fetched (`plan_fetch.rs`).
    pub plan_window: PlanWindow,
    /// How many plans and positions each principal, and all, may keep.
    pub plan_limits: PlanLimits,
    /// Jobs labelled by name in the metrics (`Metrics::labelled_jobs`).
    pub metric_jobs: std::collections::BTreeSet<String>,
    /// Index entries that hold no bytes (a stat's, a plan's) kept at most; the least
    /// recently used beyond it are removed (`lookup.rs`).
    pub empty_entries_kept: usize,
    /// Each tenant's share of the capacity (`--tenant-shares`, `policy::shares`).
    pub tenant_shares: Shares,
}

/// [`CacheConfig::empty_entries_kept`] of a spoke: ~300 bytes of memory each.
pub const EMPTY_ENTRIES_KEPT: usize = 1 << 16;

/// The cache.
#[derive(Debug)]
pub struct Cache {
    config: CacheConfig,
    store: Arc<Store>,
    index: Arc<Index>,
    capacity: Arc<Capacity>,
    admission: Arc<Admission>,
    lookups: Arc<Lookups>,
    fetch: FetchOwner,
    /// The suppliers: ownership in a group, the hubs for listings (what the fetch owner
    /// and the lookups ask of it is their `Supply`).
    chain: Arc<Chain>,
    plans: Arc<Plans>,
    metrics: Arc<Metrics>,
    /// Pin changes, one at a time (their limit is checked against all pins).
    pinning: tokio::sync::Mutex<()>,
    /// Whole-shard background fetches running (at most [`WHOLE_SHARD_FETCHES`]).
    whole_fetches: Arc<std::sync::atomic::AtomicUsize>,
    /// What index reads fetched as read (`index_reads.rs`).
    index_reads: index_reads::IndexReads,
    /// How much each chunk has been read lately, and which misses that makes worth
    /// storing (`policy::admit`).
    filter: AdmissionFilter,
    shares: Arc<Shares>,
    /// Per principal: what the chunks its admission would displace were read lately,
    /// and when that was found (recomputed every [`VICTIM_REFRESH`]).
    victims: Mutex<HashMap<String, (Instant, u64)>>,
}

/// Looks for a fetch a joining member asks for, and the pause between two: a read opens a
/// shard and starts its fetches within microseconds of the lookup it waited for.
pub const JOIN_ATTEMPTS: usize = 3;
pub const JOIN_RETRY: Duration = Duration::from_millis(5);

impl Cache {
    /// Loads what `store` holds; usable at once, before any hub answers. Chunks it lacks
    /// come from `chain`.
    pub fn open(store: Store, chain: Chain, config: CacheConfig, metrics: Arc<Metrics>) -> Result<Arc<Self>> {
        let store = Arc::new(store);
        // Records with the chunks their files hold; files of no record are gone.
        let (index, used) = Index::load(store.clone(), config.chunk_size, config.revalidate_after)?;
        let index = Arc::new(index);
        let capacity =
            Arc::new(Capacity::new(config.capacity, config.high_watermark, config.low_watermark, used));
        let speculation = Arc::new(Speculation::new(config.capacity));
        let admission = Arc::new(Admission::new(
            store.clone(),
            index.clone(),
            (capacity.clone(), speculation),
            metrics.clone(),
        ));
        let chain = Arc::new(chain);
        let lookups = Arc::new(Lookups::new(
            index.clone(),
            chain.clone() as Arc<dyn Supply>,
            admission.clone(),
            metrics.clone(),
            config.chunk_size,
            config.empty_entries_kept,
        ));
        let fetch = FetchOwner::new(
            chain.clone(),
            (admission.clone(), capacity.clone()),
            metrics.clone(),
            config.upstream_bytes_in_flight,
            config.chunk_size,
        );
        let plans = Arc::new(Plans::new(config.plan_limits));
        let filter = AdmissionFilter::new(config.capacity, config.chunk_size);
        let shares = Arc::new(config.tenant_shares.clone());
        Ok(Arc::new(Self {
            filter,
            shares,
            victims: Mutex::default(),
            config,
            store,
            index,
            capacity,
            admission,
            lookups,
            fetch,
            chain,
            plans,
            metrics,
            pinning: tokio::sync::Mutex::new(()),
            whole_fetches: Arc::default(),
            index_reads: Default::default(),
        }))
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The hubs (listings pass through to them).
    pub fn hubs(&self) -> &Hubs {
        self.chain.hubs()
    }

    /// The suppliers: peers and hubs.
    pub fn chain(&self) -> &Chain {
        &self.chain
    }

    /// Whether this spoke fetches `dataset/shard` from the hubs itself (in a group: it
    /// owns the shard).
    pub fn owns(&self, dataset: &str, shard: &str) -> bool {
        self.chain.owns(dataset, shard)
    }

    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    pub fn used_bytes(&self) -> u64 {
        self.capacity.used()
    }

    /// Bytes the store's files take on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.store.disk_bytes()
    }

    /// True while an eviction is running.
    pub fn is_evicting(&self) -> bool {
        self.capacity.is_evicting()
    }

    /// Chunk fetches running: fetched chunks not yet stored count here, not in
    /// [`Cache::used_bytes`] (readers get a chunk's bytes before it is stored).
    pub fn fetches_in_flight(&self) -> usize {
        self.fetch.in_flight()
    }

    /// Every cached entry.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        self.index.entries()
    }

    /// An entry from the index, without contacting the hub.
    pub fn cached_entry(&self, dataset: &str, shard: &str) -> Option<Arc<Entry>> {
        self.index.get(&(dataset.to_owned(), shard.to_owned()))
    }

    /// The hub confirmed `entry`'s version within `--revalidate-after`.
    pub fn is_fresh(&self, entry: &Entry) -> bool {
        self.index.is_fresh(entry)
    }

    /// What speculation brought and what came of it (`policy::speculation`).
    pub fn speculation(&self) -> &Speculation {
        self.admission.speculation()
    }

    /// Bytes held per principal (`Entry::holder`), and each one's share of the capacity
    /// now (`policy::shares`).
    pub fn held_and_shares(&self) -> (HashMap<String, u64>, HashMap<String, u64>) {
        let mut held: HashMap<String, u64> = HashMap::new();
        for entry in self.index.entries() {
            let bytes = entry.cached_bytes();
            if bytes > 0 {
                *held.entry(entry.holder()).or_default() += bytes;
            }
        }
        let shares = self.shares.of(&held, self.capacity.capacity());
        (held, shares)
    }

    /// The jobs' access plans (`SetPlan`).
    pub fn plans(&self) -> &Plans {
        &self.plans
    }

    /// The evictor, with the parts it uses.
    pub fn evictor(&self) -> Evictor {
        Evictor {
            capacity: self.capacity.clone(),
            index: self.index.clone(),
            plans: self.plans.clone(),
            admission: self.admission.clone(),
            shares: self.shares.clone(),
        }
    }

    /// Planned prefetch, with the parts it uses.
    pub fn plan_fetcher(&self) -> PlanFetcher {
        PlanFetcher {
            plans: self.plans.clone(),
            capacity: self.capacity.clone(),
            index: self.index.clone(),
            lookups: self.lookups.clone(),
            fetch: self.fetch.clone(),
            chain: self.chain.clone(),
            metrics: self.metrics.clone(),
            window: self.config.plan_window,
            parallelism: self.config.shard_fetch_parallelism,
        }
    }

    /// Sets or clears the pin of each of `entries`; returns how many changed. Pins
    /// count against the capacity: whole shards (a pinned shard is fetched whole), and
    /// all of them below the high watermark, or none is pinned (`PinLimit`).
    pub async fn set_pinned(&self, entries: &[Arc<Entry>], pinned: bool) -> Result<u64> {
        let _one_at_a_time = self.pinning.lock().await;
        if pinned {
            let requested: u64 = entries.iter().filter(|e| !e.is_pinned()).map(|e| e.size).sum();
            let already: u64 = self.index.entries().iter().filter(|e| e.is_pinned()).map(|e| e.size).sum();
            let limit = self.capacity.high_watermark();
            if already + requested > limit {
                return Err(Error::PinLimit { requested, would_pin: already + requested, limit });
            }
        }
        let mut changed = 0;
        for entry in entries {
            changed += u64::from(self.index.set_pinned(entry, pinned).await?);
        }
        Ok(changed)
    }

    /// The entry of a shard, from the index or the hub (see [`Lookups::entry`]).
    pub async fn entry(&self, dataset: &DatasetName, shard: &ShardName) -> Result<Arc<Entry>> {
        self.lookups.entry(dataset, shard).await
    }

    /// [`Cache::entry`] for a call that will read `reads` (`(offset, length)` pairs) of
    /// the shard, for `reader`. When the cache has never seen the shard, the chunks those
    /// reads cover entirely are read upstream alongside its `StatShard` rather than after
    /// it, and taken up when they were read at the version the stat returns: a cold read
    /// costs one round trip to the hub, not two. Only whole chunks that end within a
    /// read are asked for (a read inside the shard proves they exist), at most what the
    /// in-flight byte bound has room for. The reads are kept until the request ends
    /// ([`Alongside`], in `ReadFor`): a chunk the admission stores takes its read up at
    /// once, one it does not store is served from it by the read path.
    pub async fn entry_for(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
        reader: &ReadFor,
    ) -> Result<(Arc<Entry>, Option<Arc<Alongside>>)> {
        let key = (dataset.to_string(), shard.to_string());
        // The warm path: one look at the index (not again in `entry`).
        if let Some(entry) = self.index.fresh(&key) {
            return Ok((entry, None));
        }
        if self.index.get(&key).is_some() {
            return Ok((self.entry(dataset, shard).await?, None));
        }
        if reader.index_read {
            return Ok((self.entry_for_index(dataset, shard, reads, &reader.row).await?, None));
        }
        let chunk_size = self.config.chunk_size;
        let mut chunks: Vec<u64> = reads
            .iter()
            // Saturating: the request's ranges are checked against the shard after this.
            .flat_map(|&(offset, length)| offset / chunk_size..offset.saturating_add(length) / chunk_size)
            .collect();
        chunks.sort_unstable();
        chunks.dedup();
        // A shard another member owns is read from it (by the fetch owner), not the hub.
        if chunks.is_empty() || !self.owns(dataset.as_str(), shard.as_str()) {
            return Ok((self.entry(dataset, shard).await?, None));
        }
        for &index in &chunks {
            self.fetch.speculate(
                dataset.as_str(),
                shard.as_str(),
                index * chunk_size,
                chunk_size,
                &reader.row,
            );
        }
        // Forgotten however this call ends, or when the request does.
        let parts = chunks.iter().map(|&i| (i * chunk_size, chunk_size)).collect();
        let alongside = Arc::new(Alongside { fetch: self.fetch.clone(), key, parts });
        let entry = self.entry(dataset, shard).await?;
        for &index in &chunks {
            // Past the end (the read was invalid): nothing to take up.
            if entry.chunk_range(index) == (index * chunk_size, chunk_size)
                && self.stores(&entry, index, &reader.principal)
            {
                drop(self.fetch.chunk(&entry, index, reader.fetch()));
            }
        }
        Ok((entry, Some(alongside)))
    }

    /// [`Cache::entry_for`] for a format's index reads of a shard never seen: the reads,
    /// cut at chunk boundaries as the read path cuts them, are read alongside the
    /// `StatShard` (not their whole chunks: `index_reads.rs`) and kept with the index
    /// reads when they were read at the version the stat returns, so a cold index read
    /// costs one round trip to the hub.
    async fn entry_for_index(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
        row: &JobRow,
    ) -> Result<Arc<Entry>> {
        let chunk_size = self.config.chunk_size;
        let parts: Vec<(u64, u64)> = reads
            .iter()
            .flat_map(|&(offset, length)| {
                // Saturating: the request's ranges are checked against the shard after this.
                let end = offset.saturating_add(length);
                (offset / chunk_size..end.div_ceil(chunk_size)).map(move |i| {
                    let from = offset.max(i * chunk_size);
                    (from, end.min((i + 1).saturating_mul(chunk_size)) - from)
                })
            })
            .filter(|&(_, length)| length > 0 && index_reads::IndexReads::keeps(length))
            .collect();
        let (ds, sh) = (dataset.as_str(), shard.as_str());
        if parts.is_empty() || !self.owns(ds, sh) {
            return self.entry(dataset, shard).await;
        }
        for &(offset, length) in &parts {
            self.fetch.speculate(ds, sh, offset, length, row);
        }
        let key = (dataset.to_string(), shard.to_string());
        let _forget = Alongside { fetch: self.fetch.clone(), key, parts: parts.clone() };
        let entry = self.entry(dataset, shard).await?;
        for &(offset, length) in &parts {
            let Some(read) = self.fetch.speculation(ds, sh, offset, length) else { continue };
            let read = read.await.filter(|(data, version)| {
                *version == entry.version && data.data.len() as u64 == length && offset + length <= entry.size
            });
            if let Some((data, _)) = read {
                self.index_reads.put((entry.id, offset, length), data);
            }
        }
        Ok(entry)
    }

    /// The entry of `dataset/shard`: the cached one, or the one a lookup running now (a
    /// first read's `StatShard`) brings; `None` when neither is there. Never a lookup of
    /// its own.
    pub async fn known_entry(&self, dataset: &str, shard: &str) -> Option<Arc<Entry>> {
        let key = (dataset.to_owned(), shard.to_owned());
        match self.index.get(&key) {
            Some(entry) => Some(entry),
            None => self.lookups.running(&key).await,
        }
    }

    /// The bytes of `[offset, offset + length)` of `entry` from a fetch running now (see
    /// `FetchOwner::running_range`), looked for again for a moment when there is none:
    /// a member hedged to may ask just as the read that will fetch them is opening the
    /// shard. `None`: nothing here fetches them, or the fetch failed (the member asking
    /// goes on to the hub; the failure is this spoke's reader's to report).
    pub async fn join_running(
        &self,
        entry: &Entry,
        offset: u64,
        length: u64,
    ) -> Option<shardcache_proto::checksum::Checked> {
        for attempt in 0..JOIN_ATTEMPTS {
            if let Some(running) = self.fetch.running_range(entry, offset, length) {
                return running.await.ok();
            }
            if attempt + 1 < JOIN_ATTEMPTS {
                tokio::time::sleep(JOIN_RETRY).await;
            }
        }
        None
    }

    /// Evicts `entries` (their chunks and records); returns (shards, bytes) evicted.
    pub async fn evict(&self, entries: &[Arc<Entry>]) -> (u64, u64) {
        self.admission.evict(entries).await
    }

    /// Fetches every absent chunk of `entry`, `--shard-fetch-parallelism` at a time, and
    /// returns once they are stored, held by `principal`, with the bytes that crossed the
    /// link (counted in `row`).
    pub async fn fetch_shard(&self, entry: &Arc<Entry>, row: &JobRow, principal: &str) -> Result<u64> {
        let fetch = FetchFor::read(row, principal, &[]);
        self.fetch.fetch_shard(entry, self.config.shard_fetch_parallelism, fetch).await
    }
}

/// The reads `entry_for` started alongside a first stat, forgotten when the request that
/// started them ends (see `FetchOwner::forget_speculation`): until then, a part of them
/// the read path fetches as read takes them up rather than crossing the link again.
#[derive(Debug)]
pub struct Alongside {
    fetch: FetchOwner,
    key: (String, String),
    /// (offset, length) of each read.
    parts: Vec<(u64, u64)>,
}

impl Drop for Alongside {
    fn drop(&mut self) {
        for &(offset, length) in &self.parts {
            self.fetch.forget_speculation(&self.key.0, &self.key.1, offset, length);
        }
    }
}
