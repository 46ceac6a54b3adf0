//! What the store's files take on the disk: RocksDB's own (outside `--capacity`, the
//! margin `Status` shows) and the live page, record and pack files.

use super::*;

impl Store {
    /// Bytes of RocksDB's own files in the cache directory: its write-ahead log,
    /// MANIFEST, info log, options, and the shard records' tables. Not counted against
    /// `--capacity` (chunks and packs are): the margin beside it that `Status` shows.
    /// Lists the directory (chunk files are not looked at beyond their names): blocking,
    /// for `Status`, not every read.
    pub fn own_bytes(&self) -> u64 {
        let own = std::fs::read_dir(&self.path)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().ends_with(".sst"))
            .filter_map(|e| e.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum::<u64>();
        let records = self
            .cf(CF_SHARDS)
            .ok()
            .and_then(|cf| self.db.property_int_value_cf(cf, "rocksdb.live-sst-files-size").ok().flatten())
            .unwrap_or(0);
        own + records
    }

    /// Bytes of live page and record files, as RocksDB counts them.
    pub fn disk_bytes(&self) -> u64 {
        let size = |cf: &str| {
            self.cf(cf)
                .ok()
                .and_then(|cf| {
                    self.db.property_int_value_cf(cf, "rocksdb.live-sst-files-size").ok().flatten()
                })
                .unwrap_or(0)
        };
        size(CF_PAGES) + size(CF_SHARDS) + size(CF_SAMPLES)
    }
}
