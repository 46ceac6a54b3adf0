//! Counters per job and epoch: reads, bytes, hits and the bytes fetched from the hub on
//! the job's behalf. A read names its job with the `shardcache-job` and
//! `shardcache-epoch` headers (the SDK's datasets send them); a read without them counts
//! under the untagged row (job "", epoch 0), as do fetches by `Prefetch` calls; a fetch
//! a plan started counts under the plan's job (its name up to the first `/`: a job sends
//! one plan per reader as `JOB/READER`) and the epoch of the planned read. Every read
//! and every hub byte the per-dataset counters count is counted in exactly one row, so
//! the rows add up to the totals (rows folded away included).
//!
//! A job is its principal's (`Grant::principal`): rows are per (principal, job, epoch),
//! and `Status` shows a principal its own rows only.
//!
//! Rows are kept for the [`MAX_JOB_ROWS`] most recent (principal, job, epoch) keys;
//! older ones are folded into one row (job "(older)"), so a spoke that serves jobs for
//! months keeps a bounded page.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

use shardcache_reader::JobTag;

/// (job, epoch) rows kept before the oldest are folded together: a few hundred jobs'
/// last epochs, a page of ~100 KB.
pub const MAX_JOB_ROWS: usize = 512;

/// The job name of the row older rows are folded into.
pub const FOLDED_JOB: &str = "(older)";

/// The job name of the row a principal's prefetches count in: what an operator asked to
/// be fetched is no job's reads, and must not make the reads beside it look amplified.
pub const PREFETCH_JOB: &str = "(prefetch)";

/// One (job, epoch)'s counters.
#[derive(Debug, Default)]
pub struct JobCounters {
    pub reads: AtomicU64,
    pub hit_reads: AtomicU64,
    pub bytes: AtomicU64,
    pub hit_bytes: AtomicU64,
    pub hub_bytes: AtomicU64,
    /// What `hub_bytes` took on the long link (less where the hub compressed them).
    pub link_bytes: AtomicU64,
    /// Bytes fetched from group members on the job's behalf.
    pub peer_bytes: AtomicU64,
    /// Reads its sample plan had named before they came (`samples/`).
    pub planned_reads: AtomicU64,
    /// When the spoke last warned that the job's reads cost more over the link than
    /// they read (ms since the Unix epoch; 0: never).
    warned_at_ms: AtomicU64,
}

/// Bytes over the link beyond those read before a job's reads count as costing more
/// than they read: a plan's prefetch runs a block or two ahead of the reads, and a first
/// read of a chunk the cache stores brings the whole chunk.
pub const AMPLIFICATION_SLACK: u64 = 256 << 20;

/// A job is warned about at most this often.
pub const AMPLIFICATION_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// A row's values at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobSnapshot {
    pub reads: u64,
    pub hit_reads: u64,
    pub bytes: u64,
    pub hit_bytes: u64,
    pub hub_bytes: u64,
    pub link_bytes: u64,
    pub peer_bytes: u64,
    pub planned_reads: u64,
}

impl JobSnapshot {
    /// Adds `other`'s values (rows summed under one label).
    pub fn add(&mut self, other: JobSnapshot) {
        self.reads += other.reads;
        self.hit_reads += other.hit_reads;
        self.bytes += other.bytes;
        self.hit_bytes += other.hit_bytes;
        self.hub_bytes += other.hub_bytes;
        self.link_bytes += other.link_bytes;
        self.peer_bytes += other.peer_bytes;
        self.planned_reads += other.planned_reads;
    }

    /// Bytes over the long link per byte read (0 before any read).
    pub fn amplification(&self) -> f64 {
        if self.bytes == 0 { 0.0 } else { self.link_bytes as f64 / self.bytes as f64 }
    }

    /// Bytes over the long link per byte read that missed the cache (0 before any miss).
    pub fn miss_amplification(&self) -> f64 {
        let missed = self.bytes - self.hit_bytes.min(self.bytes);
        if missed == 0 { 0.0 } else { self.link_bytes as f64 / missed as f64 }
    }
}

impl JobCounters {
    /// A read of `bytes`, a hit when none of it came from the hub.
    pub fn read(&self, bytes: u64, hit: bool) {
        self.reads.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        if hit {
            self.hit_reads.fetch_add(1, Relaxed);
            self.hit_bytes.fetch_add(bytes, Relaxed);
        }
    }

    pub fn snapshot(&self) -> JobSnapshot {
        JobSnapshot {
            reads: self.reads.load(Relaxed),
            hit_reads: self.hit_reads.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            hit_bytes: self.hit_bytes.load(Relaxed),
            hub_bytes: self.hub_bytes.load(Relaxed),
            link_bytes: self.link_bytes.load(Relaxed),
            peer_bytes: self.peer_bytes.load(Relaxed),
            planned_reads: self.planned_reads.load(Relaxed),
        }
    }

    /// Whether to warn now that this row's reads cost more over the link than they read
    /// (by more than [`AMPLIFICATION_SLACK`]): at most once per
    /// [`AMPLIFICATION_WARNING_EVERY`]; `now_ms` since the Unix epoch.
    pub fn warn_amplified(&self, now_ms: u64) -> bool {
        let (read, link) = (self.bytes.load(Relaxed), self.link_bytes.load(Relaxed));
        if link <= read.saturating_add(AMPLIFICATION_SLACK) {
            return false;
        }
        let last = self.warned_at_ms.load(Relaxed);
        let every = AMPLIFICATION_WARNING_EVERY.as_millis() as u64;
        (last == 0 || now_ms.saturating_sub(last) >= every)
            && self.warned_at_ms.compare_exchange(last, now_ms.max(1), Relaxed, Relaxed).is_ok()
    }

    fn add(&self, other: JobSnapshot) {
        self.reads.fetch_add(other.reads, Relaxed);
        self.hit_reads.fetch_add(other.hit_reads, Relaxed);
        self.bytes.fetch_add(other.bytes, Relaxed);
        self.hit_bytes.fetch_add(other.hit_bytes, Relaxed);
        self.hub_bytes.fetch_add(other.hub_bytes, Relaxed);
        self.link_bytes.fetch_add(other.link_bytes, Relaxed);
        self.peer_bytes.fetch_add(other.peer_bytes, Relaxed);
        self.planned_reads.fetch_add(other.planned_reads, Relaxed);
    }
}

/// The job a job name's reads carry: its part before the first '/' (`JOB/rank0/worker1`
/// sends plans for the reads of `JOB`).
pub fn job_of(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

/// The counters a read or fetch is counted in.
pub type JobRow = Arc<JobCounters>;

/// Whose job a row counts: the principal that reads, the job and epoch it names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RowKey {
    pub principal: String,
    pub job: String,
    pub epoch: u64,
}

#[derive(Debug, Default)]
struct Rows {
    rows: BTreeMap<RowKey, JobRow>,
    /// Keys in the order their rows were made (oldest first).
    made: VecDeque<RowKey>,
    folded: JobRow,
}

/// Every (job, epoch)'s counters.
#[derive(Debug, Default)]
pub struct Jobs {
    rows: Mutex<Rows>,
}

impl Jobs {
    /// The row of `principal`'s reads tagged `tag` (its untagged row for `None`), made on
    /// first use.
    pub fn row(&self, principal: &str, tag: Option<&JobTag>) -> JobRow {
        let key = RowKey {
            principal: principal.to_owned(),
            job: tag.map(|t| t.job.clone()).unwrap_or_default(),
            epoch: tag.map_or(0, |t| t.epoch),
        };
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(row) = rows.rows.get(&key) {
            return row.clone();
        }
        let row = JobRow::default();
        rows.rows.insert(key.clone(), row.clone());
        rows.made.push_back(key);
        rows.fold_oldest();
        row
    }

    /// The row `principal`'s prefetches count in ([`PREFETCH_JOB`]).
    pub fn prefetched(&self, principal: &str) -> JobRow {
        self.row(principal, Some(&JobTag { job: PREFETCH_JOB.into(), epoch: 0 }))
    }

    /// The row a fetch for `principal`'s plan `plan` (`JOB` or `JOB/READER`) at plan
    /// epoch `epoch` is counted in.
    pub fn planned(&self, principal: &str, plan: &str, epoch: u64) -> JobRow {
        let job = job_of(plan).to_owned();
        self.row(principal, Some(&JobTag { job, epoch }))
    }

    /// `principal`'s job `job`'s rows summed, every epoch and every reader's name
    /// (`JOB/READER`) with them: what its table (`job_table/`) counts reads from.
    pub fn job_sum(&self, principal: &str, job: &str) -> JobSnapshot {
        let rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        let mut sum = JobSnapshot::default();
        for (key, row) in &rows.rows {
            if key.principal == principal && job_of(&key.job) == job {
                sum.add(row.snapshot());
            }
        }
        sum
    }

    /// Every row's values, in (principal, job, epoch) order, the folded row last when it
    /// has any (its principal is "").
    pub fn snapshot(&self) -> Vec<(RowKey, JobSnapshot)> {
        let rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = rows.rows.iter().map(|(key, row)| (key.clone(), row.snapshot())).collect();
        let folded = rows.folded.snapshot();
        if folded != JobSnapshot::default() {
            out.push((RowKey { job: FOLDED_JOB.into(), ..RowKey::default() }, folded));
        }
        out
    }
}

impl Rows {
    /// Folds the oldest rows no read or fetch holds into `folded` while over the limit
    /// (a held row may still count, and what it counts must not be lost).
    fn fold_oldest(&mut self) {
        let mut kept = VecDeque::new();
        while self.rows.len() > MAX_JOB_ROWS {
            let Some(key) = self.made.pop_front() else { break };
            match self.rows.get(&key) {
                Some(row) if Arc::strong_count(row) == 1 => {
                    if let Some(row) = self.rows.remove(&key) {
                        self.folded.add(row.snapshot());
                    }
                }
                Some(_) => kept.push_back(key),
                None => {}
            }
        }
        while let Some(key) = kept.pop_back() {
            self.made.push_front(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_whose_reads_cost_more_over_the_link_than_they_read_is_warned_about_once_a_minute() {
        let row = JobCounters::default();
        row.read(100 << 20, false);
        row.link_bytes.fetch_add(300 << 20, Relaxed);
        assert!(!row.warn_amplified(1_000), "within the slack");
        row.link_bytes.fetch_add(100 << 20, Relaxed);
        assert!(row.warn_amplified(1_000));
        assert!(!row.warn_amplified(30_000), "not again within a minute");
        assert!(row.warn_amplified(61_000));
        let snapshot = row.snapshot();
        assert_eq!((snapshot.amplification(), snapshot.miss_amplification()), (4.0, 4.0));
        assert_eq!(JobSnapshot::default().amplification(), 0.0);
    }

    #[test]
    fn old_rows_fold_into_one_and_nothing_is_lost() {
        let jobs = Jobs::default();
        let held = jobs.row("alice", Some(&JobTag { job: "held".into(), epoch: 0 }));
        for i in 0..MAX_JOB_ROWS as u64 + 10 {
            jobs.row("alice", Some(&JobTag { job: "job".into(), epoch: i })).read(10, i % 2 == 0);
        }
        held.read(5, true);
        let rows = jobs.snapshot();
        assert_eq!(rows.len(), MAX_JOB_ROWS + 1, "the limit, and the folded row");
        assert!(rows.iter().any(|(tag, _)| tag.job == "held"), "a row still held is not folded");
        let (reads, bytes) = rows.iter().fold((0, 0), |(r, b), (_, s)| (r + s.reads, b + s.bytes));
        assert_eq!((reads, bytes), (MAX_JOB_ROWS as u64 + 11, 10 * (MAX_JOB_ROWS as u64 + 10) + 5));
        assert_eq!(jobs.planned("bob", "c4/rank0/worker1", 2).snapshot(), JobSnapshot::default());
        assert!(
            jobs.snapshot()
                .iter()
                .any(|(key, _)| key.principal == "bob" && key.job == "c4" && key.epoch == 2)
        );
    }
}
