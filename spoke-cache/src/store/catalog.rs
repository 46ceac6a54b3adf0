//! Which shard versions are cached: the entries by name, their records on disk, when
//! each was last used. The catalog owns the records: an entry's record is written only
//! here, one write at a time per entry, each from the record as it is once its turn
//! comes (so a slower writer never puts back an older copy).

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock, RwLockReadGuard, RwLockWriteGuard,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use shardcache_proto::v1::ShardInfo;

use crate::{
    Result,
    store::entry::{Entry, ShardKey},
    store::{ShardRecord, Store, blocking},
};

/// Milliseconds since the Unix epoch (when a version was last checked with the hub).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The cached shard versions.
#[derive(Debug)]
pub struct Catalog {
    /// Read-locked by reads and by eviction's scan alike, so neither waits for the
    /// other; written only to add or remove an entry.
    entries: RwLock<HashMap<ShardKey, Arc<Entry>>>,
    store: Arc<Store>,
    next_id: AtomicU64,
    /// The clock of `last_access` (LRU).
    started: Instant,
    revalidate_after: Duration,
}

impl Catalog {
    /// The entries of the records `store` holds, with the bytes they account for.
    /// Records of another chunk size are dropped with their chunks rather than
    /// reinterpreted.
    pub fn load(store: Arc<Store>, chunk_size: u64, revalidate_after: Duration) -> Result<(Self, u64)> {
        let records = store.load_records()?;
        let next_id = records.iter().map(|(_, _, r)| r.id + 1).max().unwrap_or(1);
        let (mut entries, mut used) = (HashMap::new(), 0);
        for (dataset, shard, record) in records {
            if record.chunk_size == 0 || u64::from(record.chunk_size) != chunk_size {
                store.delete_shard(record.id, Some((&dataset, &shard)))?;
                continue;
            }
            used += record.cached_bytes();
            let entry = Entry::new(dataset.clone(), shard.clone(), record, 0);
            entries.insert((dataset, shard), Arc::new(entry));
        }
        tracing::info!(shards = entries.len(), used_bytes = used, "cache loaded");
        let index = Self {
            entries: RwLock::new(entries),
            store,
            next_id: AtomicU64::new(next_id),
            started: Instant::now(),
            revalidate_after,
        };
        Ok((index, used))
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<ShardKey, Arc<Entry>>> {
        self.entries.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<ShardKey, Arc<Entry>>> {
        self.entries.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry of `key`, without checking its version or marking it used.
    pub fn get(&self, key: &ShardKey) -> Option<Arc<Entry>> {
        self.read().get(key).cloned()
    }

    /// Every entry.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        self.read().values().cloned().collect()
    }

    /// Marks `entry` as just used.
    pub fn touch(&self, entry: &Entry) {
        entry.state().last_access = self.started.elapsed().as_millis() as u64;
    }

    /// The entry of `key` if its version was checked within `revalidate_after` (marked
    /// as used).
    pub fn fresh(&self, key: &ShardKey) -> Option<Arc<Entry>> {
        let entry = self.get(key)?;
        self.is_fresh(&entry).then(|| {
            self.touch(&entry);
            entry
        })
    }

    /// `entry`'s version was checked within `revalidate_after`.
    pub fn is_fresh(&self, entry: &Entry) -> bool {
        let validated_at = entry.state().record.validated_at_ms;
        Duration::from_millis(now_ms().saturating_sub(validated_at)) < self.revalidate_after
    }

    /// The entry of the shard version `info` describes: the one cached, or a new one
    /// (empty, with a new store id) that replaces any other version of it in the catalog;
    /// and whether its record was written. An entry whose record could not be written (a
    /// full disk) is still served: chunks stored for it without a record are strays the
    /// next start removes, never wrong bytes.
    pub async fn install(
        &self,
        key: ShardKey,
        info: &ShardInfo,
        chunk_size: u64,
    ) -> (Arc<Entry>, Result<()>) {
        let entry = {
            let mut entries = self.write();
            if let Some(existing) = entries.get(&key).filter(|e| e.version == info.version) {
                return (existing.clone(), Ok(()));
            }
            let record = ShardRecord {
                id: self.next_id.fetch_add(1, Relaxed),
                version: info.version.clone(),
                size: info.size,
                chunk_size: chunk_size as u32,
                record_size: info.record_size,
                present: Vec::new(),
                pinned: false,
                validated_at_ms: now_ms(),
                holder: String::new(),
                modified_ms: info.modified_ms,
            };
            let now = self.started.elapsed().as_millis() as u64;
            let entry = Arc::new(Entry::new(key.0.clone(), key.1.clone(), record, now));
            entries.insert(key, entry.clone());
            entry
        };
        let recorded = self.persist(&entry).await;
        (entry, recorded)
    }

    /// The hub confirmed `entry`'s version just now.
    pub async fn revalidated(&self, entry: &Arc<Entry>) -> Result<()> {
        entry.state().record.validated_at_ms = now_ms();
        self.persist(entry).await?;
        self.touch(entry);
        Ok(())
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
        self.persist(entry).await?;
        Ok(true)
    }

    /// Makes `principal` the holder of `entry`'s bytes unless it has one; true when it
    /// changed (the record is written then, once per entry). An open server's principal
    /// is "", as is an entry's before it has a holder: nothing to write.
    pub async fn set_holder(&self, entry: &Arc<Entry>, principal: &str) -> Result<bool> {
        {
            let mut state = entry.state();
            if principal.is_empty() || !state.record.holder.is_empty() {
                return Ok(false);
            }
            state.record.holder = principal.to_owned();
        }
        self.persist(entry).await?;
        Ok(true)
    }

    /// Puts `entry` in the catalog as it is, in memory only (tests of what reads the
    /// catalog: the evictor's).
    #[cfg(test)]
    pub fn insert(&self, entry: Arc<Entry>) {
        self.write().insert((entry.dataset.clone(), entry.shard.clone()), entry);
    }

    /// Takes `entry` out of the catalog (not a newer version that took its key).
    pub fn remove(&self, entry: &Entry) {
        let mut entries = self.write();
        let key = (entry.dataset.clone(), entry.shard.clone());
        if entries.get(&key).is_some_and(|e| e.id == entry.id) {
            entries.remove(&key);
        }
    }

    /// Writes `entry`'s record as it is now; nothing once it is evicted.
    async fn persist(&self, entry: &Arc<Entry>) -> Result<()> {
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
}
