//! Writing a chunk: its pages go into an SST file of their own, built with
//! `SstFileWriter` in `<cache-dir>/ingest/`, and the file is added to the pages column
//! family with `IngestExternalFile` (moved in, not copied).
//!
//! Why: a chunk's bytes are written once. Through a `WriteBatch` they were copied into
//! the memtable, written again by its flush, and rewritten by every level compaction
//! (`store-bench`'s CPU per GiB, BENCHMARKS.md "store"). An ingested file is the
//! page bytes' only copy; since a chunk's keys never overlap another chunk's, it lands in
//! the bottom level and is never compacted (auto-compaction is off for pages anyway).
//!
//! Ingestion is atomic (the file appears in the MANIFEST or not at all), and it is the
//! commit of a chunk: the set of live files *is* the set of present chunks
//! (`files.rs`). Each ingestion writes and syncs the MANIFEST, so concurrent admissions
//! are group-committed: whoever finds no ingestion running ingests every file queued
//! meanwhile in one call.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Condvar, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

use rocksdb::{DB, IngestExternalFileOptions, Options, SstFileWriter};
use shardcache_proto::checksum::{combine, crc32c};

use super::layout::{CF_PAGES, PAGE_HEADER, db_error, page_key};
use crate::{Error, Result};

/// Where files are written before they are ingested, under the cache directory: chunk
/// files `chunk-<id>-<page>-<n>.sst`, packs of kept samples `pack-<id>.sst`
/// (`packs.rs`).
pub(super) const DIR: &str = "ingest";
const CHUNK_PREFIX: &str = "chunk-";
pub(super) const PACK_PREFIX: &str = "pack-";
const FILE_SUFFIX: &str = ".sst";

/// Builds files and ingests them into one column family, group-committed.
pub(super) struct Ingester {
    dir: PathBuf,
    /// The column family's name and options: a file must be readable as one of its tables.
    family: &'static str,
    pages: Options,
    /// The names of this ingester's files begin so (a crash's leftovers are removed).
    prefix: &'static str,
    /// Makes file names unique among concurrent writers of one process.
    sequence: AtomicU64,
    queue: Mutex<Queue>,
    /// Signalled when a batch is done or the leader steps down.
    progress: Condvar,
}

#[derive(Default)]
struct Queue {
    /// Files written and waiting for the next ingestion, by ticket.
    waiting: Vec<(u64, PathBuf)>,
    /// Outcomes of finished ingestions, until their writers collect them.
    outcomes: HashMap<u64, Result<()>>,
    next_ticket: u64,
    /// An ingestion call is running (its caller is the leader).
    leader: bool,
}

impl std::fmt::Debug for Ingester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingester").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Ingester {
    /// The chunk files' ingester (the pages column family, with its `options`).
    pub(super) fn chunks(cache_dir: &Path, options: Options) -> Result<Self> {
        Self::new(cache_dir, (CF_PAGES, options), CHUNK_PREFIX)
    }

    /// Prepares `<cache-dir>/ingest/` for files of `family` named `prefix...`, removing
    /// such files a crash left there (ours by name; nothing else in the directory is
    /// touched).
    pub(super) fn new(
        cache_dir: &Path,
        (family, pages): (&'static str, Options),
        prefix: &'static str,
    ) -> Result<Self> {
        let dir = cache_dir.join(DIR);
        let io = |what: &str, e: std::io::Error| Error::Store {
            what: format!("{what} {}", dir.display()),
            message: e.to_string(),
        };
        std::fs::create_dir_all(&dir).map_err(|e| io("creating", e))?;
        for entry in std::fs::read_dir(&dir).map_err(|e| io("listing", e))?.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(prefix) && name.ends_with(FILE_SUFFIX) {
                tracing::info!(file = %name, "removing a file left by an interrupted write");
                std::fs::remove_file(entry.path()).map_err(|e| io("cleaning", e))?;
            }
        }
        Ok(Self {
            dir,
            family,
            pages,
            prefix,
            sequence: AtomicU64::new(0),
            queue: Mutex::default(),
            progress: Condvar::new(),
        })
    }

    /// Writes `data` (chunk bytes starting at page `first_page` of shard `id`, whose
    /// CRC32C was checked to be `crc`) as one SST file of CRC-prefixed pages, then
    /// ingests it. Returns when the chunk is in the store (or failed, leaving nothing
    /// behind).
    pub(super) fn admit(
        &self,
        db: &DB,
        id: u64,
        first_page: u64,
        page_size: usize,
        (data, crc): (&[u8], u32),
    ) -> Result<()> {
        let n = self.sequence.fetch_add(1, Relaxed);
        let path = self.dir.join(format!("{}{id:016x}-{first_page:012x}-{n}{FILE_SUFFIX}", self.prefix));
        if let Err(e) = self.write(&path, first_page, id, page_size, (data, crc)) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        // Opened before ingestion moves it: the same file under the database's name.
        let written = std::fs::File::open(&path);
        self.ingest(db, path)?;
        if let Ok(file) = written {
            // SstFileWriter drops what it wrote from the OS page cache, so the first reads
            // of a chunk just fetched (a trainer usually reads it next) would wait for the
            // disk. Ask the kernel to read it back ahead of them (asynchronously: no copy
            // here). spoke-bench's warm stream right after the fill: BENCHMARKS.md.
            let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::WillNeed);
        }
        Ok(())
    }

    fn write(
        &self,
        path: &Path,
        first_page: u64,
        id: u64,
        page_size: usize,
        (data, crc): (&[u8], u32),
    ) -> Result<()> {
        let mut writer = SstFileWriter::create(&self.pages);
        writer.open(path).map_err(db_error("creating a chunk file"))?;
        let mut value = Vec::with_capacity(PAGE_HEADER + page_size);
        let mut whole = 0;
        for (page, bytes) in (first_page..).zip(data.chunks(page_size)) {
            let page_crc = crc32c(bytes);
            whole = combine(whole, page_crc, bytes.len());
            value.clear();
            value.extend_from_slice(&page_crc.to_le_bytes());
            value.extend_from_slice(bytes);
            writer.put(page_key(id, page), &value).map_err(db_error("writing a chunk file"))?;
        }
        // The pages' checksums, combined, are the checksum the chunk was verified with:
        // what is stored is what was checked (no file is committed otherwise).
        if whole != crc {
            return Err(Error::Internal(format!(
                "chunk at page {first_page} of shard {id} changed between its check and its store \
                 (CRC32C {whole:#010x}, checked {crc:#010x}); not stored"
            )));
        }
        // Syncs the file (SstFileWriter always does) before it can be ingested.
        writer.finish().map_err(db_error("finishing a chunk file"))
    }

    /// A new file's path, named after `id` (unique among this process's files).
    pub(super) fn path(&self, id: u64) -> PathBuf {
        let n = self.sequence.fetch_add(1, Relaxed);
        self.dir.join(format!("{}{id:016x}-{n}{FILE_SUFFIX}", self.prefix))
    }

    /// A writer of a file of this ingester's column family, opened at `path`.
    pub(super) fn writer(&self, path: &Path) -> Result<SstFileWriter<'_>> {
        let writer = SstFileWriter::create(&self.pages);
        writer.open(path).map_err(db_error("creating a file to ingest"))?;
        Ok(writer)
    }

    /// Queues `path` for ingestion and waits for its outcome, ingesting for everyone
    /// queued when no one else is (group commit). A file that was not ingested is removed.
    pub(super) fn ingest(&self, db: &DB, path: PathBuf) -> Result<()> {
        let mut queue = self.lock();
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.waiting.push((ticket, path));
        loop {
            if let Some(outcome) = queue.outcomes.remove(&ticket) {
                return outcome;
            }
            if !queue.leader {
                break;
            }
            queue = self.progress.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
        // Leader until this caller's own file is in; then the next waiter takes over.
        queue.leader = true;
        let outcome = loop {
            let batch = std::mem::take(&mut queue.waiting);
            drop(queue);
            let outcomes = self.ingest_batch(db, batch);
            queue = self.lock();
            queue.outcomes.extend(outcomes);
            if let Some(outcome) = queue.outcomes.remove(&ticket) {
                break outcome;
            }
        };
        queue.leader = false;
        self.progress.notify_all();
        outcome
    }

    /// Ingests `batch` in one call; if that fails, file by file, so each writer gets its
    /// own outcome. A file that was not ingested is removed.
    fn ingest_batch(&self, db: &DB, batch: Vec<(u64, PathBuf)>) -> Vec<(u64, Result<()>)> {
        let Some(pages) = db.cf_handle(self.family) else {
            let missing = Error::Internal(format!("the {} column family is missing", self.family));
            return batch.into_iter().map(|(t, _)| (t, Err(missing.clone()))).collect();
        };
        let mut options = IngestExternalFileOptions::default();
        // The file is ours and on the same filesystem: link it in, no copy.
        options.set_move_files(true);
        // No snapshots are ever taken of the cache.
        options.set_snapshot_consistency(false);
        let paths: Vec<&PathBuf> = batch.iter().map(|(_, p)| p).collect();
        if db.ingest_external_file_cf_opts(&pages, &options, paths).is_ok() {
            return batch.into_iter().map(|(t, _)| (t, Ok(()))).collect();
        }
        batch
            .into_iter()
            .map(|(ticket, path)| {
                let outcome = db
                    .ingest_external_file_cf_opts(&pages, &options, vec![&path])
                    .map_err(db_error("ingesting a file"));
                if outcome.is_err() {
                    let _ = std::fs::remove_file(&path);
                }
                (ticket, outcome)
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}
