//! Upstream fetches: one shared fetch per missing chunk (request coalescing), bounded by
//! bytes and by requests in flight to the hubs.
//!
//! A fetch runs in its own task, so a reader that goes away does not cancel it for the
//! others waiting on the same chunk. Readers get the verified bytes as soon as they
//! arrive; the task then has the cache admit the chunk and only then leaves `inflight`,
//! after its presence bit is set, so a chunk is always either present or being fetched
//! by exactly one task (and a reader arriving meanwhile takes the bytes from memory).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, atomic::Ordering::Relaxed},
    time::Instant,
};

use bytes::Bytes;
use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
use shardcache_reader::ReadError;
use tokio::sync::Semaphore;

use crate::{
    Error, Result,
    cache::{Cache, CacheConfig, spawn_shared},
    entry::Entry,
    jobs::JobRow,
    metrics::Metrics,
    upstream::Upstream,
};

/// Chunk requests to the hubs in flight at once, whatever their size. The byte bound
/// alone let a cold read of many small chunks (16 MiB in 64 KiB chunks) send 256
/// requests at once, and a hub sheds what is over its `--max-concurrency` (256 by
/// default, for all its spokes together) with RESOURCE_EXHAUSTED. 32 is what whole-shard
/// fetches kept in flight before reads started all their chunks at once (4 shards x 8);
/// with the default 4 MiB chunks the 64 MiB byte bound (16 chunks) binds first.
pub const UPSTREAM_REQUESTS_IN_FLIGHT: usize = 32;

/// A chunk's bytes, shared by everyone waiting for them.
pub(crate) type SharedFetch = Shared<BoxFuture<'static, Result<Bytes>>>;

/// One chunk's fetch, shared by everyone who needs the chunk while it runs.
#[derive(Debug, Clone)]
pub(crate) struct ChunkFetch {
    /// The chunk's bytes, verified, as soon as they have arrived (what readers wait for).
    pub(crate) fetched: SharedFetch,
    /// Bytes that crossed the link, once the chunk is stored (what a prefetch waits for:
    /// when it reports a shard done, the shard is on disk).
    pub(crate) stored: Shared<BoxFuture<'static, Result<u64>>>,
}

/// A read of a range of a shard the cache had no entry for yet, at whatever version
/// the hub has (see [`Fetcher::speculate`]): its bytes and their version, or `None`.
pub(crate) type SpeculativeRead = Shared<BoxFuture<'static, Option<(Bytes, String)>>>;

/// Speculative reads, by (dataset, shard, offset), until their first reader has taken
/// them up (see [`Cache::entry_for`]).
type Speculating = Mutex<HashMap<(String, String, u64), SpeculativeRead>>;

/// The fetches from the hubs.
#[derive(Debug)]
pub struct Fetcher {
    upstream: Upstream,
    /// Running fetches by `(entry id, chunk index)`.
    inflight: Mutex<HashMap<(u64, u64), ChunkFetch>>,
    /// Room for `CacheConfig::upstream_bytes_in_flight`, in KiB permits.
    budget: Arc<Semaphore>,
    /// Room for [`UPSTREAM_REQUESTS_IN_FLIGHT`] requests to the hubs.
    requests: Semaphore,
    metrics: Arc<Metrics>,
    speculating: Speculating,
}

impl Fetcher {
    pub fn new(upstream: Upstream, config: &CacheConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            upstream,
            inflight: Mutex::default(),
            budget: Arc::new(Semaphore::new(
                (config.upstream_bytes_in_flight.max(config.chunk_size) >> 10) as usize,
            )),
            requests: Semaphore::new(UPSTREAM_REQUESTS_IN_FLIGHT),
            metrics,
            speculating: Speculating::default(),
        }
    }

    /// The hubs (for listings, which are not cached).
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    fn inflight(&self) -> MutexGuard<'_, HashMap<(u64, u64), ChunkFetch>> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Chunk fetches running (fetched chunks not yet stored among them).
    pub fn in_flight(&self) -> usize {
        self.inflight().len()
    }

    /// The shared fetch of chunk `index` of `entry`: started here unless one is already
    /// running (then the bytes it fetches are counted in `row`); `cache` admits the
    /// chunk once fetched.
    pub(crate) fn chunk(
        &self,
        cache: &Arc<Cache>,
        entry: &Arc<Entry>,
        index: u64,
        row: &JobRow,
    ) -> ChunkFetch {
        let key = (entry.id, index);
        let mut inflight = self.inflight();
        if let Some(running) = inflight.get(&key) {
            return running.clone();
        }
        let (cache, entry, row) = (cache.clone(), entry.clone(), row.clone());
        // Checked under the lock: a fetch sets the presence bit before it leaves
        // `inflight`, so a chunk is either present here or its fetch is registered.
        if entry.has_chunk(index) {
            let fetched = async move {
                let (offset, length) = entry.chunk_range(index);
                match cache.read_stored(&entry, index, offset, offset + length).await? {
                    Some(bytes) => Ok(bytes),
                    None => cache.fetch_chunk(&entry, index, &row).fetched.await,
                }
            };
            return ChunkFetch {
                fetched: fetched.boxed().shared(),
                stored: futures::future::ready(Ok(0)).boxed().shared(),
            };
        }
        // A read of this chunk that started alongside the shard's stat: its bytes, when
        // at this version, are this fetch's (not a second trip over the link).
        let speculative = self.speculation(&entry.dataset, &entry.shard, entry.chunk_range(index).0);
        let (bytes_tx, bytes_rx) = tokio::sync::oneshot::channel();
        // Removed only after this fetch was registered: the lock is held until then.
        let done_cache = cache.clone();
        let stored = spawn_shared(
            "chunk fetch",
            async move {
                let fetcher = cache.fetcher();
                let (offset, length) = entry.chunk_range(index);
                // Held until the chunk is stored (see `CacheConfig::upstream_bytes_in_flight`).
                let _room = fetcher
                    .budget
                    .acquire_many(length.div_ceil(1024) as u32)
                    .await
                    .map_err(|_| Error::Internal("upstream budget closed".into()))?;
                let speculated = match speculative {
                    Some(read) => read
                        .await
                        .filter(|(data, version)| *version == entry.version && data.len() as u64 == length),
                    None => None,
                };
                let fetched = match speculated {
                    Some((data, _)) => Ok(data),
                    None => {
                        // Held for the request only: storing the chunk needs no hub.
                        let _request = fetcher
                            .requests
                            .acquire()
                            .await
                            .map_err(|_| Error::Internal("upstream requests closed".into()))?;
                        fetcher.fetch_verified(&entry, offset, length, &row).await
                    }
                };
                let _ = bytes_tx.send(fetched.clone());
                if let Err(e) = cache.admit(&entry, index, fetched?).await {
                    // Serving the verified bytes was still right; only caching them failed.
                    tracing::error!(error = %e, "could not store a fetched chunk");
                }
                Ok(length)
            },
            move || {
                done_cache.fetcher().inflight().remove(&key);
            },
        );
        let fetched = async move {
            bytes_rx
                .await
                .unwrap_or_else(|_| Err(Error::Internal("a chunk fetch ended without an answer".into())))
        };
        let fetch = ChunkFetch { fetched: fetched.boxed().shared(), stored };
        inflight.insert(key, fetch.clone());
        fetch
    }

    /// Starts reading `[offset, offset + length)` of a shard the cache has no entry for
    /// yet, at whatever version the hub has, so that it crosses the link alongside the
    /// shard's `StatShard` (see [`Cache::entry_for`]); the fetch of that chunk, once the
    /// entry is known, takes its bytes when they are at the entry's version. Concurrent
    /// first reads of a shard share one read of each range (a cold batch from 16 ranks
    /// had chunks cross the link twice). `None` bytes when the byte bound has no room
    /// now: speculation never waits for room, so reads waiting for each other's room
    /// cannot deadlock.
    pub(crate) fn speculate(
        &self,
        cache: &Arc<Cache>,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
        row: &JobRow,
    ) {
        let key = (dataset.to_owned(), shard.to_owned(), offset);
        let mut speculating = self.speculating.lock().unwrap_or_else(|p| p.into_inner());
        if speculating.contains_key(&key) {
            return;
        }
        let (cache, row) = (cache.clone(), row.clone());
        let (dataset, shard) = (dataset.to_owned(), shard.to_owned());
        let read = tokio::spawn(async move {
            let fetcher = cache.fetcher();
            let _room = fetcher.budget.clone().try_acquire_many_owned(length.div_ceil(1024) as u32).ok()?;
            let _request = fetcher.requests.acquire().await.ok()?;
            let started = Instant::now();
            // In a group, what a member ranked after this one holds (it owned the shard
            // before this one joined) is taken over the local network.
            if let Some(peers) = fetcher.upstream.peers()
                && let Some(held) = peers.held(&dataset, &shard, offset, length, None).await
            {
                fetcher.metrics.fetch_latency.observe(started.elapsed());
                fetcher.metrics.dataset(&dataset).peer_bytes.fetch_add(length, Relaxed);
                return Some(held);
            }
            fetcher.metrics.upstream_requests.fetch_add(1, Relaxed);
            let read =
                fetcher.upstream.read_at_any_version(&dataset, &shard, offset, length, None).await.ok()?;
            fetcher.metrics.fetch_latency.observe(started.elapsed());
            fetcher.metrics.dataset(&dataset).upstream_bytes.fetch_add(length, Relaxed);
            row.hub_bytes.fetch_add(length, Relaxed);
            Some(read)
        });
        speculating.insert(key, async move { read.await.ok().flatten() }.boxed().shared());
    }

    /// The speculative read of `dataset/shard` at `offset`, if one was started and not
    /// yet forgotten.
    fn speculation(&self, dataset: &str, shard: &str, offset: u64) -> Option<SpeculativeRead> {
        let speculating = self.speculating.lock().unwrap_or_else(|p| p.into_inner());
        speculating.get(&(dataset.to_owned(), shard.to_owned(), offset)).cloned()
    }

    /// Forgets the speculative read of `dataset/shard` at `offset`: the fetch that takes
    /// it up is registered (or none will be), and its bytes must not stay in memory.
    pub(crate) fn forget_speculation(&self, dataset: &str, shard: &str, offset: u64) {
        let mut speculating = self.speculating.lock().unwrap_or_else(|p| p.into_inner());
        speculating.remove(&(dataset.to_owned(), shard.to_owned(), offset));
    }

    /// `[offset, offset + length)` of `entry` from the hub, verified by the SDK.
    async fn fetch_verified(
        &self,
        entry: &Arc<Entry>,
        offset: u64,
        length: u64,
        row: &JobRow,
    ) -> Result<Bytes> {
        let started = Instant::now();
        if let Some(peers) = self.upstream.peers() {
            // The members ranked before this spoke first, over the local network.
            if let Some(data) = peers.read(&entry.dataset, &entry.shard, offset, length, &entry.version).await
            {
                self.metrics.fetch_latency.observe(started.elapsed());
                self.metrics.dataset(&entry.dataset).peer_bytes.fetch_add(length, Relaxed);
                return Ok(data);
            }
        }
        self.metrics.upstream_requests.fetch_add(1, Relaxed);
        let fetched = self.upstream.read(&entry.dataset, &entry.shard, offset, length, &entry.version).await;
        let data = match fetched {
            Ok(data) => data,
            Err(e) if e.code() == tonic::Code::Aborted => {
                // The hub has a newer version: check it at the next access.
                entry.expire();
                return Err(Error::Read(ReadError::VersionChanged {
                    dataset: entry.dataset.clone(),
                    shard: entry.shard.clone(),
                    expected: entry.version.clone(),
                    found: "a newer version on the hub".into(),
                }));
            }
            Err(e) => return Err(e),
        };
        self.metrics.fetch_latency.observe(started.elapsed());
        self.metrics.dataset(&entry.dataset).upstream_bytes.fetch_add(length, Relaxed);
        row.hub_bytes.fetch_add(length, Relaxed);
        Ok(data)
    }
}
