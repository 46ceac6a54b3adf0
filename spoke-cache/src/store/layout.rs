//! The store's layout, below the store and each of its parts (`files.rs`, `ingest.rs`):
//! column families, page size and header, keys, the shard record, and what a RocksDB
//! error says. See `mod.rs` for the layout's reasons.

use crate::Error;

/// Bytes per stored page. A 16 KiB sample read touches one or two pages; a shard read
/// takes them in key order. Chosen by `store-bench` (BENCHMARKS.md): 16 KiB pages halve
/// the sample latency but cost a third of the sequential rate.
pub const PAGE_SIZE: u64 = 64 << 10;
/// CRC32C stored in front of each page.
pub const PAGE_HEADER: usize = 4;

/// The pages column family. Named anew for this layout: a cache written by the
/// memtable layout (family `pages`) has its pages dropped at open, see [`Store::open`].
pub const CF_PAGES: &str = "pages.v2";
pub const CF_LEGACY_PAGES: &str = "pages";
pub const CF_SHARDS: &str = "shards";

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
    /// The principal whose share of the capacity the shard's bytes count in
    /// (`policy::shares`): whose read first stored a chunk of it. Empty until then.
    #[prost(string, tag = "9")]
    pub holder: String,
    /// When the version's bytes last changed, as the hub said (`ShardInfo.modified_ms`);
    /// 0 when it did not say, or for a record written before this field.
    #[prost(uint64, tag = "10")]
    pub modified_ms: u64,
}

/// A chunk's number in its shard: chunk `n` holds bytes `[n x chunk size, (n + 1) x chunk
/// size)` (the last may be short). A type of its own, so that a chunk's number is never
/// taken for an offset, a length or a shard's store id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkIndex(pub u64);

impl ChunkIndex {
    /// The chunk that holds byte `offset` of a shard in chunks of `chunk_size`.
    pub fn of(offset: u64, chunk_size: u64) -> Self {
        Self(offset / chunk_size)
    }

    /// The chunks `[self, last]`, in order.
    pub fn through(self, last: ChunkIndex) -> impl Iterator<Item = ChunkIndex> + Clone {
        (self.0..=last.0).map(ChunkIndex)
    }

    /// Where it starts in a shard of chunks of `chunk_size`.
    pub fn start(self, chunk_size: u64) -> u64 {
        self.0 * chunk_size
    }

    /// Its bit in a bitmap of chunks: (byte, mask).
    fn bit(self) -> (usize, u8) {
        ((self.0 / 8) as usize, 1 << (self.0 % 8))
    }
}

impl std::fmt::Display for ChunkIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Bit `index` of `bits`, set or cleared; whether it was set.
pub(crate) fn set_bit(bits: &mut Vec<u8>, index: ChunkIndex, set: bool) -> bool {
    let (byte, mask) = index.bit();
    if bits.len() <= byte {
        if !set {
            return false;
        }
        bits.resize(byte + 1, 0);
    }
    let was = bits[byte] & mask != 0;
    if set {
        bits[byte] |= mask;
    } else {
        bits[byte] &= !mask;
    }
    was
}

impl ShardRecord {
    pub fn chunk_count(&self) -> u64 {
        self.size.div_ceil(u64::from(self.chunk_size.max(1)))
    }

    /// Every chunk of the shard, in order.
    pub fn chunks(&self) -> impl Iterator<Item = ChunkIndex> {
        (0..self.chunk_count()).map(ChunkIndex)
    }

    pub fn has_chunk(&self, index: ChunkIndex) -> bool {
        let (byte, mask) = index.bit();
        self.present.get(byte).is_some_and(|b| b & mask != 0)
    }

    pub fn set_chunk(&mut self, index: ChunkIndex, present: bool) {
        set_bit(&mut self.present, index, present);
    }

    /// Bytes of chunk `index` (the last one may be short).
    pub fn chunk_len(&self, index: ChunkIndex) -> u64 {
        let start = index.start(u64::from(self.chunk_size));
        self.size.saturating_sub(start).min(u64::from(self.chunk_size))
    }

    /// Bytes of all present chunks.
    pub fn cached_bytes(&self) -> u64 {
        self.chunks().filter(|&i| self.has_chunk(i)).map(|i| self.chunk_len(i)).sum()
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

/// A RocksDB error while doing `what`; its status code says whether the store's files
/// are damaged.
pub fn db_error(what: &str) -> impl FnOnce(rocksdb::Error) -> Error + '_ {
    move |source| {
        let (what, damaged) = (what.to_owned(), source.kind() == rocksdb::ErrorKind::Corruption);
        let message = source.into_string();
        if damaged { Error::Damaged { what, message } } else { Error::Store { what, message } }
    }
}

/// Why stored bytes could not be returned (a page of a chunk, a kept sample by ordinal).
/// The caller fetches them instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageFault {
    Missing {
        page: u64,
    },
    Corrupt {
        page: u64,
    },
    /// The disk would not give the page back (an I/O error: a bad sector, a file gone
    /// from under the store); `error` is RocksDB's words.
    Unreadable {
        page: u64,
        error: String,
    },
}
