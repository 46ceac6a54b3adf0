//! `chaos-bench`: the group chaos soak (`shardcache_tests::chaos`) at length: two trainer
//! nodes read a 256 MiB dataset through a group of three spokes of 64 MiB each (so every epoch
//! evicts and fetches again) for at least five
//! epochs while the faults go round three times (a member's hub link hangs, a member
//! stops and comes back, the hub stalls past `--hub-timeout`, another tenant fills a
//! member's disk; 3 s each). Then the baseline, run: the same reads straight to a hub
//! through identical links, no cache (`chaos::no_cache`). Prints the table BENCHMARKS.md
//! records, the bytes on the links (the emulators' counts) and the hub's served bytes each
//! beside the baseline's; exits 1 on a wrong byte, a hung call or a failed read while a
//! member or the hub could serve it.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/chaos-bench
//! ```

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shardcache_tests::chaos::{ChaosPlan, no_cache, run};

#[tokio::main]
async fn main() {
    let plan = ChaosPlan {
        shards: 64,
        shard_size: 4 << 20,
        record: 64 << 10,
        batch: 16,
        epochs: 5,
        phase: Duration::from_secs(3),
        hub_timeout: Duration::from_secs(2),
        cycles: 3,
        hung_after: Duration::from_secs(30),
        disk: 160 << 20,
        capacity: 64 << 20,
        revalidate_after: Duration::from_secs(5),
    };
    let report = run(&plan).await;
    // The baseline, run: the same reads (each node's epochs, the same orders) straight to
    // the hub through identical links, after the soak.
    let (no_cache_bytes, no_cache_served, baseline) = no_cache(&plan, report.node_epochs).await;
    assert!(
        baseline.wrong_bytes == 0 && baseline.failures.is_empty() && baseline.hung == 0,
        "the no-cache run read every byte right: {baseline:?}"
    );
    println!("| group chaos soak (3 spokes, 2 trainer nodes, 256 MiB, 16 x 64 KiB per call) | result |");
    println!("|---|---|");
    println!("| read calls / epochs per node | {} / {} |", report.calls, report.epochs);
    println!("| bytes returned, all equal to the files | {} MiB |", report.bytes >> 20);
    println!("| faults met (3 rounds of 4) | {} |", report.faults);
    let failures: Vec<String> = report.failures.iter().map(|(code, n)| format!("{code} {n}")).collect();
    println!(
        "| failed calls while a member or the hub could serve | {} |",
        if failures.is_empty() { "0".into() } else { failures.join(", ") }
    );
    println!(
        "| failed calls while the hub was stalled (shards no member held) | {} |",
        report.failed_while_hub_down
    );
    println!("| hung calls (not done in 30 s) | {} |", report.hung);
    println!("| wrong bytes | {} |", report.wrong_bytes);
    println!("| slowest call | {:.2} s |", report.slowest.as_secs_f64());
    // Each beside the same reads with no cache, run: on the wire (compressed where the hub
    // compressed: the readers with no cache ask for zstd, the spokes' `auto` decides), and
    // as the hub counts what it served (decoded).
    let per_dataset = |bytes: u64| bytes as f64 / report.dataset_bytes.max(1) as f64;
    let beside = |cached: u64, uncached: u64| {
        format!(
            "{:.2}x; no cache (run, {} + {} epochs): {:.2}x; **{:.2}x** no cache",
            per_dataset(cached),
            report.node_epochs[0],
            report.node_epochs[1],
            per_dataset(uncached),
            cached as f64 / uncached.max(1) as f64
        )
    };
    println!("| bytes over the links (the wire) / dataset | {} |", beside(report.link_bytes, no_cache_bytes));
    println!(
        "| bytes the hub served (its count, decoded) / dataset | {} |",
        beside(report.hub_bytes, no_cache_served)
    );
    println!("| elapsed | {:.1} s |", report.elapsed.as_secs_f64());
    println!();
    println!("| phase | calls | failed |");
    println!("|---|---|---|");
    for phase in &report.phases {
        println!("| {} | {} | {} |", phase.name, phase.calls, phase.failures);
    }
    for skipped in &report.skipped {
        println!("\nskipped: {skipped}");
    }
    for (code, message) in &report.examples {
        println!("\nfirst {code}: {message}");
    }
    if report.wrong_bytes > 0 || report.hung > 0 || !report.failures.is_empty() {
        std::process::exit(1);
    }
}
