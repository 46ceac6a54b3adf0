//! The spoke's storage engine: shard pages and shard records in RocksDB.
//!
//! Layout (column families):
//! - `pages`: key = shard id (u64 BE) + page index (u64 BE); value = CRC32C (u32 LE)
//!   followed by up to [`PAGE_SIZE`] bytes. Pages of one shard are contiguous in key
//!   order, so a shard is dropped with one range delete and its space reclaimed by
//!   compacting that key range.
//! - `shards`: key = `dataset \0 shard`; value = a [`ShardRecord`]: the id bound to one
//!   shard *version*, size, chunk size, which chunks are present, pin flag.
//!
//! A new version of a shard gets a new id, so pages of two versions can never mix.
//! A chunk's pages and the record marking it present are written in one `WriteBatch`,
//! which reaches the memtables atomically, and the memtables of both column families are
//! flushed together (`atomic_flush`): after `kill -9` a chunk is either wholly there and
//! marked, or not marked. There is no write-ahead log by default (see
//! [`StoreOptions::write_ahead_log`]): a crash loses the chunks admitted since the last
//! flush (at most two memtables), which the hub still has; a clean stop flushes. Every
//! page read is checked against its CRC32C; a mismatch or a missing page is reported as
//! a [`PageFault`] (the cache refetches), never as data.
//!
//! Value layout, chosen by measurement (`cargo run --release -p shardcache-tests --bin
//! store-bench`, 512 MiB written as 1 MiB chunks, 2026-11-29, 2-vCPU VM, see BENCHMARKS.md):
//!
//! | layout | write MB/s | random 16 KiB read p50 / p99 | sequential MB/s |
//! |---|---|---|---|
//! | inline pages 16 KiB | 401 | 11 / 55 us | 1950 |
//! | **inline pages 64 KiB** | 353 | 21 / 74 us | 2931 |
//! | inline pages 256 KiB | 179 | 78 / 152 us | 2743 |
//! | BlobDB pages 64 KiB | 161 | 76 / 138 us | 817 |
//! | BlobDB pages 1 MiB | 364 | 1215 / 1462 us | 846 |
//!
//! 64 KiB pages inline in SST files: near the best random-sample latency and the best
//! sequential rate. BlobDB reads were 3.5x slower both ways. Its advantage, values not
//! rewritten by compaction, matters for disk usage, but with `allow_fallocate=false` the
//! inline layout also keeps `du` of a 256 MiB cache under 280 MiB while a 1 GiB dataset
//! streams through it twice (test `spoke_capacity`). BlobDB stays a `StoreOptions` switch.

use std::path::{Path, PathBuf};

use bytes::{BufMut, Bytes, BytesMut};
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBCompressionType, Options, WriteBatch,
    WriteOptions,
};
use shardcache_proto::checksum::crc32c;

use crate::{Error, Result};

/// Bytes per stored page. A 16 KiB sample read touches one or two pages; a shard read
/// takes them in key order. Chosen by `store-bench` (module docs): 16 KiB pages halve the
/// sample latency (11 vs 21 us) but cost a third of the sequential rate.
pub const PAGE_SIZE: u64 = 64 << 10;
/// CRC32C stored in front of each page.
const PAGE_HEADER: usize = 4;
/// Bytes a WriteBatch adds to each entry besides key and value: a type tag, a column
/// family id and two varint lengths (RocksDB's write_batch.cc), at most 1 + 5 + 5 + 5.
const BATCH_ENTRY_OVERHEAD: usize = 16;

const CF_PAGES: &str = "pages";
const CF_SHARDS: &str = "shards";

/// Tuning of the RocksDB instance.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Shared block cache for both column families. Page reads of a warm working set
    /// are mostly served by the OS page cache, so this mainly holds index blocks.
    pub block_cache_bytes: usize,
    /// Memtable size per column family; also bounds the WAL (see `open`).
    pub write_buffer_bytes: usize,
    /// Store page values in blob files (BlobDB) instead of inline in SST files.
    pub blob_files: bool,
    /// Bytes per page; [`PAGE_SIZE`] except in `store-bench`. Fixed for a store's life.
    pub page_size: u64,
    /// Log every write before it reaches the memtable. Off: a cache can lose recent
    /// chunks in a crash (the hub has them; consistency comes from atomic flushes), and
    /// the WAL doubled what a cold fetch writes and checksummed every byte with RocksDB's
    /// portable (non-SSE4.2) CRC32C: without it the spoke used 22% less CPU for a cold
    /// 1 GiB fetch (`wan-bench`, runs A and B in BENCHMARKS.md).
    pub write_ahead_log: bool,
    /// RocksDB option string applied over the pages column family's options
    /// (`--rocksdb-pages-options`); empty: none.
    pub pages_options: String,
}

impl Default for StoreOptions {
    fn default() -> Self {
        // 32 MiB memtables: large enough that a 1 MiB chunk write is cheap, small enough
        // that the WAL (at most ~2 memtables) stays a small share of a cache's disk.
        Self {
            block_cache_bytes: 64 << 20,
            write_buffer_bytes: 32 << 20,
            blob_files: false,
            page_size: PAGE_SIZE,
            write_ahead_log: false,
            pages_options: String::new(),
        }
    }
}

/// What the cache knows about one cached shard version, persisted in `shards`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ShardRecord {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(uint64, tag = "3")]
    pub size: u64,
    #[prost(uint32, tag = "4")]
    pub chunk_size: u32,
    #[prost(uint32, tag = "5")]
    pub record_size: u32,
    /// Bit `i` set: chunk `i` is stored, whole and verified.
    #[prost(bytes = "vec", tag = "6")]
    pub present: Vec<u8>,
    #[prost(bool, tag = "7")]
    pub pinned: bool,
    /// Unix time (ms) of the last successful check of `version` with the hub.
    #[prost(uint64, tag = "8")]
    pub validated_at_ms: u64,
}

impl ShardRecord {
    pub fn chunk_count(&self) -> u64 {
        self.size.div_ceil(u64::from(self.chunk_size.max(1)))
    }

    pub fn has_chunk(&self, index: u64) -> bool {
        self.present.get((index / 8) as usize).is_some_and(|b| b & (1 << (index % 8)) != 0)
    }

    pub fn set_chunk(&mut self, index: u64, present: bool) {
        let byte = (index / 8) as usize;
        if self.present.len() <= byte {
            self.present.resize(byte + 1, 0);
        }
        if present {
            self.present[byte] |= 1 << (index % 8);
        } else {
            self.present[byte] &= !(1 << (index % 8));
        }
    }

    /// Bytes of chunk `index` (the last one may be short).
    pub fn chunk_len(&self, index: u64) -> u64 {
        let start = index * u64::from(self.chunk_size);
        self.size.saturating_sub(start).min(u64::from(self.chunk_size))
    }

    /// Bytes of all present chunks.
    pub fn cached_bytes(&self) -> u64 {
        (0..self.chunk_count()).filter(|&i| self.has_chunk(i)).map(|i| self.chunk_len(i)).sum()
    }
}

/// Why stored bytes could not be returned. The caller refetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageFault {
    Missing { page: u64 },
    Corrupt { page: u64 },
}

impl Drop for Store {
    /// A clean stop keeps every admitted chunk: without a WAL, what is only in the
    /// memtables would be lost. (RocksDB also flushes on close; this makes it explicit
    /// and logged.)
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::error!(error = %e, "could not flush the cache on shutdown; recent chunks will be refetched");
        }
    }
}

/// The RocksDB instance under `--cache-dir`.
pub struct Store {
    db: DB,
    path: PathBuf,
    write_options: WriteOptions,
    page_size: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).field("page_size", &self.page_size).finish()
    }
}

/// Key of a shard record.
pub fn shard_key(dataset: &str, shard: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(dataset.len() + 1 + shard.len());
    key.extend_from_slice(dataset.as_bytes());
    key.push(0); // names never contain NUL (validated), so the split is unambiguous
    key.extend_from_slice(shard.as_bytes());
    key
}

/// Key of one page.
pub fn page_key(shard_id: u64, page: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&shard_id.to_be_bytes());
    key[8..].copy_from_slice(&page.to_be_bytes());
    key
}

fn db_error(what: &str) -> impl FnOnce(rocksdb::Error) -> Error + '_ {
    move |source| Error::Store { what: what.to_owned(), message: source.into_string() }
}

impl Store {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path, options: &StoreOptions) -> Result<Self> {
        let cache = Cache::new_lru_cache(options.block_cache_bytes);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        // A page read is a point lookup: with a Bloom filter it skips the SST files
        // (many L0 files right after a fill) that cannot hold the key.
        table.set_bloom_filter(10.0, false);
        let mut pages = Options::default();
        pages.set_block_based_table_factory(&table);
        // Token ids barely compress; compression would only cost CPU on every read.
        pages.set_compression_type(DBCompressionType::None);
        pages.set_write_buffer_size(options.write_buffer_bytes);
        if options.blob_files {
            pages.set_enable_blob_files(true);
            pages.set_min_blob_size(4096);
            pages.set_enable_blob_gc(true);
            pages.set_blob_gc_age_cutoff(1.0);
        }
        if !options.pages_options.is_empty() {
            pages = pages
                .get_options_from_string(&options.pages_options)
                .map_err(db_error("applying --rocksdb-pages-options"))?;
        }
        let mut shards = Options::default();
        shards.set_block_based_table_factory(&table);

        let mut db_options = Options::default();
        db_options.create_if_missing(true);
        db_options.create_missing_column_families(true);
        // Flush all column families together, so a chunk's pages never outlive (or
        // predate) the record that marks them present.
        db_options.set_atomic_flush(true);
        db_options.set_max_total_wal_size(2 * options.write_buffer_bytes as u64);
        db_options.set_max_background_jobs(2);
        // Compactions run at low CPU priority (nice), so on a small machine they take
        // the cores readers leave idle rather than adding milliseconds to sample reads
        // (spoke-bench: warm random 16 KiB read p99 right after a 1 GiB fill, see
        // BENCHMARKS.md). Flushes keep normal priority: a late flush stalls writes.
        let mut env = rocksdb::Env::new().map_err(db_error("creating the RocksDB environment"))?;
        env.lower_thread_pool_cpu_priority();
        db_options.set_env(&env);
        db_options.set_keep_log_file_num(4);
        // No preallocation: `du` of the cache dir then shows what is really stored,
        // which is what `--capacity` promises (the Rust API has no setter for it).
        let db_options = db_options
            .get_options_from_string("allow_fallocate=false")
            .map_err(db_error("setting options"))?;
        let cfs =
            [ColumnFamilyDescriptor::new(CF_PAGES, pages), ColumnFamilyDescriptor::new(CF_SHARDS, shards)];
        let db = DB::open_cf_descriptors(&db_options, dir, cfs).map_err(db_error("opening the cache"))?;
        // With the WAL on, it is written without fsync: a killed process loses nothing
        // (the OS has the WAL), a power loss loses recent chunks, which the hub has.
        let mut write_options = WriteOptions::default();
        write_options.set_sync(false);
        write_options.disable_wal(!options.write_ahead_log);
        Ok(Self { db, path: dir.to_owned(), write_options, page_size: options.page_size })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the memtables of both column families to SST files (atomically).
    pub fn flush(&self) -> Result<()> {
        let cfs = [self.cf(CF_PAGES)?, self.cf(CF_SHARDS)?];
        self.db.flush_cfs_opt(&cfs, &rocksdb::FlushOptions::default()).map_err(db_error("flushing the cache"))
    }

    fn cf(&self, name: &str) -> Result<&rocksdb::ColumnFamily> {
        self.db.cf_handle(name).ok_or_else(|| Error::Store {
            what: "opening the cache".into(),
            message: format!("column family {name} is missing"),
        })
    }

    /// Every shard record, for startup.
    pub fn load_records(&self) -> Result<Vec<(String, String, ShardRecord)>> {
        let cf = self.cf(CF_SHARDS)?;
        let mut records = Vec::new();
        for item in self.db.iterator_cf(cf, rocksdb::IteratorMode::Start) {
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
        Ok(records)
    }

    /// Writes a shard record alone (new shard, pin change, revalidation).
    pub fn put_record(&self, dataset: &str, shard: &str, record: &ShardRecord) -> Result<()> {
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_SHARDS)?, shard_key(dataset, shard), prost::Message::encode_to_vec(record));
        self.db.write_opt(batch, &self.write_options).map_err(db_error("writing a shard record"))
    }

    /// Stores chunk `data` at `offset` (a chunk boundary) as pages, together with
    /// `record` (which the caller has already marked with this chunk), atomically.
    pub fn admit_chunk(
        &self,
        dataset: &str,
        shard: &str,
        record: &ShardRecord,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        debug_assert_eq!(offset % self.page_size, 0, "chunks start on page boundaries");
        let pages = self.cf(CF_PAGES)?;
        // Sized up front: a 1 MiB batch grown by doubling was copied again at every step
        // (std::string growth, 3% of the spoke's CPU in a cold fetch's profile).
        let page_count = data.len().div_ceil(self.page_size as usize);
        let per_page = PAGE_HEADER + 16 + BATCH_ENTRY_OVERHEAD;
        let mut batch = WriteBatch::with_capacity_bytes(data.len() + page_count * per_page + 1024);
        let mut value = Vec::with_capacity(PAGE_HEADER + self.page_size as usize);
        for (i, page) in data.chunks(self.page_size as usize).enumerate() {
            value.clear();
            value.extend_from_slice(&crc32c(page).to_le_bytes());
            value.extend_from_slice(page);
            batch.put_cf(pages, page_key(record.id, offset / self.page_size + i as u64), &value);
        }
        batch.put_cf(self.cf(CF_SHARDS)?, shard_key(dataset, shard), prost::Message::encode_to_vec(record));
        self.db.write_opt(batch, &self.write_options).map_err(db_error("writing a chunk"))
    }

    /// Reads `[offset, offset + len)` of shard `id` from its pages, verifying each page.
    pub fn read(&self, id: u64, offset: u64, len: u64) -> Result<Result<Bytes, PageFault>> {
        if len == 0 {
            return Ok(Ok(Bytes::new()));
        }
        let (first, last) = (offset / self.page_size, (offset + len - 1) / self.page_size);
        let keys: Vec<[u8; 16]> = (first..=last).map(|p| page_key(id, p)).collect();
        let values = self.db.batched_multi_get_cf(self.cf(CF_PAGES)?, &keys, true);
        let mut out = BytesMut::with_capacity(len as usize);
        for (page, value) in (first..).zip(values) {
            let value = match value {
                Ok(Some(value)) => value,
                Ok(None) => return Ok(Err(PageFault::Missing { page })),
                // RocksDB's own block checksums caught damage below us: same as a bad CRC.
                Err(e) if e.kind() == rocksdb::ErrorKind::Corruption => {
                    return Ok(Err(PageFault::Corrupt { page }));
                }
                Err(e) => return Err(db_error("reading a page")(e)),
            };
            if value.len() < PAGE_HEADER {
                return Ok(Err(PageFault::Corrupt { page }));
            }
            let (header, data) = value.split_at(PAGE_HEADER);
            let stored = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
            if crc32c(data) != stored {
                return Ok(Err(PageFault::Corrupt { page }));
            }
            let page_start = page * self.page_size;
            let from = offset.saturating_sub(page_start) as usize;
            let to = ((offset + len - page_start) as usize).min(data.len());
            if from > to {
                return Ok(Err(PageFault::Missing { page }));
            }
            out.put_slice(&data[from..to]);
        }
        if out.len() as u64 != len {
            return Ok(Err(PageFault::Missing { page: last }));
        }
        Ok(Ok(out.freeze()))
    }

    /// Deletes shard `id`'s pages and (when `record_key` is given) its record.
    pub fn delete_shard(&self, id: u64, record_key: Option<(&str, &str)>) -> Result<()> {
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.cf(CF_PAGES)?, page_key(id, 0), page_key(id + 1, 0));
        if let Some((dataset, shard)) = record_key {
            batch.delete_cf(self.cf(CF_SHARDS)?, shard_key(dataset, shard));
        }
        self.db.write_opt(batch, &self.write_options).map_err(db_error("deleting a shard"))
    }

    /// Deletes pages of every id at or above `from_id` (left behind by a crash between
    /// allocating an id and writing its record).
    pub fn delete_ids_from(&self, from_id: u64) -> Result<()> {
        let mut batch = WriteBatch::default();
        // 17 bytes of 0xff sort after every 16-byte page key.
        batch.delete_range_cf(self.cf(CF_PAGES)?, &page_key(from_id, 0)[..], &[0xffu8; 17][..]);
        self.db.write_opt(batch, &self.write_options).map_err(db_error("deleting orphan pages"))
    }

    /// Rewrites the SST files holding ids `[from_id, to_id)` so deleted pages leave the
    /// disk: a range delete alone only hides them.
    pub fn reclaim(&self, from_id: u64, to_id: u64) -> Result<()> {
        let pages = self.cf(CF_PAGES)?;
        self.db.flush_cf(pages).map_err(db_error("flushing before compaction"))?;
        let mut options = rocksdb::CompactOptions::default();
        options.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        self.db.compact_range_cf_opt(pages, Some(page_key(from_id, 0)), Some(page_key(to_id, 0)), &options);
        Ok(())
    }

    /// Bytes of live SST and blob files, as RocksDB counts them.
    pub fn disk_bytes(&self) -> u64 {
        let property = |name: &str| {
            self.cf(CF_PAGES)
                .ok()
                .and_then(|cf| self.db.property_int_value_cf(cf, name).ok().flatten())
                .unwrap_or(0)
        };
        property("rocksdb.live-sst-files-size") + property("rocksdb.live-blob-file-size")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, size: u64) -> ShardRecord {
        ShardRecord { id, version: "v1".into(), size, chunk_size: 256 << 10, ..Default::default() }
    }

    #[test]
    fn rocksdb_pages_options_apply_or_stop_the_start_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let tuned = StoreOptions {
            pages_options: "level0_file_num_compaction_trigger=8;write_buffer_size=8388608".into(),
            ..StoreOptions::default()
        };
        let store = Store::open(dir.path(), &tuned).unwrap();
        let data = vec![7u8; 200_000];
        let mut rec = record(1, data.len() as u64);
        rec.set_chunk(0, true);
        store.admit_chunk("ds", "s", &rec, 0, &data).unwrap();
        assert_eq!(store.read(1, 0, data.len() as u64).unwrap().unwrap(), data);
        drop(store);

        let bad = StoreOptions { pages_options: "no_such_option=1".into(), ..StoreOptions::default() };
        let Err(err) = Store::open(dir.path(), &bad) else { panic!("an unknown option must not be ignored") };
        let err = err.to_string();
        assert!(err.contains("--rocksdb-pages-options") && err.contains("no_such_option"), "{err}");
    }

    #[test]
    fn chunks_round_trip_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        {
            let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
            let mut rec = record(7, data.len() as u64);
            rec.set_chunk(0, true);
            store.admit_chunk("ds", "s", &rec, 0, &data[..256 << 10]).unwrap();
            assert_eq!(store.read(7, 1000, 70_000).unwrap().unwrap(), data[1000..71_000]);
            // The second chunk is not there yet.
            assert_eq!(store.read(7, 270_000, 10).unwrap(), Err(PageFault::Missing { page: 4 }));
            rec.set_chunk(1, true);
            store.admit_chunk("ds", "s", &rec, 256 << 10, &data[256 << 10..]).unwrap();
        }
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let records = store.load_records().unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].2.cached_bytes(), data.len() as u64);
        assert_eq!(store.read(7, 0, data.len() as u64).unwrap().unwrap(), data);
        store.delete_shard(7, Some(("ds", "s"))).unwrap();
        assert!(store.load_records().unwrap().is_empty());
        assert_eq!(store.read(7, 0, 1).unwrap(), Err(PageFault::Missing { page: 0 }));
    }

    #[test]
    fn presence_bits() {
        let mut rec = record(1, (256 << 10) * 3 + 5);
        assert_eq!(rec.chunk_count(), 4);
        assert_eq!(rec.chunk_len(3), 5);
        rec.set_chunk(3, true);
        rec.set_chunk(9, true);
        rec.set_chunk(9, false);
        assert!(rec.has_chunk(3) && !rec.has_chunk(0) && !rec.has_chunk(9));
        assert_eq!(rec.cached_bytes(), 5);
    }
}

#[cfg(test)]
mod reclaim_tests {
    use super::*;

    #[test]
    fn deleted_shards_leave_the_disk_after_reclaim() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
        let chunk = vec![7u8; 1 << 20];
        for id in 1..=4u64 {
            let mut rec = ShardRecord {
                id,
                version: "v".into(),
                size: 16 << 20,
                chunk_size: 1 << 20,
                ..Default::default()
            };
            for i in 0..16 {
                rec.set_chunk(i, true);
                store.admit_chunk("ds", &format!("s{id}"), &rec, i << 20, &chunk).unwrap();
            }
        }
        store.reclaim(0, 0).unwrap(); // flush everything to files
        let full = store.disk_bytes();
        assert!(full >= 64 << 20, "{full}");
        store.delete_shard(1, Some(("ds", "s1"))).unwrap();
        store.delete_shard(2, Some(("ds", "s2"))).unwrap();
        store.reclaim(1, 3).unwrap();
        let after = store.disk_bytes();
        assert!(after <= full / 2 + (1 << 20), "{full} -> {after}");
    }
}
