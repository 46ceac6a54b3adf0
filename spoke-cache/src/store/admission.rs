//! Where fetched chunks go, and how cached shards leave: the store, the catalog and the
//! capacity, kept in step.
//!
//! - [`Admission::admit`]: a verified chunk claims its bytes of the capacity
//!   ([`Admission::room_for`]: the evictor makes room; a chunk with none within
//!   [`ROOM_PATIENCE`] is served but not stored), is written (one file,
//!   `store/ingest.rs`), then made visible (its presence bit), in the share
//!   of the principal that holds its shard (`policy::shares`), and as unread speculation
//!   when no read asked for it (`policy::speculation`);
//! - [`Admission::forget_chunk`]: a stored chunk that failed its check is made absent
//!   and its file removed, so that a refetch can store it again;
//! - [`Admission::remove`]: a shard version leaves the catalog, its files the disk, its
//!   bytes the capacity (eviction, an `Evict` call, a version the hub replaced); files a
//!   reader still held stay counted by claims until they are gone from the disk;
//!
//! Samples kept for a later epoch are the keeper's (`kept/`), which shares the capacity.
//!
//! An entry's chunk-write lock orders these: admissions share it, removals take it
//! alone, so no chunk file is added after its shard was removed.
//!
//! A full or failing disk degrades the cache to pass-through, never a failed read:
//! [`Admission::storing_failed`] lowers the capacity in effect to what the filesystem
//! holds when storing failed for lack of space (the evictor then makes room), and a
//! removal whose files cannot be deleted keeps their bytes counted until a later try
//! deletes them ([`Admission::retry_deletions`]).

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, atomic::Ordering::Relaxed},
    time::Duration,
};

use shardcache_proto::checksum::Checked;

use crate::{
    Error, Result,
    observe::metrics::Metrics,
    policy::speculation::Speculation,
    store::capacity::Capacity,
    store::catalog::Catalog,
    store::entry::set_bit,
    store::entry::{ChunkIndex, Entry},
    store::{Store, blocking},
};

/// The store, the catalog and the capacity, for admitting and removing.
#[derive(Debug)]
pub struct Admission {
    store: Arc<Store>,
    catalog: Arc<Catalog>,
    capacity: Arc<Capacity>,
    metrics: Arc<Metrics>,
    speculation: Arc<Speculation>,
    /// Removed shards whose pages could not be deleted: (store id, bytes), counted in
    /// `used` until deleted.
    undeleted: Mutex<Vec<(u64, u64)>>,
    /// Removed shards' files still on the disk, and their bytes (`Capacity::lingering`).
    lingering: Mutex<Vec<(Vec<PathBuf>, u64)>>,
}

/// How long a chunk waits for room on the disk (the evictor's work, files a reader
/// held leaving) before it is served without being stored. Short: the fetch holds its
/// share of the fetch memory meanwhile; the reader has its bytes already.
pub const ROOM_PATIENCE: Duration = Duration::from_millis(500);
/// How often a claim that waits looks whether lingering files left the disk (RocksDB
/// says nothing when they do).
const LINGER_POLL: Duration = Duration::from_millis(20);

/// Bytes free on the filesystem holding `dir`, for an unprivileged writer.
pub fn filesystem_available(dir: &std::path::Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(dir).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

impl Admission {
    /// The admission over `store`.
    pub fn new(
        store: Arc<Store>,
        catalog: Arc<Catalog>,
        (capacity, speculation): (Arc<Capacity>, Arc<Speculation>),
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            catalog,
            capacity,
            metrics,
            speculation,
            undeleted: Mutex::default(),
            lingering: Mutex::default(),
        }
    }

    /// The store chunks go to.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The capacity admissions claim.
    pub fn capacity(&self) -> &Arc<Capacity> {
        &self.capacity
    }

    /// What speculation brought and what came of it.
    pub fn speculation(&self) -> &Arc<Speculation> {
        &self.speculation
    }

    /// Storing `what` failed with `error` (the read it was for is served anyway). For
    /// lack of space, the capacity in effect comes down to what the filesystem holds
    /// now (the bytes held and those still free), so the evictor makes room; counted
    /// and logged either way.
    pub fn storing_failed(&self, what: &str, error: &Error) {
        self.metrics.store_write_failures.fetch_add(1, Relaxed);
        if !error.is_no_space() {
            tracing::error!(error = %error, "could not store {what}; the read was served without it");
            return;
        }
        let holds = self.capacity.used() + filesystem_available(self.store.path()).unwrap_or(0);
        if self.capacity.limit_to(holds) {
            self.metrics.disk_full.fetch_add(1, Relaxed);
            tracing::warn!(
                dir = %self.store.path().display(),
                capacity = self.capacity.configured(),
                holds,
                "the cache's filesystem is full before --capacity; storing at most what it holds (reads are \
                 served meanwhile; give the cache its own disk or a --capacity that fits)"
            );
        }
    }

    /// Claims `bytes` of the capacity for a chunk about to be written: at once where
    /// they fit, else once the evictor (woken) or lingering files leaving the disk make
    /// room, within [`ROOM_PATIENCE`]; whether they were claimed (and counted).
    async fn room_for(&self, bytes: u64) -> bool {
        let deadline = tokio::time::Instant::now() + ROOM_PATIENCE;
        loop {
            let freed = self.capacity.freed();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.capacity.claim(bytes) {
                return true;
            }
            if self.release_lingering().await {
                continue;
            }
            let now = tokio::time::Instant::now();
            if now >= deadline || bytes > self.capacity.room() {
                return false;
            }
            let _ = tokio::time::timeout_at(deadline.min(now + LINGER_POLL), freed).await;
        }
    }

    /// Looks whether removed shards' lingering files left the disk; their bytes stop
    /// counting once all of a shard's have. Whether any did.
    async fn release_lingering(&self) -> bool {
        let pending = std::mem::take(&mut *self.lingering.lock().unwrap_or_else(|p| p.into_inner()));
        if pending.is_empty() {
            return false;
        }
        let store = self.store.clone();
        let total: u64 = pending.iter().map(|(_, bytes)| bytes).sum();
        let looked = blocking(move || {
            Ok(pending
                .into_iter()
                .map(|(mut files, bytes)| {
                    store.still_on_disk(&mut files);
                    (files, bytes)
                })
                .collect::<Vec<_>>())
        })
        .await;
        let Ok(looked) = looked else {
            // The look itself failed (its task did not finish): the list is gone with it,
            // so their bytes stop counting rather than hold their room for good.
            self.capacity.gone(total);
            return true;
        };
        let mut released = false;
        for (files, bytes) in looked {
            if files.is_empty() {
                self.capacity.gone(bytes);
                released = true;
            } else {
                self.lingering.lock().unwrap_or_else(|p| p.into_inner()).push((files, bytes));
            }
        }
        released
    }

    /// Tries again to delete the pages of removed shards whose deletion failed; the
    /// bytes of each one deleted leave `used`.
    pub async fn retry_deletions(&self) {
        let pending = std::mem::take(&mut *self.undeleted.lock().unwrap_or_else(|p| p.into_inner()));
        for (id, bytes) in pending {
            let store = self.store.clone();
            match blocking(move || store.delete_shard(id, None)).await {
                Ok(()) => self.capacity.removed(bytes),
                Err(_) => self.undeleted.lock().unwrap_or_else(|p| p.into_inner()).push((id, bytes)),
            }
        }
    }

    /// Writes verified chunk `index` of `entry`, then makes it visible, held by
    /// `principal` if the shard had no holder, marked `unread` speculation when no read
    /// asked for it. Nothing when the entry was removed meanwhile or the chunk is
    /// already there.
    pub async fn admit(
        &self,
        entry: &Arc<Entry>,
        index: ChunkIndex,
        chunk: Checked,
        principal: &str,
        unread: bool,
    ) -> Result<()> {
        let _sharing = entry.chunk_writes.read().await;
        {
            let state = entry.state();
            if state.evicted || state.record.has_chunk(index) {
                return Ok(());
            }
        }
        let (store, id) = (self.store.clone(), entry.id);
        let (offset, length) = entry.chunk_range(index);
        if !self.room_for(length).await {
            tracing::debug!(
                dataset = %entry.dataset,
                shard = %entry.shard,
                index = %index,
                "no room within --capacity in time: the chunk was served, not stored"
            );
            return Ok(());
        }
        if let Err(e) = blocking(move || store.admit_chunk(id, offset, &chunk)).await {
            self.capacity.unclaim(length);
            self.storing_failed("a fetched chunk", &e);
            return Err(e);
        }
        self.capacity.written(length);
        {
            let mut state = entry.state();
            state.record.set_chunk(index, true);
            if unread {
                set_bit(&mut state.unread, index, true);
            }
        }
        if unread {
            self.speculation.stored(length);
        }
        if let Err(e) = self.catalog.set_holder(entry, principal).await {
            self.storing_failed("a shard record", &e);
        }
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
    pub async fn forget_chunk(&self, entry: &Arc<Entry>, index: ChunkIndex) {
        let _exclusive = entry.chunk_writes.write().await;
        {
            let mut state = entry.state();
            // A removed entry's bytes were already taken off `used` as a whole.
            if state.evicted || !state.record.has_chunk(index) {
                return;
            }
            state.record.set_chunk(index, false);
            if set_bit(&mut state.unread, index, false) {
                self.speculation.forgotten(entry.chunk_range(index).1);
            }
        }
        let (offset, length) = entry.chunk_range(index);
        self.capacity.removed(length);
        let (store, id) = (self.store.clone(), entry.id);
        if let Err(e) = blocking(move || store.delete_chunk(id, offset, length)).await {
            tracing::error!(error = %e, "could not remove a damaged chunk; its refetch is stored over it");
        }
    }

    /// Evicts `entries` (their chunks and records); returns (shards, bytes) evicted.
    /// Shared by the evictor and the `Evict` call. Speculative chunks evicted unread
    /// are lost bets (`policy::speculation`).
    pub async fn evict(&self, entries: &[Arc<Entry>]) -> (u64, u64) {
        let _running = self.capacity.evicting();
        let (mut shards, mut bytes) = (0, 0);
        for entry in entries {
            let unread = self.take_unread(entry);
            bytes += self.remove(entry, true).await;
            shards += 1;
            self.speculation.wasted(unread);
        }
        if shards > 0 {
            self.metrics.evicted_shards.fetch_add(shards, Relaxed);
            self.metrics.evicted_bytes.fetch_add(bytes, Relaxed);
        }
        (shards, bytes)
    }

    /// Clears `entry`'s unread speculative chunks; their bytes.
    fn take_unread(&self, entry: &Entry) -> u64 {
        let unread = std::mem::take(&mut entry.state().unread);
        let mut bytes = 0;
        for (byte, bits) in unread.iter().enumerate() {
            for bit in 0..8 {
                if bits & (1 << bit) != 0 {
                    bytes += entry.chunk_range(ChunkIndex(byte as u64 * 8 + bit)).1;
                }
            }
        }
        bytes
    }

    /// Removes `entry` from the catalog and its pages from the store; returns the bytes it
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
        // Unread speculation that leaves for another reason than eviction (a new
        // version, a shard gone from the hub) is no lost bet.
        let unread = self.take_unread(entry);
        self.speculation.forgotten(unread);
        self.catalog.remove(entry);
        let (store, id, dataset, shard) =
            (self.store.clone(), entry.id, entry.dataset.clone(), entry.shard.clone());
        let deleted = blocking(move || {
            let mut files = store.shard_files(id)?;
            store.delete_shard(id, with_record.then_some((dataset.as_str(), shard.as_str())))?;
            store.still_on_disk(&mut files);
            Ok(files)
        })
        .await;
        match deleted {
            Ok(files) if files.is_empty() => {
                self.capacity.removed(bytes);
                bytes
            }
            Ok(files) => {
                // A reader held them: they leave the disk when it lets go.
                self.capacity.removed_lingering(bytes);
                self.lingering.lock().unwrap_or_else(|p| p.into_inner()).push((files, bytes));
                bytes
            }
            Err(e) => {
                // Its files are still on the disk: counted until a retry deletes them.
                tracing::error!(error = %e, bytes, "could not delete a removed shard's pages; they stay counted until a retry deletes them");
                self.undeleted.lock().unwrap_or_else(|p| p.into_inner()).push((entry.id, bytes));
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The admission over a real store, its entries from a fake supplier
    //! (`crate::testing`).

    use bytes::Bytes;
    use shardcache_proto::checksum::Checked;

    use crate::store::entry::ChunkIndex;

    use crate::testing::{parts, pattern};

    const CHUNK: u64 = 64 << 10;

    fn chunk(data: &[u8], index: u64) -> Checked {
        let start = (index * CHUNK) as usize;
        Checked::new(Bytes::copy_from_slice(&data[start..start + CHUNK as usize]))
    }

    #[tokio::test]
    async fn an_admitted_chunk_is_stored_visible_held_and_counted_once() {
        let parts = parts(CHUNK, 1 << 30, 1 << 30);
        let data = pattern(2 * CHUNK as usize, 1);
        parts.supply.put("ds", "s", "v1", data.clone());
        let entry = parts.entry("ds", "s").await.unwrap();
        parts.admission.admit(&entry, ChunkIndex(1), chunk(&data, 1), "trainer", false).await.unwrap();
        assert!(entry.has_chunk(ChunkIndex(1)) && !entry.has_chunk(ChunkIndex(0)));
        assert_eq!(parts.stored(&entry, CHUNK, CHUNK).unwrap(), data[CHUNK as usize..]);
        assert_eq!(entry.holder(), "trainer");
        assert_eq!(parts.capacity.used(), CHUNK);
        // The same chunk again (a second fetch that raced the first): nothing changes.
        parts.admission.admit(&entry, ChunkIndex(1), chunk(&data, 1), "other", false).await.unwrap();
        assert_eq!((parts.capacity.used(), entry.holder().as_str()), (CHUNK, "trainer"));
    }

    #[tokio::test]
    async fn eviction_removes_a_shards_chunks_and_gives_their_bytes_back() {
        let parts = parts(CHUNK, 1 << 30, 1 << 30);
        let data = pattern(2 * CHUNK as usize, 2);
        parts.supply.put("ds", "s", "v1", data.clone());
        let entry = parts.entry("ds", "s").await.unwrap();
        for index in 0..2 {
            parts.admission.admit(&entry, ChunkIndex(index), chunk(&data, index), "t", false).await.unwrap();
        }
        assert!(entry.is_complete() && parts.capacity.used() == 2 * CHUNK);
        assert_eq!(parts.admission.evict(std::slice::from_ref(&entry)).await, (1, 2 * CHUNK));
        assert!(parts.stored(&entry, 0, CHUNK).is_none(), "its chunks are gone from the store");
        assert_eq!(parts.capacity.used(), 0);
        assert!(parts.catalog.get(&("ds".into(), "s".into())).is_none());
        // A fetch that finishes after the eviction stores nothing for the evicted entry.
        parts.admission.admit(&entry, ChunkIndex(0), chunk(&data, 0), "t", false).await.unwrap();
        assert!(parts.stored(&entry, 0, CHUNK).is_none() && parts.capacity.used() == 0);
    }

    #[tokio::test]
    async fn a_forgotten_chunk_is_absent_and_its_bytes_given_back() {
        let parts = parts(CHUNK, 1 << 30, 1 << 30);
        let data = pattern(CHUNK as usize, 3);
        parts.supply.put("ds", "s", "v1", data.clone());
        let entry = parts.entry("ds", "s").await.unwrap();
        parts.admission.admit(&entry, ChunkIndex(0), chunk(&data, 0), "t", true).await.unwrap();
        assert_eq!(parts.admission.speculation().unread(), CHUNK, "admitted unread: speculation's bytes");
        parts.admission.forget_chunk(&entry, ChunkIndex(0)).await;
        assert!(!entry.has_chunk(ChunkIndex(0)) && parts.stored(&entry, 0, CHUNK).is_none());
        assert_eq!(parts.capacity.used(), 0);
        assert_eq!(parts.admission.speculation().unread(), 0, "and no longer speculation's");
    }
}
