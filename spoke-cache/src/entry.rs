//! One cached shard *version*: its identity (id, version, size, chunk size), which of
//! its chunks are present, and the locks that order writes to its record and its chunks.
//! A new version of a shard is a new `Entry` with a new store id, so bytes of two versions
//! never mix.

use std::sync::{Mutex, MutexGuard};

use crate::store::ShardRecord;

/// `(dataset, shard)`: a shard's name, the key of the index and of the plans.
pub type ShardKey = (String, String);

/// One cached shard version.
#[derive(Debug)]
pub struct Entry {
    pub dataset: String,
    pub shard: String,
    pub id: u64,
    pub version: String,
    pub size: u64,
    pub chunk_size: u64,
    pub record_size: u32,
    state: Mutex<EntryState>,
    /// Serialises writes of this entry's record; each writes the record as it is once
    /// the lock is held, so the record on disk is never older than one written before.
    pub(crate) record_writes: tokio::sync::Mutex<()>,
    /// Shared by chunk admissions, exclusive for removing chunks (eviction, a chunk
    /// that failed its check): no chunk file is added after its shard was evicted.
    pub(crate) chunk_writes: tokio::sync::RwLock<()>,
}

#[derive(Debug)]
pub(crate) struct EntryState {
    pub(crate) record: ShardRecord,
    /// Milliseconds since the cache started, at the last read (for LRU).
    pub(crate) last_access: u64,
    /// Prefetch plans currently holding this shard.
    pub(crate) prefetching: u32,
    pub(crate) evicted: bool,
    pub(crate) whole_fetch_started: bool,
}

impl Entry {
    /// The entry of the shard version `record` describes.
    pub(crate) fn new(dataset: String, shard: String, record: ShardRecord, last_access: u64) -> Self {
        Self {
            dataset,
            shard,
            id: record.id,
            version: record.version.clone(),
            size: record.size,
            chunk_size: u64::from(record.chunk_size),
            record_size: record.record_size,
            state: Mutex::new(EntryState {
                record,
                last_access,
                prefetching: 0,
                evicted: false,
                whole_fetch_started: false,
            }),
            record_writes: tokio::sync::Mutex::new(()),
            chunk_writes: tokio::sync::RwLock::new(()),
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, EntryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn has_chunk(&self, index: u64) -> bool {
        let state = self.state();
        !state.evicted && state.record.has_chunk(index)
    }

    pub fn cached_bytes(&self) -> u64 {
        let state = self.state();
        if state.evicted { 0 } else { state.record.cached_bytes() }
    }

    pub fn is_pinned(&self) -> bool {
        self.state().record.pinned
    }

    /// Makes the next access check the version with the hub.
    pub fn expire(&self) {
        self.state().record.validated_at_ms = 0;
    }

    /// Marks the entry as part of a running prefetch (or no longer): eviction takes it
    /// only when nothing else is left.
    pub fn hold_for_prefetch(&self, hold: bool) {
        let mut state = self.state();
        if hold {
            state.prefetching += 1;
        } else {
            state.prefetching = state.prefetching.saturating_sub(1);
        }
    }

    pub fn is_complete(&self) -> bool {
        (0..self.chunk_count()).all(|i| self.has_chunk(i))
    }

    pub fn chunk_count(&self) -> u64 {
        self.size.div_ceil(self.chunk_size)
    }

    /// `(offset, length)` of chunk `index`.
    pub fn chunk_range(&self, index: u64) -> (u64, u64) {
        let offset = index * self.chunk_size;
        (offset, self.size.saturating_sub(offset).min(self.chunk_size))
    }
}
