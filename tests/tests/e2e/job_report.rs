//! A job's own table (`ReportSteps`, `JobReport`, `shardcache report`): two ranks of a
//! job read through a spoke with tokens while their loops are timed by the SDK's
//! `StepTimer`; the spoke's table has every step in the seed's phases, each step's wait
//! as its slowest rank's, the rank that waited named, the job's reads counted where they
//! ran; it is the principal's own (another tenant sees none of it, the operator all of
//! it), and it is there again after the spoke restarts. Through a group, every member
//! folds the job's steps and counts the reads it answered: the SDK gathers one table.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shardcache_client::{CacheClient, Client, ConnectOptions, Range, StepTimer, report};
use shardcache_proto::v1::{JobReport, StepReport};
use shardcache_serving::{auth::Authenticator, server::Security};
use shardcache_tests::{Cli, TestHub, TestSpoke, group::TestGroup, make_dataset, spoke_options, token_file};
use tonic::Code;

fn token(token: &str) -> ConnectOptions {
    ConnectOptions { tls: None, token: Some(token.to_owned()) }
}

const STEPS: u64 = 160;

fn steps(table: &JobReport) -> u64 {
    table.phases.iter().map(|p| p.steps).sum()
}

/// Waits (bounded) until `control`'s table of `job` has `want` steps.
async fn table_with(control: &CacheClient, job: &str, principal: &str, want: u64) -> JobReport {
    let mut last = JobReport::default();
    for _ in 0..500 {
        if let Ok(table) = control.job_report(job, principal).await {
            if steps(&table) >= want {
                return table;
            }
            last = table;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the table never had {want} steps: {last:?}");
}

/// Two ranks of alice's job "train": each step, each rank asks for its batch, reads it
/// through the spoke (as the job), has it; rank 1's batches also take 3 ms longer.
/// Returns the reads made.
async fn two_ranks_of_train(endpoint: &str, alice_token: &str, alice: &CacheClient) -> u64 {
    let reader =
        Client::connect_with(endpoint, &token(alice_token)).await.unwrap().for_job("train", 0).unwrap();
    let mut ranks =
        [StepTimer::new(alice.clone(), "train", 0, 2), StepTimer::new(alice.clone(), "train", 1, 2)];
    for timer in &mut ranks {
        timer.start_epoch(0);
    }
    let mut reads = 0;
    for step in 0..STEPS {
        for (rank, timer) in ranks.iter_mut().enumerate() {
            timer.waiting();
            let shard = format!("shard-{:05}.bin", (step + rank as u64) % 4);
            reader.read_range(&Range::new("c4", &shard, (step % 64) * 16384, 16384)).await.unwrap();
            reads += 1;
            if rank == 1 {
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            timer.arrived(24);
        }
    }
    drop(ranks); // the last batches are sent
    reads
}

/// `shardcache report --png`'s image of `table`: its size, and its marks drawn in blue.
fn assert_timeline_drawn(table: &JobReport, path: &std::path::Path) {
    let points = shardcache_cli::timeline::points(table);
    assert!(!points.is_empty() && points.iter().all(|p| (0.0..=100.0).contains(&p.2)), "{points:?}");
    shardcache_cli::timeline::write_png(table, path).unwrap();
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((frame.width, frame.height), (1200, 700));
    let channels = frame.color_type.samples();
    let blue = pixels.chunks(channels).filter(|p| p[2] > 200 && p[0] < 60 && p[1] < 60).count();
    assert!(blue > 50, "the timeline's marks are drawn: {blue} blue pixels");
    let empty = JobReport { job: "none".into(), ..Default::default() };
    let refused = shardcache_cli::timeline::write_png(&empty, path).unwrap_err();
    assert!(refused.to_string().contains("no steps"), "{refused}");
}

#[tokio::test]
async fn a_jobs_table_is_its_loops_waits_by_phase_and_rank_its_own_and_outlives_a_restart() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 4, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens_path = dir.path().join("tokens");
    let tokens = token_file(&tokens_path, &[("alice", "c4"), ("bob", "c4"), ("ops", "* control")]);
    let mut options = spoke_options(&hub.endpoint);
    options.security = Security { tls: None, auth: Authenticator::with_token_file(&tokens_path).unwrap() };
    let cache_dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache_dir.path(), options.clone()).await;
    let alice = CacheClient::connect_with(&spoke.endpoint, &token(&tokens[0])).await.unwrap();
    let bob = CacheClient::connect_with(&spoke.endpoint, &token(&tokens[1])).await.unwrap();
    let ops = CacheClient::connect_with(&spoke.endpoint, &token(&tokens[2])).await.unwrap();

    let reads = two_ranks_of_train(&spoke.endpoint, &tokens[0], &alice).await;

    let table = table_with(&alice, "train", "", STEPS).await;
    let phases: Vec<_> = table.phases.iter().map(|p| (p.epoch, p.name.as_str(), p.steps)).collect();
    assert_eq!(
        phases,
        [(0, "batches 0-100", 100), (0, "batches 100-150", 50), (0, "steady (150-end)", 10)],
        "every step once, in the seed's phases"
    );
    assert_eq!((table.principal.as_str(), table.job.as_str(), table.ranks), ("alice", "train", 2));
    for phase in &table.phases {
        assert_eq!(phase.samples, phase.steps * 48, "both ranks' samples");
        assert!(phase.wait_us <= phase.wall_us, "{phase:?}");
        let row = report::row(phase);
        assert_eq!(row.slowest_rank.map(|(rank, _)| rank), Some(1), "rank 1 waited longest: {phase:?}");
        // A step waits for its slowest rank: never less than rank 1's own waits.
        assert!(phase.wait_us >= phase.rank_wait_us[1], "{phase:?}");
    }
    let counted: u64 = table.phases.iter().map(|p| p.reads).sum();
    let timed: u64 = table.phases.iter().flat_map(|p| &p.latency).sum();
    assert_eq!((counted, timed), (reads, reads), "every read of the job counted and timed once");
    let stored: u64 = table.phases.iter().map(|p| p.store_reads).sum();
    assert!(
        stored > 0 && stored < reads,
        "cold misses first, then reads from the store: {stored} of {reads}"
    );
    // The metrics carry the job's step and wait time (what the data-wait alert watches;
    // "train" is not in --metric-jobs, so under job_id="other").
    for (series, want) in [
        ("shardcache_spoke_job_step_seconds_total", table.phases.iter().map(|p| p.wall_us).sum::<u64>()),
        ("shardcache_spoke_job_data_wait_seconds_total", table.phases.iter().map(|p| p.wait_us).sum::<u64>()),
    ] {
        let got = spoke.metric(&format!("{series}{{job_id=\"other\",epoch=\"\"}}")).await;
        assert!((got - want as f64 / 1e6).abs() < 1e-6, "{series}: {got}, the table has {want} µs");
    }
    let markdown = report::markdown(&table);
    assert!(
        markdown.contains("| epoch 0, batches 0-100 | 100 |") && markdown.contains("| 1 ("),
        "{markdown}"
    );
    assert_timeline_drawn(&table, &dir.path().join("train.png"));

    // Alice's job is hers: Bob has no job "train" and may not ask for hers; the operator may.
    let refused = bob.job_report("train", "").await.unwrap_err();
    assert_eq!(refused.code(), Some(Code::NotFound), "{refused}");
    let refused = bob.job_report("train", "alice").await.unwrap_err();
    assert_eq!(refused.code(), Some(Code::PermissionDenied), "{refused}");
    assert_eq!(steps(&ops.job_report("train", "alice").await.unwrap()), STEPS);

    // A report that does not add up is refused with what is wrong; the spoke goes on.
    let bad = StepReport {
        job: "train".into(),
        ranks: 2,
        wait_us: vec![1, 2],
        busy_us: vec![1],
        ..Default::default()
    };
    let refused = alice.report_steps(bad).await.unwrap_err();
    assert_eq!(refused.code(), Some(Code::InvalidArgument), "{refused}");
    assert!(refused.to_string().contains("one entry per batch"), "{refused}");

    // Restarted, the spoke has the table as it was.
    spoke.stop().await;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let alice = CacheClient::connect_with(&spoke.endpoint, &token(&tokens[0])).await.unwrap();
    let again = alice.job_report("train", "").await.unwrap();
    assert_eq!(again.phases.len(), 3);
    assert_eq!(steps(&again), STEPS);
    assert_eq!(again.phases.iter().map(|p| p.reads).sum::<u64>(), reads);
}

#[tokio::test]
async fn a_groups_members_tables_are_gathered_into_one() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 8, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let group = TestGroup::start(3, |_| hub.endpoint.clone()).await;
    let control = CacheClient::connect(&group.spec()).await.unwrap();
    let reader = Client::connect(&group.spec()).await.unwrap().for_job("train", 0).unwrap();
    let mut timer = StepTimer::new(control.clone(), "train", 0, 1);
    timer.start_epoch(0);
    let mut reads = 0;
    for step in 0..120u64 {
        timer.waiting();
        let shard = format!("shard-{:05}.bin", step % 8);
        reader.read_range(&Range::new("c4", &shard, (step % 64) * 16384, 16384)).await.unwrap();
        reads += 1;
        timer.arrived(24);
    }
    drop(timer);

    let table = table_with(&control, "train", "", 120).await;
    assert_eq!(table.members.len(), 3, "every member's table");
    let phases: Vec<_> = table.phases.iter().map(|p| (p.name.as_str(), p.steps, p.samples)).collect();
    assert_eq!(phases, [("batches 0-100", 100, 2400), ("batches 100-150", 20, 480)], "each step once");
    assert_eq!(
        table.phases.iter().map(|p| p.reads).sum::<u64>(),
        reads,
        "each read counted once, where answered"
    );
    // The reads were answered by the shards' owners: more than one member counted some.
    let mut answering = 0;
    for url in &group.urls {
        let own = CacheClient::connect(url).await.unwrap().job_report("train", "").await.unwrap();
        assert_eq!(steps(&own), 120, "{url} folded every step");
        answering += usize::from(own.phases.iter().any(|p| p.reads > 0));
    }
    assert!(answering >= 2, "the reads went to their shards' owners");
}

/// `shardcache report JOB`, run as a process, against a spoke a timed loop read through:
/// its table has every step the loop sent, in the seed's phases, and each phase's data
/// wait is what the loop's own clock measured around its waits (the read and the loader's
/// work on the batch), not only what the timer sent: a timer that mis-timed its waits
/// shows another share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shardcache_report_prints_the_steps_sent_and_the_wait_the_loops_own_clock_measured() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 2, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let cache_dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    let control = spoke.control().await;
    let reader = spoke.client().await.for_job("timed", 0).unwrap();
    let mut timer = StepTimer::new(control.clone(), "timed", 0, 1);
    timer.start_epoch(0);
    // Per phase (batches 0-100, 100-130): the loop's own clock of its waits, and of its
    // steps (from one ask to the next).
    let mut own = [(Duration::ZERO, Duration::ZERO); 2];
    let mut step_began = std::time::Instant::now();
    for step in 0..130u64 {
        timer.waiting();
        let asked = std::time::Instant::now();
        if step > 0 {
            own[usize::from(step > 100)].1 += asked - step_began;
        }
        step_began = asked;
        reader.read_range(&Range::new("c4", "shard-00000.bin", (step % 64) * 16384, 16384)).await.unwrap();
        // The loader's own work on the batch: the trainer waits for that too.
        tokio::time::sleep(Duration::from_millis(3)).await;
        own[usize::from(step >= 100)].0 += asked.elapsed();
        timer.arrived(8);
        // The step's compute.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    own[1].1 += step_began.elapsed();
    drop(timer); // the last step ends here, and is sent

    table_with(&control, "timed", "", 130).await;
    let endpoint = spoke.endpoint.clone();
    let printed = tokio::task::spawn_blocking(move || Cli::at(&endpoint, &["report", "timed"]).ok_text())
        .await
        .unwrap();
    // `| phase | steps | samples/s | data wait | ...` rows.
    let rows: Vec<(String, u64, f64)> = printed
        .lines()
        .filter(|l| l.starts_with("| epoch "))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].to_owned(), cells[2].parse().unwrap(), cells[4].trim_end_matches('%').parse().unwrap())
        })
        .collect();
    let phases: Vec<(&str, u64)> = rows.iter().map(|(p, s, _)| (p.as_str(), *s)).collect();
    assert_eq!(phases, [("epoch 0, batches 0-100", 100), ("epoch 0, batches 100-150", 30)], "{printed}");
    for ((phase, _, printed_wait), (waited, stepped)) in rows.iter().zip(own) {
        let measured = waited.as_secs_f64() * 100.0 / stepped.as_secs_f64();
        eprintln!("{phase}: the report {printed_wait}% data wait, the loop's own clock {measured:.2}%");
        assert!(
            (printed_wait - measured).abs() <= 3.0,
            "{phase}: the report says {printed_wait}% data wait, the loop's own clock {measured:.1}%: {printed}"
        );
    }
}
