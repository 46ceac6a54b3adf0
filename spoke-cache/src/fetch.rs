//! Upstream fetches: one shared fetch per missing chunk (request coalescing), whole
//! shards fetched with bounded parallelism, and admission of verified chunks.
//!
//! A fetch runs in its own task, so a reader that goes away does not cancel it for the
//! others waiting on the same chunk. Readers get the verified bytes as soon as they
//! arrive; the task then stores the chunk and only then leaves `inflight`, after its
//! presence bit is set, so a chunk is always either present or being fetched by exactly
//! one task (and a reader arriving meanwhile takes the bytes from memory).

use std::{
    sync::{Arc, atomic::Ordering::Relaxed},
    time::Instant,
};

use bytes::Bytes;
use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
use shardcache_reader::ReadError;

use crate::{
    Error, Result,
    cache::{Cache, SharedFetch, blocking, spawn_shared},
    entry::Entry,
};

/// One chunk's fetch, shared by everyone who needs the chunk while it runs.
#[derive(Debug, Clone)]
pub(crate) struct ChunkFetch {
    /// The chunk's bytes, verified, as soon as they have arrived (what readers wait for).
    pub(crate) fetched: SharedFetch,
    /// Bytes that crossed the link, once the chunk is stored (what a prefetch waits for:
    /// when it reports a shard done, the shard is on disk).
    pub(crate) stored: Shared<BoxFuture<'static, Result<u64>>>,
}

impl Cache {
    /// Fetches every absent chunk of `entry`, `shard_fetch_parallelism` at a time, and
    /// returns once they are stored, with the bytes that crossed the link.
    pub async fn fetch_shard(self: &Arc<Self>, entry: &Arc<Entry>) -> Result<u64> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let missing: Vec<u64> = (0..entry.chunk_count()).filter(|&i| !entry.has_chunk(i)).collect();
        stream::iter(missing)
            .map(|index| self.fetch_chunk(entry, index).stored)
            .buffer_unordered(self.config.shard_fetch_parallelism.max(1))
            .try_fold(0, |sum, n| async move { Ok(sum + n) })
            .await
    }

    /// The shared fetch of chunk `index`: started here unless one is already running.
    pub(crate) fn fetch_chunk(self: &Arc<Self>, entry: &Arc<Entry>, index: u64) -> ChunkFetch {
        let key = (entry.id, index);
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(running) = inflight.get(&key) {
            return running.clone();
        }
        let (cache, entry) = (self.clone(), entry.clone());
        // Checked under the lock: a fetch sets the presence bit before it leaves
        // `inflight`, so a chunk is either present here or its fetch is registered.
        if entry.has_chunk(index) {
            let fetched = async move {
                let (offset, length) = entry.chunk_range(index);
                match cache.read_stored(&entry, index, offset, offset + length).await? {
                    Some(bytes) => Ok(bytes),
                    None => cache.fetch_chunk(&entry, index).fetched.await,
                }
            };
            return ChunkFetch {
                fetched: fetched.boxed().shared(),
                stored: futures::future::ready(Ok(0)).boxed().shared(),
            };
        }
        let (bytes_tx, bytes_rx) = tokio::sync::oneshot::channel();
        // Removed only after this fetch was registered: the lock is held until then.
        let done_cache = cache.clone();
        let stored = spawn_shared(
            "chunk fetch",
            async move {
                let (offset, length) = entry.chunk_range(index);
                // Held until the chunk is stored (see `CacheConfig::upstream_bytes_in_flight`).
                let _room = cache
                    .upstream_budget
                    .acquire_many(length.div_ceil(1024) as u32)
                    .await
                    .map_err(|_| Error::Internal("upstream budget closed".into()))?;
                let fetched = {
                    // Held for the request only: storing the chunk needs no hub.
                    let _request = cache
                        .upstream_requests
                        .acquire()
                        .await
                        .map_err(|_| Error::Internal("upstream requests closed".into()))?;
                    cache.fetch_verified(&entry, offset, length).await
                };
                let _ = bytes_tx.send(fetched.clone());
                if let Err(e) = cache.admit(&entry, index, fetched?).await {
                    // Serving the verified bytes was still right; only caching them failed.
                    tracing::error!(error = %e, "could not store a fetched chunk");
                }
                Ok(length)
            },
            move || {
                done_cache.inflight.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
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

    /// `[offset, offset + length)` of `entry` from the hub, verified by the SDK.
    async fn fetch_verified(&self, entry: &Arc<Entry>, offset: u64, length: u64) -> Result<Bytes> {
        let started = Instant::now();
        self.metrics.upstream_requests.fetch_add(1, Relaxed);
        let fetched = self.upstream.read(&entry.dataset, &entry.shard, offset, length, &entry.version).await;
        let data = match fetched {
            Ok(data) => data,
            Err(e) if e.code() == tonic::Code::Aborted => {
                // The hub has a newer version: check it at the next access.
                entry.state().record.validated_at_ms = 0;
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
        Ok(data)
    }

    /// Writes a verified chunk, then makes it visible.
    async fn admit(&self, entry: &Arc<Entry>, index: u64, data: Bytes) -> Result<()> {
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
        let used = self.used.fetch_add(length, Relaxed) + length;
        if used as f64 > self.config.capacity as f64 * self.config.high_watermark {
            self.evict_wakeup.notify_one();
        }
        Ok(())
    }
}
