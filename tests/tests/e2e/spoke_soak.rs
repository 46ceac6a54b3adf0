//! The short soak (`make test`): an epoch of 32 MiB through a spoke while the link to
//! its hub cycles through every fault the WAN emulator has. No wrong byte, no hung
//! call, every failure a status a caller can act on, and once the link heals the epoch
//! completes. The long one is `soak-bench` (1 GiB; BENCHMARKS.md).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shardcache_tests::{
    TestHub, TestSpoke, make_dataset,
    soak::{SoakPlan, soak},
    spoke_options,
    wan::{Fault, LinkConfig, Toward, WanProxy},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_through_a_faulty_link_is_byte_exact_never_hangs_and_completes() {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 8, 4 << 20);
    let hub = TestHub::start(root.path()).await;
    let link =
        LinkConfig { rtt: Duration::from_millis(10), rate_bps: Some(200_000_000), jitter: Duration::ZERO };
    let proxy = WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, link).await.unwrap();
    let mut options = spoke_options(&proxy.endpoint());
    options.hub_transport.timeout = Duration::from_secs(1);
    options.cache.revalidate_after = Duration::from_millis(200);
    let spoke = TestSpoke::start(cache.path(), options).await;
    let client = spoke.client().await;

    let step = Duration::from_millis(300);
    let schedule = vec![
        (Fault::None, step),
        (Fault::Stall, step),
        (Fault::None, step),
        (Fault::Down, step),
        (Fault::None, step),
        (Fault::StallAfter(256 << 10), step),
        (Fault::Hold(Toward::Client), step),
        (Fault::None, step),
        (Fault::Hold(Toward::Upstream), step),
        (Fault::Throttle(20_000_000), step),
        (Fault::None, step),
    ];
    let plan = SoakPlan {
        dataset: "ds",
        dir: &dir,
        schedule,
        record: 64 << 10,
        batch: 4,
        hung_after: Duration::from_secs(15),
        // 128 calls x 30 ms: the epoch spans the 3.3 s schedule.
        pace: Duration::from_millis(30),
    };
    let report = soak(&client, &proxy, plan).await;
    eprintln!("{report:#?}");
    assert_eq!(report.wrong_bytes, 0, "wrong bytes were returned");
    assert_eq!(report.hung, 0, "calls hung");
    assert!(report.unclean.is_empty(), "failures without a clean status: {:?}", report.unclean);
    assert_eq!(report.still_failing, 0, "the epoch did not complete after the link healed");
    assert!(report.faults_injected >= 4, "the faults ran during the epoch");
    let failed: u64 = report.failures.values().sum();
    assert!(failed > 0, "no call met a fault: the soak proved nothing");
    assert_eq!(report.bytes + report.reread * (64 << 10), 32 << 20, "every record was read, first or again");
}
