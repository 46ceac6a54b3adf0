//! The group chaos soak, short (`shardcache_tests::chaos`): two trainer nodes read
//! through a group of three spokes while one member's hub link hangs, a member stops and
//! comes back, the hub stalls past `--hub-timeout` and another tenant fills a member's
//! disk: no wrong byte, no hung call, no failed read while a member or the hub could
//! serve it. `chaos-bench` runs it longer (BENCHMARKS.md).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shardcache_tests::chaos::{ChaosPlan, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_under_faults_serves_every_read_right_and_in_bounded_time() {
    let plan = ChaosPlan {
        shards: 12,
        shard_size: 1 << 20,
        record: 64 << 10,
        batch: 8,
        epochs: 3,
        phase: Duration::from_millis(700),
        hub_timeout: Duration::from_secs(1),
        cycles: 1,
        hung_after: Duration::from_secs(20),
        disk: 24 << 20,
        capacity: 3 << 20,
        revalidate_after: Duration::from_secs(2),
    };
    let report = run(&plan).await;
    eprintln!("{report:#?}");
    assert_eq!(report.wrong_bytes, 0);
    assert_eq!(report.hung, 0);
    assert!(
        report.failures.is_empty(),
        "reads failed while a member or the hub could serve: {:?}",
        report.examples
    );
    // Every fault was met by reads.
    let met: Vec<&str> = report.phases.iter().filter(|p| p.calls > 0).map(|p| p.name.as_str()).collect();
    for fault in ["member 2's hub link stalled", "member 1 stopped", "hub stalled past --hub-timeout"] {
        assert!(met.contains(&fault), "no read met {fault:?}: {met:?}");
    }
    if report.skipped.is_empty() {
        assert!(met.contains(&"member 0's disk full"), "no read met the full disk: {met:?}");
    } else {
        eprintln!("SKIPPED in part: {:?}", report.skipped);
    }
}
