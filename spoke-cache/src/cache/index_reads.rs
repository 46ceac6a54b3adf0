//! A format's index reads (an MDS offset table, a tar header, a Parquet footer: reads
//! the SDK marks `shardcache-index-read`) of chunks the spoke does not hold are fetched
//! as read, not as whole chunks: opening a dataset's index must not bring every shard's
//! first chunk across the link (with shards of one chunk, that is the whole dataset,
//! before any plan says what to keep). What they fetched is kept here, in memory, so
//! the index opened again (by each DataLoader worker, in each epoch) costs nothing
//! upstream; the least recently used go past [`INDEX_READS_KEPT`] bytes.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use shardcache_proto::checksum::Checked;

/// Bytes of index reads kept: the offset tables of ~1,000 MDS shards of 64 KiB heads.
pub const INDEX_READS_KEPT: u64 = 64 << 20;

/// `(entry id, offset, length)`: an entry is one version of a shard, so bytes kept for
/// a version are never served for another.
type Key = (u64, u64, u64);

#[derive(Debug, Default)]
pub struct IndexReads {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    bytes: u64,
    /// Each read's bytes and when it was last used.
    reads: HashMap<Key, (Checked, u64)>,
    clock: u64,
}

impl IndexReads {
    pub fn get(&self, key: Key) -> Option<Checked> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.clock += 1;
        let now = kept.clock;
        let (data, used) = kept.reads.get_mut(&key)?;
        *used = now;
        Some(data.clone())
    }

    /// Whether a read of `length` bytes is kept: not one of more than an index's size,
    /// which would push out many.
    pub fn keeps(length: u64) -> bool {
        length <= INDEX_READS_KEPT / 16
    }

    pub fn put(&self, key: Key, data: Checked) {
        let length = data.data.len() as u64;
        if !Self::keeps(length) {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.clock += 1;
        let now = kept.clock;
        if let Some((old, _)) = kept.reads.insert(key, (data, now)) {
            kept.bytes -= old.data.len() as u64;
        }
        kept.bytes += length;
        while kept.bytes > INDEX_READS_KEPT {
            let Some(oldest) = kept.reads.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| *k) else {
                break;
            };
            if let Some((old, _)) = kept.reads.remove(&oldest) {
                kept.bytes -= old.data.len() as u64;
            }
        }
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
        let piece = (INDEX_READS_KEPT / 16) as usize;
        for i in 0..16 {
            reads.put((i, 0, piece as u64), checked(piece));
        }
        assert!(reads.get((0, 0, piece as u64)).is_some(), "all 16 fit");
        reads.put((99, 0, piece as u64), checked(piece));
        assert!(reads.get((1, 0, piece as u64)).is_none(), "the least recently used went");
        assert!(reads.get((0, 0, piece as u64)).is_some(), "the one just used stayed");
        assert!(reads.get((99, 0, piece as u64)).is_some());
        reads.put((100, 0, 0), checked(piece + 1));
        assert!(reads.get((100, 0, 0)).is_none(), "larger than an index read: not kept");
    }
}
