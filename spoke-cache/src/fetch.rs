//! Upstream fetches: one shared fetch per missing chunk (request coalescing), whole
//! shards fetched with bounded parallelism, and admission of verified chunks.
//!
//! A fetch runs in its own task, so a reader that goes away does not cancel it for the
//! others waiting on the same chunk; a chunk's presence bit is set only after its pages
//! and record are written, and before the fetch leaves `inflight`, so a chunk is always
//! either present or being fetched by exactly one task.

use std::{
    sync::{Arc, atomic::Ordering::Relaxed},
    time::Instant,
};

use bytes::Bytes;
use futures::FutureExt;

use crate::{
    Error, Result,
    cache::{Cache, SharedFetch, blocking, spawn_shared},
    entry::Entry,
};

impl Cache {
    /// Fetches every absent chunk of `entry`, `shard_fetch_parallelism` at a time.
    /// Returns the bytes that crossed the link.
    pub async fn fetch_shard(self: &Arc<Self>, entry: &Arc<Entry>) -> Result<u64> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let missing: Vec<u64> = (0..entry.chunk_count()).filter(|&i| !entry.has_chunk(i)).collect();
        stream::iter(missing)
            .map(|index| {
                let fetch = self.fetch_chunk(entry, index);
                async move { fetch.await.map(|bytes| bytes.len() as u64) }
            })
            .buffer_unordered(self.config.shard_fetch_parallelism.max(1))
            .try_fold(0, |sum, n| async move { Ok(sum + n) })
            .await
    }

    /// The shared fetch of chunk `index`: started here unless one is already running.
    pub(crate) fn fetch_chunk(self: &Arc<Self>, entry: &Arc<Entry>, index: u64) -> SharedFetch {
        let key = (entry.id, index);
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(running) = inflight.get(&key) {
            return running.clone();
        }
        let (cache, entry) = (self.clone(), entry.clone());
        // Checked under the lock: a fetch sets the presence bit before it leaves
        // `inflight`, so a chunk is either present here or its fetch is registered.
        if entry.has_chunk(index) {
            return async move {
                let (offset, length) = entry.chunk_range(index);
                match cache.read_stored(&entry, index, offset, offset + length).await? {
                    Some(bytes) => Ok(bytes),
                    None => cache.fetch_chunk(&entry, index).await,
                }
            }
            .boxed()
            .shared();
        }
        // Removed only after this fetch was registered: the lock is held until then.
        let done_cache = cache.clone();
        let shared = spawn_shared(
            "chunk fetch",
            async move { cache.fetch_and_admit(&entry, index).await },
            move || {
                done_cache.inflight.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
            },
        );
        inflight.insert(key, shared.clone());
        shared
    }

    async fn fetch_and_admit(self: &Arc<Self>, entry: &Arc<Entry>, index: u64) -> Result<Bytes> {
        let (offset, length) = entry.chunk_range(index);
        // Held until the chunk is stored (see `CacheConfig::upstream_bytes_in_flight`).
        let _room = self
            .upstream_budget
            .acquire_many(length.div_ceil(1024) as u32)
            .await
            .map_err(|_| Error::Internal("upstream budget closed".into()))?;
        let started = Instant::now();
        self.metrics.upstream_requests.fetch_add(1, Relaxed);
        let fetched = self.upstream.read(&entry.dataset, &entry.shard, offset, length, &entry.version).await;
        let data = match fetched {
            Ok(data) => data,
            Err(e) if e.code() == tonic::Code::Aborted => {
                // The hub has a newer version: check it at the next access.
                entry.state().record.validated_at_ms = 0;
                return Err(Error::VersionChanged {
                    dataset: entry.dataset.clone(),
                    shard: entry.shard.clone(),
                    expected: entry.version.clone(),
                    found: "a newer version on the hub".into(),
                });
            }
            Err(e) => return Err(e),
        };
        self.metrics.fetch_latency.observe(started.elapsed());
        self.metrics.dataset(&entry.dataset).upstream_bytes.fetch_add(length, Relaxed);
        if let Err(e) = self.admit(entry, index, data.clone()).await {
            // Serving the verified bytes is still right; only caching them failed.
            tracing::error!(error = %e, "could not store a fetched chunk");
        }
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
