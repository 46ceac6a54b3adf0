//! The rows of `Status` built from the cache's parts: each plan's progress, each
//! principal's bytes and share, each job's reads.

use shardcache_proto::v1::{JobStatus, PlanStatus, PrincipalStatus};

use crate::cache::Cache;

/// Every plan's progress.
pub(super) fn plan_statuses(cache: &Cache) -> Vec<PlanStatus> {
    let progress = cache.plans().shards.progress();
    progress
        .into_iter()
        .map(|p| PlanStatus {
            principal: p.principal,
            job: p.job,
            cursor: p.cursor as u64,
            positions: p.positions as u64,
            lag: p.lag as u64,
            samples: p.samples,
        })
        .collect()
}

/// Every principal holding bytes, with its share (`policy::shares`).
pub(super) fn principal_statuses(cache: &Cache) -> Vec<PrincipalStatus> {
    let (held, shares) = cache.held_and_shares();
    let mut out: Vec<PrincipalStatus> = held
        .into_iter()
        .map(|(principal, held_bytes)| PrincipalStatus {
            share_bytes: shares.get(&principal).copied().unwrap_or_default(),
            principal,
            held_bytes,
        })
        .collect();
    out.sort_by(|a, b| a.principal.cmp(&b.principal));
    out
}

/// Every (job, epoch) row (see `observe/job_counters.rs`).
pub(super) fn job_statuses(cache: &Cache) -> Vec<JobStatus> {
    let rows = cache.metrics().jobs.snapshot();
    rows.into_iter()
        .map(|(key, row)| JobStatus {
            principal: key.principal,
            job: key.job,
            epoch: key.epoch,
            reads: row.reads,
            hit_reads: row.hit_reads,
            bytes: row.bytes,
            hit_bytes: row.hit_bytes,
            hub_bytes: row.hub_bytes,
            link_bytes: row.link_bytes,
            planned_reads: row.planned_reads,
        })
        .collect()
}
