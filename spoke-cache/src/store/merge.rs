//! Merging a complete shard's chunk files into one, once the store holds many files:
//! RocksDB builds a new list of the column family's files on every ingestion, so the
//! cost of admitting a chunk grows with the number of files (`store-scale-bench`).

use std::path::Path;

use super::{CF_PAGES, Store, page_key};
use crate::Result;

/// Default of `--merge-above-files`: the chunk files above which complete shards are
/// merged into one file each. Every ingestion builds a new list of the column family's
/// files (RocksDB's `VersionBuilder`), so its cost grows with the number of files, while
/// a merge costs one more write of the shard, whatever the count. Set where the first
/// approaches the second (`store-scale-bench` and `spoke-bench` with
/// `SPOKE_MERGE_ABOVE_FILES=0`, BENCHMARKS.md "store-scale-bench").
pub const DEFAULT_MERGE_ABOVE_FILES: u64 = 16_384;

/// Whether files in `dir` can be opened for direct I/O (`O_DIRECT`): tmpfs and some
/// overlay filesystems refuse it, and RocksDB would then fail every merge.
pub(super) fn direct_io_works(dir: &Path) -> bool {
    use rustix::fs::{Mode, OFlags};
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    let probe = dir.join("DIRECT_IO_PROBE");
    let works = rustix::fs::open(
        &probe,
        OFlags::CREATE | OFlags::WRONLY | OFlags::DIRECT,
        Mode::from_raw_mode(0o600),
    )
    .is_ok();
    let _ = std::fs::remove_file(&probe);
    works
}

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
        Ok(true)
    }
}
