//! Where fetched chunks go, and how cached shards leave: the store, the index and the
//! capacity, kept in step.
//!
//! - [`Admission::admit`]: a verified chunk is written (one file, `store/ingest.rs`),
//!   then made visible (its presence bit) and counted against the capacity;
//! - [`Admission::forget_chunk`]: a stored chunk that failed its check is made absent
//!   and its file removed, so that a refetch can store it again;
//! - [`Admission::remove`]: a shard version leaves the index, its files the disk, its
//!   bytes the capacity (eviction, an `Evict` call, a version the hub replaced).
//!
//! An entry's chunk-write lock orders these: admissions share it, removals take it
//! alone, so no chunk file is added after its shard was removed.

use std::sync::{Arc, atomic::Ordering::Relaxed};

use shardcache_proto::checksum::Checked;

use crate::{
    Result,
    capacity::Capacity,
    entry::Entry,
    index::Index,
    metrics::Metrics,
    store::{Store, blocking},
};

/// The store, the index and the capacity, for admitting and removing.
#[derive(Debug)]
pub struct Admission {
    store: Arc<Store>,
    index: Arc<Index>,
    capacity: Arc<Capacity>,
    metrics: Arc<Metrics>,
}

impl Admission {
    pub fn new(store: Arc<Store>, index: Arc<Index>, capacity: Arc<Capacity>, metrics: Arc<Metrics>) -> Self {
        Self { store, index, capacity, metrics }
    }

    /// Writes verified chunk `index` of `entry`, then makes it visible. Nothing when the
    /// entry was removed meanwhile or the chunk is already there.
    pub async fn admit(&self, entry: &Arc<Entry>, index: u64, chunk: Checked) -> Result<()> {
        let _sharing = entry.chunk_writes.read().await;
        {
            let state = entry.state();
            if state.evicted || state.record.has_chunk(index) {
                return Ok(());
            }
        }
        let (store, id) = (self.store.clone(), entry.id);
        let (offset, length) = entry.chunk_range(index);
        blocking(move || store.admit_chunk(id, offset, &chunk)).await?;
        entry.state().record.set_chunk(index, true);
        self.capacity.added(length);
        // Checked here, not in the task: below the threshold (most caches) no task is
        // spawned, so none outlives the spoke holding its store open.
        if entry.chunk_count() > 1 && entry.is_complete() && self.store.wants_merge() {
            self.merge_later(entry);
        }
        Ok(())
    }

    /// Merges `entry`'s chunk files into one in the background, if the store holds
    /// many files (`Store::merge_shard`); removals of the shard wait for it.
    fn merge_later(&self, entry: &Arc<Entry>) {
        let (store, entry) = (self.store.clone(), entry.clone());
        tokio::spawn(async move {
            let _sharing = entry.chunk_writes.read().await;
            if entry.state().evicted {
                return;
            }
            let (id, size) = (entry.id, entry.size);
            match blocking(move || store.merge_shard(id, size)).await {
                Ok(true) => {
                    tracing::debug!(dataset = %entry.dataset, shard = %entry.shard, "merged a shard's chunk files")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "could not merge a shard's chunk files"),
            }
        });
    }

    /// Marks chunk `index` of `entry` absent and removes its stored copy.
    pub async fn forget_chunk(&self, entry: &Arc<Entry>, index: u64) {
        let _exclusive = entry.chunk_writes.write().await;
        {
            let mut state = entry.state();
            // A removed entry's bytes were already taken off `used` as a whole.
            if state.evicted || !state.record.has_chunk(index) {
                return;
            }
            state.record.set_chunk(index, false);
        }
        let (offset, length) = entry.chunk_range(index);
        self.capacity.removed(length);
        let (store, id) = (self.store.clone(), entry.id);
        if let Err(e) = blocking(move || store.delete_chunk(id, offset, length)).await {
            tracing::error!(error = %e, "could not remove a damaged chunk; its refetch is stored over it");
        }
    }

    /// Evicts `entries` (their chunks and records); returns (shards, bytes) evicted.
    /// Shared by the evictor and the `Evict` call.
    pub async fn evict(&self, entries: &[Arc<Entry>]) -> (u64, u64) {
        let _running = self.capacity.evicting();
        let (mut shards, mut bytes) = (0, 0);
        for entry in entries {
            bytes += self.remove(entry, true).await;
            shards += 1;
        }
        if shards > 0 {
            self.metrics.evicted_shards.fetch_add(shards, Relaxed);
            self.metrics.evicted_bytes.fetch_add(bytes, Relaxed);
        }
        (shards, bytes)
    }

    /// Removes `entry` from the index and its pages from the store; returns the bytes it
    /// held. `with_record`: also delete the record (not when a newer version takes its
    /// key).
    pub async fn remove(&self, entry: &Arc<Entry>, with_record: bool) -> u64 {
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
}
