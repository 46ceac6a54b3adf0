//! How much of each chunk has been read lately: a count-min sketch (Cormode and
//! Muthukrishnan) of bytes read per chunk, TinyLFU's frequency filter (Einziger, Friedman
//! and Manes, 2017) as Caffeine and foyer keep it, with one difference: it counts bytes,
//! not accesses, since a chunk read as one 4 MiB stream message and one read as 256
//! records of 16 KiB have been read alike.
//!
//! Aging: once as many bytes have been counted as the cache holds, every counter is
//! halved, so a chunk's count is about what was read of it over the last two cache-fulls
//! of reads; what a finished job read fades by half each time.
//!
//! A doorkeeper (TinyLFU's: a Bloom filter of the chunks read since the last halving)
//! takes each chunk's first read of a period, so that chunks read once (a scan's, a
//! sparse reader's) never reach the counters: the counters are shared by far fewer
//! chunks, and one read once is not overcounted by one it collides with.
//!
//! Counters are 16 bits in units of [`UNIT`] bytes (saturating at 256 MiB, far above
//! any chunk), four rows, updated conservatively (only the counters at the minimum grow),
//! which keeps the overcount of colliding chunks low.

/// Rows of the sketch: each chunk's count is the least of its counter in each.
const DEPTH: usize = 4;

/// Bytes per counted unit: a read of less counts one unit.
pub const UNIT: u64 = 4096;

/// Counters per row at least and at most: the cache's chunks times [`WIDTH_PER_CHUNK`],
/// between these (4 x 4 Mi x 2 bytes = 32 MiB for a cache of a million chunks).
const MIN_WIDTH: usize = 1 << 10;
const MAX_WIDTH: usize = 1 << 22;

/// Counters per chunk the cache holds, per row: the chunks counted include many the
/// cache does not hold (the candidates), so more counters than held chunks.
const WIDTH_PER_CHUNK: u64 = 4;

/// Doorkeeper bits per counter of a row, and its probes.
const DOORKEEPER_BITS_PER_COUNTER: usize = 8;
const DOORKEEPER_PROBES: u64 = 3;

/// Bytes read per chunk, lately (see the module's documentation).
#[derive(Debug, Clone)]
pub struct FrequencySketch {
    /// `DEPTH` rows of `mask + 1` counters, one after another.
    counters: Vec<u16>,
    mask: u64,
    /// The doorkeeper's bits, and their count less one (a power of two).
    doorkeeper: Vec<u64>,
    door_mask: u64,
    /// Units counted since the last halving, and how many make one.
    added: u64,
    period: u64,
}

impl FrequencySketch {
    /// A sketch for a cache of `capacity` bytes in chunks of `chunk_size`: wide enough
    /// for its chunks, halved after `capacity` bytes counted.
    pub fn new(capacity: u64, chunk_size: u64) -> Self {
        let chunks = capacity / chunk_size.max(1);
        let width = (chunks.saturating_mul(WIDTH_PER_CHUNK) as usize).clamp(MIN_WIDTH, MAX_WIDTH);
        let width = width.next_power_of_two();
        let door_bits = width * DOORKEEPER_BITS_PER_COUNTER;
        Self {
            counters: vec![0; DEPTH * width],
            mask: width as u64 - 1,
            doorkeeper: vec![0; door_bits / 64],
            door_mask: door_bits as u64 - 1,
            added: 0,
            period: (capacity / UNIT).max(1),
        }
    }

    /// Lets `key` past the doorkeeper: whether it was read before in this period (else
    /// it is remembered now).
    fn seen(&mut self, key: u64) -> bool {
        let mut seen = true;
        for probe in 0..DOORKEEPER_PROBES {
            let bit = mix(key ^ probe.wrapping_mul(0xA076_1D64_78BD_642F)) & self.door_mask;
            let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
            seen &= self.doorkeeper[word] & mask != 0;
            self.doorkeeper[word] |= mask;
        }
        seen
    }

    fn slots(&self, key: u64) -> [usize; DEPTH] {
        let width = self.mask as usize + 1;
        std::array::from_fn(|row| {
            let hash = mix(key.wrapping_add((row as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            row * width + (hash & self.mask) as usize
        })
    }

    /// `bytes` of chunk `key` were read.
    pub fn record(&mut self, key: u64, bytes: u64) {
        let units = (bytes / UNIT).max(1);
        self.added += units;
        if self.added >= self.period {
            self.age();
        }
        if !self.seen(key) {
            return; // its first read this period: the doorkeeper's
        }
        let slots = self.slots(key);
        let least = slots.iter().map(|&s| self.counters[s]).min().unwrap_or(0);
        let target = u64::from(least).saturating_add(units).min(u64::from(u16::MAX)) as u16;
        for slot in slots {
            // Conservative update: a counter above the minimum already counts more than
            // this chunk (another chunk shares it), so it is left as it is.
            let counter = &mut self.counters[slot];
            *counter = (*counter).max(target);
        }
    }

    /// Bytes read of chunk `key` lately, but for its first read of each period (an
    /// overestimate when chunks collide).
    pub fn estimate(&self, key: u64) -> u64 {
        let least = self.slots(key).iter().map(|&s| self.counters[s]).min().unwrap_or(0);
        u64::from(least) * UNIT
    }

    /// Halves every counter (old reads weigh half) and clears the doorkeeper.
    fn age(&mut self) {
        for counter in &mut self.counters {
            *counter /= 2;
        }
        self.doorkeeper.fill(0);
        self.added = 0;
    }
}

/// The key of chunk `index` of the shard whose name hashes to `shard`: the same for
/// every version of the shard (a new version is read as the old one was).
pub fn chunk_key(shard: u64, index: u64) -> u64 {
    mix(shard ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93))
}

/// A hash of `(dataset, shard)` for [`chunk_key`].
pub fn shard_hash(dataset: &str, shard: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same name hashes alike in every run.
    let mut hasher = std::hash::DefaultHasher::new();
    (dataset, shard).hash(&mut hasher);
    hasher.finish()
}

/// SplitMix64's finaliser: a good spread of any 64-bit input.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn counts_bytes_per_chunk_past_its_first_read_and_ages_by_halving() {
        let mut sketch = FrequencySketch::new(64 * MIB, 4 * MIB);
        let (a, b, once) = (chunk_key(1, 0), chunk_key(1, 1), chunk_key(1, 2));
        for _ in 0..65 {
            sketch.record(a, 16 << 10);
        }
        sketch.record(b, 100);
        sketch.record(b, 100);
        sketch.record(once, 4 * MIB);
        assert_eq!(sketch.estimate(a), MIB, "64 reads of 16 KiB after the first");
        assert_eq!(sketch.estimate(b), UNIT, "a small read counts one unit");
        assert_eq!(sketch.estimate(once), 0, "read once: the doorkeeper's");
        assert_eq!(sketch.estimate(chunk_key(2, 0)), 0, "never read");
        // The rest of a cache-full of reads elsewhere: everything is halved once, and
        // the doorkeeper forgets.
        for i in 0..59 {
            sketch.record(chunk_key(3, i), MIB);
        }
        assert_eq!(sketch.estimate(a), MIB / 2);
        assert_eq!(sketch.estimate(b), 0);
        sketch.record(once, 4 * MIB);
        assert_eq!(sketch.estimate(once), 0, "once in this period too");
    }

    #[test]
    fn chunks_of_many_shards_are_told_apart() {
        let mut sketch = FrequencySketch::new(1 << 30, 4 * MIB);
        let shards: Vec<u64> = (0..1000).map(|s| shard_hash("ds", &format!("shard-{s}"))).collect();
        for &shard in &shards {
            sketch.record(chunk_key(shard, 0), UNIT); // the doorkeeper's
        }
        for &shard in &shards[..10] {
            sketch.record(chunk_key(shard, 0), 4 * MIB);
        }
        let overcounted = shards[10..].iter().filter(|&&s| sketch.estimate(chunk_key(s, 0)) > 0).count();
        assert!(overcounted < 10, "{overcounted} of 990 unread chunks look read");
        assert!(shards[..10].iter().all(|&s| sketch.estimate(chunk_key(s, 0)) >= 4 * MIB));
    }
}
