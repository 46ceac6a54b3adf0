//! The read-through cache: the parts of the cached source, each with one owner, and the
//! paths that cross them.
//!
//! - [`Index`] (`index.rs`): which shard versions are cached, their records, LRU order;
//! - [`Fetcher`] (`fetch.rs`): coalesced, bounded fetches from the hubs;
//! - [`Store`] (`store/`): chunk files and records in RocksDB;
//! - [`Capacity`] (`evict.rs`): bytes held against the watermarks, and the evictor.
//!
//! Here: a shard's entry (one `StatShard` shared by concurrent callers, revalidation
//! after `revalidate_after`, chunks asked for alongside a first stat), admission of
//! fetched chunks, and removal of evicted shards; in `cache/read.rs` the read path
//! (stored parts from the store, CRC-checked per page; missing chunks through the
//! fetcher; a chunk that failed its check forgotten and refetched).
//!
//! - An [`Entry`] is one shard *version* with its own store id. A new version found at
//!   revalidation replaces the entry (new id), so bytes of two versions never mix.
//! - When the hub cannot be reached, cached shards are served as they are and misses
//!   fail with UNAVAILABLE.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, atomic::Ordering::Relaxed},
    time::Duration,
};

use bytes::Bytes;
use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
use shardcache_proto::names::{DatasetName, ShardName};

mod read;

use crate::{
    Error, Result,
    entry::Entry,
    evict::Capacity,
    fetch::{ChunkFetch, Fetcher},
    index::{Index, ShardKey, blocking},
    jobs::JobRow,
    metrics::Metrics,
    plan::Plans,
    revalidation::{REVALIDATION_WAIT, Revalidation},
    store::Store,
    upstream::Upstream,
};

/// How the cache behaves; see `config.rs` for the flags.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub capacity: u64,
    /// Eviction starts above `capacity x high_watermark`...
    pub high_watermark: f64,
    /// ...and stops below `capacity x low_watermark`.
    pub low_watermark: f64,
    /// Unit of fetching and of presence; a multiple of the store's page size.
    pub chunk_size: u64,
    /// Time after which a cached shard's version is checked with the hub again.
    pub revalidate_after: Duration,
    /// On the first miss in a shard, fetch the whole shard in the background.
    pub fetch_whole_shard: bool,
    /// After reading chunk `i`, fetch chunks `i+1..=i+n` in the background.
    pub read_ahead_chunks: u64,
    /// Chunk fetches in flight for one shard's background fetch.
    pub shard_fetch_parallelism: usize,
    /// Bytes fetched from hubs and not yet stored, across all fetches: a fetch waits
    /// for room before it asks the hub, and holds it until its chunk is on disk. Bounds
    /// memory when the link is faster than the disk path; too small, it bounds the link:
    /// each chunk holds its room for a round trip plus its admission (an fsync). The
    /// default, 64 MiB, is chosen by `wan-bench` (uncapped 60 ms link; BENCHMARKS.md).
    pub upstream_bytes_in_flight: u64,
    /// How far ahead of the jobs' reads their plans are fetched, in bytes of shards
    /// beyond those being read (`plan_fetch.rs`).
    pub plan_window: u64,
}

type SharedLookup = Shared<BoxFuture<'static, Result<Arc<Entry>>>>;

/// The cache.
#[derive(Debug)]
pub struct Cache {
    store: Arc<Store>,
    index: Index,
    fetcher: Fetcher,
    capacity: Capacity,
    config: CacheConfig,
    metrics: Arc<Metrics>,
    /// Shard lookups (StatShard) in progress, shared by concurrent callers.
    lookups: Mutex<HashMap<ShardKey, SharedLookup>>,
    revalidation: Revalidation,
    plans: Plans,
    /// Pin changes, one at a time (their limit is checked against all pins).
    pinning: tokio::sync::Mutex<()>,
}

/// Runs `job` in its own task, so a caller that goes away does not cancel it for the
/// others sharing it; `done` runs in that task once the job has finished (to take it out
/// of the map that lets callers share it). `what` names the job in a failure.
pub(crate) fn spawn_shared<T: Clone + Send + Sync + 'static>(
    what: &'static str,
    job: impl std::future::Future<Output = Result<T>> + Send + 'static,
    done: impl FnOnce() + Send + 'static,
) -> Shared<BoxFuture<'static, Result<T>>> {
    let task = tokio::spawn(async move {
        let result = job.await;
        done();
        result
    });
    async move { task.await.unwrap_or_else(|e| Err(Error::Internal(format!("{what} failed: {e}")))) }
        .boxed()
        .shared()
}

impl Cache {
    /// Loads what `store` holds; usable at once, before any hub answers.
    pub fn open(
        store: Store,
        upstream: Upstream,
        config: CacheConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>> {
        let store = Arc::new(store);
        // Records with the chunks their files hold; files of no record are gone.
        let (index, used) = Index::load(store.clone(), config.chunk_size, config.revalidate_after)?;
        Ok(Arc::new(Self {
            store,
            index,
            fetcher: Fetcher::new(upstream, &config, metrics.clone()),
            capacity: Capacity::new(&config, used),
            config,
            metrics,
            lookups: Mutex::default(),
            revalidation: Revalidation::default(),
            plans: Plans::default(),
            pinning: tokio::sync::Mutex::new(()),
        }))
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The hubs (listings pass through to them).
    pub fn upstream(&self) -> &Upstream {
        self.fetcher.upstream()
    }

    pub(crate) fn fetcher(&self) -> &Fetcher {
        &self.fetcher
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
        self.fetcher.in_flight()
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

    /// The entry eviction takes next (see [`Index::eviction_victim`]): by the jobs'
    /// plans when they name it, else least recently used.
    pub fn eviction_victim(&self) -> Option<Arc<Entry>> {
        self.index.eviction_victim(|e| self.plans.next_use(&(e.dataset.clone(), e.shard.clone())))
    }

    /// The jobs' access plans (`SetPlan`).
    pub fn plans(&self) -> &Plans {
        &self.plans
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

    /// The cached entry of a shard, checked with the hub when its TTL has passed, or a
    /// new entry from the hub's `StatShard`.
    ///
    /// Concurrent callers for one shard share one lookup (one `StatShard`): a trainer's
    /// first batch touches a shard from hundreds of reads at once, and without this
    /// each asked the hub, which shed them (seed-demo, 1536 reads in flight).
    pub async fn entry(self: &Arc<Self>, dataset: &DatasetName, shard: &ShardName) -> Result<Arc<Entry>> {
        let key = (dataset.to_string(), shard.to_string());
        if let Some(entry) = self.index.fresh(&key) {
            return Ok(entry);
        }
        let cached = self.index.get(&key);
        if let Some(entry) = cached.as_ref().filter(|_| self.revalidation.paused()) {
            // The hub did not answer lately: serve what is cached without asking.
            self.index.touch(entry);
            return Ok(entry.clone());
        }
        let lookup = {
            let mut lookups = self.lookups.lock().unwrap_or_else(|p| p.into_inner());
            lookups
                .entry(key.clone())
                .or_insert_with(|| {
                    let (cache, dataset, shard) = (self.clone(), dataset.clone(), shard.clone());
                    let (done_cache, done_key) = (self.clone(), key.clone());
                    spawn_shared(
                        "shard lookup",
                        async move { cache.lookup(&dataset, &shard).await },
                        move || {
                            done_cache.lookups.lock().unwrap_or_else(|p| p.into_inner()).remove(&done_key);
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
                self.index.touch(&entry);
                Ok(entry)
            }
        }
    }

    /// [`Cache::entry`] for a call that will read `reads` (`(offset, length)` pairs) of
    /// the shard. When the cache has never seen the shard, the chunks those reads cover
    /// entirely are read from the hub alongside its `StatShard` rather than after it,
    /// and kept when the hub read them at the version the stat returns: a cold read
    /// costs one round trip to the hub, not two. Only whole chunks that end within a
    /// read are asked for (a read inside the shard proves they exist), at most what the
    /// in-flight byte bound has room for.
    pub async fn entry_for(
        self: &Arc<Self>,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
        row: &JobRow,
    ) -> Result<Arc<Entry>> {
        let key = (dataset.to_string(), shard.to_string());
        // The warm path: one look at the index (not again in `entry`).
        if let Some(entry) = self.index.fresh(&key) {
            return Ok(entry);
        }
        if self.index.get(&key).is_some() {
            return self.entry(dataset, shard).await;
        }
        let chunk_size = self.config.chunk_size;
        let mut chunks: Vec<u64> = reads
            .iter()
            .flat_map(|&(offset, length)| offset / chunk_size..(offset + length) / chunk_size)
            .collect();
        chunks.sort_unstable();
        chunks.dedup();
        // A shard another member owns is read from it (by the fetcher), not from the hub.
        if chunks.is_empty() || !self.upstream().owns(dataset.as_str(), shard.as_str()) {
            return self.entry(dataset, shard).await;
        }
        for &index in &chunks {
            self.fetcher.speculate(
                self,
                dataset.as_str(),
                shard.as_str(),
                index * chunk_size,
                chunk_size,
                row,
            );
        }
        // Forgotten however this call ends; by then the chunks' fetches that take them
        // up are registered.
        let _forget =
            Forget { cache: self, dataset: dataset.as_str(), shard: shard.as_str(), chunks: &chunks };
        let entry = self.entry(dataset, shard).await?;
        for &index in &chunks {
            // Past the end (the read was invalid): nothing to take up.
            if entry.chunk_range(index) == (index * chunk_size, chunk_size) {
                drop(self.fetch_chunk(&entry, index, row));
            }
        }
        Ok(entry)
    }

    /// The slow path of [`Cache::entry`]: ask the hub.
    async fn lookup(self: &Arc<Self>, dataset: &DatasetName, shard: &ShardName) -> Result<Arc<Entry>> {
        let key = (dataset.to_string(), shard.to_string());
        // Another lookup may have refreshed it since the caller looked.
        if let Some(entry) = self.index.fresh(&key) {
            return Ok(entry);
        }
        let upstream = self.upstream();
        let Some(entry) = self.index.get(&key) else {
            let info = upstream.stat(dataset.as_str(), shard.as_str()).await?;
            return self.index.install(key, &info, self.config.chunk_size).await;
        };
        // Readers are served the cached version after REVALIDATION_WAIT; past it, the
        // hub counts as not answering (once per lookup, not once per waiting reader), so
        // revalidation pauses while this stat carries on to --hub-timeout.
        let stat = upstream.stat(dataset.as_str(), shard.as_str());
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
                self.index.revalidated(&entry).await?;
                Ok(entry)
            }
            Ok(info) => {
                tracing::info!(dataset = %dataset, shard = %shard, old = %entry.version, new = %info.version, "shard changed on the hub");
                self.drop_entry(&entry, false).await;
                self.index.install(key, &info, self.config.chunk_size).await
            }
            Err(e) if e.hub_cannot_answer() => {
                // Whatever the trouble (down, hung, overloaded, refusing us, garbled),
                // the verified bytes on disk are still the version the hub served.
                self.index.touch(&entry);
                Ok(entry)
            }
            Err(e) if e.code() == tonic::Code::NotFound => {
                self.drop_entry(&entry, true).await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    fn revalidation_failed(&self, why: &dyn std::fmt::Display) {
        self.metrics.revalidation_failures.fetch_add(1, Relaxed);
        self.revalidation.failed(why);
    }

    /// Evicts `entries` (their chunks and records); returns (shards, bytes) evicted.
    /// Shared by the evictor and the `Evict` call.
    pub async fn evict(&self, entries: &[Arc<Entry>]) -> (u64, u64) {
        let _running = self.capacity.evicting();
        let (mut shards, mut bytes) = (0, 0);
        for entry in entries {
            bytes += self.drop_entry(entry, true).await;
            shards += 1;
        }
        if shards > 0 {
            self.metrics.evicted_shards.fetch_add(shards, Relaxed);
            self.metrics.evicted_bytes.fetch_add(bytes, Relaxed);
        }
        (shards, bytes)
    }

    /// Removes `entry` from the index and its pages from the store. `with_record`: also
    /// delete the record (not when a newer version takes its key).
    async fn drop_entry(&self, entry: &Arc<Entry>, with_record: bool) -> u64 {
        // Waits for admissions in progress; none starts after `evicted` is set.
        let _chunks = entry.chunk_writes.write().await;
        let _record = entry.record_writes.lock().await;
        let bytes = {
            let mut state = entry.state();
            if state.evicted {
                return 0;
            }
            state.evicted = true;
            state.record.cached_bytes()
        };
        self.index.remove(entry);
        self.capacity.removed(bytes);
        let (store, id, dataset, shard) =
            (self.store.clone(), entry.id, entry.dataset.clone(), entry.shard.clone());
        let deleted = blocking(move || {
            store.delete_shard(id, with_record.then_some((dataset.as_str(), shard.as_str())))
        })
        .await;
        if let Err(e) = deleted {
            tracing::error!(error = %e, "could not delete an evicted shard's pages");
        }
        bytes
    }

    /// The shared fetch of chunk `index`: started unless one is already running (what
    /// it fetches is counted in `row`).
    pub(crate) fn fetch_chunk(self: &Arc<Self>, entry: &Arc<Entry>, index: u64, row: &JobRow) -> ChunkFetch {
        self.fetcher.chunk(self, entry, index, row)
    }

    /// Fetches every absent chunk of `entry`, `shard_fetch_parallelism` at a time, and
    /// returns once they are stored, with the bytes that crossed the link (counted in
    /// `row`).
    pub async fn fetch_shard(self: &Arc<Self>, entry: &Arc<Entry>, row: &JobRow) -> Result<u64> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let missing: Vec<u64> = (0..entry.chunk_count()).filter(|&i| !entry.has_chunk(i)).collect();
        stream::iter(missing)
            .map(|index| self.fetch_chunk(entry, index, row).stored)
            .buffer_unordered(self.config.shard_fetch_parallelism.max(1))
            .try_fold(0, |sum, n| async move { Ok(sum + n) })
            .await
    }

    /// Writes a verified chunk, then makes it visible.
    pub(crate) async fn admit(&self, entry: &Arc<Entry>, index: u64, data: Bytes) -> Result<()> {
        let _sharing = entry.chunk_writes.read().await;
        {
            let state = entry.state();
            if state.evicted || state.record.has_chunk(index) {
                return Ok(());
            }
        }
        let (store, id) = (self.store.clone(), entry.id);
        let (offset, length) = entry.chunk_range(index);
        blocking(move || store.admit_chunk(id, offset, &data)).await?;
        entry.state().record.set_chunk(index, true);
        self.capacity.added(length);
        Ok(())
    }

    /// Read-ahead and whole-shard fetch, in the background.
    fn after_read(self: &Arc<Self>, entry: &Arc<Entry>, last: u64, missed: bool, row: &JobRow) {
        let start_whole = missed && self.config.fetch_whole_shard && {
            let mut state = entry.state();
            !std::mem::replace(&mut state.whole_fetch_started, true)
        };
        if start_whole {
            let (cache, entry, row) = (self.clone(), entry.clone(), row.clone());
            tokio::spawn(async move {
                if let Err(e) = cache.fetch_shard(&entry, &row).await {
                    tracing::warn!(dataset = %entry.dataset, shard = %entry.shard, error = %e, "background shard fetch failed");
                }
            });
            return;
        }
        for index in
            (last + 1..=last + self.config.read_ahead_chunks).take_while(|&i| i < entry.chunk_count())
        {
            if !entry.has_chunk(index) {
                // Started by `fetch_chunk` itself; the result is only wanted in the store.
                drop(self.fetch_chunk(entry, index, row));
            }
        }
    }
}

/// Forgets `entry_for`'s speculative reads when it ends (see
/// `Fetcher::forget_speculation`).
struct Forget<'a> {
    cache: &'a Cache,
    dataset: &'a str,
    shard: &'a str,
    chunks: &'a [u64],
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let chunk_size = self.cache.config.chunk_size;
        for &index in self.chunks {
            self.cache.fetcher.forget_speculation(self.dataset, self.shard, index * chunk_size);
        }
    }
}
