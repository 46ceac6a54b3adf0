//! Orders of samples computed a position at a time, never listed, in one implementation
//! the Rust SDK and the Python SDK share (`shardcache._native`): a keyed [`Permutation`]
//! of any size with its inverse (where a sample is read, from which sample a place
//! reads), and the [`SamplerOrder`] of a map-style sampler over ranks, the order
//! `torch.utils.data.DistributedSampler` deals (a permutation per epoch, padded to a
//! multiple of the ranks or cut to one, every rank's share a stride of it).
//!
//! The inverse is what a plan needs: a job that reads sample `s` now reads it again at
//! `position_of(next epoch, s)`, which the SDK sends the spoke with each planned read
//! (`CacheClient::plan_samples`), so the spoke keeps what is read again soonest.

use blake2::{Blake2b, Digest, digest::consts::U32};

/// A bijection of `0..n` keyed by a string, computed per position: a balanced Feistel
/// network over the next power of four, values past `n` cycle-walked back in (Black &
/// Rogaway's cipher on an arbitrary domain), four rounds of splitmix64's finaliser keyed
/// by blake2b of the key. The same numbers as `shardcache.order.Permutation` in Python
/// (its blocks past a million samples are shuffled by it: `client/python/tests`).
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half: u32,
    mask: u64,
    keys: [u64; ROUNDS],
}

const ROUNDS: usize = 4;

/// splitmix64's finaliser: every bit of the result depends on every bit of `x`.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Permutation {
    /// The permutation of `0..n` keyed by `key` (`n` at least 1).
    pub fn new(n: u64, key: &str) -> Self {
        let n = n.max(1);
        let mut bits = (u64::BITS - (n - 1).leading_zeros()).max(2);
        bits += bits & 1; // two equal halves: the domain is at most 4n
        let half = bits / 2;
        let digest = Blake2b::<U32>::digest(key.as_bytes());
        let mut keys = [0; ROUNDS];
        for (r, key) in keys.iter_mut().enumerate() {
            let mut word = [0; 8];
            word.copy_from_slice(&digest[8 * r..8 * r + 8]);
            *key = u64::from_le_bytes(word);
        }
        Self { n, half, mask: (1 << half) - 1, keys }
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    fn encrypt(&self, x: u64) -> u64 {
        let (mut left, mut right) = (x >> self.half, x & self.mask);
        for key in self.keys {
            (left, right) = (right, left ^ (mix(right ^ key) & self.mask));
        }
        (left << self.half) | right
    }

    fn decrypt(&self, x: u64) -> u64 {
        let (mut left, mut right) = (x >> self.half, x & self.mask);
        for key in self.keys.iter().rev() {
            (left, right) = (right ^ (mix(left ^ key) & self.mask), left);
        }
        (left << self.half) | right
    }

    /// The value at `position` (`< n`): cycle-walking, a few steps at most (the domain is
    /// under 4n).
    pub fn at(&self, position: u64) -> u64 {
        let mut x = self.encrypt(position);
        while x >= self.n {
            x = self.encrypt(x);
        }
        x
    }

    /// The position of `value` (`< n`): `at`'s inverse.
    pub fn position_of(&self, value: u64) -> u64 {
        let mut x = self.decrypt(value);
        while x >= self.n {
            x = self.decrypt(x);
        }
        x
    }
}

/// The order in which a map-style sampler over `ranks` ranks reads `n` samples each
/// epoch, as `torch.utils.data.DistributedSampler` deals it: the epoch's order (a
/// [`Permutation`] keyed by the seed and the epoch, or `0..n` unshuffled), padded with
/// its first places to a multiple of the ranks (or, `drop_last`, cut to one), place `p`
/// read by rank `p % ranks` as its `p / ranks`-th sample. With one rank and no padding,
/// a drop-in for `RandomSampler`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplerOrder {
    pub n: u64,
    pub seed: u64,
    pub shuffle: bool,
    pub ranks: u64,
    pub drop_last: bool,
}

impl SamplerOrder {
    /// Places of an epoch: `n` padded to, or cut to, a multiple of the ranks.
    pub fn places(&self) -> u64 {
        let ranks = self.ranks.max(1);
        if self.drop_last { self.n / ranks * ranks } else { self.n.div_ceil(ranks) * ranks }
    }

    /// Samples each rank reads an epoch.
    pub fn per_rank(&self) -> u64 {
        self.places() / self.ranks.max(1)
    }

    fn permutation(&self, epoch: u64) -> Option<Permutation> {
        (self.shuffle && self.n > 0)
            .then(|| Permutation::new(self.n, &format!("shardcache:sampler:{}:{epoch}", self.seed)))
    }

    /// The sample read at `place` (`< places()`) of `epoch`.
    pub fn sample_at(&self, epoch: u64, place: u64) -> u64 {
        let place = if self.n == 0 { 0 } else { place % self.n }; // the padding repeats the first places
        self.permutation(epoch).map_or(place, |p| p.at(place))
    }

    /// The places rank `rank` reads in `epoch` past its first `base` places (the places
    /// all ranks read before a resume, in all: every `ranks`-th from `base + rank`), from
    /// its `from`-th on, at most `count`.
    pub fn rank_places(&self, rank: u64, (base, from): (u64, u64), count: u64) -> Vec<u64> {
        let ranks = self.ranks.max(1);
        let places = self.places();
        (from..from.saturating_add(count))
            .map(|j| base + rank + j * ranks)
            .take_while(|&place| place < places)
            .collect()
    }

    /// The samples rank `rank` reads in `epoch`, as [`SamplerOrder::rank_places`].
    pub fn rank_samples(&self, epoch: u64, rank: u64, (base, from): (u64, u64), count: u64) -> Vec<u64> {
        let permutation = self.permutation(epoch);
        self.rank_places(rank, (base, from), count)
            .into_iter()
            .map(|place| {
                let place = place % self.n.max(1);
                permutation.as_ref().map_or(place, |p| p.at(place))
            })
            .collect()
    }

    /// The first place of `epoch` that reads `sample` (`None`: none does, cut by
    /// `drop_last`).
    pub fn place_of(&self, epoch: u64, sample: u64) -> Option<u64> {
        let place = self.permutation(epoch).map_or(sample, |p| p.position_of(sample));
        (place < self.places()).then_some(place)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permutation_is_a_bijection_with_its_inverse_at_every_size() {
        for n in [1, 2, 3, 4, 5, 17, 1000, 4097] {
            let p = Permutation::new(n, "shardcache:0:1:block0");
            let mut seen = vec![false; n as usize];
            for position in 0..n {
                let value = p.at(position);
                assert!(value < n && !seen[value as usize], "n {n}: {position} -> {value}");
                seen[value as usize] = true;
                assert_eq!(p.position_of(value), position);
            }
        }
        let (a, b) = (Permutation::new(1000, "a"), Permutation::new(1000, "b"));
        assert!((0..1000).any(|i| a.at(i) != b.at(i)), "another key, another order");
    }

    #[test]
    fn a_sampler_deals_every_sample_once_an_epoch_across_ranks_with_distributed_samplers_padding() {
        let order = SamplerOrder { n: 10, seed: 3, shuffle: true, ranks: 3, drop_last: false };
        assert_eq!((order.places(), order.per_rank()), (12, 4));
        let ranks: Vec<Vec<u64>> = (0..3).map(|r| order.rank_samples(5, r, (0, 0), u64::MAX)).collect();
        let mut all: Vec<u64> = ranks.concat();
        all.sort_unstable();
        // Padded with the epoch's first two places: those two samples twice.
        let (first, second) = (order.sample_at(5, 0), order.sample_at(5, 1));
        let mut expected: Vec<u64> = (0..10).chain([first, second]).collect();
        expected.sort_unstable();
        assert_eq!(all, expected);
        for (rank, samples) in ranks.iter().enumerate() {
            for (j, &s) in samples.iter().enumerate() {
                assert_eq!(order.sample_at(5, j as u64 * 3 + rank as u64), s);
            }
        }
        assert_eq!(order.rank_samples(5, 1, (0, 2), 10), ranks[1][2..], "from a rank's place on");
        // Resumed by two ranks after 6 places: the rest of the epoch (now 10 places: no
        // padding for two), each place once.
        let two = SamplerOrder { ranks: 2, ..order.clone() };
        let mut rest: Vec<u64> = (0..2).flat_map(|r| two.rank_places(r, (6, 0), 100)).collect();
        rest.sort_unstable();
        assert_eq!(rest, (6..10).collect::<Vec<_>>());
        for s in 0..10 {
            assert_eq!(order.sample_at(5, order.place_of(5, s).unwrap()), s);
        }
        let cut = SamplerOrder { drop_last: true, ..order.clone() };
        assert_eq!((cut.places(), cut.per_rank()), (9, 3));
        assert_eq!((0..10).filter(|&s| cut.place_of(5, s).is_none()).count(), 1, "one sample cut");
        let plain = SamplerOrder { shuffle: false, ranks: 1, ..order };
        assert_eq!(plain.rank_samples(0, 0, (0, 0), 100), (0..10).collect::<Vec<_>>());
    }
}
