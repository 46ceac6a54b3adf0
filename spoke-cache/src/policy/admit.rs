//! Which missed chunks enter the store. A chunk fetched to be stored crosses the link
//! whole (4 MiB for a 16 KiB read); one fetched as read crosses as what was asked. So
//! a miss is stored only when the chunk is likely to be read again before it would be
//! evicted: while the cache has room below its low watermark (every chunk: a cache
//! larger than the data behaves as with no filter), when a plan reads the shard (the
//! plans decide), or when the chunk has been read lately far more than what its
//! admission would evict ([`AdmissionFilter::admits`]). Otherwise it is fetched as read
//! and served without being stored: a random reader of a dataset twice the cache's
//! size brings what it reads, plus one fill of the cache, not a chunk per record.
//!
//! What counts as a chunk being read ([`counts`]): every read of it, but a sequential
//! reader's once per chunk it enters. A scan reads each chunk once, in pieces; counted
//! piece by piece it would look read as often as a chunk a random reader comes back to
//! again and again, and it would be admitted late in its one pass, when what is left of
//! it to read is less than it costs.

use std::sync::Mutex;

use super::frequency::FrequencySketch;

/// A candidate is stored over a victim only if it has been read at least this many
/// times more than the victim's chunks (per chunk): between chunks read alike (a
/// uniform random reader), storing one costs its whole size over the link and gains
/// nothing, so near-equals never displace each other.
pub const VALUE_MARGIN: u64 = 2;

/// Whether a part of a read counts in the filter: always, but for a read that begins
/// where the last read of its shard ended (`sequential`), only the part that enters a
/// chunk at its start (`at_chunk_start`).
pub fn counts(sequential: bool, at_chunk_start: bool) -> bool {
    !sequential || at_chunk_start
}

/// How much each chunk has been read lately, and the rule that compares a candidate with
/// the chunks it would displace.
#[derive(Debug)]
pub struct AdmissionFilter {
    sketch: Mutex<FrequencySketch>,
    chunk_size: u64,
}

impl AdmissionFilter {
    /// A filter for a cache of `capacity` bytes in chunks of `chunk_size`.
    pub fn new(capacity: u64, chunk_size: u64) -> Self {
        Self { sketch: Mutex::new(FrequencySketch::new(capacity, chunk_size)), chunk_size }
    }

    fn sketch(&self) -> std::sync::MutexGuard<'_, FrequencySketch> {
        self.sketch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `bytes` of the chunk `key` (`frequency::chunk_key`) were read, from the store or
    /// not.
    pub fn read(&self, key: u64, bytes: u64) {
        self.sketch().record(key, bytes);
    }

    /// Bytes of the chunk `key` read lately.
    pub fn value(&self, key: u64) -> u64 {
        self.sketch().estimate(key)
    }

    /// Bytes read lately of each of the chunks `keys` (a victim's), on average.
    pub fn mean_value(&self, keys: impl IntoIterator<Item = u64>) -> u64 {
        let sketch = self.sketch();
        let (mut sum, mut count) = (0u64, 0u64);
        for key in keys {
            sum = sum.saturating_add(sketch.estimate(key));
            count += 1;
        }
        sum.checked_div(count).unwrap_or(0)
    }

    /// Whether the chunk `key` is worth storing in place of chunks read `victim` bytes
    /// each lately: read more than its own size lately (some of it again: a scan reads a
    /// chunk once, however it is cut), and more than [`VALUE_MARGIN`] times the victim's.
    pub fn admits(&self, key: u64, victim: u64) -> bool {
        let value = self.value(key);
        value > self.chunk_size && value > victim.saturating_mul(VALUE_MARGIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::frequency::chunk_key;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_chunk_read_far_more_than_its_victim_is_admitted_and_near_equals_are_not() {
        let filter = AdmissionFilter::new(256 * MIB, 4 * MIB);
        let (hot, warm, once) = (chunk_key(1, 0), chunk_key(1, 1), chunk_key(1, 2));
        for _ in 0..512 {
            filter.read(hot, 16 << 10); // 8 MiB read
        }
        for _ in 0..320 {
            filter.read(warm, 16 << 10); // 5 MiB
        }
        filter.read(once, 4 * MIB); // the whole chunk once: a scan
        assert!(filter.admits(hot, 0) && filter.admits(hot, 3 * MIB), "over twice the victim");
        assert!(!filter.admits(hot, 5 * MIB), "not twice a victim read as much");
        assert!(filter.admits(warm, 2 * MIB) && !filter.admits(warm, 3 * MIB));
        assert!(!filter.admits(once, 0), "a chunk read once is no reason to keep it");
        // Past each chunk's first read (the doorkeeper's).
        assert_eq!(filter.mean_value([hot, once]), (8 * MIB - (16 << 10)) / 2);
        assert_eq!(filter.mean_value([]), 0);
    }
}
