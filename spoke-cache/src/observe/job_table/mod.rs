//! Every job's own table (issue 49): how long its training loop waited on data, per
//! phase and rank, beside what the spoke saw of its reads.
//!
//! The SDK's `StepTimer` times, per rank, how long the loop waited for each batch and how
//! long it ran after it, and sends them (`ReportSteps`, a few a second). A step of the
//! job is every rank's batch of one index: it waits for its slowest rank (an all-reduce
//! does), so its data wait is the largest of the ranks' waits and its wall time the
//! largest wait plus busy; one minus the wait's share is the seed's GPU utilisation. A
//! step is folded into its phase once every rank has reported it (or it has waited
//! [`FOLD_AFTER`] for a rank that stopped reporting). Phases are the seed's rows: the
//! job's first epoch in batches 0-100, 100-150 and the rest, then each later epoch. Each
//! phase also holds the job's reads answered while it ran (counted from the job's rows
//! in `jobs.rs`), their latency and where they came from; and a timeline of the job's
//! steps, by wall clock, for a plot.
//!
//! Bounded: [`MAX_TABLES`] jobs (the least recently reported go first), [`MAX_RANKS`]
//! ranks a job, [`MAX_PENDING`] steps and [`MAX_PENDING_WAITS`] ranks' waits a job
//! waiting for the rest of their ranks, [`MAX_PHASES`] phases (the first epoch's and the
//! latest epochs'), [`TIMELINE_POINTS`] buckets (two merged into one when full). A job's
//! table is then at most ~3.5 MiB (phases 32 x (1.3 KiB of latency + 8 B a rank), its
//! pending waits 2 MiB, its timeline 24 KiB), 0.9 GiB for 256; a job of 16 ranks past its
//! first epoch holds ~50 KiB. Kept across a restart in `jobs.pb`.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use prost::Message;
use shardcache_proto::{
    job_headers::{LATENCY_BUCKETS, latency_bucket},
    v1::{JobReport, JobTables as Saved, StepReport},
};

use crate::observe::job_counters::JobSnapshot;

mod table;

#[cfg(test)]
use table::FIRST_WIDTH_MS;
pub use table::{
    BEFORE_STEPS, FOLD_AFTER, MAX_PENDING, MAX_PENDING_WAITS, MAX_PHASES, TIMELINE_POINTS, phase_name,
};
use table::{Pending, Table};

/// Jobs with a table; the least recently reported is dropped for a new one.
pub const MAX_TABLES: usize = 256;
/// Ranks a job's steps are matched across; a report from a rank past it is refused.
pub const MAX_RANKS: u32 = 4096;
/// Batches one report may carry.
pub const MAX_BATCHES_A_REPORT: usize = 16 << 10;
/// A job that reports steps it has folded already after this long without a report is
/// run again under the same name: its table starts afresh (a late rank reports within
/// seconds).
pub const RERUN_AFTER: Duration = Duration::from_secs(60);
/// The file the tables are kept in, in the cache directory.
pub const FILE: &str = "jobs.pb";

/// Reads a phase has before one of them can be called slower than its p99.
pub const SLOW_AFTER_READS: u64 = 100;

/// Whether a read in `bucket` is above the p99 of `latency` (per-bucket counts): fewer
/// than one in a hundred of them were in `bucket` or above.
fn above_p99(latency: &[u64], bucket: usize) -> bool {
    let total: u64 = latency.iter().sum();
    let at_or_above: u64 = latency.get(bucket..).map_or(0, |tail| tail.iter().sum());
    total >= SLOW_AFTER_READS && at_or_above * 100 < total
}

/// Why a report was refused (INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadReport {
    #[error("a step report's wait_us, busy_us and samples lists must have one entry per batch each")]
    Lengths,
    #[error(
        "a step report of {0} batches is over the limit of {MAX_BATCHES_A_REPORT}; report every second or so"
    )]
    TooMany(usize),
    #[error("rank {rank} of {ranks}: a rank must be below the job's ranks, and below {MAX_RANKS}")]
    Rank { rank: u32, ranks: u32 },
    #[error("a step report names no job")]
    NoJob,
}

/// Every job's table.
#[derive(Debug, Default)]
pub struct JobTables {
    /// By principal, then job.
    tables: Mutex<HashMap<String, HashMap<String, Table>>>,
    /// Where they are kept (None: not kept, in tests).
    file: Option<PathBuf>,
}

impl JobTables {
    /// The tables kept in `dir` (none if there is no file, or it cannot be read: a
    /// table is a report, not data; the spoke says so and starts afresh).
    pub fn open(dir: &Path) -> Self {
        let file = dir.join(FILE);
        let mut tables: HashMap<String, HashMap<String, Table>> = HashMap::new();
        match std::fs::read(&file) {
            Ok(bytes) => match Saved::decode(bytes.as_slice()) {
                Ok(saved) => {
                    for report in saved.jobs {
                        let (principal, job) = (report.principal.clone(), report.job.clone());
                        tables.entry(principal).or_default().insert(job, Table::from_report(report));
                    }
                }
                Err(e) => {
                    tracing::warn!(file = %file.display(), error = %e, "jobs' tables unreadable; starting afresh")
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "jobs' tables unreadable; starting afresh")
            }
        }
        Self { tables: Mutex::new(tables), file: Some(file) }
    }

    fn tables(&self) -> MutexGuard<'_, HashMap<String, HashMap<String, Table>>> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `report`'s batches from `principal`; `reads` sums the job's read rows now.
    pub fn report(&self, principal: &str, report: &StepReport, reads: JobSnapshot) -> Result<(), BadReport> {
        let job = crate::observe::job_counters::job_of(&report.job);
        if job.is_empty() {
            return Err(BadReport::NoJob);
        }
        let count = report.wait_us.len();
        if report.busy_us.len() != count || report.samples.len() != count {
            return Err(BadReport::Lengths);
        }
        if count > MAX_BATCHES_A_REPORT {
            return Err(BadReport::TooMany(count));
        }
        if report.rank >= MAX_RANKS
            || (report.ranks > 0 && report.rank >= report.ranks)
            || report.ranks > MAX_RANKS
        {
            return Err(BadReport::Rank { rank: report.rank, ranks: report.ranks });
        }
        let mut tables = self.tables();
        let table = table_of(&mut tables, principal, job);
        let first = (report.epoch, report.first_batch);
        if table.folded_through.is_some_and(|through| first <= through)
            && table.touched.elapsed() >= RERUN_AFTER
        {
            *table = Table::new(principal, job); // the job run again: its table is its latest run's
        }
        table.touched = Instant::now();
        table.report.ranks = table.report.ranks.max(report.ranks).max(report.rank + 1);
        // Each batch's start, by the wall clock: the report's start plus the batches before.
        let mut at_us = report.started_ms.saturating_mul(1000);
        for i in 0..count {
            let batch_at_ms = if report.started_ms > 0 { at_us / 1000 } else { 0 };
            at_us = at_us.saturating_add(u64::from(report.wait_us[i]) + u64::from(report.busy_us[i]));
            let key = (report.epoch, report.first_batch.saturating_add(i as u64));
            if table.folded_through.is_some_and(|through| key <= through) {
                continue; // folded without this rank already
            }
            let (wait, busy) = (report.wait_us[i], report.busy_us[i]);
            let (step, waits) = table.pending.entry(key).or_insert_with(|| {
                let first_seen = Instant::now();
                (
                    Pending { first_seen, at_ms: batch_at_ms, ranks: 0, wait_us: 0, wall_us: 0, samples: 0 },
                    Vec::new(),
                )
            });
            if waits.iter().any(|&(r, _)| r == report.rank) {
                continue; // sent twice
            }
            waits.push((report.rank, wait));
            step.ranks += 1;
            step.wait_us = step.wait_us.max(wait);
            step.wall_us = step.wall_us.max(u64::from(wait) + u64::from(busy));
            step.samples += u64::from(report.samples[i]);
        }
        table.fold_ready(reads);
        drop(tables);
        Ok(())
    }

    /// A read of `principal`'s job `job` answered in `elapsed` (jobs without a table get one).
    ///
    /// Returns whether the read was slower than the phase's p99 so far (at least
    /// [`SLOW_AFTER_READS`] of them): the mark a collector's tail sampling keeps a trace
    /// by (`shardcache_transport::telemetry`).
    pub fn read(&self, principal: &str, job: &str, elapsed: Duration) -> bool {
        let job = crate::observe::job_counters::job_of(job);
        if job.is_empty() {
            return false;
        }
        let mut tables = self.tables();
        let table = table_of(&mut tables, principal, job);
        let phase = table.current_phase();
        if phase.latency.len() < LATENCY_BUCKETS {
            phase.latency.resize(LATENCY_BUCKETS, 0);
        }
        let bucket = latency_bucket(elapsed);
        let slow = above_p99(&phase.latency, bucket);
        phase.latency[bucket] += 1;
        slow
    }

    /// `principal`'s job `job`'s table as it stands (`reads`: its read rows summed now),
    /// or `None`.
    pub fn get(&self, principal: &str, job: &str, reads: JobSnapshot) -> Option<JobReport> {
        let mut tables = self.tables();
        let table = tables.get_mut(principal)?.get_mut(crate::observe::job_counters::job_of(job))?;
        table.fold_ready(reads);
        table.count_reads(reads);
        Some(table.snapshot())
    }

    /// Every job's steps' wall and data-wait time per epoch, in microseconds, summed over
    /// its phases: `(principal, job, epoch, wall_us, wait_us)` (the metrics' series).
    pub fn step_times(&self) -> Vec<(String, String, u64, u64, u64)> {
        let mut out = Vec::new();
        for (principal, jobs) in self.tables().iter() {
            for (job, table) in jobs {
                let mut epochs: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
                for phase in &table.report.phases {
                    let sums = epochs.entry(phase.epoch).or_default();
                    sums.0 += phase.wall_us;
                    sums.1 += phase.wait_us;
                }
                for (epoch, (wall, wait)) in epochs {
                    out.push((principal.clone(), job.clone(), epoch, wall, wait));
                }
            }
        }
        out
    }

    /// Writes the tables to their file (a new file renamed over the old: never half one).
    pub fn save(&self) -> std::io::Result<()> {
        let Some(file) = &self.file else { return Ok(()) };
        let saved = Saved {
            jobs: self.tables().values().flat_map(|jobs| jobs.values().map(|t| t.report.clone())).collect(),
        };
        let new = file.with_extension("pb.new");
        std::fs::write(&new, saved.encode_to_vec())?;
        std::fs::rename(&new, file)
    }
}

/// `principal`'s table of `job`, made (and the least recently reported dropped past
/// [`MAX_TABLES`]) if new.
fn table_of<'a>(
    tables: &'a mut HashMap<String, HashMap<String, Table>>,
    principal: &str,
    job: &str,
) -> &'a mut Table {
    let known = tables.get(principal).is_some_and(|jobs| jobs.contains_key(job));
    if known {
        // Every read of a job comes here: no new strings for a known one.
        return tables.get_mut(principal).and_then(|jobs| jobs.get_mut(job)).expect("known");
    }
    if tables.values().map(HashMap::len).sum::<usize>() >= MAX_TABLES {
        let oldest = tables
            .iter()
            .flat_map(|(p, jobs)| jobs.iter().map(move |(j, t)| (t.touched, p.clone(), j.clone())))
            .min();
        if let Some((_, p, j)) = oldest {
            tables.get_mut(&p).map(|jobs| jobs.remove(&j));
        }
    }
    tables
        .entry(principal.to_owned())
        .or_default()
        .entry(job.to_owned())
        .or_insert_with(|| Table::new(principal, job))
}

#[cfg(test)]
mod tests;
