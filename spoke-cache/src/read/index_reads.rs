//! A format's index reads (an MDS offset table, a tar header, a Parquet footer: reads
//! the SDK marks `shardcache-index-read`) of chunks the spoke does not hold are fetched
//! as read, not as whole chunks: opening a dataset's index must not bring every shard's
//! first chunk across the link (with shards of one chunk, that is the whole dataset,
//! before any plan says what to keep). What they fetched is kept here, in memory, so
//! the index opened again (by each DataLoader worker, in each epoch) costs nothing
//! upstream; the least recently used go past [`INDEX_READS_KEPT`] bytes.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, PoisonError},
};

use bytes::Bytes;
use shardcache_proto::checksum::Checked;

/// Bytes of index reads kept: the offset tables of ~1,000 MDS shards of 64 KiB heads.
pub const INDEX_READS_KEPT: u64 = 64 << 20;

/// What a kept read costs beside its bytes: its key and use in both maps (with their
/// slots and nodes), its `Checked`, the allocation's header. Counted so that a client
/// sending many tiny (or empty) index reads fills the bound as surely as large ones,
/// instead of growing the maps without bound.
pub const ENTRY_OVERHEAD: u64 = 192;

/// `(entry id, offset, length)`: an entry is one version of a shard, so bytes kept for
/// a version are never served for another.
type Key = (u64, u64, u64);

#[derive(Debug, Default)]
pub struct IndexReads {
    held: Mutex<HeldReads>,
}

/// The reads kept, and their order of last use (so the least recently used is found
/// without a scan of every read: an eviction costs a log, not the whole map).
#[derive(Debug, Default)]
struct HeldReads {
    /// Bytes and overheads of the reads kept.
    bytes: u64,
    /// Each read's bytes and when it was last used.
    reads: HashMap<Key, (Checked, u64)>,
    /// The reads by last use.
    by_use: BTreeMap<u64, Key>,
    clock: u64,
}

impl HeldReads {
    /// `key`'s last use moved to now.
    fn touch(&mut self, key: Key) -> Option<Checked> {
        self.clock += 1;
        let now = self.clock;
        let (data, used) = self.reads.get_mut(&key)?;
        self.by_use.remove(used);
        *used = now;
        let data = data.clone();
        self.by_use.insert(now, key);
        Some(data)
    }

    fn remove(&mut self, key: &Key) {
        if let Some((old, used)) = self.reads.remove(key) {
            self.by_use.remove(&used);
            self.bytes -= cost(&old);
        }
    }
}

fn cost(read: &Checked) -> u64 {
    read.data.len() as u64 + ENTRY_OVERHEAD
}

impl IndexReads {
    pub fn get(&self, key: Key) -> Option<Checked> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).touch(key)
    }

    /// Whether a read of `length` bytes is kept: not one of more than an index's size,
    /// which would push out many.
    pub fn keeps(length: u64) -> bool {
        length <= INDEX_READS_KEPT / 16
    }

    pub fn put(&self, key: Key, data: Checked) {
        if !Self::keeps(data.data.len() as u64) {
            return;
        }
        // Copied: `data` may be a slice of a larger response, which a slice kept here
        // would keep whole, past what is counted.
        let data = Checked { data: Bytes::copy_from_slice(&data.data), crc32c: data.crc32c };
        let mut kept = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        kept.remove(&key);
        kept.clock += 1;
        let now = kept.clock;
        kept.bytes += cost(&data);
        kept.reads.insert(key, (data, now));
        kept.by_use.insert(now, key);
        while kept.bytes > INDEX_READS_KEPT {
            let Some((_, oldest)) = kept.by_use.pop_first() else { break };
            kept.remove(&oldest);
        }
    }

    /// Reads kept, and what they cost.
    #[cfg(test)]
    fn held(&self) -> (usize, u64) {
        let kept = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        (kept.reads.len(), kept.bytes)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn checked(length: usize) -> Checked {
        Checked { data: Bytes::from(vec![7; length]), ..Default::default() }
    }

    #[test]
    fn the_least_recently_used_go_first_past_the_bound() {
        let reads = IndexReads::default();
        let piece = (INDEX_READS_KEPT / 16 - ENTRY_OVERHEAD) as usize;
        for i in 0..16 {
            reads.put((i, 0, piece as u64), checked(piece));
        }
        assert!(reads.get((0, 0, piece as u64)).is_some(), "all 16 fit");
        reads.put((99, 0, piece as u64), checked(piece));
        assert!(reads.get((1, 0, piece as u64)).is_none(), "the least recently used went");
        assert!(reads.get((0, 0, piece as u64)).is_some(), "the one just used stayed");
        assert!(reads.get((99, 0, piece as u64)).is_some());
        reads.put((100, 0, 0), checked((INDEX_READS_KEPT / 16) as usize + 1));
        assert!(reads.get((100, 0, 0)).is_none(), "larger than an index read: not kept");
        assert!(reads.held().1 <= INDEX_READS_KEPT);
    }

    #[test]
    fn tiny_and_empty_reads_fill_the_bound_too() {
        // Empty reads cost no bytes of data; before their overhead counted, each one
        // grew the maps for good (and each eviction scanned them all).
        let reads = IndexReads::default();
        let most = (INDEX_READS_KEPT / ENTRY_OVERHEAD) as usize;
        for i in 0..most as u64 + 10_000 {
            reads.put((i, 0, 0), checked(0));
        }
        let (count, bytes) = reads.held();
        assert!(count == most && bytes <= INDEX_READS_KEPT, "{count} reads kept, {bytes} bytes");
        assert!(reads.get((0, 0, 0)).is_none(), "the oldest went");
        assert!(reads.get((most as u64 + 9_999, 0, 0)).is_some(), "the newest stayed");
    }

    #[test]
    fn a_kept_read_does_not_keep_the_response_it_was_sliced_from() {
        let reads = IndexReads::default();
        let response = Bytes::from(vec![1u8; 1 << 20]);
        reads.put((1, 0, 16), Checked { data: response.slice(0..16), crc32c: 0 });
        let kept = reads.get((1, 0, 16)).unwrap();
        // A copy of its 16 bytes, not a view into the 1 MiB buffer.
        let within = response.as_ptr_range();
        assert!(
            kept.data.len() == 16 && !within.contains(&kept.data.as_ptr()),
            "the kept read is its own buffer"
        );
    }
}
