//! One cached shard *version*: its identity (id, version, size, chunk size), which of
//! its chunks are present (and which of those speculation brought and no read has
//! used), where its last read ended, and the locks that order writes to its record and
//! its chunks.
//! A new version of a shard is a new `Entry` with a new store id, so bytes of two versions
//! never mix.

use std::sync::{Mutex, MutexGuard};

use crate::store::ShardRecord;
pub use crate::store::layout::ChunkIndex;
pub(crate) use crate::store::layout::set_bit;

/// `(dataset, shard)`: a shard's name, the key of the catalog and of the plans.
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
    /// When the version's bytes last changed, ms since the Unix epoch (0: unknown).
    pub modified_ms: u64,
    /// `policy::frequency::shard_hash` of the name: its chunks' keys in the admission
    /// filter, the same for every version.
    pub name_hash: u64,
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
    /// Bit `i` set: chunk `i` was stored by speculation (read-ahead, a whole-shard
    /// fetch) and no read has used it yet (`policy::speculation`).
    pub(crate) unread: Vec<u8>,
    /// Where the last read of the shard ended, and how many reads in a row began
    /// where the one before ended (a sequential reader: read-ahead grows with it).
    pub(crate) next_offset: u64,
    pub(crate) sequential_run: u32,
}

impl Entry {
    /// The entry of the shard version `record` describes.
    pub(crate) fn new(dataset: String, shard: String, record: ShardRecord, last_access: u64) -> Self {
        let name_hash = crate::policy::frequency::shard_hash(&dataset, &shard);
        Self {
            dataset,
            shard,
            id: record.id,
            version: record.version.clone(),
            size: record.size,
            chunk_size: u64::from(record.chunk_size),
            record_size: record.record_size,
            modified_ms: record.modified_ms,
            name_hash,
            state: Mutex::new(EntryState {
                record,
                last_access,
                prefetching: 0,
                evicted: false,
                whole_fetch_started: false,
                unread: Vec::new(),
                next_offset: 0,
                sequential_run: 0,
            }),
            record_writes: tokio::sync::Mutex::new(()),
            chunk_writes: tokio::sync::RwLock::new(()),
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, EntryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn has_chunk(&self, index: ChunkIndex) -> bool {
        let state = self.state();
        !state.evicted && state.record.has_chunk(index)
    }

    /// Whether chunk `index` is stored, for a read of it: and whether it was unread
    /// speculation until now (the read uses it: `policy::speculation`).
    pub fn has_chunk_for_read(&self, index: ChunkIndex) -> (bool, bool) {
        let mut state = self.state();
        if state.evicted || !state.record.has_chunk(index) {
            return (false, false);
        }
        (true, set_bit(&mut state.unread, index, false))
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
        (0..self.chunk_count()).map(ChunkIndex).all(|i| self.has_chunk(i))
    }

    pub fn chunk_count(&self) -> u64 {
        self.size.div_ceil(self.chunk_size)
    }

    /// `(offset, length)` of chunk `index`.
    pub fn chunk_range(&self, index: ChunkIndex) -> (u64, u64) {
        let offset = index.start(self.chunk_size);
        (offset, self.size.saturating_sub(offset).min(self.chunk_size))
    }

    /// The chunk that holds byte `offset`.
    pub fn chunk_of(&self, offset: u64) -> ChunkIndex {
        ChunkIndex::of(offset, self.chunk_size)
    }

    /// The chunks `[offset, end)` spans (`end > offset`), in order.
    pub fn chunks_of(&self, offset: u64, end: u64) -> impl Iterator<Item = ChunkIndex> + Clone {
        self.chunk_of(offset).through(self.chunk_of(end - 1))
    }

    /// Chunk `index`'s key in the admission filter.
    pub fn chunk_key(&self, index: ChunkIndex) -> u64 {
        crate::policy::frequency::chunk_key(self.name_hash, index.0)
    }

    /// The principal whose share the entry's bytes count in ("" before any is stored, and
    /// on an open server).
    pub fn holder(&self) -> String {
        self.state().record.holder.clone()
    }

    /// A read of `[offset, end)` began: whether it continues where the last one ended,
    /// with the length of that run of reads (0 for a read that does not).
    pub fn read_from(&self, offset: u64, end: u64) -> u32 {
        let mut state = self.state();
        state.sequential_run = if offset == state.next_offset && offset > 0 {
            state.sequential_run.saturating_add(1)
        } else {
            0
        };
        state.next_offset = end;
        state.sequential_run
    }
}
