//! `soak-bench`: a 1 GiB training epoch through a spoke while its 60 ms link to the hub
//! cycles, three times over, through every fault the WAN emulator has (stall, down,
//! stall after 256 KiB per connection, answers held, requests held, throttled to
//! 20 Mbit/s), each for 2 s between 2 s of health. Prints the calls, bytes, faults,
//! failures by status, wrong bytes, hung calls and the reread after healing; fails
//! (exit 1) on a wrong byte, a hung call, a failure without a clean status, or an epoch
//! that does not complete once the link heals.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/soak-bench
//! ```

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shardcache_tests::{
    TestHub, TestSpoke, make_dataset,
    soak::{SoakPlan, soak},
    spoke_options,
    wan::{Fault, LinkConfig, Toward, WanProxy},
};

#[tokio::main]
async fn main() {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "c4", 64, 16 << 20);
    // The hub's --max-read must hold a spoke chunk (4 MiB), as with its 16 MiB default.
    let mut hub_options = shardcache_tests::test_options();
    hub_options.limits.max_read = 16 << 20;
    let hub = TestHub::start_with(root.path(), hub_options).await;
    let link =
        LinkConfig { rtt: Duration::from_millis(60), rate_bps: Some(2_000_000_000), jitter: Duration::ZERO };
    let proxy = WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, link).await.unwrap();
    let mut options = spoke_options(&proxy.endpoint());
    options.cache.chunk_size = 4 << 20;
    options.cache.capacity = 4 << 30;
    options.hub_transport.timeout = Duration::from_secs(5);
    options.cache.revalidate_after = Duration::from_secs(5);
    options.max_read = 16 << 20;
    let spoke = TestSpoke::start(cache.path(), options).await;
    let client = spoke.client().await;

    let (healthy, faulty) = (Duration::from_secs(2), Duration::from_secs(2));
    let faults = [
        Fault::Stall,
        Fault::Down,
        Fault::StallAfter(256 << 10),
        Fault::Hold(Toward::Client),
        Fault::Hold(Toward::Upstream),
        Fault::Throttle(20_000_000),
    ];
    let schedule: Vec<_> =
        (0..3).flat_map(|_| faults.iter().flat_map(|&f| [(Fault::None, healthy), (f, faulty)])).collect();
    let plan = SoakPlan {
        dataset: "c4",
        dir: &dir,
        schedule,
        record: 64 << 10,
        batch: 16,
        hung_after: Duration::from_secs(30),
        // 1024 calls x 60 ms of compute: ~60 s, about the schedule's 72 s.
        pace: Duration::from_millis(60),
    };
    let report = soak(&client, &proxy, plan).await;

    println!("| soak (1 GiB epoch, 60 ms link, 16 x 64 KiB records per call) | result |");
    println!("|---|---|");
    println!("| read calls (ReadRanges of 16 records; every tenth, 16 StreamShards) | {} |", report.calls);
    println!("| bytes returned, all equal to the files | {} MiB |", report.bytes >> 20);
    println!("| faults injected (2 s each, between 2 s of health) | {} |", report.faults_injected);
    let failures: Vec<String> = report.failures.iter().map(|(code, n)| format!("{code} {n}")).collect();
    let failed: u64 = report.failures.values().sum();
    println!(
        "| failed calls, by status | {failed}: {} |",
        if failures.is_empty() { "-".into() } else { failures.join(", ") }
    );
    println!("| failed calls without a clean status | {} |", report.unclean.len());
    println!("| hung calls (not done in 30 s) | {} |", report.hung);
    println!("| wrong bytes | {} |", report.wrong_bytes);
    println!(
        "| records reread after the link healed / still failing | {} / {} |",
        report.reread, report.still_failing
    );
    println!("| elapsed | {:.1} s |", report.elapsed.as_secs_f64());
    for (code, message) in &report.examples {
        println!("\nfirst {code}: {message}");
    }
    let ok =
        report.wrong_bytes == 0 && report.hung == 0 && report.unclean.is_empty() && report.still_failing == 0;
    if !ok {
        eprintln!("soak failed: {report:#?}");
        std::process::exit(1);
    }
}
