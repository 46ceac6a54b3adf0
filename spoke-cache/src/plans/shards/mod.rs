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
        atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed},
    },
};

use tokio::sync::Notify;

use self::{
    job_plan::{JobPlan, Seen},
    table::ShardTable,
};
use crate::{policy::window::PlanWindow, store::entry::ShardKey};

mod job_plan;
mod new_plan;
mod table;

pub use self::{
    job_plan::CURSOR_REACH,
    new_plan::{NewPlan, Planned, Use},
};

/// A plan is followed whole shard by whole shard while its largest block takes at most
/// this share of the room below the low watermark (the block being read, and the next
/// fetched beside it); past it, sample by sample (`samples/`): whole shards of a block
/// larger than that are evicted before they are read (2.2-3x the dataset an epoch over
/// the link, issue 47's measurement).
pub const SHARD_BLOCK_SHARE: f64 = 2.0 / 3.0;

/// Most positions one plan may have (two epochs of a large dataset: the seed's C4 at 64
/// MiB shards is ~12k shards an epoch). Positions are counted in 32 bits.
pub const MAX_PLAN_POSITIONS: usize = 1 << 20;

/// A plan's owner and name: (principal, job). Each principal names its jobs in its own
/// namespace, so no principal can replace, withdraw or see another's plan.
pub type PlanKey = (String, String);

/// How many plans, and plan positions, the spoke keeps: per principal (one tenant cannot
/// take the room of the others) and in all (a position costs 8 to ~16 bytes of memory:
/// `job.rs`).
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
    /// Followed sample by sample.
    pub samples: bool,
}

#[derive(Debug, Default)]
struct Book {
    /// Every shard the plans name.
    table: ShardTable,
    /// ShardPlans by id (`None`: an id free to take again), and ids by owner.
    plans: Vec<Option<(PlanKey, JobPlan)>>,
    ids: HashMap<PlanKey, u32>,
    free: Vec<u32>,
    /// The plans that name each shard (by table id): a read or an eviction looks at those
    /// only, not at every plan.
    by_shard: Vec<Vec<u32>>,
}

impl Book {
    fn plan(&self, id: u32) -> Option<&(PlanKey, JobPlan)> {
        self.plans.get(id as usize)?.as_ref()
    }

    fn live(&self) -> impl Iterator<Item = &(PlanKey, JobPlan)> {
        self.plans.iter().flatten()
    }

    fn remove(&mut self, owner: &PlanKey) -> Option<JobPlan> {
        let id = self.ids.remove(owner)?;
        let (_, plan) = self.plans.get_mut(id as usize)?.take()?;
        for shard in plan.distinct() {
            if let Some(plans) = self.by_shard.get_mut(shard as usize) {
                plans.retain(|&p| p != id);
            }
            self.table.release(shard);
        }
        self.free.push(id);
        Some(plan)
    }

    fn insert(
        &mut self,
        owner: PlanKey,
        new: NewPlan,
        (lag, room): (usize, u64),
        opened: bool,
    ) -> (usize, bool) {
        let NewPlan { shards, positions, until, epochs } = new;
        let ids: Vec<u32> = shards.into_iter().map(|(key, size)| self.table.intern(key, size)).collect();
        let distinct = ids.len();
        let mut plan = JobPlan::new((positions, until, epochs), &ids, lag);
        plan.opened = opened;
        plan.samples =
            plan.largest_block(|shard| self.table.size(shard)) as f64 > room as f64 * SHARD_BLOCK_SHARE;
        let samples = plan.samples;
        let id = self.free.pop().unwrap_or(self.plans.len() as u32);
        if self.by_shard.len() < self.table.len() {
            self.by_shard.resize_with(self.table.len(), Vec::new);
        }
        for &shard in &ids {
            self.by_shard[shard as usize].push(id);
        }
        match self.plans.get_mut(id as usize) {
            Some(free) => *free = Some((owner.clone(), plan)),
            None => self.plans.push(Some((owner.clone(), plan))),
        }
        self.ids.insert(owner, id);
        (distinct, samples)
    }

    /// Plans whose window is not open yet.
    fn unopened(&self) -> usize {
        self.live().filter(|(_, plan)| !plan.opened).count()
    }

    /// The plans that name `key`, by id.
    fn naming(&self, key: &ShardKey) -> &[u32] {
        self.table.id(key).and_then(|id| self.by_shard.get(id as usize)).map_or(&[], Vec::as_slice)
    }

    /// Drops the plans idle for `expiry` or longer.
    fn expire(&mut self, expiry: std::time::Duration) {
        let idle: Vec<PlanKey> = self
            .live()
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
        let others = self.live().filter(|(key, _)| key != owner);
        let (mut plans, mut all_positions, mut mine, mut my_positions) = (1, positions, 1, positions);
        for (key, plan) in others {
            plans += 1;
            all_positions += plan.len();
            if key.0 == owner.0 {
                mine += 1;
                my_positions += plan.len();
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
pub struct ShardPlans {
    book: Mutex<Book>,
    limits: PlanLimits,
    /// Any plan at all: reads skip the lock while there is none.
    any: AtomicBool,
    /// Plans whose window no answered read has opened yet: answers skip the lock while
    /// there is none.
    unopened: AtomicUsize,
    /// A plan was set or a cursor moved: what to prefetch may have changed.
    changed: Notify,
    /// Shards being fetched because a plan reads them next (`plans/prefetch.rs`).
    fetching: Mutex<HashSet<ShardKey>>,
}

impl ShardPlans {
    pub fn new(limits: PlanLimits) -> Self {
        Self { limits, ..Self::default() }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `principal`'s plan for `job` (`plan`: each position, in order) in a cache with
    /// `room` bytes below its low watermark; an empty one withdraws it. Returns the
    /// distinct shards it names and whether it is followed sample by sample (its largest
    /// block over [`SHARD_BLOCK_SHARE`] of the room), or the bound it would cross.
    pub fn set(
        &self,
        principal: &str,
        job: &str,
        plan: impl Into<NewPlan>,
        room: u64,
    ) -> Result<(usize, bool), PlanRefused> {
        let plan = plan.into();
        let owner = (principal.to_owned(), job.to_owned());
        let mut book = self.book();
        book.expire(self.limits.idle_expiry);
        let set = if plan.is_empty() {
            book.remove(&owner);
            (0, false)
        } else {
            book.check(&owner, plan.len(), &self.limits)?;
            let (lag, opened) = book.remove(&owner).map_or((0, false), |old| (old.lag, old.opened));
            book.insert(owner, plan, (lag, room), opened)
        };
        self.any.store(!book.ids.is_empty(), Relaxed);
        self.unopened.store(book.unopened(), Relaxed);
        drop(book);
        self.changed.notify_one();
        Ok(set)
    }

    /// Refuses, before any work, a plan of `positions` for `principal`'s `job` that
    /// [`ShardPlans::set`] would refuse.
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
        let Some(id) = book.table.id(&key) else { return false };
        let naming = book.naming(&key).to_vec();
        for plan_id in naming {
            let Some((owner, plan)) = book.plans.get_mut(plan_id as usize).and_then(Option::as_mut) else {
                continue;
            };
            plan.touched = std::time::Instant::now();
            // A plan followed sample by sample keeps no shard's room: no read of it is a
            // straggler's to it.
            match plan.read(id) {
                Seen::Straggler if plan.samples => {}
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

    /// Reads of `shards` were answered: the plans that name one open their windows (the
    /// follower fetches them from now on: `JobPlan::opened`).
    pub fn answered<'a>(&self, shards: impl IntoIterator<Item = (&'a str, &'a str)>) {
        if !self.any.load(Relaxed) || self.unopened.load(Relaxed) == 0 {
            return;
        }
        let mut book = self.book();
        let mut opened = false;
        for (dataset, shard) in shards {
            let naming = book.naming(&(dataset.to_owned(), shard.to_owned())).to_vec();
            for id in naming {
                if let Some((_, plan)) = book.plans.get_mut(id as usize).and_then(Option::as_mut)
                    && !plan.opened
                {
                    plan.opened = true;
                    opened = true;
                }
            }
        }
        self.unopened.store(book.unopened(), Relaxed);
        drop(book);
        if opened {
            self.changed.notify_one();
        }
    }

    /// How many plan positions away `key`'s next planned read is, over all plans that
    /// name it and are followed shard by shard (0 while a job is reading it); `None` when
    /// no such plan reads it again (a plan followed sample by sample says what it reads
    /// again sample by sample: `samples/`).
    pub fn next_use(&self, key: &ShardKey) -> Option<usize> {
        if !self.any.load(Relaxed) {
            return None;
        }
        let book = self.book();
        let id = book.table.id(key)?;
        book.naming(key)
            .iter()
            .filter_map(|&p| book.plan(p).filter(|(_, plan)| !plan.samples)?.1.next_use(id))
            .min()
    }

    /// Drops the plans no read has met for `--plan-idle-expiry` (the evictor's pass and
    /// every `SetPlan` and `Status` call this).
    pub fn expire(&self) {
        let mut book = self.book();
        book.expire(self.limits.idle_expiry);
        self.any.store(!book.ids.is_empty(), Relaxed);
    }

    /// Each plan's progress, in (principal, job) order.
    pub fn progress(&self) -> Vec<Progress> {
        self.expire();
        let mut out: Vec<_> = self
            .book()
            .live()
            .map(|((principal, job), plan)| Progress {
                principal: principal.clone(),
                job: job.clone(),
                cursor: plan.cursor,
                positions: plan.len(),
                lag: plan.lag,
                samples: plan.samples,
            })
            .collect();
        out.sort();
        out
    }

    /// Bytes of memory the plans' positions hold (their arrays), for `plan-memory-bench`.
    pub fn positions_memory(&self) -> usize {
        self.book().live().map(|(_, plan)| plan.memory()).sum()
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
    /// whether it was registered (the caller then fetches and calls [`ShardPlans::fetched`]).
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
        let mut near: Vec<(usize, bool, &(PlanKey, JobPlan), usize)> = Vec::new();
        for entry in book.live().filter(|(_, plan)| !plan.samples && plan.opened) {
            let plan = &entry.1;
            let positions = match window {
                PlanWindow::Blocks => plan.window(),
                PlanWindow::Bytes(ahead) => plan.ahead(ahead, |shard| book.table.size(shard)),
            };
            near.extend(positions.into_iter().map(|(d, ahead, at)| (d, ahead, entry, at)));
        }
        near.sort_by_key(|&(distance, ..)| distance);
        let mut seen = std::collections::HashSet::new();
        let mut listed = 0;
        let mut out = Vec::new();
        for (distance, ahead, ((principal, job), plan), at) in near {
            let shard = plan.shard_at(at);
            if !seen.insert(shard) {
                continue;
            }
            let size = book.table.size(shard);
            if let PlanWindow::Bytes(ahead) = window
                && distance > 0
            {
                listed += size;
                if listed > ahead {
                    break;
                }
            }
            let Some(key) = book.table.key(shard) else { continue };
            out.push(Upcoming {
                key: key.clone(),
                size,
                principal: principal.clone(),
                job: job.clone(),
                epoch: plan.epoch_at(at),
                ahead,
            });
        }
        out
    }
}

/// A shard a job reads next (see [`ShardPlans::upcoming`]).
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

#[cfg(test)]
mod tests;
