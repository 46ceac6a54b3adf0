//! The read-through cache: which shard versions are cached, which of their chunks are
//! present, and how a miss becomes exactly one upstream fetch.
//!
//! - An [`Entry`] is one shard *version* with its own store id. A new version found at
//!   revalidation replaces the entry (new id), so bytes of two versions never mix.
//! - A read serves present chunks from the store (CRC-checked per page) and fetches the
//!   others through `fetch.rs` (one shared fetch per chunk; a chunk becomes visible only
//!   once written and verified).
//! - Versions are revalidated with the hub after `revalidate_after`; when the hub cannot
//!   be reached, cached shards are served as they are and misses fail with UNAVAILABLE.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use bytes::{Bytes, BytesMut};
use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
use shardcache_proto::{
    names::{DatasetName, ShardName},
    v1::ShardInfo,
};
use tokio::sync::Notify;

use crate::{
    Error, Result,
    entry::Entry,
    fetch::ChunkFetch,
    metrics::Metrics,
    store::{PageFault, ShardRecord, Store},
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
}

/// Chunk requests to the hubs in flight at once, whatever their size. The byte bound
/// alone let a cold read of many small chunks (16 MiB in 64 KiB chunks) send 256
/// requests at once, and a hub sheds what is over its `--max-concurrency` (256 by
/// default, for all its spokes together) with RESOURCE_EXHAUSTED. 32 is what whole-shard
/// fetches kept in flight before reads started all their chunks at once (4 shards x 8);
/// with the default 4 MiB chunks the 64 MiB byte bound (16 chunks) binds first.
pub const UPSTREAM_REQUESTS_IN_FLIGHT: usize = 32;

type ShardKey = (String, String);
pub(crate) type SharedFetch = Shared<BoxFuture<'static, Result<Bytes>>>;
type SharedLookup = Shared<BoxFuture<'static, Result<Arc<Entry>>>>;

/// The cache.
#[derive(Debug)]
pub struct Cache {
    pub(crate) store: Arc<Store>,
    pub(crate) upstream: Upstream,
    pub(crate) config: CacheConfig,
    pub(crate) metrics: Arc<Metrics>,
    /// Read-locked by reads and by eviction's scan alike, so neither waits for the
    /// other; written only to add or remove an entry.
    index: RwLock<HashMap<ShardKey, Arc<Entry>>>,
    pub(crate) inflight: Mutex<HashMap<(u64, u64), ChunkFetch>>,
    /// Shard lookups (StatShard) in progress, shared by concurrent callers.
    lookups: Mutex<HashMap<ShardKey, SharedLookup>>,
    /// Room for `upstream_bytes_in_flight`, in KiB permits.
    pub(crate) upstream_budget: tokio::sync::Semaphore,
    /// Room for [`UPSTREAM_REQUESTS_IN_FLIGHT`] requests to the hubs.
    pub(crate) upstream_requests: tokio::sync::Semaphore,
    next_id: AtomicU64,
    pub(crate) used: AtomicU64,
    started: Instant,
    pub(crate) evict_wakeup: Notify,
    /// Eviction passes running (see `evict.rs`).
    pub(crate) evicting: AtomicU64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Runs store work on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Error::Internal(format!("store task failed: {e}"))))
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
        let upstream_budget = tokio::sync::Semaphore::new(
            (config.upstream_bytes_in_flight.max(config.chunk_size) >> 10) as usize,
        );
        // Records with the chunks their files hold; files of no record are gone.
        let records = store.load_records()?;
        let next_id = records.iter().map(|(_, _, r)| r.id + 1).max().unwrap_or(1);
        let mut index = HashMap::new();
        let mut used = 0;
        for (dataset, shard, record) in records {
            if record.chunk_size == 0 || u64::from(record.chunk_size) != config.chunk_size {
                // Cached with another chunk size: drop rather than reinterpret.
                store.delete_shard(record.id, Some((&dataset, &shard)))?;
                continue;
            }
            used += record.cached_bytes();
            let entry = Entry::new(dataset.clone(), shard.clone(), record, 0);
            index.insert((dataset, shard), Arc::new(entry));
        }
        tracing::info!(shards = index.len(), used_bytes = used, "cache loaded");
        Ok(Arc::new(Self {
            store: Arc::new(store),
            upstream,
            config,
            metrics,
            index: RwLock::new(index),
            inflight: Mutex::default(),
            lookups: Mutex::default(),
            upstream_budget,
            upstream_requests: tokio::sync::Semaphore::new(UPSTREAM_REQUESTS_IN_FLIGHT),
            next_id: AtomicU64::new(next_id),
            used: AtomicU64::new(used),
            started: Instant::now(),
            evict_wakeup: Notify::new(),
            evicting: AtomicU64::new(0),
        }))
    }

    fn index(&self) -> RwLockReadGuard<'_, HashMap<ShardKey, Arc<Entry>>> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    fn index_mut(&self) -> RwLockWriteGuard<'_, HashMap<ShardKey, Arc<Entry>>> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn used_bytes(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Chunk fetches running: fetched chunks not yet stored count here, not in
    /// [`Cache::used_bytes`] (readers get a chunk's bytes before it is stored).
    pub fn fetches_in_flight(&self) -> usize {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Every cached entry.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        self.index().values().cloned().collect()
    }

    fn touch(&self, entry: &Entry) {
        entry.state().last_access = self.started.elapsed().as_millis() as u64;
    }

    /// The cached entry of a shard, checked with the hub when its TTL has passed, or a
    /// new entry from the hub's `StatShard`.
    ///
    /// Concurrent callers for one shard share one lookup (one `StatShard`): a trainer's
    /// first batch touches a shard from hundreds of reads at once, and without this
    /// each asked the hub, which shed them (seed-demo, 1536 reads in flight).
    pub async fn entry(self: &Arc<Self>, dataset: &DatasetName, shard: &ShardName) -> Result<Arc<Entry>> {
        let key = (dataset.to_string(), shard.to_string());
        if let Some(entry) = self.fresh(&key) {
            return Ok(entry);
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
        lookup.await
    }

    /// The cached entry of `key` if its version was checked within `revalidate_after`
    /// (marked as used).
    fn fresh(&self, key: &ShardKey) -> Option<Arc<Entry>> {
        let entry = self.index().get(key).cloned()?;
        let validated_at = entry.state().record.validated_at_ms;
        let age = Duration::from_millis(now_ms().saturating_sub(validated_at));
        (age < self.config.revalidate_after).then(|| {
            self.touch(&entry);
            entry
        })
    }

    /// The slow path of [`Cache::entry`]: ask the hub.
    async fn lookup(self: &Arc<Self>, dataset: &DatasetName, shard: &ShardName) -> Result<Arc<Entry>> {
        let key = (dataset.to_string(), shard.to_string());
        // Another lookup may have refreshed it since the caller looked.
        if let Some(entry) = self.fresh(&key) {
            return Ok(entry);
        }
        let cached = self.index().get(&key).cloned();
        let Some(entry) = cached else {
            let info = self.upstream.stat(dataset.as_str(), shard.as_str()).await?;
            return self.install(key, info).await;
        };
        match self.upstream.stat(dataset.as_str(), shard.as_str()).await {
            Ok(info) if info.version == entry.version && info.size == entry.size => {
                entry.state().record.validated_at_ms = now_ms();
                self.persist_record(&entry).await?;
                self.touch(&entry);
                Ok(entry)
            }
            Ok(info) => {
                tracing::info!(dataset = %dataset, shard = %shard, old = %entry.version, new = %info.version, "shard changed on the hub");
                self.drop_entry(&entry, false).await;
                self.install(key, info).await
            }
            Err(Error::HubUnavailable { hub, message }) => {
                tracing::warn!(%hub, %message, dataset = %dataset, shard = %shard, "cannot revalidate: serving the cached version");
                self.touch(&entry);
                Ok(entry)
            }
            Err(e) if e.code() == tonic::Code::NotFound => {
                self.drop_entry(&entry, true).await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Adds an entry for a shard version the hub just described.
    async fn install(self: &Arc<Self>, key: ShardKey, info: ShardInfo) -> Result<Arc<Entry>> {
        let entry = {
            let mut index = self.index_mut();
            if let Some(existing) = index.get(&key).filter(|e| e.version == info.version) {
                return Ok(existing.clone());
            }
            let record = ShardRecord {
                id: self.next_id.fetch_add(1, Relaxed),
                version: info.version.clone(),
                size: info.size,
                chunk_size: self.config.chunk_size as u32,
                record_size: info.record_size,
                present: Vec::new(),
                pinned: false,
                validated_at_ms: now_ms(),
            };
            let now = self.started.elapsed().as_millis() as u64;
            let entry = Arc::new(Entry::new(key.0.clone(), key.1.clone(), record, now));
            index.insert(key, entry.clone());
            entry
        };
        self.persist_record(&entry).await?;
        Ok(entry)
    }

    /// Writes `entry`'s record as it is now (copied under the lock that orders record
    /// writes, so a slower writer never puts back an older copy).
    async fn persist_record(&self, entry: &Arc<Entry>) -> Result<()> {
        let _serial = entry.record_writes.lock().await;
        let record = {
            let state = entry.state();
            if state.evicted {
                return Ok(());
            }
            state.record.clone()
        };
        let (store, dataset, shard) = (self.store.clone(), entry.dataset.clone(), entry.shard.clone());
        blocking(move || store.put_record(&dataset, &shard, &record)).await
    }

    /// Removes `entry` from the index and its pages from the store. `with_record`: also
    /// delete the record (not when a newer version takes its key).
    pub(crate) async fn drop_entry(&self, entry: &Arc<Entry>, with_record: bool) -> u64 {
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
        {
            let mut index = self.index_mut();
            let key = (entry.dataset.clone(), entry.shard.clone());
            if index.get(&key).is_some_and(|e| e.id == entry.id) {
                index.remove(&key);
            }
        }
        self.used.fetch_sub(bytes, Relaxed);
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

    /// Reads `[offset, offset + length)` of `entry` (inside the shard: checked by the
    /// caller), from the store where present and from the hub where not.
    pub async fn read(self: &Arc<Self>, entry: &Arc<Entry>, offset: u64, length: u64) -> Result<Bytes> {
        let mut read = self.read_many(&[(entry, offset, length)]).await?;
        Ok(read.pop().unwrap_or_default())
    }

    /// Reads several ranges (each inside its shard: checked by the caller) for one call.
    ///
    /// Every missing chunk's fetch starts before anything is awaited, so a cold read of
    /// n chunks costs one round trip to the hub, not n; and every stored part is read in
    /// one trip to the blocking pool, so a warm batch makes one hop off the runtime.
    pub async fn read_many(self: &Arc<Self>, wants: &[(&Arc<Entry>, u64, u64)]) -> Result<Vec<Bytes>> {
        let mut parts = Vec::new();
        for (want, &(entry, offset, length)) in wants.iter().enumerate() {
            if length == 0 {
                continue;
            }
            let end = offset + length;
            for index in offset / entry.chunk_size..=(end - 1) / entry.chunk_size {
                let (chunk_start, chunk_len) = entry.chunk_range(index);
                let (from, to) = (offset.max(chunk_start), end.min(chunk_start + chunk_len));
                let fetch = (!entry.has_chunk(index)).then(|| self.fetch_chunk(entry, index));
                parts.push(Part { want, entry, index, from, to, fetch, bytes: None });
            }
        }
        let stored: Vec<(u64, u64, u64)> =
            parts.iter().filter(|p| p.fetch.is_none()).map(|p| (p.entry.id, p.from, p.to - p.from)).collect();
        if !stored.is_empty() {
            let store = self.store.clone();
            let read: Vec<Result<Bytes, PageFault>> = blocking(move || {
                stored.into_iter().map(|(id, from, len)| store.read(id, from, len)).collect()
            })
            .await?;
            for (part, result) in parts.iter_mut().filter(|p| p.fetch.is_none()).zip(read) {
                match result {
                    Ok(bytes) => part.bytes = Some(bytes),
                    Err(fault) => {
                        // Its stored copy failed its check (now forgotten): fetch it.
                        self.stored_fault(part.entry, part.index, fault).await;
                        part.fetch = Some(self.fetch_chunk(part.entry, part.index));
                    }
                }
            }
        }
        let fetched = parts.iter().filter_map(|part| {
            let fetch = part.fetch.as_ref()?.fetched.clone();
            let chunk_start = part.index * part.entry.chunk_size;
            let range = (part.from - chunk_start) as usize..(part.to - chunk_start) as usize;
            Some(async move {
                let chunk = fetch.await?;
                // A part of a chunk is copied out rather than sliced: a slice would keep
                // the whole chunk alive as long as the response, so a batch of small reads
                // in many chunks would hold chunk size x ranges instead of what it returns.
                Ok::<_, Error>(if range.len() == chunk.len() {
                    chunk
                } else {
                    Bytes::copy_from_slice(&chunk[range])
                })
            })
        });
        let mut fetched = futures::future::try_join_all(fetched).await?.into_iter();
        for part in parts.iter_mut().filter(|p| p.fetch.is_some()) {
            part.bytes = fetched.next();
        }
        // Parts were planned in the order of the ranges: each range takes its run.
        let mut parts = parts.into_iter().peekable();
        let mut out = Vec::with_capacity(wants.len());
        for (want, &(entry, _, length)) in wants.iter().enumerate() {
            let (mut mine, mut missed, mut last) = (Vec::new(), false, None);
            while let Some(part) = parts.next_if(|p| p.want == want) {
                missed |= part.fetch.is_some();
                last = Some(part.index);
                mine.extend(part.bytes);
            }
            if let Some(last) = last {
                self.after_read(entry, last, missed);
            }
            let counters = self.metrics.dataset(&entry.dataset);
            let (requests, bytes) = if missed {
                (&counters.miss_requests, &counters.miss_bytes)
            } else {
                (&counters.hit_requests, &counters.hit_bytes)
            };
            requests.fetch_add(1, Relaxed);
            bytes.fetch_add(length, Relaxed);
            out.push(concat(mine));
        }
        Ok(out)
    }

    /// Stored bytes `[from, to)` of chunk `index`, or `None` when they must be fetched
    /// (a missing or corrupt page: the chunk is then marked absent).
    pub(crate) async fn read_stored(
        &self,
        entry: &Arc<Entry>,
        index: u64,
        from: u64,
        to: u64,
    ) -> Result<Option<Bytes>> {
        let (store, id) = (self.store.clone(), entry.id);
        match blocking(move || store.read(id, from, to - from)).await? {
            Ok(bytes) => Ok(Some(bytes)),
            Err(fault) => {
                self.stored_fault(entry, index, fault).await;
                Ok(None)
            }
        }
    }

    /// A stored chunk that cannot be served: counted and logged, then forgotten so that
    /// it is fetched again.
    async fn stored_fault(&self, entry: &Arc<Entry>, index: u64, fault: PageFault) {
        if let PageFault::Corrupt { page } = fault {
            self.metrics.checksum_failures.fetch_add(1, Relaxed);
            tracing::error!(dataset = %entry.dataset, shard = %entry.shard, page, "stored page failed its checksum; refetching");
        } else {
            tracing::warn!(dataset = %entry.dataset, shard = %entry.shard, ?fault, "stored chunk incomplete; refetching");
        }
        self.forget_chunk(entry, index).await;
    }

    /// Marks chunk `index` absent and removes its stored copy, so a refetch can store it
    /// again.
    async fn forget_chunk(&self, entry: &Arc<Entry>, index: u64) {
        let _exclusive = entry.chunk_writes.write().await;
        {
            let mut state = entry.state();
            // An evicted entry's bytes were already taken off `used` as a whole.
            if state.evicted || !state.record.has_chunk(index) {
                return;
            }
            state.record.set_chunk(index, false);
        }
        let (offset, length) = entry.chunk_range(index);
        self.used.fetch_sub(length, Relaxed);
        let (store, id) = (self.store.clone(), entry.id);
        if let Err(e) = blocking(move || store.delete_chunk(id, offset, length)).await {
            tracing::error!(error = %e, "could not remove a damaged chunk; its refetch is stored over it");
        }
    }

    /// Read-ahead and whole-shard fetch, in the background.
    fn after_read(self: &Arc<Self>, entry: &Arc<Entry>, last: u64, missed: bool) {
        let start_whole = missed && self.config.fetch_whole_shard && {
            let mut state = entry.state();
            !std::mem::replace(&mut state.whole_fetch_started, true)
        };
        if start_whole {
            let (cache, entry) = (self.clone(), entry.clone());
            tokio::spawn(async move {
                if let Err(e) = cache.fetch_shard(&entry).await {
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
                drop(self.fetch_chunk(entry, index));
            }
        }
    }

    /// Sets or clears the pin of `entry`; true when it changed.
    pub async fn set_pinned(&self, entry: &Arc<Entry>, pinned: bool) -> Result<bool> {
        {
            let mut state = entry.state();
            if state.record.pinned == pinned {
                return Ok(false);
            }
            state.record.pinned = pinned;
        }
        self.persist_record(entry).await?;
        Ok(true)
    }

    /// Marks `entry` as part of a running prefetch (or no longer).
    pub fn hold_for_prefetch(&self, entry: &Entry, hold: bool) {
        let mut state = entry.state();
        if hold {
            state.prefetching += 1;
        } else {
            state.prefetching = state.prefetching.saturating_sub(1);
        }
    }

    /// The least recently used entry that may be evicted: never a pinned one; one held
    /// by a prefetch only when nothing else is left.
    pub(crate) fn eviction_victim(&self) -> Option<Arc<Entry>> {
        let index = self.index();
        let candidates = index.values().filter_map(|e| {
            let state = e.state();
            let evictable = !state.record.pinned && !state.evicted && state.record.cached_bytes() > 0;
            evictable.then(|| (state.prefetching > 0, state.last_access, e.clone()))
        });
        candidates.min_by_key(|(held, last_access, _)| (*held, *last_access)).map(|(_, _, e)| e)
    }

    /// An entry from the index, without contacting the hub.
    pub fn cached_entry(&self, dataset: &str, shard: &str) -> Option<Arc<Entry>> {
        self.index().get(&(dataset.to_owned(), shard.to_owned())).cloned()
    }
}

/// One chunk's share of one range of a `read_many` call.
struct Part<'a> {
    /// Which range of the call.
    want: usize,
    entry: &'a Arc<Entry>,
    index: u64,
    /// Shard offsets `[from, to)` of the part.
    from: u64,
    to: u64,
    /// The chunk's fetch, when it is not (or no longer) stored.
    fetch: Option<ChunkFetch>,
    bytes: Option<Bytes>,
}

/// Joins parts without copying when there is only one.
fn concat(mut parts: Vec<Bytes>) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut out = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    for part in parts {
        out.extend_from_slice(&part);
    }
    out.freeze()
}
