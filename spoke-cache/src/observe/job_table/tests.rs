//! The job tables' unit tests: steps folded once into phases by batch index, the
//! slowest rank's wait, bounds, persistence, and the slow-read mark.

use super::*;

fn report(rank: u32, ranks: u32, epoch: u64, first: u64, waits: &[u32]) -> StepReport {
    StepReport {
        job: "train/rank".into(),
        rank,
        ranks,
        epoch,
        first_batch: first,
        wait_us: waits.to_vec(),
        busy_us: vec![1000; waits.len()],
        samples: vec![24; waits.len()],
        started_ms: 0,
    }
}

#[test]
fn a_read_is_marked_slow_only_above_the_p99_of_a_hundred_before_it() {
    let tables = JobTables::default();
    let fast = Duration::from_millis(2);
    // Too few reads to know a p99: even a slow one is not marked.
    assert!(!tables.read("alice", "train", Duration::from_secs(1)));
    for _ in 0..150 {
        assert!(!tables.read("alice", "train", fast), "no read as fast as the rest is slow");
    }
    assert!(tables.read("alice", "train", Duration::from_millis(200)), "far above the p99");
    // Another principal's job of that name has its own reads.
    assert!(!tables.read("bob", "train", Duration::from_millis(200)));
    assert!(!tables.read("alice", "", Duration::from_millis(200)), "a read with no job is never marked");
}

#[test]
fn a_step_waits_for_its_slowest_rank_and_folds_into_its_phase() {
    let tables = JobTables::default();
    let reads = JobSnapshot::default();
    tables.report("alice", &report(0, 2, 0, 0, &[10; 120]), reads).unwrap();
    let table = tables.get("alice", "train", reads).unwrap();
    assert!(table.phases.iter().all(|p| p.steps == 0), "rank 1 has not reported: nothing folded");
    let mut slow = vec![500; 120];
    slow[0] = 7000;
    tables.report("alice", &report(1, 2, 0, 0, &slow), reads).unwrap();
    let table = tables.get("alice", "train", reads).unwrap();
    let names: Vec<_> = table.phases.iter().map(|p| (p.name.as_str(), p.steps)).collect();
    assert_eq!(names, [("batches 0-100", 100), ("batches 100-150", 20)]);
    let first = &table.phases[0];
    assert_eq!(first.wait_us, 7000 + 99 * 500, "each step's wait is its slowest rank's");
    assert_eq!(first.wall_us, 8000 + 99 * 1500);
    assert_eq!(first.samples, 100 * 48);
    assert_eq!(first.rank_wait_us, [1000, 7000 + 99 * 500]);
    assert!(tables.get("bob", "train", reads).is_none(), "another principal's job is another job");
}

#[test]
fn later_epochs_are_a_phase_each_and_reads_count_where_they_ran() {
    let tables = JobTables::default();
    let mut reads = JobSnapshot { reads: 10, hit_reads: 2, bytes: 100, ..Default::default() };
    tables.report("a", &report(0, 1, 3, 0, &[1; 200]), reads).unwrap();
    reads.reads = 30;
    reads.hit_reads = 22;
    tables.report("a", &report(0, 1, 4, 0, &[1; 10]), reads).unwrap();
    reads.reads = 35;
    let table = tables.get("a", "train", reads).unwrap();
    let names: Vec<_> = table.phases.iter().map(|p| (p.name.as_str(), p.steps, p.reads)).collect();
    assert_eq!(
        names,
        [
            ("batches 0-100", 100, 10),
            ("batches 100-150", 50, 0),
            ("steady (150-end)", 50, 20),
            ("epoch 4", 10, 5)
        ]
    );
}

#[test]
fn reads_before_the_first_step_are_the_first_phases_whatever_its_epoch() {
    let tables = JobTables::default();
    tables.read("a", "train", Duration::from_micros(100));
    let reads = JobSnapshot { reads: 1, ..Default::default() };
    let early = tables.get("a", "train", reads).unwrap();
    assert_eq!(
        early.phases.iter().map(|p| (p.name.as_str(), p.reads)).collect::<Vec<_>>(),
        [(BEFORE_STEPS, 1)]
    );
    tables.report("a", &report(0, 1, 1, 0, &[1; 3]), reads).unwrap();
    tables.read("a", "train", Duration::from_micros(100));
    let table = tables.get("a", "train", reads).unwrap();
    let phases: Vec<_> = table.phases.iter().map(|p| (p.epoch, p.name.as_str(), p.steps, p.reads)).collect();
    assert_eq!(phases, [(1, "batches 0-100", 3, 1)], "epoch 1 is the job's first");
    assert_eq!(table.phases[0].latency.iter().sum::<u64>(), 2);
}

#[test]
fn bad_reports_are_refused_and_bounds_hold() {
    let tables = JobTables::default();
    let reads = JobSnapshot::default();
    let mut bad = report(0, 1, 0, 0, &[1, 2]);
    bad.busy_us.pop();
    assert_eq!(tables.report("a", &bad, reads), Err(BadReport::Lengths));
    assert!(matches!(tables.report("a", &report(2, 2, 0, 0, &[1]), reads), Err(BadReport::Rank { .. })));
    for job in 0..MAX_TABLES + 5 {
        let mut r = report(0, 1, 0, 0, &[1]);
        r.job = format!("job{job}");
        tables.report("a", &r, reads).unwrap();
    }
    assert_eq!(tables.tables().values().map(HashMap::len).sum::<usize>(), MAX_TABLES);
    assert!(tables.get("a", "job0", reads).is_none(), "the least recently reported went first");
}

#[test]
fn tables_are_kept_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let reads = JobSnapshot::default();
    let tables = JobTables::open(dir.path());
    tables.report("a", &report(0, 1, 0, 0, &[5; 160]), reads).unwrap();
    tables.read("a", "train/rank0", Duration::from_millis(3));
    tables.save().unwrap();
    let again = JobTables::open(dir.path());
    let table = again.get("a", "train", reads).unwrap();
    assert_eq!(table.phases.iter().map(|p| p.steps).sum::<u64>(), 160);
    assert_eq!(table.phases.iter().flat_map(|p| &p.latency).sum::<u64>(), 1);
    again.report("a", &report(0, 1, 1, 0, &[5; 4]), reads).unwrap();
    let table = again.get("a", "train", reads).unwrap();
    assert_eq!(table.phases.last().unwrap().name, "epoch 1", "the first epoch is still the job's first");
}

#[test]
fn steps_waiting_for_ranks_are_bounded_by_the_waits_they_hold() {
    let tables = JobTables::default();
    let reads = JobSnapshot::default();
    // 100 of 4096 ranks report the same 3000 steps (under MAX_PENDING): their waits
    // pass MAX_PENDING_WAITS, and the oldest steps fold with the ranks they have.
    let many = 3000;
    for rank in 0..100 {
        tables.report("a", &report(rank, 4096, 0, 0, &vec![1; many]), reads).unwrap();
    }
    let mut guard = tables.tables();
    let table = table_of(&mut guard, "a", "train");
    let held: usize = table.pending.values().map(|(_, waits)| waits.len()).sum();
    assert!(held <= MAX_PENDING_WAITS, "{held}");
    let folded: u64 = table.report.phases.iter().map(|p| p.steps).sum();
    assert!(folded > 0, "the oldest steps were folded");
    assert_eq!(folded + table.pending.len() as u64, many as u64, "every step folded or held");
}

#[test]
fn a_late_rank_is_not_counted_twice_and_a_job_run_again_starts_afresh() {
    let tables = JobTables::default();
    let reads = JobSnapshot::default();
    tables.report("a", &report(0, 1, 0, 0, &[1; 10]), reads).unwrap();
    tables.report("a", &report(0, 1, 0, 5, &[1; 10]), reads).unwrap();
    let table = tables.get("a", "train", reads).unwrap();
    assert_eq!(table.phases[0].steps, 15, "batches 5-9 sent twice count once");
    // The same name an hour later, from its first batch: a new run.
    table_of(&mut tables.tables(), "a", "train").touched -= RERUN_AFTER;
    tables.report("a", &report(0, 1, 0, 0, &[1; 3]), reads).unwrap();
    assert_eq!(tables.get("a", "train", reads).unwrap().phases[0].steps, 3);
}

#[test]
fn the_timeline_stays_bounded() {
    let tables = JobTables::default();
    let mut tables_guard = tables.tables();
    let table = table_of(&mut tables_guard, "a", "j");
    let step = Pending { first_seen: Instant::now(), at_ms: 0, ranks: 1, wait_us: 1, wall_us: 2, samples: 3 };
    for i in 0..(TIMELINE_POINTS as u64 * 3) {
        table.timeline(1_000_000 + i * 1000, step);
    }
    let points = &table.report.timeline;
    assert!(points.len() <= TIMELINE_POINTS);
    assert_eq!(points.iter().map(|p| p.steps).sum::<u64>(), TIMELINE_POINTS as u64 * 3);
    assert!(points[0].width_ms > FIRST_WIDTH_MS);
}
