//! The cache: the facade over its parts, through which the read service, cache control
//! and the server reach them. Data flows one way:
//!
//! ```text
//!   read ──> Catalog (entries) ──hit──> Store (pages, CRC-checked)
//!     │          │ miss/stale
//!     │          └──> Lookups (StatShard to the hubs, shared; revalidation)
//!     └─ absent chunk ──> FetchOwner (coalescing, byte and request bounds, counting)
//!                            ├──> Chain of suppliers: peers ranked before, peers
//!                            │    holding it, hubs (hedged)
//!                            └──> Admission (store + catalog + capacity) ──> Evictor
//!                                                    (in the order of policy::evict)
//! ```
//!
//! - [`Catalog`] (`store/catalog.rs`): which shard versions are cached, their records, LRU order;
//! - [`Lookups`] (`fetch/lookup.rs`): entries checked with the hubs (one stat per shard);
//! - [`FetchOwner`] (`fetch/`): the fetches of missing chunks from the suppliers;
//! - [`Admission`] (`store/admission.rs`): chunks into the store, shards out of it;
//! - [`Capacity`] (`store/capacity.rs`) and the [`Evictor`] (`store/evict.rs`);
//! - [`ColdOpen`] (`read/cold_open.rs`): a shard's entry, a never-seen shard's first reads
//!   alongside its stat;
//! - [`ReadPath`] (`read/path/`): stored, fetched-and-stored or fetched-as-read parts;
//! - [`ReadAhead`] (`read/ahead.rs`): which misses are stored (`policy::admit`), and the
//!   read-ahead and whole-shard fetches after a read (`policy::speculation`);
//! - [`Plans`] (`plans/`): what each read is to the jobs' plans, followed shard by shard
//!   or sample by sample, and the [`Follower`] (`plans/follow.rs`) that fetches what they
//!   read next; what a job followed sample by sample reads again is kept (`store/kept/`,
//!   the keeper);
//!
//! each given the parts it uses when the cache opens, none calling back into this
//! facade or into the part that called it (`tests/tests/architecture.rs`). Here: the
//! parts assembled, and what the services ask of them (pins, joins, status).
//!
//! - An [`Entry`] is one shard *version* with its own store id. A new version found at
//!   revalidation replaces the entry (new id), so bytes of two versions never mix.
//! - When the hub cannot be reached, cached shards are served as they are and misses
//!   fail with UNAVAILABLE.
//!
//! The parts are assembled in `open.rs`.
//!
//! Owns: the parts, assembled, and what the services ask of them. May import every part
//! below it; never `serve`.

mod open;

use std::{collections::HashMap, sync::Arc, time::Duration};

use shardcache_proto::{
    checksum::Checked,
    names::{DatasetName, ShardName},
};

use crate::{
    Error, Result,
    fetch::lookup::Lookups,
    fetch::suppliers::{Chain, hubs::Hubs},
    fetch::{Alongside, FetchFor, FetchOwner},
    observe::job_counters::JobRow,
    observe::metrics::Metrics,
    plans::shards::PlanLimits,
    plans::{Plans, follow::Follower},
    policy::window::PlanWindow,
    policy::{shares::Shares, speculation::Speculation},
    read::cold_open::ColdOpen,
    read::path::{Piece, ReadFor, ReadPath},
    store::Store,
    store::admission::Admission,
    store::capacity::Capacity,
    store::catalog::Catalog,
    store::entry::Entry,
    store::evict::Evictor,
    store::kept::Keeper,
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
    /// How far ahead of the jobs' reads their plans are fetched (`plans/prefetch.rs`).
    pub plan_window: PlanWindow,
    /// How many plans and positions each principal, and all, may keep.
    pub plan_limits: PlanLimits,
    /// Jobs labelled by name in the metrics (`Metrics::labelled_jobs`).
    pub metric_jobs: std::collections::BTreeSet<String>,
    /// Catalog entries that hold no bytes (a stat's, a plan's) kept at most; the least
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
    catalog: Arc<Catalog>,
    capacity: Arc<Capacity>,
    admission: Arc<Admission>,
    keeper: Arc<Keeper>,
    lookups: Arc<Lookups>,
    fetch: FetchOwner,
    /// The suppliers: ownership in a group, the hubs for listings (what the fetch owner
    /// and the lookups ask of it is their `Supply`).
    chain: Arc<Chain>,
    /// The jobs' plans, shard by shard and sample by sample, and the samples held for
    /// their reads.
    plans: Arc<Plans>,
    metrics: Arc<Metrics>,
    /// Pin changes, one at a time (their limit is checked against all pins).
    pinning: tokio::sync::Mutex<()>,
    /// The evictor, with the parts it uses (the read-ahead weighs admissions by its
    /// next victim; the server runs it).
    evictor: Evictor,
    cold: ColdOpen,
    reads: ReadPath,
}

/// Looks for a fetch a joining member asks for, and the pause between two: a read opens a
/// shard and starts its fetches within microseconds of the lookup it waited for.
pub const JOIN_ATTEMPTS: usize = 3;
pub const JOIN_RETRY: Duration = Duration::from_millis(5);

impl Cache {
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

    /// Bytes stored (chunks being written are not yet: `Capacity::stored`).
    pub fn used_bytes(&self) -> u64 {
        self.capacity.stored()
    }

    /// Bytes of RocksDB's own files: the margin beside `--capacity` (`Store::own_bytes`),
    /// read off the runtime's threads (it lists the cache directory, chunk files and all).
    pub async fn store_own_bytes(&self) -> u64 {
        let store = self.store.clone();
        crate::store::blocking(move || Ok(store.own_bytes())).await.unwrap_or(0)
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

    /// Fetches running of any kind: calls to the suppliers, chunk fetches until their
    /// chunk is stored, planned shard fetches (`Status`'s `fetches_in_flight`). 0: nothing
    /// asked of the suppliers is on its way.
    pub fn fetches_running(&self) -> usize {
        self.fetch.upstream_calls() + self.fetch.in_flight() + self.plans.shards.fetching()
    }

    /// Every cached entry.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        self.catalog.entries()
    }

    /// An entry from the catalog, without contacting the hub.
    pub fn cached_entry(&self, dataset: &str, shard: &str) -> Option<Arc<Entry>> {
        self.catalog.get(&(dataset.to_owned(), shard.to_owned()))
    }

    /// The hub confirmed `entry`'s version within `--revalidate-after`.
    pub fn is_fresh(&self, entry: &Entry) -> bool {
        self.catalog.is_fresh(entry)
    }

    /// What speculation brought and what came of it (`policy::speculation`).
    pub fn speculation(&self) -> &Speculation {
        self.admission.speculation()
    }

    /// Bytes held per principal (`Entry::holder`), and each one's share of the capacity
    /// now (`policy::shares`).
    pub fn held_and_shares(&self) -> (HashMap<String, u64>, HashMap<String, u64>) {
        let mut held: HashMap<String, u64> = HashMap::new();
        for entry in self.catalog.entries() {
            let bytes = entry.cached_bytes();
            if bytes > 0 {
                *held.entry(entry.holder()).or_default() += bytes;
            }
        }
        let shares = self.evictor.shares.of(&held, self.capacity.capacity());
        (held, shares)
    }

    /// The jobs' plans: followed shard by shard (`SetPlan`) and sample by sample
    /// (`PlanSamples`).
    pub fn plans(&self) -> &Plans {
        &self.plans
    }

    /// The follower of the plans, with the parts it uses.
    pub fn follower(&self) -> Follower {
        Follower {
            plans: self.plans.clone(),
            capacity: self.capacity.clone(),
            catalog: self.catalog.clone(),
            lookups: self.lookups.clone(),
            fetch: self.fetch.clone(),
            chain: self.chain.clone(),
            keeper: self.keeper.clone(),
            metrics: self.metrics.clone(),
            window: self.config.plan_window,
            parallelism: self.config.shard_fetch_parallelism,
        }
    }

    /// Bytes of samples kept for later epochs, the packs holding them, and the bytes of
    /// samples fetched ahead of their reads.
    pub fn samples_held(&self) -> (u64, u64, u64) {
        let (kept, packs) = self.keeper.samples().bytes_and_packs();
        (kept, packs as u64, self.plans.staged.bytes())
    }

    /// Writes the kept samples waiting for their pack (the server does, now and then).
    pub async fn flush_kept(&self) {
        self.keeper.flush().await;
    }

    /// The evictor, with the parts it uses.
    pub fn evictor(&self) -> Evictor {
        self.evictor.clone()
    }

    /// Sets or clears the pin of each of `entries`; returns how many changed. Pins
    /// count against the capacity: whole shards (a pinned shard is fetched whole), and
    /// all of them below the high watermark, or none is pinned (`PinLimit`).
    pub async fn set_pinned(&self, entries: &[Arc<Entry>], pinned: bool) -> Result<u64> {
        let _one_at_a_time = self.pinning.lock().await;
        if pinned {
            let requested: u64 = entries.iter().filter(|e| !e.is_pinned()).map(|e| e.size).sum();
            let already: u64 = self.catalog.entries().iter().filter(|e| e.is_pinned()).map(|e| e.size).sum();
            let limit = self.capacity.high_watermark();
            if already + requested > limit {
                return Err(Error::PinLimit { requested, would_pin: already + requested, limit });
            }
        }
        let mut changed = 0;
        for entry in entries {
            changed += u64::from(self.catalog.set_pinned(entry, pinned).await?);
        }
        Ok(changed)
    }

    /// The entry of a shard, from the catalog or the hub (see [`Lookups::entry`]).
    pub async fn entry(&self, dataset: &DatasetName, shard: &ShardName) -> Result<Arc<Entry>> {
        self.lookups.entry(dataset, shard).await
    }

    /// The entry of `dataset/shard` when the catalog holds it and its version was
    /// confirmed within `--revalidate-after` (the warm path of `entry_for`); never a lookup.
    pub fn fresh_entry(&self, dataset: &str, shard: &str) -> Option<Arc<Entry>> {
        self.catalog.fresh(&(dataset.to_owned(), shard.to_owned()))
    }

    /// [`ColdOpen::entry_for`]: the entry of a shard for a call that will read `reads`
    /// of it, a never-seen shard's first chunks read alongside its stat.
    pub async fn entry_for(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
        reader: &ReadFor,
    ) -> Result<(Arc<Entry>, Option<Arc<Alongside>>)> {
        self.cold.entry_for(dataset, shard, reads, reader).await
    }

    /// [`ReadPath::read`]: `[offset, offset + length)` of `entry`.
    pub async fn read(
        &self,
        entry: &Arc<Entry>,
        offset: u64,
        length: u64,
        reader: &ReadFor,
    ) -> Result<Checked> {
        self.reads.read(entry, offset, length, reader).await
    }

    /// [`ReadPath::read_many`]: several ranges for one call.
    pub async fn read_many(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        reader: &ReadFor,
    ) -> Result<Vec<Checked>> {
        self.reads.read_many(wants, reader).await
    }

    /// [`ReadPath::locate_many`]: the same-node door's reads, placed in the store's files.
    pub async fn locate_many(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        reader: &ReadFor,
    ) -> Result<Option<Vec<Vec<Piece>>>> {
        self.reads.locate_many(wants, reader).await
    }

    /// [`ReadPath::read_cached`]: from the store only, never a fetch.
    pub async fn read_cached(&self, entry: &Arc<Entry>, offset: u64, length: u64) -> Result<Option<Checked>> {
        self.reads.read_cached(entry, offset, length).await
    }

    /// The entry of `dataset/shard`: the cached one, or the one a lookup running now (a
    /// first read's `StatShard`) brings; `None` when neither is there. Never a lookup of
    /// its own.
    pub async fn known_entry(&self, dataset: &str, shard: &str) -> Option<Arc<Entry>> {
        let key = (dataset.to_owned(), shard.to_owned());
        match self.catalog.get(&key) {
            Some(entry) => Some(entry),
            None => self.lookups.running(&key).await,
        }
    }

    /// The bytes of `[offset, offset + length)` of `entry` from a fetch running now (see
    /// `FetchOwner::running_range`), looked for again for a moment when there is none:
    /// a member hedged to may ask just as the read that will fetch them is opening the
    /// shard. `None`: nothing here fetches them, or the fetch failed (the member asking
    /// goes on to the hub; the failure is this spoke's reader's to report).
    pub async fn join_running(&self, entry: &Entry, offset: u64, length: u64) -> Option<Checked> {
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
