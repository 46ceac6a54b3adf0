//! Opening the store (its column families, their tuning, the pages of an older layout
//! dropped, the chunk files no record accounts for removed) and removing a damaged one.

use super::*;

impl Store {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path, options: &StoreOptions) -> Result<Self> {
        let cache = Cache::new_lru_cache(options.block_cache_bytes);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        let mut pages = Options::default();
        // No Bloom filter for pages: their files never overlap, so a lookup finds the one
        // file that can hold a key by its key range alone.
        pages.set_block_based_table_factory(&table);
        // Token ids barely compress; compression would only cost CPU on every read.
        pages.set_compression_type(DBCompressionType::None);
        // Pages arrive as ingested files whose keys never overlap; compacting them would
        // only rewrite bytes that are written once.
        pages.set_disable_auto_compactions(true);
        // A merge (`merge_shard`) writes a shard as one file, whatever its size: a file
        // cut elsewhere than at a chunk boundary would not be recognised at startup.
        pages.set_target_file_size_base(1 << 50);
        if !options.pages_options.is_empty() {
            pages = pages.get_options_from_string(&options.pages_options).map_err(|e| {
                Error::Config(format!(
                    "--rocksdb-pages-options {:?} is not a valid RocksDB option string: {}",
                    options.pages_options,
                    e.into_string()
                ))
            })?;
        }
        let mut records_table = BlockBasedOptions::default();
        records_table.set_block_cache(&cache);
        records_table.set_bloom_filter(10.0, false);
        let mut shards = Options::default();
        shards.set_block_based_table_factory(&records_table);
        shards.set_write_buffer_size(options.write_buffer_bytes);

        let mut db_options = Options::default();
        db_options.create_if_missing(true);
        db_options.create_missing_column_families(true);
        db_options.set_max_total_wal_size(4 * options.write_buffer_bytes as u64);
        db_options.set_max_background_jobs(2);
        db_options.set_max_open_files(i32::try_from(options.max_open_files).unwrap_or(i32::MAX).max(16));
        // RocksDB's own files are a bounded margin beside `--capacity` (which counts chunks
        // and packs): its info log at most 1 MiB and one old one, its MANIFEST rewritten
        // past 8 MiB (`Store::own_bytes` measures them for `Status`).
        db_options.set_keep_log_file_num(2);
        db_options.set_max_log_file_size(1 << 20);
        db_options.set_max_manifest_file_size(8 << 20);
        // Merges (`merge_shard`) read and write a shard once more; with direct I/O they
        // skip the page cache's copies and cost a third of the CPU (BENCHMARKS.md
        // "store-scale-bench"). Only where the filesystem allows it (not tmpfs).
        db_options.set_use_direct_io_for_flush_and_compaction(direct_io_works(dir));
        // No preallocation: `du` of the cache dir then shows what is really stored,
        // which is what `--capacity` promises (the Rust API has no setter for it).
        let db_options = db_options
            .get_options_from_string("allow_fallocate=false")
            .map_err(db_error("setting options"))?;
        let legacy = DB::list_cf(&db_options, dir).unwrap_or_default().iter().any(|cf| cf == CF_LEGACY_PAGES);
        let mut cfs = vec![
            ColumnFamilyDescriptor::new(CF_PAGES, pages.clone()),
            ColumnFamilyDescriptor::new(CF_SHARDS, shards),
            // Packs are files of the same kind as chunks: ingested, never compacted.
            ColumnFamilyDescriptor::new(CF_SAMPLES, pages.clone()),
        ];
        if legacy {
            cfs.push(ColumnFamilyDescriptor::new(CF_LEGACY_PAGES, Options::default()));
        }
        let mut db = DB::open_cf_descriptors(&db_options, dir, cfs).map_err(|e| {
            // RocksDB's LOCK file: another process has this cache open.
            if e.as_ref().contains("LOCK") && e.as_ref().contains("Resource temporarily unavailable") {
                return Error::Config(format!(
                    "--cache-dir {} is in use by another spoke (or another process holds its RocksDB lock): \
                     give each spoke its own directory",
                    dir.display()
                ));
            }
            db_error("opening the cache")(e)
        })?;
        if legacy {
            // Pages of the memtable layout (before ingestion): their presence was kept in
            // the records, which this layout does not read. A cache refills; it must
            // not guess.
            tracing::warn!(dir = %dir.display(), "cache written by an older shardcache: dropping its pages (they will be fetched again)");
            db.drop_cf(CF_LEGACY_PAGES).map_err(db_error("dropping the old pages"))?;
        }
        let packs = Ingester::new(dir, (CF_SAMPLES, pages.clone()), ingest::PACK_PREFIX)?;
        let ingester = Ingester::chunks(dir, pages)?;
        Ok(Self {
            db,
            path: dir.to_owned(),
            ingester,
            packs,
            page_size: options.page_size,
            merge_above_files: options.merge_above_files,
            places: locate::Places::default(),
        })
    }

    /// Removes the store in `dir` after damage: RocksDB's own files (those whose names
    /// RocksDB gives its files, as `DestroyDB` recognises them) and the chunk files
    /// being written (`ingest/`); anything else in `dir` stays. Returns what was left.
    pub fn destroy(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
        DB::destroy(&Options::default(), dir).map_err(db_error("removing the damaged store"))?;
        let ingest = dir.join(ingest::DIR);
        if ingest.exists() {
            std::fs::remove_dir_all(&ingest).map_err(|e| Error::Store {
                what: format!("removing {}", ingest.display()),
                message: e.to_string(),
            })?;
        }
        let left =
            std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        Ok(left)
    }
}
