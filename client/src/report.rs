//! A job's own table as the spoke keeps it (`JobReport`, from `CacheClient::job_report`)
//! turned into the seed's columns: per phase, samples/s, data wait and GPU utilisation
//! (one minus the wait's share), read latency, where the reads were answered from, link
//! bytes per byte read, and the rank that waited most. `shardcache report JOB` prints
//! [`markdown`]; a group's members' tables are merged first ([`merge`]).

use shardcache_proto::{
    job_headers::latency_bound_ms,
    v1::{JobPhase, JobReport},
};

/// The `q` quantile (0..1) of a latency histogram, as its bucket's upper bound (ms);
/// 0 when empty.
pub fn quantile_ms(buckets: &[u64], q: f64) -> f64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return latency_bound_ms(i);
        }
    }
    latency_bound_ms(buckets.len().saturating_sub(1))
}

/// One phase in the seed's columns.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseRow {
    pub epoch: u64,
    pub phase: String,
    pub steps: u64,
    pub samples_per_s: f64,
    /// The steps' data wait (their slowest rank's) as a share of their wall time, %.
    pub data_wait_pct: f64,
    /// 100 - `data_wait_pct`: the seed's GPU utilisation.
    pub gpu_util_pct: f64,
    pub read_p50_ms: f64,
    pub read_p99_ms: f64,
    pub reads: u64,
    /// Shares of the reads: answered from the spoke's store, and (of the rest, by the
    /// bytes fetched for them) from group members and from the hub, %.
    pub from_store_pct: f64,
    pub from_members_pct: f64,
    pub from_hub_pct: f64,
    /// Bytes over the long link per byte read.
    pub link_per_read: f64,
    /// The rank that waited longest, and its wait as a share of the phase's wall time, %.
    pub slowest_rank: Option<(u32, f64)>,
}

/// `phase`'s row.
pub fn row(phase: &JobPhase) -> PhaseRow {
    let wall_s = phase.wall_us as f64 / 1e6;
    let share = |part: f64, whole: f64| if whole > 0.0 { part * 100.0 / whole } else { 0.0 };
    let data_wait_pct = share(phase.wait_us as f64, phase.wall_us as f64);
    let from_store_pct = share(phase.store_reads as f64, phase.reads as f64);
    let fetched = (phase.member_bytes + phase.hub_bytes) as f64;
    let missed = if phase.reads > 0 { 100.0 - from_store_pct } else { 0.0 };
    let slowest = phase
        .rank_wait_us
        .iter()
        .enumerate()
        .max_by_key(|&(rank, &wait)| (wait, std::cmp::Reverse(rank)))
        .filter(|&(_, &wait)| wait > 0)
        .map(|(rank, &wait)| (rank as u32, share(wait as f64, phase.wall_us as f64)));
    PhaseRow {
        epoch: phase.epoch,
        phase: phase.name.clone(),
        steps: phase.steps,
        samples_per_s: if wall_s > 0.0 { phase.samples as f64 / wall_s } else { 0.0 },
        data_wait_pct,
        gpu_util_pct: if phase.steps > 0 { 100.0 - data_wait_pct } else { 0.0 },
        read_p50_ms: quantile_ms(&phase.latency, 0.5),
        read_p99_ms: quantile_ms(&phase.latency, 0.99),
        reads: phase.reads,
        from_store_pct,
        from_members_pct: if fetched > 0.0 { missed * phase.member_bytes as f64 / fetched } else { 0.0 },
        from_hub_pct: if fetched > 0.0 { missed * phase.hub_bytes as f64 / fetched } else { missed },
        link_per_read: if phase.bytes > 0 { phase.link_bytes as f64 / phase.bytes as f64 } else { 0.0 },
        slowest_rank: slowest,
    }
}

/// The table as markdown: a line saying whose it is, then a row a phase.
pub fn markdown(report: &JobReport) -> String {
    let mut out = format!(
        "job {:?} of principal {:?}, {} rank(s){}\n\n",
        report.job,
        report.principal,
        report.ranks,
        if report.members.len() > 1 {
            format!(", gathered from {} members", report.members.len())
        } else {
            String::new()
        }
    );
    out += "| phase | steps | samples/s | data wait | GPU util | read p50 / p99 | from store | from members | \
            from hub | link / read | slowest rank (its wait) |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for phase in &report.phases {
        let r = row(phase);
        let slowest = r.slowest_rank.map_or("-".to_owned(), |(rank, pct)| format!("{rank} ({pct:.1}%)"));
        out += &format!(
            "| {} | {} | {:.0} | {:.1}% | {:.1}% | {:.2} / {:.2} ms | {:.1}% | {:.1}% | {:.1}% | {:.2} | {} |\n",
            if phase.name.starts_with("epoch") {
                phase.name.clone()
            } else {
                format!("epoch {}, {}", r.epoch, r.phase)
            },
            r.steps,
            r.samples_per_s,
            r.data_wait_pct,
            r.gpu_util_pct,
            r.read_p50_ms,
            r.read_p99_ms,
            r.from_store_pct,
            r.from_members_pct,
            r.from_hub_pct,
            r.link_per_read,
            slowest
        );
    }
    out
}

/// A group's members' tables of one job as one: every member takes every step report,
/// so a phase's steps are the most any member folded; each member counts the reads it
/// answered, so those add up (latency histograms too).
pub fn merge(mut tables: Vec<(String, JobReport)>) -> Option<JobReport> {
    tables.sort_by_key(|(_, t)| std::cmp::Reverse(t.phases.iter().map(|p| p.steps).sum::<u64>()));
    let mut members = Vec::new();
    let mut merged: Option<JobReport> = None;
    for (url, table) in tables {
        members.push(url);
        let Some(into) = merged.as_mut() else {
            merged = Some(table);
            continue;
        };
        into.ranks = into.ranks.max(table.ranks);
        for phase in table.phases {
            match into.phases.iter_mut().find(|p| p.epoch == phase.epoch && p.name == phase.name) {
                Some(p) => p.add_reads(&phase),
                None => {
                    // Steps this member folded that the fullest did not: a phase of its own.
                    into.phases.push(phase);
                }
            }
        }
    }
    let mut merged = merged?;
    merged.phases.sort_by_key(|p| (p.epoch, p.first_ms));
    merged.members = members;
    Some(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &str, steps: u64, reads: u64, latency_at: usize) -> JobPhase {
        let mut latency = vec![0; 160];
        latency[latency_at] = reads;
        JobPhase {
            epoch: 1,
            name: name.into(),
            steps,
            wall_us: 10_000_000,
            wait_us: 500_000,
            samples: 24_000,
            rank_wait_us: vec![100_000, 400_000, 0],
            reads,
            store_reads: reads / 2,
            bytes: 1000,
            member_bytes: 100,
            hub_bytes: 300,
            link_bytes: 150,
            latency,
            ..Default::default()
        }
    }

    #[test]
    fn a_phase_reads_as_the_seed_columns() {
        let r = row(&phase("batches 0-100", 100, 40, 39));
        assert_eq!((r.samples_per_s, r.data_wait_pct, r.gpu_util_pct), (2400.0, 5.0, 95.0));
        assert_eq!((r.from_store_pct, r.from_members_pct, r.from_hub_pct), (50.0, 12.5, 37.5));
        assert_eq!(r.link_per_read, 0.15);
        assert_eq!(r.slowest_rank, Some((1, 4.0)));
        assert!((r.read_p50_ms - 1.024).abs() < 1e-9, "bucket 39 ends at 2^10 µs: {}", r.read_p50_ms);
        assert_eq!(quantile_ms(&[], 0.5), 0.0);
    }

    #[test]
    fn members_tables_merge_steps_once_and_reads_summed() {
        let a =
            JobReport { ranks: 2, phases: vec![phase("batches 0-100", 100, 40, 10)], ..Default::default() };
        let b =
            JobReport { ranks: 2, phases: vec![phase("batches 0-100", 99, 20, 20)], ..Default::default() };
        let merged = merge(vec![("b".into(), b), ("a".into(), a)]).unwrap();
        assert_eq!(merged.members, ["a", "b"]);
        let p = &merged.phases[0];
        assert_eq!((p.steps, p.reads, p.hub_bytes), (100, 60, 600));
        assert_eq!((p.latency[10], p.latency[20]), (40, 20));
        assert!(markdown(&merged).contains("| epoch 1, batches 0-100 | 100 | 2400 | 5.0% | 95.0% |"));
        assert!(merge(Vec::new()).is_none());
    }
}
