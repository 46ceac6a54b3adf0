//! What the spoke holds on its disk, and the I/O that changes it: the storage engine
//! (here: shard pages and shard records in RocksDB, with `files.rs`, `ingest.rs`,
//! `layout.rs`, `merge.rs`, `packs.rs`), the catalog of cached shard versions
//! (`catalog.rs`, `entry.rs`), chunks in and shards out (`admission.rs`), the bytes
//! against the capacity (`capacity.rs`), the samples kept for a later epoch (`kept/`)
//! and eviction's I/O loop (`evict.rs`, in the order `policy::evict` gives).
//!
//! Owns: the disk and the capacity. May import `policy`, `observe`, `error`; never
//! `fetch`, `plans`, `read`, the facade or the services (the plans are seen through
//! `evict::NextUses`).
//!
//! The storage engine:
//! Layout (column families):
//! - `pages.v2`: key = shard id (u64 BE) + page index (u64 BE); value = CRC32C (u32 LE)
//!   followed by up to [`PAGE_SIZE`] bytes. Written only by ingesting SST files, one per
//!   chunk (`ingest.rs`): a page's bytes are written once, never through a memtable, a
//!   flush (auto-compaction is off: chunks never overlap, so nothing would gain from
//!   it). Eviction drops a shard's files whole (`DeleteFilesInRange`). Once the store
//!   holds many files, a shard whose chunks are all present is merged into one file
//!   ([`Store::merge_shard`]): RocksDB's per-file costs grow with the number of files.
//! - `shards`: key = `dataset \0 shard`; value = a [`ShardRecord`]: the id bound to one
//!   shard *version*, size, chunk size, pin flag, last revalidation. Small writes, logged
//!   in the WAL.
//!
//! A new version of a shard gets a new id, so pages of two versions can never mix.
//!
//! Crash safety: a shard's record is written (and logged) before any of its chunks. A
//! chunk is committed by its file's ingestion, which RocksDB makes atomic; there is no
//! other presence marker to keep in step with it, because presence is read back from
//! the live files at startup (`files.rs`). So after `kill -9` at any point a chunk is
//! either wholly there or not at all, and files that no record accounts for (a shard
//! evicted between its record and its files, a half-written file in `ingest/`) are
//! removed when the store opens. Every page read is checked against its CRC32C; a
//! mismatch, a missing page or a page the disk cannot read (an I/O error, not
//! damage) is reported as a [`PageFault`] (the cache forgets the chunk and refetches),
//! never as data and never as a failed read.
//!
//! Layout chosen by measurement (`store-bench`, BENCHMARKS.md "store"): see the table
//! there, with the memtable layout this replaced in the same run.

pub mod admission;
pub mod capacity;
pub mod catalog;
pub mod entry;
pub mod evict;
mod files;
mod ingest;
pub mod kept;
mod layout;
pub mod locate;
mod merge;
mod open;
mod packs;
mod usage;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use bytes::{BufMut, BytesMut};
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBCompressionType, Options, WriteOptions,
};
use shardcache_proto::checksum::{Checked, checked_part, combine};

use self::{
    files::{FileUse, classify},
    ingest::Ingester,
    layout::{CF_LEGACY_PAGES, CF_SHARDS, PAGE_HEADER, db_error},
    merge::direct_io_works,
};
pub use self::{
    layout::{CF_PAGES, PAGE_SIZE, PageFault, ShardRecord, page_key, shard_key},
    merge::DEFAULT_MERGE_ABOVE_FILES,
    packs::{CF_SAMPLES, PackedSample},
};
use crate::{Error, Result};

/// Default of `--max-open-files`, the chunk files RocksDB keeps open. Every chunk is a
/// file, so a cache of 100 GiB in 4 MiB chunks has 25,600 of them, and a 4 TB NVMe a
/// million: unbounded (RocksDB's default), the spoke would open them all at start
/// (`spoke-bench`'s restart row) and need that many descriptors (containers often allow
/// 10,000). Bounded, files open on first use and the least recently used close; 4096
/// holds a 16 GiB working set.
pub const DEFAULT_MAX_OPEN_FILES: u32 = 4096;

/// Tuning of the RocksDB instance.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Shared block cache for both column families. Page reads of a warm working set
    /// are mostly served by the OS page cache, so this mainly holds index blocks.
    pub block_cache_bytes: usize,
    /// Memtable size of the shard records (pages never pass through a memtable).
    pub write_buffer_bytes: usize,
    /// Bytes per page; [`PAGE_SIZE`] except in `store-bench`. Fixed for a store's life.
    pub page_size: u64,
    /// RocksDB option string applied over the pages column family's options
    /// (`--rocksdb-pages-options`); empty: none.
    pub pages_options: String,
    /// Files kept open at most (`--max-open-files`): the descriptors and table readers
    /// the store holds, whatever the number of chunk files.
    pub max_open_files: u32,
    /// Page files above which complete shards are merged (`--merge-above-files`).
    pub merge_above_files: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            block_cache_bytes: 64 << 20,
            // Records are ~100 bytes: 8 MiB holds tens of thousands between flushes.
            write_buffer_bytes: 8 << 20,
            page_size: PAGE_SIZE,
            pages_options: String::new(),
            max_open_files: DEFAULT_MAX_OPEN_FILES,
            merge_above_files: DEFAULT_MERGE_ABOVE_FILES,
        }
    }
}

impl Drop for Store {
    /// A clean stop leaves the records in SST files, so the next start replays no WAL.
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::error!(error = %e, "could not flush the shard records on shutdown; the WAL has them");
        }
    }
}

/// The RocksDB instance under `--cache-dir`.
pub struct Store {
    db: DB,
    path: PathBuf,
    ingester: Ingester,
    /// Packs of kept samples are ingested into their own column family (`packs.rs`).
    packs: Ingester,
    page_size: u64,
    merge_above_files: u64,
    /// Where stored pages lie in the files, for the same-node door (`locate.rs`).
    places: locate::Places,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).field("page_size", &self.page_size).finish()
    }
}

/// Runs store work on the blocking pool (RocksDB calls block: a read may wait for the
/// disk, an ingestion for an fsync).
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Error::Internal(format!("store task failed: {e}"))))
}

/// A record as stored: presence is not part of it (the live files are, see `files.rs`).
fn encode_record(record: &ShardRecord) -> Vec<u8> {
    let stored = ShardRecord { present: Vec::new(), ..record.clone() };
    prost::Message::encode_to_vec(&stored)
}

impl Store {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the shard records' memtable to an SST file (the WAL already holds them).
    pub fn flush(&self) -> Result<()> {
        self.db.flush_cf(self.cf(CF_SHARDS)?).map_err(db_error("flushing the shard records"))
    }

    fn cf(&self, name: &str) -> Result<&rocksdb::ColumnFamily> {
        self.db.cf_handle(name).ok_or_else(|| Error::Store {
            what: "opening the cache".into(),
            message: format!("column family {name} is missing"),
        })
    }

    /// Every shard record with its present chunks, for startup. Chunk files that no
    /// record accounts for are removed here (see the module docs).
    pub fn load_records(&self) -> Result<Vec<(String, String, ShardRecord)>> {
        let mut records = Vec::new();
        for item in self.db.iterator_cf(self.cf(CF_SHARDS)?, rocksdb::IteratorMode::Start) {
            let (key, value) = item.map_err(db_error("reading shard records"))?;
            let Some(split) = key.iter().position(|&b| b == 0) else { continue };
            let (Ok(dataset), Ok(shard)) =
                (std::str::from_utf8(&key[..split]), std::str::from_utf8(&key[split + 1..]))
            else {
                continue;
            };
            match <ShardRecord as prost::Message>::decode(&value[..]) {
                Ok(record) => records.push((dataset.to_owned(), shard.to_owned(), record)),
                Err(e) => tracing::warn!(dataset, shard, error = %e, "dropping an unreadable shard record"),
            }
        }
        let mut by_id: HashMap<u64, ShardRecord> = records
            .iter()
            .map(|(_, _, r)| (r.id, ShardRecord { present: Vec::new(), ..r.clone() }))
            .collect();
        // Pages are never written through the memtable; if something did (a tool, a
        // test), make it a file so that it is judged like every other.
        self.db.flush_cf(self.cf(CF_PAGES)?).map_err(db_error("flushing pages"))?;
        let mut uses = self.page_files(&by_id)?;
        let strays: Vec<_> = uses
            .iter()
            .filter_map(|used| match used {
                FileUse::Stray { start, end } => Some((start.clone(), end.clone())),
                FileUse::Chunks { .. } => None,
            })
            .collect();
        if !strays.is_empty() {
            for (start, end) in &strays {
                self.delete_pages(start, end)?;
            }
            tracing::warn!(
                files = strays.len(),
                "removed chunk files that no shard record accounts for (an interrupted write or eviction)"
            );
            // Removing a stray may have taken a chunk's file with it (one lying inside
            // the stray's key range): judge the files again.
            uses = self.page_files(&by_id)?;
        }
        for used in uses {
            if let FileUse::Chunks { id, first, count } = used
                && let Some(record) = by_id.get_mut(&id)
            {
                for index in (first..first + count).map(layout::ChunkIndex) {
                    record.set_chunk(index, true);
                }
            }
        }
        for (_, _, record) in &mut records {
            record.present = by_id.remove(&record.id).map(|r| r.present).unwrap_or_default();
        }
        Ok(records)
    }

    /// What each live page file holds, judged against the records (by id).
    fn page_files(&self, records: &HashMap<u64, ShardRecord>) -> Result<Vec<FileUse>> {
        let files = self.db.live_files().map_err(db_error("listing the cache's files"))?;
        Ok(classify(&files, records, self.page_size))
    }

    /// Writes a shard record (new shard, pin change, revalidation); logged, so it
    /// survives a crash.
    pub fn put_record(&self, dataset: &str, shard: &str, record: &ShardRecord) -> Result<()> {
        self.db
            .put_cf_opt(
                self.cf(CF_SHARDS)?,
                shard_key(dataset, shard),
                encode_record(record),
                &WriteOptions::default(),
            )
            .map_err(db_error("writing a shard record"))
    }

    /// Stores one chunk of shard `id`: `chunk` starting at `offset` (a chunk boundary,
    /// so also a page boundary). Present once this returns `Ok`, and at no moment before.
    pub fn admit_chunk(&self, id: u64, offset: u64, chunk: &Checked) -> Result<()> {
        debug_assert_eq!(offset % self.page_size, 0, "chunks start on page boundaries");
        if chunk.data.is_empty() {
            return Ok(());
        }
        let first_page = offset / self.page_size;
        let admitted = self.ingester.admit(
            &self.db,
            id,
            first_page,
            self.page_size as usize,
            (&chunk.data, chunk.crc32c),
        );
        self.places.forget(id);
        admitted
    }

    /// Reads `[offset, offset + len)` of shard `id` from its pages, verifying each page;
    /// with the CRC32C of the bytes read, combined from the pages' (one pass over them,
    /// the check's).
    pub fn read(&self, id: u64, offset: u64, len: u64) -> Result<Result<Checked, PageFault>> {
        if len == 0 {
            return Ok(Ok(Checked::default()));
        }
        let (first, last) = (offset / self.page_size, (offset + len - 1) / self.page_size);
        let keys: Vec<[u8; 16]> = (first..=last).map(|p| page_key(id, p)).collect();
        // Each page carries its own CRC32C, checked below on every read, and is found by
        // its key: RocksDB's block checksums (XXH3 over every block read) checked the same
        // bytes a second time, 4.4-4.6% of the spoke's CPU in a warm stream (BENCHMARKS.md,
        // spoke-bench, issue 59). Damage in a block is still caught: in a page's bytes or
        // header by its CRC, in a key by the lookup (a page not found is refetched).
        let mut options = rocksdb::ReadOptions::default();
        options.set_verify_checksums(false);
        let values = self.db.batched_multi_get_cf_opt(self.cf(CF_PAGES)?, &keys, true, &options);
        let mut out = BytesMut::with_capacity(len as usize);
        let mut crc = 0;
        for (page, value) in (first..).zip(values) {
            let value = match value {
                Ok(Some(value)) => value,
                Ok(None) => return Ok(Err(PageFault::Missing { page })),
                // RocksDB found a block it cannot parse: same as a bad CRC.
                Err(e) if e.kind() == rocksdb::ErrorKind::Corruption => {
                    return Ok(Err(PageFault::Corrupt { page }));
                }
                Err(e) => return Ok(Err(PageFault::Unreadable { page, error: e.into_string() })),
            };
            if value.len() < PAGE_HEADER {
                return Ok(Err(PageFault::Corrupt { page }));
            }
            let (header, data) = value.split_at(PAGE_HEADER);
            let stored = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
            let page_start = page * self.page_size;
            let from = offset.saturating_sub(page_start) as usize;
            let to = ((offset + len - page_start) as usize).min(data.len());
            if from > to {
                return Ok(Err(PageFault::Missing { page }));
            }
            let Ok(part) = checked_part(data, stored, from, to) else {
                return Ok(Err(PageFault::Corrupt { page }));
            };
            crc = combine(crc, part, to - from);
            out.put_slice(&data[from..to]);
        }
        if out.len() as u64 != len {
            return Ok(Err(PageFault::Missing { page: last }));
        }
        Ok(Ok(Checked { data: out.freeze(), crc32c: crc }))
    }

    /// Removes the pages of `[offset, offset + len)` of shard `id` (one chunk, whose
    /// stored copy failed its check), so it can be admitted again.
    pub fn delete_chunk(&self, id: u64, offset: u64, len: u64) -> Result<()> {
        let (first, last) = (offset / self.page_size, (offset + len.max(1) - 1) / self.page_size);
        self.delete_pages(&page_key(id, first), &page_key(id, last))
    }

    /// Deletes shard `id`'s pages and (when `record_key` is given) its record.
    pub fn delete_shard(&self, id: u64, record_key: Option<(&str, &str)>) -> Result<()> {
        self.delete_pages(&page_key(id, 0), &page_key(id, u64::MAX))?;
        if let Some((dataset, shard)) = record_key {
            self.db
                .delete_cf(self.cf(CF_SHARDS)?, shard_key(dataset, shard))
                .map_err(db_error("deleting a shard record"))?;
        }
        Ok(())
    }

    /// The files that hold shard `id`'s pages and nothing else (chunk files, a merged
    /// shard's file): what [`Store::delete_shard`] drops whole, to see them leave the
    /// disk ([`Store::still_on_disk`]).
    pub fn shard_files(&self, id: u64) -> Result<Vec<PathBuf>> {
        let (start, end) = (page_key(id, 0), page_key(id, u64::MAX));
        let within = |key: &Option<Vec<u8>>| key.as_deref().is_some_and(|k| k >= &start[..] && k <= &end[..]);
        let files = self.db.live_files().map_err(db_error("listing the store's files"))?;
        Ok(files
            .into_iter()
            .filter(|f| f.column_family_name == CF_PAGES && within(&f.start_key) && within(&f.end_key))
            .map(|f| self.path.join(f.name.trim_start_matches('/')))
            .collect())
    }

    /// Keeps those of `files` (dropped from the store) that are still on the disk.
    /// RocksDB deletes a dropped file once no reader holds a version of the store that
    /// has it, but only when it next looks for such files (a flush, a compaction): it
    /// is asked to look now (`EnableFileDeletions` looks through the directory).
    pub fn still_on_disk(&self, files: &mut Vec<PathBuf>) {
        files.retain(|f| f.exists());
        if files.is_empty() {
            return;
        }
        if self.db.disable_file_deletions().is_ok() {
            let _ = self.db.enable_file_deletions();
        }
        files.retain(|f| f.exists());
    }

    /// Removes every page with a key in `[start, end]`: the files wholly inside go at
    /// once (their disk space with them). Anything left (a file RocksDB wrote itself, not
    /// one of ours) is deleted by key and compacted away, so it leaves the disk too.
    fn delete_pages(&self, start: &[u8], end: &[u8]) -> Result<()> {
        // (Forgotten before and after: a reader placed meanwhile is not kept.)
        self.forget_places(start, end);
        let deleted = self.delete_pages_now(start, end);
        self.forget_places(start, end);
        deleted
    }

    /// The places of the pages `[start, end]` (`locate.rs`) are found again when asked.
    fn forget_places(&self, start: &[u8], end: &[u8]) {
        match (start.get(..8), end.get(..8)) {
            (Some(a), Some(b)) if a == b => {
                self.places.forget(u64::from_be_bytes(a.try_into().unwrap_or_default()))
            }
            _ => self.places.forget_all(),
        }
    }

    fn delete_pages_now(&self, start: &[u8], end: &[u8]) -> Result<()> {
        let pages = self.cf(CF_PAGES)?;
        self.db.delete_file_in_range_cf(pages, start, end).map_err(db_error("deleting chunk files"))?;
        // The range delete's end is exclusive: one byte past `end` covers it.
        let past_end = [end, &[0u8][..]].concat();
        let mut bounded = rocksdb::ReadOptions::default();
        bounded.set_iterate_upper_bound(past_end.clone());
        let mut rest = self.db.raw_iterator_cf_opt(pages, bounded);
        rest.seek(start);
        let left = rest.valid() && rest.key().is_some_and(|key| key <= end);
        // A check that could not read (the disk lost a file nearby: often why a chunk is
        // being forgotten) cannot say the range is empty, so it is deleted by key too.
        let unsure = rest.status().is_err();
        if left || unsure {
            self.db.delete_range_cf(pages, start, &past_end[..]).map_err(db_error("deleting pages"))?;
            self.db.flush_cf(pages).map_err(db_error("flushing pages"))?;
            let mut options = rocksdb::CompactOptions::default();
            options.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
            self.db.compact_range_cf_opt(pages, Some(start), Some(&past_end[..]), &options);
        }
        Ok(())
    }
}

/// Kept samples, in packs (`packs.rs`).
impl Store {
    /// Writes pack `pack` of `samples` (each verified against its CRC32C) as one file:
    /// all of it is stored once this returns `Ok`, none of it before.
    pub fn write_pack(&self, pack: u64, samples: &[(PackedSample, Checked)]) -> Result<()> {
        packs::write(&self.packs, &self.db, pack, samples)
    }

    /// `[from, from + length)` of the sample at `ordinal` of `pack`, checked.
    pub fn read_sample(
        &self,
        pack: u64,
        ordinal: u32,
        from: u64,
        length: u64,
    ) -> Result<Result<Checked, PageFault>> {
        packs::read(&self.db, pack, ordinal, (from, length))
    }

    /// Drops pack `pack` and its disk space.
    pub fn delete_pack(&self, pack: u64) -> Result<()> {
        packs::delete(&self.db, pack)
    }

    /// Every whole pack with what it holds (anything else in the family is removed).
    pub fn load_packs(&self) -> Result<Vec<(u64, Vec<PackedSample>)>> {
        packs::load(&self.db)
    }
}

/// Merging (`merge.rs`).
impl Store {
    /// Page files in the store (chunk files and merged shards), from RocksDB's counts
    /// per level: no listing.
    pub fn page_files_count(&self) -> u64 {
        let Ok(pages) = self.cf(CF_PAGES) else { return 0 };
        (0..7)
            .filter_map(|level| {
                self.db.property_value_cf(pages, &format!("rocksdb.num-files-at-level{level}")).ok().flatten()
            })
            .filter_map(|count| count.trim().parse::<u64>().ok())
            .sum()
    }

    /// Whether the store holds more than `--merge-above-files` files, so that complete
    /// shards are to be merged.
    pub fn wants_merge(&self) -> bool {
        self.page_files_count() > self.merge_above_files
    }

    /// Merges the chunk files of shard `id` (`size` bytes, every chunk present) into
    /// one file, once the store holds more than `--merge-above-files` files; returns
    /// whether it did. The caller keeps the shard from being removed meanwhile. A
    /// compaction of the shard's key range: the bytes are read (checked against RocksDB's
    /// block checksums) and written once more, each page with its own CRC32C; readers see
    /// the old files or the new one, never neither. Eviction still drops the shard whole,
    /// and at startup the file counts for every chunk it spans (`files.rs`).
    pub fn merge_shard(&self, id: u64, size: u64) -> Result<bool> {
        let pages = size.div_ceil(self.page_size);
        if pages < 2 || !self.wants_merge() {
            return Ok(false);
        }
        let (start, end) = (page_key(id, 0), page_key(id, pages - 1));
        let past_end = [&end[..], &[0u8][..]].concat();
        let mut options = rocksdb::CompactOptions::default();
        // The chunk files lie in the last level; without `Force` they are left as they are.
        options.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        options.set_exclusive_manual_compaction(false);
        self.db.compact_range_cf_opt(self.cf(CF_PAGES)?, Some(&start[..]), Some(&past_end[..]), &options);
        self.places.forget(id);
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
