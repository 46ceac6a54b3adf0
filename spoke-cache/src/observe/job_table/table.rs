//! One job's table: its phases, its steps waiting for their ranks, its timeline.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use shardcache_proto::{
    job_headers::LATENCY_BUCKETS,
    v1::{JobPhase, JobReport, TimelinePoint},
};

use crate::observe::job_counters::JobSnapshot;

/// Steps a job holds waiting for the rest of their ranks; the oldest are folded past it.
pub const MAX_PENDING: usize = 4096;
/// Ranks' waits those steps hold in all (8 bytes each: 2 MiB a job): 64 steps of a job of
/// 4096 ranks, all 4096 of one of 64 ranks.
pub const MAX_PENDING_WAITS: usize = 1 << 18;
/// Phases a job keeps: the first epoch's three and the latest epochs'.
pub const MAX_PHASES: usize = 32;
/// Timeline buckets a job keeps; when full, neighbours merge and the width doubles.
pub const TIMELINE_POINTS: usize = 512;
/// The timeline's first bucket width.
pub(super) const FIRST_WIDTH_MS: u64 = 1000;
/// A step some rank has not reported this long after the first did is folded without it.
pub const FOLD_AFTER: Duration = Duration::from_secs(10);
/// The phase of a job's reads before its first step is reported.
pub const BEFORE_STEPS: &str = "before the first step";

/// The name of the phase of batch `batch` of `epoch`, in a job whose first epoch is `first`.
pub fn phase_name(first: u64, epoch: u64, batch: u64) -> String {
    if epoch != first {
        return format!("epoch {epoch}");
    }
    match batch {
        0..100 => "batches 0-100".to_owned(),
        100..150 => "batches 100-150".to_owned(),
        _ => "steady (150-end)".to_owned(),
    }
}

/// A step waiting for the rest of its ranks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pub(super) first_seen: Instant,
    /// When the step began (ms since the Unix epoch), as its first reported rank says; 0:
    /// unknown (placed when folded).
    pub(super) at_ms: u64,
    pub(super) ranks: u32,
    pub(super) wait_us: u32,
    pub(super) wall_us: u64,
    pub(super) samples: u64,
}

/// A step waiting for its ranks, with each rank's (rank, wait) so far.
pub(super) type PendingStep = (Pending, Vec<(u32, u32)>);

/// One job's table.
#[derive(Debug)]
pub(super) struct Table {
    pub(super) report: JobReport,
    /// Steps by (epoch, batch) waiting for their ranks, and the ranks each has.
    pub(super) pending: BTreeMap<(u64, u64), PendingStep>,
    /// The job's first epoch (its phases by batch), from its first step.
    pub(super) first_epoch: Option<u64>,
    /// The latest step folded: a rank's report of it or of an earlier one comes too late
    /// (it was folded without that rank) and is not counted again. Ranks report their
    /// batches in order, so steps are folded in order.
    pub(super) folded_through: Option<(u64, u64)>,
    /// Reads before the job's first step (its loaders start first): added to its first
    /// phase when that is known.
    pub(super) early: JobPhase,
    /// The job's read counters when last added to a phase.
    pub(super) reads_seen: JobSnapshot,
    pub(super) touched: Instant,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Table {
    pub(super) fn new(principal: &str, job: &str) -> Self {
        Self::from_report(JobReport {
            principal: principal.to_owned(),
            job: job.to_owned(),
            ..Default::default()
        })
    }

    pub(super) fn from_report(report: JobReport) -> Self {
        let first_epoch = report.phases.iter().find(|p| p.name.starts_with("batches")).map(|p| p.epoch);
        Self {
            report,
            pending: BTreeMap::new(),
            first_epoch,
            folded_through: None,
            early: JobPhase {
                name: BEFORE_STEPS.to_owned(),
                latency: vec![0; LATENCY_BUCKETS],
                ..Default::default()
            },
            reads_seen: JobSnapshot::default(),
            touched: Instant::now(),
        }
    }

    /// The phase a read or step of `(epoch, batch)` counts in, made if new.
    pub(super) fn phase(&mut self, epoch: u64, batch: u64) -> &mut JobPhase {
        let first = *self.first_epoch.get_or_insert(epoch);
        let name = phase_name(first, epoch, batch);
        let at = match self.report.phases.iter().position(|p| p.epoch == epoch && p.name == name) {
            Some(at) => at,
            None => {
                let mut phase =
                    JobPhase { epoch, name, latency: vec![0; LATENCY_BUCKETS], ..Default::default() };
                if self.report.phases.is_empty() {
                    // The reads before the first step were this phase's loaders'.
                    phase.add_reads(&self.early);
                    self.early = JobPhase { name: BEFORE_STEPS.to_owned(), ..Default::default() };
                }
                self.report.phases.push(phase);
                self.trim_phases();
                self.report.phases.len() - 1
            }
        };
        &mut self.report.phases[at]
    }

    /// Drops the oldest later-epoch phase past [`MAX_PHASES`] (the first epoch's stay).
    pub(super) fn trim_phases(&mut self) {
        while self.report.phases.len() > MAX_PHASES {
            let first = self.first_epoch;
            match self.report.phases.iter().position(|p| Some(p.epoch) != first) {
                Some(at) => self.report.phases.remove(at),
                None => self.report.phases.remove(0),
            };
        }
    }

    /// The phase reads count in now: the latest one's (reads run ahead of the steps), or
    /// before the first step, the reads held for the first phase.
    pub(super) fn current_phase(&mut self) -> &mut JobPhase {
        match self.report.phases.last_mut() {
            Some(phase) => phase,
            None => &mut self.early,
        }
    }

    /// The table as it stands: before any step, the reads so far as a phase of their own.
    pub(super) fn snapshot(&self) -> JobReport {
        let mut report = self.report.clone();
        if report.phases.is_empty() && self.early.reads + self.early.latency.iter().sum::<u64>() > 0 {
            report.phases.push(self.early.clone());
        }
        report
    }

    /// Adds what the job's reads did since last seen (`now`: its rows summed) to the
    /// current phase. Counters that went back (a restart) count from zero.
    pub(super) fn count_reads(&mut self, now: JobSnapshot) {
        let seen = self.reads_seen;
        let delta = |now: u64, seen: u64| if now >= seen { now - seen } else { now };
        let phase = self.current_phase();
        phase.reads += delta(now.reads, seen.reads);
        phase.store_reads += delta(now.hit_reads, seen.hit_reads);
        phase.bytes += delta(now.bytes, seen.bytes);
        phase.member_bytes += delta(now.peer_bytes, seen.peer_bytes);
        phase.hub_bytes += delta(now.hub_bytes, seen.hub_bytes);
        phase.link_bytes += delta(now.link_bytes, seen.link_bytes);
        self.reads_seen = now;
    }

    /// Folds step `(epoch, batch)` into its phase and the timeline.
    pub(super) fn fold(
        &mut self,
        (epoch, batch): (u64, u64),
        step: Pending,
        ranks: &[(u32, u32)],
        reads: JobSnapshot,
    ) {
        // Reads up to now belong to the phase before a new one starts.
        let name = phase_name(*self.first_epoch.get_or_insert(epoch), epoch, batch);
        let new_phase = self.report.phases.last().is_none_or(|p| p.epoch != epoch || p.name != name);
        if new_phase {
            self.count_reads(reads);
        }
        self.folded_through = self.folded_through.max(Some((epoch, batch)));
        let at = if step.at_ms > 0 { step.at_ms } else { now_ms() };
        let phase = self.phase(epoch, batch);
        phase.steps += 1;
        phase.wall_us += step.wall_us;
        phase.wait_us += u64::from(step.wait_us);
        phase.samples += step.samples;
        for &(rank, wait) in ranks {
            let rank = rank as usize;
            if phase.rank_wait_us.len() <= rank {
                phase.rank_wait_us.resize(rank + 1, 0);
            }
            phase.rank_wait_us[rank] += u64::from(wait);
        }
        if phase.first_ms == 0 {
            phase.first_ms = at;
        }
        phase.last_ms = at;
        self.timeline(at, step);
    }

    pub(super) fn timeline(&mut self, at: u64, step: Pending) {
        let points = &mut self.report.timeline;
        let width = points.last().map_or(FIRST_WIDTH_MS, |p| p.width_ms);
        if points.last().is_none_or(|p| at >= p.at_ms + p.width_ms) {
            let start = points.last().map_or(at, |p| {
                p.at_ms + (at.saturating_sub(p.at_ms) / p.width_ms.max(1)) * p.width_ms.max(1)
            });
            points.push(TimelinePoint { at_ms: start, width_ms: width, ..Default::default() });
        }
        let point = points.last_mut().expect("pushed");
        point.steps += 1;
        point.wall_us += step.wall_us;
        point.wait_us += u64::from(step.wait_us);
        point.samples += step.samples;
        if points.len() > TIMELINE_POINTS {
            let merged = points
                .chunks(2)
                .map(|pair| {
                    let mut p = pair[0];
                    p.width_ms *= 2;
                    for q in &pair[1..] {
                        p.steps += q.steps;
                        p.wall_us += q.wall_us;
                        p.wait_us += q.wait_us;
                        p.samples += q.samples;
                    }
                    p
                })
                .collect();
            *points = merged;
        }
    }

    /// Folds the pending steps that have every rank, have waited long enough, or are
    /// past [`MAX_PENDING`] or [`MAX_PENDING_WAITS`] (the oldest first).
    pub(super) fn fold_ready(&mut self, reads: JobSnapshot) {
        let ranks = self.report.ranks;
        let ready: Vec<(u64, u64)> = self
            .pending
            .iter()
            .filter(|(_, (p, _))| (ranks > 0 && p.ranks >= ranks) || p.first_seen.elapsed() >= FOLD_AFTER)
            .map(|(&key, _)| key)
            .collect();
        for key in ready {
            if let Some((step, waits)) = self.pending.remove(&key) {
                self.fold(key, step, &waits, reads);
            }
        }
        let mut waits_held: usize = self.pending.values().map(|(_, waits)| waits.len()).sum();
        while self.pending.len() > MAX_PENDING || waits_held > MAX_PENDING_WAITS {
            let Some((key, (step, waits))) = self.pending.pop_first() else { break };
            waits_held -= waits.len();
            self.fold(key, step, &waits, reads);
        }
    }
}
