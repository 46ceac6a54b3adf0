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
//!
//! When a chunk is decided ([`AdmissionFilter::admits`]): at the first miss of a pass over
//! it, and not again until as much of it as it holds has been fetched as read. A chunk
//! declined at its first miss is being read by a reader that reads it a piece at a
//! time (a shuffled block of records, a random reader); admitted partway through that
//! pass it would cost its pieces so far plus its whole self, for the rest of one pass
//! (plan-bench's planless reader of 4 MiB shards brought 1.18x the dataset an epoch so,
//! where no cache brings 1.00x). Once a chunk's worth has crossed as read, the pass is
//! over (or the chunk is read more than once a pass: hot), and it is decided afresh.

use std::{collections::HashMap, sync::Mutex};

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
    /// Chunks declined at a miss, with the bytes of each fetched as read since (see the
    /// module's documentation); at most `max_declined`, then forgotten all at once (a
    /// forgotten chunk is only decided again sooner).
    declined: Mutex<HashMap<u64, u64>>,
    max_declined: usize,
    chunk_size: u64,
}

/// Declined chunks remembered per chunk the cache holds, and at least: the candidates a
/// cache turns away outnumber what it holds.
const DECLINED_PER_CHUNK: u64 = 4;
const MIN_DECLINED: usize = 4096;

impl AdmissionFilter {
    /// A filter for a cache of `capacity` bytes in chunks of `chunk_size`.
    pub fn new(capacity: u64, chunk_size: u64) -> Self {
        let chunks = (capacity / chunk_size.max(1)).saturating_mul(DECLINED_PER_CHUNK);
        Self {
            sketch: Mutex::new(FrequencySketch::new(capacity, chunk_size)),
            declined: Mutex::default(),
            max_declined: usize::try_from(chunks).unwrap_or(usize::MAX).max(MIN_DECLINED),
            chunk_size,
        }
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

    /// Whether a miss of the chunk `key` stores it in place of chunks read `victim` bytes
    /// each lately: not while a pass over it that it was declined at is under way (less
    /// than a chunk of it fetched as read since); else if it was read more than its own
    /// size lately (some of it again: a scan reads a chunk once, however it is cut), and
    /// more than [`VALUE_MARGIN`] times the victim's. A chunk declined here is counted
    /// as read by [`AdmissionFilter::fetched_as_read`].
    pub fn admits(&self, key: u64, victim: u64) -> bool {
        let mut declined = self.declined.lock().unwrap_or_else(|p| p.into_inner());
        if declined.get(&key).is_some_and(|&as_read| as_read < self.chunk_size) {
            return false;
        }
        let value = self.value(key);
        let admitted = value > self.chunk_size && value > victim.saturating_mul(VALUE_MARGIN);
        if admitted {
            declined.remove(&key);
        } else {
            if declined.len() >= self.max_declined {
                declined.clear();
            }
            declined.insert(key, 0);
        }
        admitted
    }

    /// `bytes` of the chunk `key`, declined, were fetched as read.
    pub fn fetched_as_read(&self, key: u64, bytes: u64) {
        let mut declined = self.declined.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(as_read) = declined.get_mut(&key) {
            *as_read = as_read.saturating_add(bytes);
        }
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

    #[test]
    fn a_chunk_declined_at_its_first_miss_is_decided_again_only_after_a_chunk_crossed_as_read() {
        let filter = AdmissionFilter::new(256 * MIB, 4 * MIB);
        let chunk = chunk_key(2, 0);
        assert!(!filter.admits(chunk, 0), "never read: declined, its pass begins");
        // The pass reads the chunk in 16 KiB pieces, each fetched as read: by the middle
        // of it the chunk has been read more than its size lately (an earlier pass
        // counts too), yet storing it now would bring it whole for half a pass.
        for _ in 0..384 {
            filter.read(chunk, 16 << 10);
        }
        for _ in 0..128 {
            filter.fetched_as_read(chunk, 16 << 10);
            assert!(!filter.admits(chunk, 0), "partway through the pass it was declined at");
        }
        filter.fetched_as_read(chunk, 2 * MIB);
        assert!(filter.admits(chunk, 0), "a chunk's worth crossed as read: decided afresh, and read enough");
        // Admitted chunks are not remembered as declined.
        filter.fetched_as_read(chunk, 4 * MIB);
        assert!(filter.admits(chunk, 0));
    }
}
