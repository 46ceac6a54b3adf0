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
    /// When the plan was set or a read last met it: a plan idle for
    /// [`PlanLimits::idle_expiry`] is a finished job's, and is dropped.
    touched: std::time::Instant,
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
        Self { uses, order, block_of, block_ends, cursor: 0, lag, touched: std::time::Instant::now() }
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

/// A plan's owner and name: (principal, job). Each principal names its jobs in its own
/// namespace, so no principal can replace, withdraw or see another's plan.
pub type PlanKey = (String, String);

/// How many plans, and plan positions, the spoke keeps: per principal (one tenant cannot
/// take the room of the others) and in all (a position costs ~150 bytes of memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanLimits {
    pub plans_per_principal: usize,
    pub positions_per_principal: usize,
    pub plans: usize,
    pub positions: usize,
    /// A plan no read has met for this long is dropped (`--plan-idle-expiry`): its job
    /// has finished or moved on, and its positions hold room in the bounds above.
    pub idle_expiry: std::time::Duration,
}

impl Default for PlanLimits {
    fn default() -> Self {
        Self {
            plans_per_principal: 256,
            positions_per_principal: 1 << 22,
            plans: 1024,
            positions: 1 << 23,
            idle_expiry: std::time::Duration::from_secs(3600),
        }
    }
}

/// Why a plan was refused: the bound it would cross (RESOURCE_EXHAUSTED).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} would be {would}, over {flag} ({limit}); withdraw the plans of finished jobs (a SetPlan with no \
     epochs) or send the current and next epoch only"
)]
pub struct PlanRefused {
    pub what: String,
    pub would: usize,
    pub flag: &'static str,
    pub limit: usize,
}

/// One plan's progress (`Status.plans`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Progress {
    pub principal: String,
    pub job: String,
    pub cursor: usize,
    pub positions: usize,
    pub lag: usize,
}

#[derive(Debug, Default)]
struct Book {
    plans: HashMap<PlanKey, JobPlan>,
    /// The plans that name each shard: a read or an eviction looks at those only, not
    /// at every plan.
    by_shard: HashMap<ShardKey, Vec<PlanKey>>,
}

impl Book {
    fn remove(&mut self, owner: &PlanKey) -> Option<JobPlan> {
        let plan = self.plans.remove(owner)?;
        for key in plan.uses.keys() {
            if let Some(owners) = self.by_shard.get_mut(key) {
                owners.retain(|o| o != owner);
                if owners.is_empty() {
                    self.by_shard.remove(key);
                }
            }
        }
        Some(plan)
    }

    fn insert(&mut self, owner: PlanKey, plan: JobPlan) {
        for key in plan.uses.keys() {
            self.by_shard.entry(key.clone()).or_default().push(owner.clone());
        }
        self.plans.insert(owner, plan);
    }

    /// Drops the plans idle for `expiry` or longer.
    fn expire(&mut self, expiry: std::time::Duration) {
        let idle: Vec<PlanKey> = self
            .plans
            .iter()
            .filter(|(_, plan)| plan.touched.elapsed() >= expiry)
            .map(|(k, _)| k.clone())
            .collect();
        for owner in idle {
            tracing::info!(
                principal = owner.0,
                job = owner.1,
                "access plan expired (no read met it for --plan-idle-expiry)"
            );
            self.remove(&owner);
        }
    }

    /// Refuses a plan of `positions` for `owner` that would cross a bound of `limits`
    /// (the plan it replaces does not count).
    fn check(&self, owner: &PlanKey, positions: usize, limits: &PlanLimits) -> Result<(), PlanRefused> {
        let others = self.plans.iter().filter(|(key, _)| *key != owner);
        let (mut plans, mut all_positions, mut mine, mut my_positions) = (1, positions, 1, positions);
        for (key, plan) in others {
            plans += 1;
            all_positions += plan.order.len();
            if key.0 == owner.0 {
                mine += 1;
                my_positions += plan.order.len();
            }
        }
        let who = |what: &str| format!("{what} of principal {:?}", owner.0);
        let bounds = [
            (who("the plans"), mine, "--max-plans-per-principal", limits.plans_per_principal),
            (
                who("the plan positions"),
                my_positions,
                "--max-plan-positions-per-principal",
                limits.positions_per_principal,
            ),
            ("the plans of this spoke".to_owned(), plans, "--max-plans", limits.plans),
            (
                "the plan positions of this spoke".to_owned(),
                all_positions,
                "--max-plan-positions",
                limits.positions,
            ),
        ];
        match bounds.into_iter().find(|(_, would, _, limit)| would > limit) {
            Some((what, would, flag, limit)) => Err(PlanRefused { what, would, flag, limit }),
            None => Ok(()),
        }
    }
}

/// The plans of the jobs reading through this cache.
#[derive(Debug, Default)]
pub struct Plans {
    book: Mutex<Book>,
    limits: PlanLimits,
    /// Any plan at all: reads skip the lock while there is none.
    any: AtomicBool,
    /// A plan was set or a cursor moved: what to prefetch may have changed.
    changed: Notify,
    /// Shards being fetched because a plan reads them next (`plan_fetch.rs`).
    fetching: Mutex<HashSet<ShardKey>>,
}

impl Plans {
    pub fn new(limits: PlanLimits) -> Self {
        Self { limits, ..Self::default() }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `principal`'s plan for `job` (`order`: each position, in order); an empty
    /// order withdraws it. Returns the distinct shards it names, or the bound it would
    /// cross.
    pub fn set(&self, principal: &str, job: &str, order: Vec<Planned>) -> Result<usize, PlanRefused> {
        let owner = (principal.to_owned(), job.to_owned());
        let mut book = self.book();
        book.expire(self.limits.idle_expiry);
        let distinct = if order.is_empty() {
            book.remove(&owner);
            0
        } else {
            book.check(&owner, order.len(), &self.limits)?;
            let lag = book.remove(&owner).map_or(0, |old| old.lag);
            let plan = JobPlan::new(order, lag);
            let distinct = plan.uses.len();
            book.insert(owner, plan);
            distinct
        };
        self.any.store(!book.plans.is_empty(), Relaxed);
        drop(book);
        self.changed.notify_one();
        Ok(distinct)
    }

    /// Refuses, before any work, a plan of `positions` for `principal`'s `job` that
    /// [`Plans::set`] would refuse.
    pub fn admits(&self, principal: &str, job: &str, positions: usize) -> Result<(), PlanRefused> {
        let owner = (principal.to_owned(), job.to_owned());
        if positions == 0 {
            return Ok(());
        }
        self.book().check(&owner, positions, &self.limits)
    }

    /// `principal` read `dataset/shard` for `job` (the read's job header): plans that
    /// name the shard a little ahead move their cursors there. Returns whether the read
    /// is a straggler's to the reader's own plans (`JOB` or `JOB/...` of the same
    /// principal): the shard's use in them has just ended.
    pub fn read(&self, dataset: &str, shard: &str, principal: &str, job: Option<&str>) -> bool {
        if !self.any.load(Relaxed) {
            return false;
        }
        let key = (dataset.to_owned(), shard.to_owned());
        let (mut moved, mut straggler) = (false, false);
        let mut book = self.book();
        let Book { plans, by_shard } = &mut *book;
        for owner in by_shard.get(&key).into_iter().flatten() {
            let Some(plan) = plans.get_mut(owner) else { continue };
            plan.touched = std::time::Instant::now();
            match plan.read(&key) {
                Seen::Moved => moved = true,
                Seen::Straggler => {
                    straggler |=
                        owner.0 == principal && job.is_some_and(|job| owner.1.split('/').next() == Some(job))
                }
                Seen::Other => {}
            }
        }
        drop(book);
        if moved {
            self.changed.notify_one();
        }
        straggler
    }

    /// How many plan positions away `key`'s next planned read is, over all plans that
    /// name it (0 while a job is reading it); `None` when no plan reads it again.
    pub fn next_use(&self, key: &ShardKey) -> Option<usize> {
        if !self.any.load(Relaxed) {
            return None;
        }
        let book = self.book();
        let owners = book.by_shard.get(key)?;
        owners.iter().filter_map(|owner| book.plans.get(owner)?.next_use(key)).min()
    }

    /// Drops the plans no read has met for `--plan-idle-expiry` (the evictor's pass and
    /// every `SetPlan` and `Status` call this).
    pub fn expire(&self) {
        let mut book = self.book();
        book.expire(self.limits.idle_expiry);
        self.any.store(!book.plans.is_empty(), Relaxed);
    }

    /// Each plan's progress, in (principal, job) order.
    pub fn progress(&self) -> Vec<Progress> {
        self.expire();
        let mut out: Vec<_> = self
            .book()
            .plans
            .iter()
            .map(|((principal, job), plan)| Progress {
                principal: principal.clone(),
                job: job.clone(),
                cursor: plan.cursor,
                positions: plan.order.len(),
                lag: plan.lag,
            })
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
        let book = self.book();
        // (distance, ahead, plan, position) of each plan's shards in use and ahead.
        let mut near: Vec<(usize, bool, &PlanKey, &Planned)> = Vec::new();
        for (owner, plan) in book.plans.iter() {
            let positions = match window {
                PlanWindow::Blocks => plan.window(),
                PlanWindow::Bytes(ahead) => plan.ahead(ahead),
            };
            near.extend(positions.into_iter().map(|(d, ahead, p)| (d, ahead, owner, p)));
        }
        near.sort_by_key(|&(distance, ..)| distance);
        let mut seen = std::collections::HashSet::new();
        let mut listed = 0;
        let mut out = Vec::new();
        for (distance, ahead, (principal, job), planned) in near {
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
                principal: principal.clone(),
                job: job.clone(),
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
    /// The plan's owner and job: its fetches count in their row.
    pub principal: String,
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
mod tests;
