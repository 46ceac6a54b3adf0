//! `group-bench`: what owner routing costs a warm trainer. One node reads random batches
//! (24 x 16 KiB samples per `ReadRanges`, 64 batches in flight) from a warm single spoke
//! and from a warm group of three spokes (`--peers`; the SDK splits each batch by owner
//! and puts it back in order), alternating, twice each, in one run. Checks that every
//! measured read was a hit (the spokes' miss counters do not move).
//!
//! `--gray`: a gray failure instead. Two cold groups of three, started afresh each round,
//! each member reaching the hub over a 60 ms link capped at 2 Gbit/s (`wan-proxy`), 64
//! shards of 16 MiB: a healthy one, and one
//! whose first member's link hangs (`--faults stall`) while the member itself stays up
//! and SERVING. One client
//! reads every sample of the dataset once in random batches (the cold epoch: misses
//! fetched through the group), then once more (warm); samples/s of each group and their
//! ratio, the hedges the client sent, and what crossed the healthy link in the cold epoch
//! per byte of the dataset (the emulator's count, once the link is still; the hub's
//! compression off, so bytes are bytes). Checks every byte read against the dataset's
//! files.
//!
//! ```sh
//! cargo build --release --workspace --bins && target/release/group-bench [--gray]
//! ```

#![allow(clippy::unwrap_used)] // a benchmark: failing loudly is the right response

use std::time::Instant;

use futures::{StreamExt, stream};
use shardcache_client::{CacheClient, Client, Range};
use shardcache_tests::{
    HubProcess, ProxyProcess, SpokeProcess, free_loopback_addr, make_dataset, next_random, wire,
};

const SHARDS: u32 = 8;
const SHARD: u64 = 16 << 20;
const SAMPLE: u64 = 16 << 10;
const BATCH: usize = 24;
const IN_FLIGHT: usize = 64;
const BATCHES: usize = 4000;
/// `--gray`'s dataset: 1 GiB, a cold epoch of several seconds over the capped link.
const GRAY_SHARDS: u32 = 64;

/// Samples per second reading `BATCHES` random batches through `client`.
async fn samples_per_s(client: &Client, seed: u64) -> f64 {
    let mut rng = seed;
    let batches: Vec<Vec<Range>> = (0..BATCHES)
        .map(|_| {
            (0..BATCH)
                .map(|_| {
                    let shard = (next_random(&mut rng) % u64::from(SHARDS)) as u32;
                    let offset = next_random(&mut rng) % (SHARD / SAMPLE) * SAMPLE;
                    Range::new("c4", shardcache_cli::dataset_gen::shard_name(shard), offset, SAMPLE)
                })
                .collect()
        })
        .collect();
    let started = Instant::now();
    stream::iter(batches)
        .map(|ranges| {
            let client = client.clone();
            async move { client.read_ranges(&ranges).await.unwrap() }
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|_| async {})
        .await;
    (BATCHES * BATCH) as f64 / started.elapsed().as_secs_f64()
}

async fn misses(control: &CacheClient) -> u64 {
    control.status().await.unwrap().datasets.iter().map(|d| d.miss_requests).sum()
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--gray") {
        return gray().await;
    }
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", SHARDS, SHARD);
    let hub = HubProcess::start(root.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let single = SpokeProcess::start(&hub.endpoint, dirs[0].path(), &[]);
    let addrs: Vec<String> = (0..3).map(|_| free_loopback_addr()).collect();
    let peers = addrs.iter().map(|a| format!("http://{a}")).collect::<Vec<_>>().join(",");
    let members: Vec<SpokeProcess> = addrs
        .iter()
        .zip(&dirs[1..])
        .map(|(addr, dir)| {
            let me = format!("http://{addr}");
            SpokeProcess::start_at(&hub.endpoint, dir.path(), addr, &["--peers", &peers, "--peer-self", &me])
        })
        .collect();
    assert_eq!(members.len(), 3);
    let (single_control, group_control) =
        (CacheClient::connect(&single.endpoint).await.unwrap(), CacheClient::connect(&peers).await.unwrap());
    single_control.prefetch("c4", &[], 0).await.unwrap().finish().await.unwrap();
    group_control.prefetch("c4", &[], 0).await.unwrap().finish().await.unwrap();
    let (single_client, group_client) =
        (Client::connect(&single.endpoint).await.unwrap(), Client::connect(&peers).await.unwrap());
    let before = (misses(&single_control).await, misses(&group_control).await, hub.bytes_served().await);
    let mut rows = Vec::new();
    for round in 0..2 {
        let one = samples_per_s(&single_client, 2 * round + 1).await;
        let group = samples_per_s(&group_client, 2 * round + 2).await;
        rows.push((one, group));
    }
    let after = (misses(&single_control).await, misses(&group_control).await, hub.bytes_served().await);
    assert_eq!(after.0, before.0, "every single spoke's measured read was a hit");
    // A read the client hedged to another member misses there and is served by the
    // owner (it joins the owner's copy): no byte crosses the link for it.
    assert_eq!(after.2, before.2, "the warm group fetched nothing from the hub");
    println!(
        "{SHARDS} shards x 16 MiB, warm; random batches of {BATCH} x 16 KiB, {IN_FLIGHT} in flight, {BATCHES} batches; \
         group reads a member missed and took from another's copy: {}, hedges sent: {}",
        after.1 - before.1,
        group_client.hedges().sent.load(std::sync::atomic::Ordering::Relaxed)
    );
    println!("| round | single spoke: samples/s | group of 3: samples/s | group / single |");
    println!("|---|---|---|---|");
    for (round, (one, group)) in rows.iter().enumerate() {
        println!("| {} | {one:.0} | {group:.0} | {:.2} |", round + 1, group / one);
    }
}

/// A group of three started afresh on `hub`, over a 60 ms 2 Gbit/s link; with `gray`, the first
/// member's link hangs (the links are returned with the group, to keep them up).
fn start_group(
    hub: &HubProcess,
    gray: bool,
    dirs: &[tempfile::TempDir],
) -> (String, Vec<SpokeProcess>, [Option<ProxyProcess>; 2]) {
    let hub_addr = hub.endpoint.trim_start_matches("http://").parse().unwrap();
    let link = ProxyProcess::start(hub_addr, &["--rtt", "60ms", "--rate", "2Gbit"]);
    let stalled = gray.then(|| {
        ProxyProcess::start(hub_addr, &["--rtt", "60ms", "--rate", "2Gbit", "--faults", "stall:1000h"])
    });
    let addrs: Vec<String> = (0..3).map(|_| free_loopback_addr()).collect();
    let peers = addrs.iter().map(|a| format!("http://{a}")).collect::<Vec<_>>().join(",");
    let members = addrs
        .iter()
        .zip(dirs)
        .enumerate()
        .map(|(i, (addr, dir))| {
            let me = format!("http://{addr}");
            let upstream = match (&stalled, i) {
                (Some(proxy), 0) => proxy.endpoint.clone(),
                _ => link.endpoint.clone(),
            };
            SpokeProcess::start_at(&upstream, dir.path(), addr, &["--peers", &peers, "--peer-self", &me])
        })
        .collect();
    (peers, members, [Some(link), stalled])
}

/// Every sample of the dataset once, in random batches through `client`, checked
/// against `files`; samples/s.
async fn epoch(client: &Client, files: &[Vec<u8>], seed: u64) -> f64 {
    let samples_per_shard = SHARD / SAMPLE;
    let mut order: Vec<(u32, u64)> =
        (0..files.len() as u32).flat_map(|s| (0..samples_per_shard).map(move |i| (s, i * SAMPLE))).collect();
    let mut rng = seed;
    for i in (1..order.len()).rev() {
        order.swap(i, (next_random(&mut rng) % (i as u64 + 1)) as usize);
    }
    let started = Instant::now();
    stream::iter(order.chunks(BATCH))
        .map(|batch| {
            let client = client.clone();
            async move {
                let ranges: Vec<Range> = batch
                    .iter()
                    .map(|&(s, o)| Range::new("c4", shardcache_cli::dataset_gen::shard_name(s), o, SAMPLE))
                    .collect();
                (batch, client.read_ranges(&ranges).await.unwrap())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|(batch, read)| {
            for (&(s, o), got) in batch.iter().zip(read) {
                assert!(got.data == files[s as usize][o as usize..(o + SAMPLE) as usize], "shard {s} at {o}");
            }
            async {}
        })
        .await;
    order.len() as f64 / started.elapsed().as_secs_f64()
}

/// `--gray`: see the module docs.
async fn gray() {
    let root = tempfile::tempdir().unwrap();
    let dir = make_dataset(root.path(), "c4", GRAY_SHARDS, SHARD);
    let files: Vec<Vec<u8>> = (0..GRAY_SHARDS)
        .map(|s| std::fs::read(dir.join(shardcache_cli::dataset_gen::shard_name(s))).unwrap())
        .collect();
    // Its compression off: the link's bytes are the bytes fetched.
    let hub = HubProcess::start(root.path(), &["--link-compression-level", "0"]);
    println!(
        "{GRAY_SHARDS} shards x 16 MiB, cold groups of 3 over a 60 ms 2 Gbit/s link, the hub's compression off; every sample once in random batches of {BATCH} x 16 KiB, {IN_FLIGHT} in flight, then again warm"
    );
    println!(
        "| round | healthy group: cold / warm samples/s | one member gray: cold / warm samples/s | gray / healthy: cold / warm | hedges sent (healthy / gray) | link bytes / dataset, cold (healthy / gray; the wire) |"
    );
    println!("|---|---|---|---|---|---|");
    for round in 0..3 {
        let mut rates = Vec::new();
        for gray in [false, true] {
            let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
            let (peers, members, links) = start_group(&hub, gray, &dirs);
            let client = Client::connect(&peers).await.unwrap();
            let control = CacheClient::connect(&peers).await.unwrap();
            let cold = epoch(&client, &files, 2 * round + 1).await;
            // What the healthy link carried (the emulator's count) once it is still: with
            // no member fetching, or (gray) with the gray member's fetches hung on its own
            // stalled link, which delivers nothing.
            let healthy = links[0].as_ref().unwrap();
            let fetched = if gray {
                wire::settled_link(healthy).await.to_client
            } else {
                let (count, received) = wire::settled_spoke(healthy, &control).await;
                assert!(wire::agrees(received, count.to_client), "the group {received}, the wire {count:?}");
                count.to_client
            };
            let warm = epoch(&client, &files, 2 * round + 2).await;
            let hedges = client.hedges().sent.load(std::sync::atomic::Ordering::Relaxed);
            let dataset = u64::from(GRAY_SHARDS) * SHARD;
            rates.push((cold, warm, hedges, fetched as f64 / dataset as f64));
            drop((members, links));
        }
        let ((hc, hw, hh, hf), (gc, gw, gh, gf)) = (rates[0], rates[1]);
        println!(
            "| {} | {hc:.0} / {hw:.0} | {gc:.0} / {gw:.0} | {:.2} / {:.2} | {hh} / {gh} | {hf:.3} / {gf:.3} |",
            round + 1,
            gc / hc,
            gw / hw
        );
    }
}
