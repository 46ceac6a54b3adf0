//! Access plans: the order in which jobs will read shards (`SetPlan`), and how far away
//! each cached shard's next planned read is, for eviction.
//!
//! A job's plan is the shard order of the rest of its current epoch followed by the
//! next one (the SDK knows both: a seed and a shuffle). Each job has a cursor, the plan
//! position it has reached: a client read of a shard moves it to that shard's next
//! position in the plan, if that is within [`CURSOR_REACH`] (reads arrive a little out
//! of order: several ranks, batches in flight). A shard's next use is its first
//! position at or after the cursor, as a distance; over several jobs, the nearest.
//!
//! Readers are not in lockstep: when the first reader reaches a block, the others still
//! read the block before. Their reads are a straggler's: they do not move the cursor, and
//! the cache fetches what they miss as they ask for it without storing it (the room is
//! the plan's, for the block being read and the next), rather than keeping two blocks in
//! use (which in a cache a few blocks large evicts the blocks being read).
//!
//! Evicting the shard whose next use is furthest away is Belady's rule: with the future
//! known it misses least. Under a reshuffle every epoch, least-recently-used evicts
//! shards just before they are read again; this keeps a stable set and lets the rest
//! stream through.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
};

use tokio::sync::Notify;

use crate::entry::ShardKey;

/// How far ahead of a job's cursor a read may be and still move it: reads arrive out of
/// order by what a trainer has in flight (ranks x batches x shards per batch), far less
/// than an epoch.
pub const CURSOR_REACH: usize = 256;

/// Most positions one plan may have (two epochs of a large dataset: the seed's C4 at 64
/// MiB shards is ~12k shards an epoch).
pub const MAX_PLAN_POSITIONS: usize = 1 << 20;

/// One planned use of a shard: from the read that first touches it (`first`) to the
/// position of the last shard first read before its own last read (`until`), both plan
/// positions. A shard read whole before the next starts has `until == first`; under a
/// block shuffle the shards of a block are in use together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    pub first: usize,
    pub until: usize,
}

/// One position of a plan: the shard first read there, its use, its size and the
/// epoch of the read.
#[derive(Debug, Clone)]
pub struct Planned {
    pub key: ShardKey,
    pub at: Use,
    pub size: u64,
    pub epoch: u64,
}

#[derive(Debug)]
struct JobPlan {
    /// Each shard's uses, ascending.
    uses: HashMap<ShardKey, Vec<Use>>,
    /// Each position in order: the shard first read there, its use, size and epoch.
    order: Vec<Planned>,
    /// The block of each position, and the last position of each block: a block runs
    /// until every shard first read in it has been read for the last time (the `until`
    /// of each position it spans, transitively); a shard read whole before the next is
    /// its own block. Under a block shuffle, a block's shards are read together.
    block_of: Vec<usize>,
    block_ends: Vec<usize>,
    cursor: usize,
    /// The furthest behind the cursor a straggler's read was seen, in positions (kept
    /// when the job sends its next plan): reported, so an operator sees how far apart
    /// the job's readers are.
    lag: usize,
}

impl JobPlan {
    fn new(order: Vec<Planned>, lag: usize) -> Self {
        let mut uses: HashMap<ShardKey, Vec<Use>> = HashMap::new();
        let (mut block_of, mut block_ends) = (Vec::with_capacity(order.len()), Vec::new());
        for (at, planned) in order.iter().enumerate() {
            uses.entry(planned.key.clone()).or_default().push(planned.at);
            match block_ends.last_mut() {
                Some(end) if at <= *end => *end = (*end).max(planned.at.until),
                _ => block_ends.push(planned.at.until),
            }
            block_of.push(block_ends.len() - 1);
        }
        Self { uses, order, block_of, block_ends, cursor: 0, lag }
    }

    /// The last position of the block that holds position `at`.
    fn block_end(&self, at: usize) -> usize {
        self.block_of.get(at).map_or(at, |&block| self.block_ends[block])
    }

    /// Whether the cursor is in the last block of its epoch (the epoch's reads are
    /// ending, and a read of the next epoch's shards is the next epoch's start).
    fn in_last_block_of_epoch(&self) -> bool {
        let next = self.block_end(self.cursor) + 1;
        self.order.get(next).is_none_or(|p| p.epoch != self.order[self.cursor].epoch)
    }

    /// The positions to have in the cache now: the shards in use (begun and not ended),
    /// the rest of the block being read, and the next block, each with its distance from
    /// the cursor and whether it is in the next block (ahead).
    fn window(&self) -> Vec<(usize, bool, &Planned)> {
        let mut near = Vec::new();
        let behind = self.cursor.saturating_sub(CURSOR_REACH);
        let mut current_end = self.cursor;
        for position in &self.order[behind..self.cursor.min(self.order.len())] {
            if self.next_use(&position.key) == Some(0) {
                current_end = current_end.max(position.at.until);
                near.push((0, false, position));
            }
        }
        if self.cursor >= self.order.len() {
            return near;
        }
        let current_end = self.block_end(self.cursor).max(current_end);
        let next_end = self.block_end(current_end + 1).min(self.order.len() - 1);
        for (at, position) in self.order.iter().enumerate().take(next_end + 1).skip(self.cursor) {
            near.push((at - self.cursor, at > current_end, position));
        }
        near
    }

    /// The use of `key` the cursor is in, else its next one.
    fn current_or_next(&self, key: &ShardKey) -> Option<Use> {
        let uses = self.uses.get(key)?;
        let at = uses.partition_point(|u| u.until < self.cursor);
        uses.get(at).copied()
    }

    /// Distance from the cursor to `key`'s next use; 0 while in use.
    fn next_use(&self, key: &ShardKey) -> Option<usize> {
        self.current_or_next(key).map(|u| u.first.saturating_sub(self.cursor))
    }

    /// A client read `key`: moves the cursor to its next use if that is a little ahead
    /// (not while it is in use; into the next epoch only from the last block of this
    /// one). A read of a shard whose use ended in the block the cursor is in or the one
    /// before is a straggler's: readers are not in lockstep (ranks, workers and their
    /// read-ahead reach the next block at different times), so the cursor stays, and the
    /// read is reported as a straggler's (its misses are fetched as read and not stored:
    /// the plan needs that room for what is read next).
    fn read(&mut self, key: &ShardKey) -> Seen {
        let Some(uses) = self.uses.get(key) else { return Seen::Other };
        let at = uses.partition_point(|u| u.until < self.cursor);
        let next = uses.get(at).copied();
        if next.is_some_and(|u| u.first <= self.cursor) {
            return Seen::Other; // in use
        }
        if let Some(before) = at.checked_sub(1).map(|before| uses[before])
            && self.block_of[before.until] + 1 >= self.block_of[self.cursor]
        {
            self.lag = self.lag.max(self.cursor - before.until);
            return Seen::Straggler;
        }
        let Some(next) = next else { return Seen::Other };
        let same_epoch = self.order[next.first].epoch == self.order[self.cursor].epoch;
        if next.first - self.cursor > CURSOR_REACH || !(same_epoch || self.in_last_block_of_epoch()) {
            return Seen::Other;
        }
        self.cursor = next.first;
        Seen::Moved
    }
}

/// What a read was to a job's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// It moved the cursor.
    Moved,
    /// A straggler's read of a shard whose use has just ended.
    Straggler,
    Other,
}

/// The plans of the jobs reading through this cache.
#[derive(Debug, Default)]
pub struct Plans {
    jobs: Mutex<HashMap<String, JobPlan>>,
    /// Any plan at all: reads skip the lock while there is none.
    any: AtomicBool,
    /// A plan was set or a cursor moved: what to prefetch may have changed.
    changed: Notify,
    /// Shards being fetched because a plan reads them next (`plan_fetch.rs`).
    fetching: Mutex<HashSet<ShardKey>>,
}

impl Plans {
    fn jobs(&self) -> MutexGuard<'_, HashMap<String, JobPlan>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `job`'s plan (`order`: each position, in order); an empty order withdraws
    /// it. Returns the distinct shards it names.
    pub fn set(&self, job: &str, order: Vec<Planned>) -> usize {
        let mut jobs = self.jobs();
        let distinct = if order.is_empty() {
            jobs.remove(job);
            0
        } else {
            let lag = jobs.get(job).map_or(0, |old| old.lag);
            let plan = JobPlan::new(order, lag);
            let distinct = plan.uses.len();
            jobs.insert(job.to_owned(), plan);
            distinct
        };
        self.any.store(!jobs.is_empty(), Relaxed);
        drop(jobs);
        self.changed.notify_one();
        distinct
    }

    /// A client read `dataset/shard` for `job` (the read's job header): jobs that
    /// planned it a little ahead move their cursors there. Returns whether the read is a
    /// straggler's to `job`'s own plans (`JOB` or `JOB/...`): the shard's use in them has
    /// just ended.
    pub fn read(&self, dataset: &str, shard: &str, job: Option<&str>) -> bool {
        if !self.any.load(Relaxed) {
            return false;
        }
        let key = (dataset.to_owned(), shard.to_owned());
        let (mut moved, mut straggler) = (false, false);
        for (name, plan) in self.jobs().iter_mut() {
            match plan.read(&key) {
                Seen::Moved => moved = true,
                Seen::Straggler => straggler |= job.is_some_and(|job| name.split('/').next() == Some(job)),
                Seen::Other => {}
            }
        }
        if moved {
            self.changed.notify_one();
        }
        straggler
    }

    /// How many plan positions away `key`'s next planned read is, over all jobs (0 while
    /// a job is reading it); `None` when no plan reads it again.
    pub fn next_use(&self, key: &ShardKey) -> Option<usize> {
        if !self.any.load(Relaxed) {
            return None;
        }
        self.jobs().values().filter_map(|plan| plan.next_use(key)).min()
    }

    /// Each job's (job, cursor, positions, lag), in job order.
    pub fn progress(&self) -> Vec<(String, usize, usize, usize)> {
        let mut out: Vec<_> = self
            .jobs()
            .iter()
            .map(|(job, plan)| (job.clone(), plan.cursor, plan.order.len(), plan.lag))
            .collect();
        out.sort();
        out
    }

    /// Whether any job has a plan.
    pub fn any(&self) -> bool {
        self.any.load(Relaxed)
    }

    /// Waits until a plan is set or a cursor moves.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Registers a planned fetch of `key` unless it is running or `limit` are; returns
    /// whether it was registered (the caller then fetches and calls [`Plans::fetched`]).
    pub fn start_fetch(&self, key: &ShardKey, limit: usize) -> Option<bool> {
        let mut fetching = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
        if fetching.len() >= limit {
            return None;
        }
        Some(fetching.insert(key.clone()))
    }

    /// A planned fetch of `key` finished: wakes the follower for the next one.
    pub fn fetched(&self, key: &ShardKey) {
        self.fetching.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        self.changed.notify_one();
    }

    /// Planned fetches running.
    pub fn fetching(&self) -> usize {
        self.fetching.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// What the jobs' plans want in the cache now, nearest first, each shard once with
    /// its size and the job and epoch that read it first: the shards being read (their
    /// planned use has begun and not ended), then those read next. How far ahead is
    /// `window`: the rest of each job's block and its next block ([`PlanWindow::Blocks`]:
    /// a block shuffle reads a block's shards together, so the next block is what must
    /// arrive before the reads reach it), or bytes of shards beyond those in use.
    pub fn upcoming(&self, window: PlanWindow) -> Vec<Upcoming> {
        if !self.any.load(Relaxed) {
            return Vec::new();
        }
        let jobs = self.jobs();
        // (distance, ahead, job, position) of each job's shards in use and ahead.
        let mut near: Vec<(usize, bool, &str, &Planned)> = Vec::new();
        for (job, plan) in jobs.iter() {
            let positions = match window {
                PlanWindow::Blocks => plan.window(),
                PlanWindow::Bytes(ahead) => plan.ahead(ahead),
            };
            near.extend(positions.into_iter().map(|(d, ahead, p)| (d, ahead, job.as_str(), p)));
        }
        near.sort_by_key(|&(distance, ..)| distance);
        let mut seen = std::collections::HashSet::new();
        let mut listed = 0;
        let mut out = Vec::new();
        for (distance, ahead, job, planned) in near {
            if !seen.insert(&planned.key) {
                continue;
            }
            if let PlanWindow::Bytes(ahead) = window
                && distance > 0
            {
                listed += planned.size;
                if listed > ahead {
                    break;
                }
            }
            out.push(Upcoming {
                key: planned.key.clone(),
                size: planned.size,
                job: job.to_owned(),
                epoch: planned.epoch,
                ahead,
            });
        }
        out
    }
}

/// How far ahead of the jobs' reads planned prefetch looks (`--plan-window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanWindow {
    /// The rest of the block being read and the next block, by each plan's `until`s.
    Blocks,
    /// This many bytes of shards beyond those in use; 0 turns planned prefetch off.
    Bytes(u64),
}

impl JobPlan {
    /// The shards in use, then those from the cursor on until `ahead` bytes beyond the
    /// one at the cursor are listed (the one that crosses it included), each with its
    /// distance and whether it is ahead of the one being read.
    fn ahead(&self, ahead: u64) -> Vec<(usize, bool, &Planned)> {
        let mut near = Vec::new();
        let behind = self.cursor.saturating_sub(CURSOR_REACH);
        for position in &self.order[behind..self.cursor.min(self.order.len())] {
            if self.next_use(&position.key) == Some(0) {
                near.push((0, false, position));
            }
        }
        let mut walked = 0;
        for (at, position) in self.order.iter().enumerate().skip(self.cursor) {
            if walked > ahead {
                break;
            }
            // The shard at the cursor is being read: not ahead.
            let distance = at - self.cursor;
            walked += if distance == 0 { 0 } else { position.size };
            near.push((distance, distance > 0, position));
        }
        near
    }
}

/// A shard a job reads next (see [`Plans::upcoming`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upcoming {
    pub key: ShardKey,
    pub size: u64,
    pub job: String,
    pub epoch: u64,
    /// Read after the block being read (the window), not in it.
    pub ahead: bool,
}

/// Eviction order: which of two cached shards to evict first. Shards no plan reads
/// again go first, least recently used first (`last_access`); then planned ones,
/// furthest next use first.
pub fn evict_before(a: (Option<usize>, u64), b: (Option<usize>, u64)) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a.0, b.0) {
        (None, None) => a.1.cmp(&b.1),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => y.cmp(&x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> ShardKey {
        ("ds".into(), format!("s{i}"))
    }

    fn planned(i: u32, first: usize, until: usize) -> Planned {
        Planned { key: key(i), at: Use { first, until }, size: 1, epoch: 0 }
    }

    /// A plan reading `shards` one after another, each 1 byte.
    fn in_order(shards: &[u32]) -> Vec<Planned> {
        shards.iter().enumerate().map(|(at, &i)| planned(i, at, at)).collect()
    }

    /// Misses of `sequence` with a cache of `capacity` shards that evicts by the plan:
    /// the plan is the sequence itself, the cursor moved by each read.
    fn misses_by_plan(sequence: &[u32], capacity: usize) -> usize {
        let plans = Plans::default();
        plans.set("job", in_order(sequence));
        let (mut cached, mut misses) = (Vec::<u32>::new(), 0);
        for &item in sequence {
            plans.read("ds", &format!("s{item}"), None);
            if cached.contains(&item) {
                continue;
            }
            misses += 1;
            if cached.len() == capacity {
                let victim = cached
                    .iter()
                    .copied()
                    .min_by(|&a, &b| {
                        evict_before((plans.next_use(&key(a)), a as u64), (plans.next_use(&key(b)), b as u64))
                    })
                    .unwrap_or_default();
                cached.retain(|&c| c != victim);
            }
            cached.push(item);
        }
        misses
    }

    /// The fewest misses any eviction choice can have (exhaustive search).
    fn misses_optimal(sequence: &[u32], capacity: usize, cached: Vec<u32>) -> usize {
        let Some((&item, rest)) = sequence.split_first() else { return 0 };
        if cached.contains(&item) {
            return misses_optimal(rest, capacity, cached);
        }
        if cached.len() < capacity {
            let mut next = cached;
            next.push(item);
            return 1 + misses_optimal(rest, capacity, next);
        }
        (0..cached.len())
            .map(|evict| {
                let mut next = cached.clone();
                next[evict] = item;
                1 + misses_optimal(rest, capacity, next)
            })
            .min()
            .unwrap_or(0)
    }

    #[test]
    fn evicting_by_the_plan_misses_as_little_as_the_best_choice_can() {
        let mut seed = 17u64;
        for case in 0..60 {
            let (items, len, capacity) = (3 + case % 4, 8 + case % 7, 2 + case % 3);
            let sequence: Vec<u32> = (0..len)
                .map(|_| {
                    seed =
                        seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    ((seed >> 33) % items as u64) as u32
                })
                .collect();
            let optimal = misses_optimal(&sequence, capacity, Vec::new());
            assert_eq!(misses_by_plan(&sequence, capacity), optimal, "{sequence:?} with room for {capacity}");
        }
    }

    #[test]
    fn reshuffled_epochs_keep_a_stable_set_where_lru_keeps_nothing() {
        // Two epochs over 8 shards with room for 4, the second in the same order (the
        // worst case for LRU, which misses all 16): the plan keeps shards 0-2 and 7
        // through the first epoch, so the second misses only 3-6.
        let epoch: Vec<u32> = (0..8).collect();
        let sequence: Vec<u32> = epoch.iter().chain(&epoch).copied().collect();
        assert_eq!(misses_by_plan(&sequence, 4), 8 + 4);
        assert_eq!(misses_optimal(&sequence, 4, Vec::new()), 8 + 4);
    }

    #[test]
    fn cursors_follow_reads_a_little_ahead_and_plans_are_per_job() {
        let plans = Plans::default();
        assert_eq!(plans.next_use(&key(1)), None, "no plan: no next use");
        plans.set("a", in_order(&[0, 1, 2, 3, 1]));
        plans.set("b", in_order(&[3, 2]));
        assert_eq!(plans.next_use(&key(1)), Some(1));
        assert_eq!(plans.next_use(&key(3)), Some(0), "job b reads it first");
        plans.read("ds", "s2", None); // job a reaches position 2, job b position 1
        assert_eq!(plans.next_use(&key(1)), Some(2), "its second read in a's plan");
        assert_eq!(plans.next_use(&key(0)), None, "a read it already, b never will");
        plans.set("a", Vec::new());
        assert_eq!(plans.next_use(&key(1)), None, "withdrawn");
    }

    #[test]
    fn shards_read_together_stay_in_use_until_their_last_read() {
        // A block of three shards read together (each in use until position 2), then
        // shard 3 alone; the next epoch reads 0 first.
        let plans = Plans::default();
        plans.set(
            "job",
            vec![planned(0, 0, 2), planned(1, 1, 2), planned(2, 2, 2), planned(3, 3, 3), planned(0, 4, 4)],
        );
        plans.read("ds", "s0", None);
        plans.read("ds", "s2", None); // the cursor reaches the block's last shard
        for i in 0..3 {
            assert_eq!(plans.next_use(&key(i)), Some(0), "shard {i} is still being read");
        }
        plans.read("ds", "s0", None); // a read inside its use does not move the cursor
        assert_eq!(plans.next_use(&key(3)), Some(1));
        let names = |listed: Vec<Upcoming>| listed.into_iter().map(|u| u.key.1).collect::<Vec<_>>();
        assert_eq!(
            names(plans.upcoming(PlanWindow::Bytes(10))),
            ["s0", "s1", "s2", "s3"],
            "in use, then ahead"
        );
        assert_eq!(
            names(plans.upcoming(PlanWindow::Bytes(0))),
            ["s0", "s1", "s2"],
            "what is being read, always"
        );
        assert_eq!(
            names(plans.upcoming(PlanWindow::Blocks)),
            ["s0", "s1", "s2", "s3"],
            "shard 3 is the next block"
        );
        plans.read("ds", "s3", None);
        assert_eq!(plans.next_use(&key(0)), Some(1), "the block is done: shard 0's next use is next epoch");
        assert_eq!(plans.next_use(&key(1)), None);
    }

    #[test]
    fn the_window_is_the_block_being_read_and_the_next_one() {
        // Blocks of three shards (each in use until the block's last position), then
        // blocks of two.
        let plans = Plans::default();
        let blocks = [(0, 2), (1, 2), (2, 2), (3, 4), (4, 4), (5, 6), (6, 6)];
        plans.set("job", blocks.iter().map(|&(i, until)| planned(i, i as usize, until)).collect());
        let names = |listed: Vec<Upcoming>| listed.into_iter().map(|u| u.key.1).collect::<Vec<_>>();
        assert_eq!(names(plans.upcoming(PlanWindow::Blocks)), ["s0", "s1", "s2", "s3", "s4"]);
        plans.read("ds", "s1", None);
        assert_eq!(
            names(plans.upcoming(PlanWindow::Blocks)),
            ["s0", "s1", "s2", "s3", "s4"],
            "still in block 1"
        );
        plans.read("ds", "s3", None);
        assert_eq!(
            names(plans.upcoming(PlanWindow::Blocks)),
            ["s3", "s4", "s5", "s6"],
            "block 1 is done: the window moved on by a block"
        );
        // Without `until`s each shard is its own block: the one being read and the next.
        plans.set("job", in_order(&[7, 8, 9]));
        plans.read("ds", "s7", None);
        assert_eq!(names(plans.upcoming(PlanWindow::Blocks)), ["s7", "s8"]);
    }

    #[test]
    fn a_plan_changed_mid_epoch_is_followed() {
        let plans = Plans::default();
        plans.set("job", in_order(&[0, 1, 2, 3]));
        plans.read("ds", "s0", None);
        plans.read("ds", "s1", None);
        assert_eq!(plans.next_use(&key(3)), Some(2));
        // The job resumes with another order for the rest of its epoch (say, after a
        // restart with a new world size): the new plan replaces the old, cursor and all.
        plans.set("job", in_order(&[3, 2]));
        assert_eq!(plans.next_use(&key(3)), Some(0));
        assert_eq!(plans.next_use(&key(2)), Some(1));
        assert_eq!(plans.next_use(&key(1)), None, "not in the new plan");
        plans.read("ds", "s2", None);
        assert_eq!(plans.next_use(&key(3)), None, "read before the cursor's position, done");
    }

    #[test]
    fn stragglers_are_told_apart_and_do_not_move_the_cursor() {
        // Two epochs of 8 shards, the second in the same order (from position 8); each
        // shard read whole, its own block.
        let plans = Plans::default();
        let mut order = in_order(&[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7]);
        for planned in &mut order[8..] {
            planned.epoch = 1;
        }
        plans.set("job/rank0/worker1", order);
        assert!(!plans.read("ds", "s4", Some("job")), "the reads move the cursor");
        assert_eq!(plans.next_use(&key(3)), Some(7), "shard 3 is done");
        // A slower reader still reads shard 3 (the block before the cursor's): a
        // straggler's read, to its own job; the cursor stays.
        assert!(plans.read("ds", "s3", Some("job")), "a straggler's");
        assert!(!plans.read("ds", "s3", Some("other")), "another job's plan says nothing of it");
        assert!(!plans.read("ds", "s3", None), "nor of an untagged read");
        assert_eq!(plans.next_use(&key(5)), Some(1), "the cursor stayed");
        assert_eq!(
            plans.next_use(&key(3)),
            Some(7),
            "and the shard stays done: its room is for what comes next"
        );
        assert_eq!(plans.progress()[0].3, 1, "how far behind stragglers read is reported");
        // Further behind: out of order, not a straggler's; and not the next epoch's start
        // while this epoch has blocks to go.
        assert!(!plans.read("ds", "s1", Some("job")));
        assert_eq!(plans.next_use(&key(5)), Some(1), "the cursor stayed");
        // From the epoch's last block, a read of the next epoch's first shard moves on.
        plans.read("ds", "s7", Some("job"));
        assert!(!plans.read("ds", "s0", Some("job")));
        assert_eq!(plans.next_use(&key(1)), Some(1), "the cursor is at the next epoch's start");
    }
}
