//! Where a stored page lies in the store's own files, for the same-node door
//! (`serve/local_door.rs`): a reader on the spoke's node is handed the files and reads
//! the pages itself, checking each against the CRC32C stored in front of it.
//!
//! A page file is a RocksDB table written by `SstFileWriter` (a chunk, `ingest.rs`) or by
//! a merge (`merge.rs`), with no compression and RocksDB's default 4 KiB data blocks: a
//! page's value (64 KiB and its header) is larger than a block, so each data block holds
//! exactly one page, and the blocks lie end to end from the file's first byte in key
//! order. A block is the entry's three varints (shared key bytes: 0; key bytes: 24, the
//! 16-byte page key and RocksDB's 8-byte sequence and type; value bytes), the key, the
//! value, the restart array (one restart, at 0) and its count (1), then the block trailer
//! (the compression type, 0, and a 4-byte checksum).
//!
//! Each file is walked once, block by block, and every block must be exactly that, its
//! key the page expected: a file that is anything else (a `--rocksdb-pages-options`
//! with larger blocks, a future RocksDB) is not placed, and its pages are read as before
//! (`Store::read`) and carried in the answer. A wrong place cannot hand out wrong bytes:
//! the reader checks each page against its CRC32C, and a page key names one shard
//! version.
//!
//! A file's bytes never change (RocksDB writes a file once and never reuses its number),
//! and a file evicted while a reader holds it stays readable through the descriptor
//! until the reader closes it. The places are kept per shard id and forgotten whenever
//! the shard's files change (a chunk admitted or dropped, a merge, an eviction).

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::SeqCst},
    },
};

use super::{
    Store,
    layout::{CF_PAGES, PAGE_HEADER},
};

/// Bytes of a block that follow its value: the restart array of one restart and the
/// restart count (u32 each), then the trailer (compression type, 4-byte checksum).
const BLOCK_TAIL: u64 = 4 + 4 + 5;
/// A data block's key: the page key (16 bytes) and RocksDB's sequence and type (8,
/// little-endian: the type first).
const INTERNAL_KEY: u64 = 24;
/// RocksDB's `kTypeValue`.
const VALUE_TYPE: u8 = 1;

/// Part of one stored page that a read takes, in an open file.
#[derive(Debug, Clone)]
pub struct PageSpan {
    pub file: Arc<File>,
    /// Where the page's stored value begins in the file: its CRC32C, then its bytes.
    pub at: u64,
    pub page_len: u32,
    /// The part the read takes, within the page's bytes.
    pub from: u32,
    pub to: u32,
}

/// The files a call's reads were placed in, opened once each, at most `most` of them
/// (what one answer may pass: `shardcache_transport::local_socket::MAX_FILES`); a page
/// in another file is not placed (it is read and carried).
#[derive(Debug)]
pub struct Opened {
    files: HashMap<PathBuf, Arc<File>>,
    most: usize,
}

impl Opened {
    pub fn new(most: usize) -> Self {
        Self { files: HashMap::new(), most }
    }

    /// `path`, opened once per call; `None` past `most` files or when it is gone.
    fn open(&mut self, path: &Path) -> Option<Arc<File>> {
        if let Some(file) = self.files.get(path) {
            return Some(file.clone());
        }
        if self.files.len() >= self.most {
            return None;
        }
        // Gone since it was placed (evicted): read as before.
        let file = Arc::new(File::open(path).ok()?);
        self.files.insert(path.to_owned(), file.clone());
        Some(file)
    }
}

/// Pages of one file that lie at a regular stride: page `first + k` (k < `count`) at
/// `at + k * stride`, each `len` bytes after its header.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: u64,
    count: u64,
    at: u64,
    stride: u64,
    len: u32,
}

impl Run {
    /// Where page `page` lies, if this run holds it.
    fn place(&self, page: u64) -> Option<(u64, u32)> {
        (page >= self.first && page - self.first < self.count)
            .then(|| (self.at + (page - self.first) * self.stride, self.len))
    }

    /// Takes page `page` at `at` (`len` bytes, its block `stride` long) if it continues
    /// this run.
    fn extend(&mut self, page: u64, at: u64, len: u32, stride: u64) -> bool {
        let next = page == self.first + self.count && at == self.at + self.count * self.stride;
        if next && len == self.len && (stride == self.stride || self.count == 1) {
            self.stride = stride;
            self.count += 1;
            return true;
        }
        false
    }
}

/// One page file of a shard and its pages, in runs (a file holds one chunk, a merged
/// shard, or what RocksDB rewrote of one around a dropped chunk: runs with holes).
#[derive(Debug)]
struct PlacedFile {
    path: PathBuf,
    runs: Vec<Run>,
}

/// Counters of changes, a shard id's being `id % CHANGE_COUNTERS`: places found while
/// their shard's counter moved are not kept. Per id rather than one counter, so that
/// admissions of other shards (a node filling while it serves) do not keep a warm
/// shard's places from being kept; bounded, where a map by id would grow with every
/// shard ever admitted (two ids sharing a counter only cost a placement found again).
const CHANGE_COUNTERS: usize = 1024;

/// The places of each shard's pages, by shard id (`None`: its files could not be placed).
#[derive(Debug)]
pub(super) struct Places {
    shards: Mutex<HashMap<u64, Option<Arc<Vec<PlacedFile>>>>>,
    changes: Box<[AtomicU64]>,
}

impl Default for Places {
    fn default() -> Self {
        Self { shards: Mutex::default(), changes: (0..CHANGE_COUNTERS).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl Places {
    fn changes(&self, id: u64) -> &AtomicU64 {
        &self.changes[(id % CHANGE_COUNTERS as u64) as usize]
    }

    /// Shard `id`'s files changed: its places are found again when next asked.
    pub(super) fn forget(&self, id: u64) {
        self.changes(id).fetch_add(1, SeqCst);
        self.shards.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
    }

    /// Every shard's files may have changed (a range of ids dropped).
    pub(super) fn forget_all(&self) {
        for counter in &self.changes {
            counter.fetch_add(1, SeqCst);
        }
        self.shards.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }
}

impl Store {
    /// Where `[offset, offset + len)` of shard `id` lies in the store's files (opened into
    /// `opened`, shared by a call's reads), page by page; `None` when some page cannot be
    /// placed, or lies in a file past what `opened` may hold (then it is read with
    /// [`Store::read`], which says whether it is there).
    pub fn locate(&self, id: u64, offset: u64, len: u64, opened: &mut Opened) -> Option<Vec<PageSpan>> {
        if len == 0 {
            return Some(Vec::new());
        }
        let files = self.placed(id)?;
        let (first, last) = (offset / self.page_size, (offset + len - 1) / self.page_size);
        let mut spans = Vec::with_capacity((last - first + 1) as usize);
        for page in first..=last {
            let (file, (at, page_len)) = files
                .iter()
                .find_map(|f| f.runs.iter().find_map(|r| r.place(page)).map(|place| (f, place)))?;
            let page_start = page * self.page_size;
            let from = offset.saturating_sub(page_start);
            let to = (offset + len - page_start).min(u64::from(page_len));
            if from >= to {
                return None;
            }
            let handle = opened.open(&file.path)?;
            spans.push(PageSpan { file: handle, at, page_len, from: from as u32, to: to as u32 });
        }
        Some(spans)
    }

    /// Shard `id`'s page files, placed (found and walked once, then kept until they change).
    fn placed(&self, id: u64) -> Option<Arc<Vec<PlacedFile>>> {
        let places = &self.places;
        if let Some(known) = places.shards.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&id)
        {
            return known.clone();
        }
        let before = places.changes(id).load(SeqCst);
        let found = self.place_files(id).map(Arc::new);
        let mut shards = places.shards.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Not kept when the shard's files changed meanwhile: what was listed may be stale.
        if places.changes(id).load(SeqCst) == before {
            shards.insert(id, found.clone());
        }
        found
    }

    /// Finds and walks shard `id`'s page files; `None` when one is not as expected.
    fn place_files(&self, id: u64) -> Option<Vec<PlacedFile>> {
        let live = self.db.live_files().ok()?;
        let of_shard = |key: &Option<Vec<u8>>| key.as_deref().and_then(page_of(id));
        let mut files: Vec<PlacedFile> = Vec::new();
        for file in live.iter().filter(|f| f.column_family_name == CF_PAGES) {
            let (Some(first), Some(last)) = (of_shard(&file.start_key), of_shard(&file.end_key)) else {
                continue;
            };
            let path = self.path.join(file.name.trim_start_matches('/'));
            let runs = walk(&path, id, first, last)?;
            files.push(PlacedFile { path, runs });
        }
        Some(files)
    }
}

/// The page index of `key` when it is a page key of shard `id`.
fn page_of(id: u64) -> impl Fn(&[u8]) -> Option<u64> {
    move |key| {
        let key: [u8; 16] = key.try_into().ok()?;
        let (shard, page) = key.split_at(8);
        (shard == id.to_be_bytes()).then(|| u64::from_be_bytes(page.try_into().unwrap_or_default()))
    }
}

/// The runs of pages of shard `id` in `path`, whose first key is page `first` and last
/// `last`: its data blocks from the file's first byte, each exactly one page, in rising
/// page order (see the module docs); `None` when a block is anything else.
fn walk(path: &Path, id: u64, first: u64, last: u64) -> Option<Vec<Run>> {
    let file = File::open(path).ok()?;
    let mut runs: Vec<Run> = Vec::new();
    let (mut block, mut expected) = (0u64, first);
    loop {
        let mut head = [0u8; 3 + 5 + INTERNAL_KEY as usize];
        file.read_exact_at(&mut head, block).ok()?;
        let mut at = 0;
        let (shared, key_len, value_len) =
            (varint(&head, &mut at)?, varint(&head, &mut at)?, varint(&head, &mut at)?);
        if shared != 0 || key_len != INTERNAL_KEY || value_len < PAGE_HEADER as u64 {
            return None;
        }
        let page = page_of(id)(&head[at..at + 16]).filter(|&page| page >= expected && page <= last)?;
        // The key's type (the low byte of its trailer): a value, not a deletion.
        if head[at + 16] != VALUE_TYPE {
            return None;
        }
        let value = block + at as u64 + INTERNAL_KEY;
        let mut tail = [0u8; 9];
        file.read_exact_at(&mut tail, value + value_len).ok()?;
        // One restart, at 0; no compression.
        if tail[..8] != [0, 0, 0, 0, 1, 0, 0, 0] || tail[8] != 0 {
            return None;
        }
        let len = u32::try_from(value_len - PAGE_HEADER as u64).ok()?;
        let next = value + value_len + BLOCK_TAIL;
        let stride = next - block;
        if !runs.last_mut().is_some_and(|run| run.extend(page, value, len, stride)) {
            runs.push(Run { first: page, count: 1, at: value, stride, len });
        }
        if page == last {
            return Some(runs);
        }
        (block, expected) = (next, page + 1);
    }
}

/// A LEB128 varint of at most 5 bytes (RocksDB's varint32) at `at`, advanced past it.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in 0..5 {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << (7 * shift);
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}
