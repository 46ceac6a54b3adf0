//! A model of the cache's policies run over a trace of reads, counting bytes read, bytes
//! served from the store and bytes over the link: the unit tests' and `policy-bench`'s
//! way to hold the policies against each other and against Belady's offline optimum
//! on the same trace, without servers.
//!
//! The model is the spoke's: chunks of shards, stored whole or fetched as read; shards
//! evicted whole, least recently used first, from the high watermark to the low one,
//! principals over their share first (`policy::shares`). What it leaves out (round
//! trips, concurrency, in-flight bytes) changes no byte counts of a reader in order.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use super::{
    admit::AdmissionFilter,
    evict::{Candidate, Victims},
    frequency::{chunk_key, shard_hash},
    keep::NextUse,
    shares::Shares,
};

/// The cache being modelled.
#[derive(Debug, Clone, Copy)]
pub struct Model {
    pub capacity: u64,
    pub chunk_size: u64,
    pub shard_size: u64,
    pub high_watermark: f64,
    pub low_watermark: f64,
}

impl Model {
    /// The spoke's watermarks (`config.rs`).
    pub fn new(capacity: u64, chunk_size: u64, shard_size: u64) -> Self {
        Self {
            capacity,
            chunk_size,
            shard_size,
            high_watermark: crate::policy::evict::HIGH_WATERMARK,
            low_watermark: crate::policy::evict::LOW_WATERMARK,
        }
    }

    fn chunks(&self) -> u64 {
        self.shard_size.div_ceil(self.chunk_size)
    }

    fn chunk_len(&self, index: u64) -> u64 {
        (self.shard_size - index * self.chunk_size).min(self.chunk_size)
    }
}

/// Which misses are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every miss (the spoke before admission), and with `whole_shard` the rest of its
    /// shard on a shard's first miss.
    StoreEvery { whole_shard: bool },
    /// S3-FIFO's ghost (Yang et al., 2023) without its small queue: a miss is stored if
    /// its chunk missed before and is still remembered (as many chunks as the cache
    /// holds), else fetched as read and remembered.
    SecondMiss,
    /// The spoke's: room below the low watermark, else the frequency filter against the
    /// victim (`AdmissionFilter::admits`); and its speculation (`policy::speculation`):
    /// the rest of a shard on its first stored miss, chunks ahead of a sequential reader,
    /// into room below the low watermark, while those bets pay.
    Frequency,
}

/// One read of a trace: `length` bytes at `offset` of shard `shard`, by principal
/// `principal` (an index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    pub principal: u8,
    pub shard: u32,
    pub offset: u64,
    pub length: u64,
}

/// What a trace cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub read: u64,
    /// Bytes served from the store.
    pub hit: u64,
    /// Bytes over the link.
    pub link: u64,
    /// (read, hit) per principal, and per shard.
    pub principals: HashMap<u8, (u64, u64)>,
    pub shards: HashMap<u32, (u64, u64)>,
}

impl Outcome {
    pub fn hit_ratio(&self) -> f64 {
        self.hit as f64 / self.read.max(1) as f64
    }

    /// Bytes over the link per byte read.
    pub fn amplification(&self) -> f64 {
        self.link as f64 / self.read.max(1) as f64
    }

    /// The hit ratio of `principal`'s reads.
    pub fn principal_hit_ratio(&self, principal: u8) -> f64 {
        self.principals.get(&principal).map_or(0.0, |&(read, hit)| hit as f64 / read.max(1) as f64)
    }

    /// The hit ratio of the reads of the shards `shards` selects.
    pub fn shards_hit_ratio(&self, shards: impl Fn(u32) -> bool) -> f64 {
        let (read, hit) = self
            .shards
            .iter()
            .filter(|(s, _)| shards(**s))
            .fold((0, 0), |(r, h), (_, &(read, hit))| (r + read, h + hit));
        hit as f64 / read.max(1) as f64
    }

    fn count(&mut self, (principal, shard): (u8, u32), bytes: u64, hit: bool, link: u64) {
        self.read += bytes;
        self.link += link;
        for slot in [self.principals.entry(principal).or_default(), self.shards.entry(shard).or_default()] {
            slot.0 += bytes;
            slot.1 += if hit { bytes } else { 0 };
        }
        if hit {
            self.hit += bytes;
        }
    }
}

#[derive(Debug, Default)]
struct Shard {
    present: HashSet<u64>,
    /// Stored by speculation, not read since.
    unread: HashSet<u64>,
    last_access: u64,
    /// Who stored it first (whose share it counts in).
    holder: u8,
    whole_fetched: bool,
    sequential_run: u32,
}

/// The model's state while a trace runs.
struct Sim<'a> {
    model: Model,
    policy: Policy,
    shares: &'a Shares,
    shards: HashMap<u32, Shard>,
    used: u64,
    clock: u64,
    filter: AdmissionFilter,
    ghost: VecDeque<u64>,
    ghosted: HashSet<u64>,
    hashes: HashMap<u32, u64>,
    /// Where the last read of each shard ended (a read beginning there is sequential).
    next_offset: HashMap<u32, u64>,
    speculation: super::speculation::Speculation,
}

impl Sim<'_> {
    fn key(&mut self, shard: u32, index: u64) -> u64 {
        let hash = *self.hashes.entry(shard).or_insert_with(|| shard_hash("sim", &shard.to_string()));
        chunk_key(hash, index)
    }

    fn bytes(&self, shard: &Shard) -> u64 {
        shard.present.iter().map(|&i| self.model.chunk_len(i)).sum()
    }

    /// The shard eviction takes next for an admission by `principal` (`None`: any
    /// principal's eviction), never `keep`: the evictor's order (`evict::Victims`) over
    /// the model's shards, which no plan reads and no prefetch holds.
    fn victim(&self, principal: Option<u8>, keep: u32) -> Option<u32> {
        let principal = principal.map(|p| p.to_string());
        self.victims(keep).peek(self.shares, self.model.capacity, principal.as_deref()).map(|c| c.key)
    }

    /// The model's shards but `keep` in the evictor's order.
    fn victims(&self, keep: u32) -> Victims<u32> {
        let candidates = self
            .shards
            .iter()
            .filter(|(id, s)| **id != keep && !s.present.is_empty())
            .map(|(id, s)| Candidate {
                key: *id,
                holder: s.holder.to_string(),
                bytes: self.bytes(s),
                prefetching: false,
                next_use: NextUse::Never,
                last_access: s.last_access,
            })
            .collect();
        Victims::new(candidates)
    }

    fn has_room(&self, bytes: u64) -> bool {
        self.used + bytes <= (self.model.capacity as f64 * self.model.low_watermark) as u64
    }

    /// Whether a miss of chunk `index` of `shard` is stored.
    fn stores(&mut self, principal: u8, shard: u32, index: u64) -> bool {
        let key = self.key(shard, index);
        if self.has_room(self.model.chunk_len(index)) {
            return true;
        }
        match self.policy {
            Policy::StoreEvery { .. } => true,
            Policy::SecondMiss => {
                if self.ghosted.remove(&key) {
                    return true;
                }
                self.ghost.push_back(key);
                self.ghosted.insert(key);
                let remembered = (self.model.capacity / self.model.chunk_size).max(1) as usize;
                while self.ghost.len() > remembered {
                    if let Some(old) = self.ghost.pop_front() {
                        self.ghosted.remove(&old);
                    }
                }
                false
            }
            Policy::Frequency => {
                let victim = self.victim(Some(principal), shard).map_or(0, |v| {
                    let present: Vec<u64> = self.shards[&v].present.iter().copied().collect();
                    let keys: Vec<u64> = present.into_iter().map(|i| self.key(v, i)).collect();
                    self.filter.mean_value(keys)
                });
                self.filter.admits(key, victim)
            }
        }
    }

    fn store(&mut self, principal: u8, shard: u32, index: u64) -> u64 {
        let len = self.model.chunk_len(index);
        let state = self.shards.entry(shard).or_default();
        if state.present.is_empty() {
            state.holder = principal;
        }
        if state.present.insert(index) {
            self.used += len;
            len
        } else {
            0
        }
    }

    fn evict_if_over(&mut self, reading: u32) {
        if self.used as f64 <= self.model.capacity as f64 * self.model.high_watermark {
            return;
        }
        let target = (self.model.capacity as f64 * self.model.low_watermark) as u64;
        let taken = self.victims(reading).take_until(self.shares, self.model.capacity, self.used, target);
        for victim in taken {
            let shard = self.shards.remove(&victim.key).unwrap_or_default();
            self.used -= self.bytes(&shard);
            let unread: u64 = shard.unread.iter().map(|&i| self.model.chunk_len(i)).sum();
            self.speculation.wasted(unread);
        }
    }

    /// The spoke's speculation after a read of `shard` that ended in chunk `last`
    /// (`Cache::after_read`); the bytes it brought.
    fn speculate(&mut self, principal: u8, shard: u32, last: u64, stored_miss: bool) -> u64 {
        let Some(state) = self.shards.get(&shard) else { return 0 };
        let rest: u64 = (0..self.model.chunks())
            .filter(|i| !state.present.contains(i))
            .map(|i| self.model.chunk_len(i))
            .sum();
        let fits = |sim: &Self, bytes: u64| sim.has_room(bytes) && sim.speculation.has_room(bytes, 0);
        let chunks: Vec<u64> =
            if stored_miss && !state.whole_fetched && fits(self, rest) && self.speculation.whole_shards() {
                (0..self.model.chunks()).collect()
            } else {
                let ahead = self.speculation.read_ahead(4, state.sequential_run);
                (last + 1..=last + ahead).take_while(|&i| i < self.model.chunks()).collect()
            };
        if let Some(state) = self.shards.get_mut(&shard) {
            state.whole_fetched |= stored_miss;
        }
        let mut brought = 0;
        for index in chunks {
            let len = self.model.chunk_len(index);
            if self.shards.get(&shard).is_some_and(|s| s.present.contains(&index)) {
                continue;
            }
            if !fits(self, len) {
                break;
            }
            brought += self.store(principal, shard, index);
            if let Some(state) = self.shards.get_mut(&shard) {
                state.unread.insert(index);
            }
            self.speculation.stored(len);
        }
        brought
    }

    fn read(&mut self, read: Read, outcome: &mut Outcome) {
        self.clock += 1;
        let end = read.offset + read.length;
        let sequential = self.next_offset.insert(read.shard, end) == Some(read.offset) && read.offset > 0;
        let (mut missed, mut last) = (false, 0);
        for index in read.offset / self.model.chunk_size..end.div_ceil(self.model.chunk_size) {
            last = index;
            let start = index * self.model.chunk_size;
            let from = read.offset.max(start);
            let part = end.min(start + self.model.chunk_len(index)) - from;
            let key = self.key(read.shard, index);
            if super::admit::counts(sequential, from == start) {
                self.filter.read(key, part);
            }
            let stored = self.shards.get_mut(&read.shard).filter(|s| s.present.contains(&index));
            if let Some(shard) = stored {
                if shard.unread.remove(&index) {
                    self.speculation.used(self.model.chunk_len(index));
                }
                outcome.count((read.principal, read.shard), part, true, 0);
            } else if self.stores(read.principal, read.shard, index) {
                let fetched = self.store(read.principal, read.shard, index);
                outcome.count((read.principal, read.shard), part, false, fetched);
                missed = true;
            } else {
                self.filter.fetched_as_read(key, part);
                outcome.count((read.principal, read.shard), part, false, part);
            }
        }
        if let Some(shard) = self.shards.get_mut(&read.shard) {
            shard.last_access = self.clock;
            shard.sequential_run = if sequential { shard.sequential_run + 1 } else { 0 };
        }
        match self.policy {
            Policy::StoreEvery { whole_shard: true } if missed => {
                for index in 0..self.model.chunks() {
                    outcome.link += self.store(read.principal, read.shard, index);
                }
            }
            Policy::Frequency => outcome.link += self.speculate(read.principal, read.shard, last, missed),
            _ => {}
        }
        self.evict_if_over(read.shard);
    }
}

/// What each of `phases` (traces run one after another on one cache) costs a cache of
/// `model` under `policy`, tenants weighted by `shares`.
pub fn simulate(model: Model, policy: Policy, shares: &Shares, phases: &[Vec<Read>]) -> Vec<Outcome> {
    let mut sim = Sim {
        model,
        policy,
        shares,
        shards: HashMap::new(),
        used: 0,
        clock: 0,
        filter: AdmissionFilter::new(model.capacity, model.chunk_size),
        ghost: VecDeque::new(),
        ghosted: HashSet::new(),
        hashes: HashMap::new(),
        next_offset: HashMap::new(),
        speculation: super::speculation::Speculation::new(model.capacity),
    };
    phases
        .iter()
        .map(|trace| {
            let mut outcome = Outcome::default();
            for &read in trace {
                sim.read(read, &mut outcome);
            }
            outcome
        })
        .collect()
}

/// Belady's MIN with bypass on `phases` run one after another: a cache of whole chunks, `capacity` of them in
/// all, that knows the future: a miss is stored (its chunk fetched whole) unless its next
/// read is later than every stored chunk's, and evicts the chunk read again furthest
/// away; a miss not stored is fetched as read. The most hits any cache of this size can
/// have at chunk granularity.
pub fn belady(model: Model, phases: &[Vec<Read>]) -> Vec<Outcome> {
    let trace: Vec<Read> = phases.concat();
    // Every read's chunk parts, in order: (read index, chunk, bytes).
    let mut parts: Vec<(usize, (u32, u64), u64)> = Vec::new();
    for (at, read) in trace.iter().enumerate() {
        let end = read.offset + read.length;
        for index in read.offset / model.chunk_size..end.div_ceil(model.chunk_size) {
            let start = index * model.chunk_size;
            let part = end.min(start + model.chunk_len(index)) - read.offset.max(start);
            parts.push((at, (read.shard, index), part));
        }
    }
    // The position of each part's chunk's next part.
    let mut next = vec![usize::MAX; parts.len()];
    let mut seen: HashMap<(u32, u64), usize> = HashMap::new();
    for (i, (_, chunk, _)) in parts.iter().enumerate().rev() {
        if let Some(&later) = seen.get(chunk) {
            next[i] = later;
        }
        seen.insert(*chunk, i);
    }
    let slots = (model.capacity / model.chunk_size) as usize;
    // Each stored chunk's next read, and the stored chunks by it.
    let mut stored: HashMap<(u32, u64), usize> = HashMap::new();
    let mut by_next: BTreeSet<(usize, (u32, u64))> = BTreeSet::new();
    // The read each phase starts at.
    let starts: Vec<usize> =
        phases.iter().scan(0, |at, p| Some(std::mem::replace(at, *at + p.len()))).collect();
    let mut outcomes = vec![Outcome::default(); phases.len()];
    for (i, &(at, chunk, part)) in parts.iter().enumerate() {
        let principal = (trace[at].principal, chunk.0);
        let outcome = &mut outcomes[starts.partition_point(|&s| s <= at) - 1];
        if let Some(old) = stored.insert(chunk, next[i]) {
            by_next.remove(&(old, chunk));
            by_next.insert((next[i], chunk));
            outcome.count(principal, part, true, 0);
            continue;
        }
        // A miss: stored (in place of the chunk read again furthest away, when full)
        // unless it is read again later than every stored chunk.
        stored.remove(&chunk);
        if stored.len() >= slots {
            match by_next.last().copied() {
                Some((far, victim)) if far > next[i] => {
                    by_next.remove(&(far, victim));
                    stored.remove(&victim);
                }
                _ => {
                    outcome.count(principal, part, false, part);
                    continue;
                }
            }
        }
        stored.insert(chunk, next[i]);
        by_next.insert((next[i], chunk));
        outcome.count(principal, part, false, model.chunk_len(chunk.1));
    }
    outcomes
}

pub mod samples;
#[cfg(test)]
mod tests;
pub mod traces;
