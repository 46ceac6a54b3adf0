//! Plans followed sample by sample: the jobs whose order a cache of shards cannot serve
//! (a uniform shuffle, a map-style sampler, blocks of shards larger than the cache) send
//! their next reads as byte ranges (`PlanSamples`), a rolling window ahead of their
//! reads, each with the position of the sample's next read. The spoke then
//! (`plans/follow.rs`) fetches the nearest of them ahead of the reads in batches of ranges (many
//! shards a call, several calls in flight: the link's bandwidth-delay product), holds
//! them until read ([`staged`]), and keeps for later epochs what the plan says is read
//! again (`policy::keep`, `store/kept/`). The link carries each sample as read, once, and
//! nothing else: never a whole chunk or shard for a sample.
//!
//! Here: each job's window of planned reads, by position (the SDK's epoch positions,
//! counted across epochs), found again by what they read when a read comes; bounded per
//! job, per principal and in all.

pub mod staged;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use tokio::sync::Notify;

use crate::{plans::shards::PlanKey, store::entry::ShardKey};

/// Planned reads a job's window holds at most: the furthest go first. 2^17 samples of 16
/// KiB are 2 GiB ahead, far more than any window fetches (`policy::window::samples_bound`),
/// at 233 bytes each in memory as measured (29 MiB a job at the bound; `plan-memory-bench`
/// in BENCHMARKS.md). The SDK sends twice the spoke's `window_bytes` ahead, far fewer.
pub const MAX_PLANNED_PER_JOB: usize = 1 << 17;
/// Jobs following samples, per principal and in all.
pub const MAX_JOBS_PER_PRINCIPAL: usize = 64;
pub const MAX_JOBS: usize = 256;
/// A window no read or plan has met for this long is dropped (its job ended).
pub const IDLE_EXPIRY: Duration = Duration::from_secs(600);

/// One planned read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedRead {
    /// Its sample's position (the pieces of one sample share it).
    pub position: u64,
    /// Index into the request's shard table.
    pub shard: u32,
    pub offset: u64,
    pub length: u64,
    /// Position of the sample's next read; `None`: not planned.
    pub next_use: Option<u64>,
}

/// A planned read the follower may fetch now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub job: PlanKey,
    pub epoch: u64,
    /// Its place in the window (`Place`).
    pub place: (u64, u32, u64),
    pub shard: ShardKey,
    pub offset: u64,
    pub length: u64,
}

/// What a read was to its job's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matched {
    /// Not a planned read of a job that follows samples.
    Unplanned,
    /// A planned read: its sample's next read, if planned.
    Planned { next_use: Option<u64> },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    shard: u32,
    offset: u64,
    length: u64,
    next_use: Option<u64>,
    /// Handed to the follower (fetching, held or found stored).
    due: bool,
}

/// A planned read's place in its window: its position (a sample's pieces share it: a
/// WebDataset sample's fields, a window of tokens across two shards), its shard id and
/// offset.
type Place = (u64, u32, u64);

/// One job's window.
#[derive(Debug)]
struct Window {
    /// Shards by id, and ids by shard.
    shards: Vec<ShardKey>,
    ids: HashMap<ShardKey, u32>,
    /// Planned reads not yet read, by place.
    upcoming: BTreeMap<Place, Entry>,
    /// Places by what they read: (shard id, offset, length).
    by_range: HashMap<(u32, u64, u64), Place>,
    epoch_samples: u64,
    touched: Instant,
}

impl Window {
    fn new(epoch_samples: u64) -> Self {
        Self {
            shards: Vec::new(),
            ids: HashMap::new(),
            upcoming: BTreeMap::new(),
            by_range: HashMap::new(),
            epoch_samples: epoch_samples.max(1),
            touched: Instant::now(),
        }
    }

    fn intern(&mut self, key: &ShardKey) -> u32 {
        if let Some(&id) = self.ids.get(key) {
            return id;
        }
        let id = self.shards.len() as u32;
        self.shards.push(key.clone());
        self.ids.insert(key.clone(), id);
        id
    }

    fn remove(&mut self, place: Place) -> Option<Entry> {
        let entry = self.upcoming.remove(&place)?;
        if self.by_range.get(&(entry.shard, entry.offset, entry.length)) == Some(&place) {
            self.by_range.remove(&(entry.shard, entry.offset, entry.length));
        }
        Some(entry)
    }

    /// Drops the furthest reads past `MAX_PLANNED_PER_JOB`.
    fn trim(&mut self) {
        while self.upcoming.len() > MAX_PLANNED_PER_JOB {
            let Some((&last, _)) = self.upcoming.last_key_value() else { break };
            self.remove(last);
        }
    }
}

/// Why sample plans were refused: the bound they would cross (RESOURCE_EXHAUSTED).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} would be {would}, over the limit of {limit}; let finished jobs' windows expire (10 minutes idle)"
)]
pub struct SamplesRefused {
    pub what: String,
    pub would: usize,
    pub limit: usize,
}

/// The windows of the jobs that follow samples.
#[derive(Debug, Default)]
pub struct SamplePlans {
    jobs: Mutex<HashMap<PlanKey, Window>>,
    /// Any window at all: reads skip the lock while there is none.
    any: AtomicBool,
    /// Reads were planned or taken: what to fetch may have changed.
    changed: Notify,
}

pub use crate::observe::job_counters::job_of;

impl SamplePlans {
    fn jobs(&self) -> MutexGuard<'_, HashMap<PlanKey, Window>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `reads` (naming `table`'s shards) to the window of `principal`'s job `job`
    /// (its part before the first '/'), of `epoch_samples` samples an epoch; returns the
    /// reads it holds now.
    pub fn add(
        &self,
        (principal, job): (&str, &str),
        epoch_samples: u64,
        table: &[ShardKey],
        reads: &[PlannedRead],
    ) -> Result<usize, SamplesRefused> {
        let key = (principal.to_owned(), job_of(job).to_owned());
        let mut jobs = self.jobs();
        jobs.retain(|_, w| w.touched.elapsed() < IDLE_EXPIRY);
        if !jobs.contains_key(&key) {
            let mine = jobs.keys().filter(|(p, _)| p == principal).count() + 1;
            if mine > MAX_JOBS_PER_PRINCIPAL {
                let what = format!("the jobs following samples of principal {principal:?}");
                return Err(SamplesRefused { what, would: mine, limit: MAX_JOBS_PER_PRINCIPAL });
            }
            if jobs.len() + 1 > MAX_JOBS {
                let what = "the jobs following samples on this spoke".to_owned();
                return Err(SamplesRefused { what, would: jobs.len() + 1, limit: MAX_JOBS });
            }
        }
        let window = jobs.entry(key).or_insert_with(|| Window::new(epoch_samples));
        window.touched = Instant::now();
        window.epoch_samples = epoch_samples.max(1);
        let ids: Vec<u32> = table.iter().map(|shard| window.intern(shard)).collect();
        for read in reads {
            let Some(&shard) = ids.get(read.shard as usize) else { continue };
            let (range, place) = ((shard, read.offset, read.length), (read.position, shard, read.offset));
            let entry = Entry {
                shard,
                offset: read.offset,
                length: read.length,
                next_use: read.next_use,
                due: false,
            };
            // Sent again (windows overlap): its state stays.
            if window.upcoming.contains_key(&place) {
                continue;
            }
            window.upcoming.insert(place, entry);
            window.by_range.insert(range, place);
        }
        window.trim();
        let planned = window.upcoming.len();
        self.any.store(true, Relaxed);
        drop(jobs);
        self.changed.notify_one();
        Ok(planned)
    }

    /// Whether `principal`'s job `job` follows samples (its misses are fetched as read,
    /// never as whole chunks: the room is its window's and its keeps').
    pub fn follows(&self, principal: &str, job: Option<&str>) -> bool {
        if !self.any.load(Relaxed) {
            return false;
        }
        let Some(job) = job else { return false };
        self.jobs().contains_key(&(principal.to_owned(), job_of(job).to_owned()))
    }

    /// A read of `[offset, offset + length)` of `shard` by `principal`'s job `job`: taken
    /// out of its window (the earliest planned read of that range), with what the plan says
    /// of the sample's next read.
    pub fn read(
        &self,
        principal: &str,
        job: Option<&str>,
        shard: &ShardKey,
        offset: u64,
        length: u64,
    ) -> Matched {
        self.reads(principal, job, [(shard, offset, length)]).pop().unwrap_or(Matched::Unplanned)
    }

    /// [`SamplePlans::read`] for each of `reads` (`(shard, offset, length)`), as one
    /// call's reads begin: taken out of the window before they are fetched, so that the
    /// follower does not fetch them again beside them.
    pub fn reads<'a>(
        &self,
        principal: &str,
        job: Option<&str>,
        reads: impl IntoIterator<Item = (&'a ShardKey, u64, u64)>,
    ) -> Vec<Matched> {
        let reads = reads.into_iter();
        let (Some(job), true) = (job, self.any.load(Relaxed)) else {
            return reads.map(|_| Matched::Unplanned).collect();
        };
        let mut jobs = self.jobs();
        let Some(window) = jobs.get_mut(&(principal.to_owned(), job_of(job).to_owned())) else {
            return reads.map(|_| Matched::Unplanned).collect();
        };
        window.touched = Instant::now();
        let matched = reads
            .map(|(shard, offset, length)| {
                let place =
                    window.ids.get(shard).and_then(|&id| window.by_range.get(&(id, offset, length)).copied());
                match place.and_then(|place| window.remove(place)) {
                    Some(entry) => Matched::Planned { next_use: entry.next_use },
                    None => Matched::Unplanned,
                }
            })
            .collect();
        drop(jobs);
        self.changed.notify_one();
        matched
    }

    /// The nearest planned reads no one has taken yet, up to `budget` bytes, each job's
    /// in turn, of shards `mine` says this spoke fetches: handed to the follower (marked
    /// due, so they are not handed again).
    pub fn due(&self, budget: u64, mine: impl Fn(&ShardKey) -> bool) -> Vec<Due> {
        if !self.any.load(Relaxed) {
            return Vec::new();
        }
        let mut jobs = self.jobs();
        // Each job's not-yet-due reads, nearest first.
        let mut queues: Vec<(PlanKey, std::collections::VecDeque<Place>)> = jobs
            .iter()
            .map(|(key, w)| {
                let next = w.upcoming.iter().filter(|(_, e)| !e.due).map(|(&p, _)| p).take(4096).collect();
                (key.clone(), next)
            })
            .collect();
        let mut out = Vec::new();
        let mut left = budget;
        let mut turn = 0;
        while left > 0 && queues.iter().any(|(_, q)| !q.is_empty()) {
            let at = turn % queues.len();
            turn += 1;
            let (key, queue) = &mut queues[at];
            if queue.is_empty() {
                continue;
            }
            let Some(place) = queue.pop_front() else { continue };
            let Some(window) = jobs.get_mut(key) else { continue };
            let epoch = place.0 / window.epoch_samples;
            let Some(entry) = window.upcoming.get_mut(&place) else { continue };
            entry.due = true;
            let shard = window.shards[entry.shard as usize].clone();
            if !mine(&shard) {
                continue;
            }
            if entry.length > left && !out.is_empty() {
                entry.due = false;
                break;
            }
            left = left.saturating_sub(entry.length);
            out.push(Due {
                job: key.clone(),
                epoch,
                place,
                shard,
                offset: entry.offset,
                length: entry.length,
            });
        }
        out
    }

    /// Whether `due` is still planned (no read has taken it since it was handed out).
    pub fn still_planned(&self, due: &Due) -> bool {
        self.jobs().get(&due.job).is_some_and(|w| w.upcoming.contains_key(&due.place))
    }

    /// A due read could not be fetched ahead: it may be handed again.
    pub fn not_fetched(&self, due: &Due) {
        if let Some(entry) = self.jobs().get_mut(&due.job).and_then(|w| w.upcoming.get_mut(&due.place)) {
            entry.due = false;
        }
    }

    /// Wakes the follower (a fetch ahead ended: room in the window).
    pub fn wake(&self) {
        self.changed.notify_one();
    }

    /// Waits until reads are planned or taken.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Per job following samples: (principal, job, reads planned and not yet read).
    pub fn progress(&self) -> Vec<(String, String, usize)> {
        let mut out: Vec<_> = self
            .jobs()
            .iter()
            .map(|((principal, job), w)| (principal.clone(), job.clone(), w.upcoming.len()))
            .collect();
        out.sort();
        out
    }

    /// Drops the windows idle for [`IDLE_EXPIRY`].
    pub fn expire(&self) {
        let mut jobs = self.jobs();
        jobs.retain(|_, w| w.touched.elapsed() < IDLE_EXPIRY);
        self.any.store(!jobs.is_empty(), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(name: &str) -> ShardKey {
        ("ds".to_owned(), name.to_owned())
    }

    fn read(position: u64, shard: u32, offset: u64, next_use: Option<u64>) -> PlannedRead {
        PlannedRead { position, shard, offset, length: 100, next_use }
    }

    #[test]
    fn reads_are_matched_to_the_window_of_their_job_and_leave_it() {
        let plans = SamplePlans::default();
        let table = [shard("a"), shard("b")];
        let reads = [read(5, 0, 0, Some(20)), read(6, 1, 300, None), read(7, 0, 100, Some(9))];
        assert_eq!(plans.add(("alice", "train/rank0/worker1"), 10, &table, &reads).unwrap(), 3);
        assert!(plans.follows("alice", Some("train")) && !plans.follows("bob", Some("train")));
        assert_eq!(
            plans.read("bob", Some("train"), &shard("a"), 0, 100),
            Matched::Unplanned,
            "another principal's"
        );
        assert_eq!(
            plans.read("alice", Some("train"), &shard("a"), 0, 99),
            Matched::Unplanned,
            "another range"
        );
        assert_eq!(
            plans.read("alice", Some("train"), &shard("a"), 0, 100),
            Matched::Planned { next_use: Some(20) }
        );
        assert_eq!(plans.read("alice", Some("train"), &shard("a"), 0, 100), Matched::Unplanned, "read once");
        assert_eq!(plans.progress(), [("alice".into(), "train".into(), 2)]);
    }

    #[test]
    fn due_reads_are_handed_nearest_first_within_the_budget_once_each() {
        let plans = SamplePlans::default();
        let table = [shard("a"), shard("b")];
        let reads: Vec<PlannedRead> = (0..10).map(|p| read(p, (p % 2) as u32, p * 100, None)).collect();
        plans.add(("p", "j"), 4, &table, &reads).unwrap();
        let due = plans.due(350, |_| true);
        let positions = |due: &[Due]| due.iter().map(|d| d.place.0).collect::<Vec<_>>();
        assert_eq!(positions(&due), [0, 1, 2]);
        assert_eq!(due[2].epoch, 0);
        let next = plans.due(1000, |s| s.1 == "a");
        assert_eq!(positions(&next), [4, 6, 8], "only the shards it fetches");
        assert_eq!(next[0].epoch, 1);
        plans.not_fetched(&due[0]);
        assert_eq!(positions(&plans.due(1000, |_| true)), [0]);
    }
}
