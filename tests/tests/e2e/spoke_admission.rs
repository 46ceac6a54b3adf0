//! Every reader pays once: a spoke never sends more over the long link than its readers
//! would have fetched without it, plus one copy of what it keeps. A map-style random
//! reader through a cache half the dataset's size brings what it reads plus one fill of
//! the cache, and less in its next epoch (status shows it per job); one tenant's scan
//! leaves another's working set in the cache; a client's hedge to another member of a
//! group joins the owner's fetch rather than fetching again.

#![allow(clippy::unwrap_used)]

use std::{collections::HashMap, time::Duration};

use futures::{StreamExt, stream};
use shardcache_client::{CacheClient, Client, ConnectOptions, Range};
use shardcache_proto::v1::StatusResponse;
use shardcache_serving::{auth::Authenticator, server::Security};
use shardcache_tests::{TestGroup, TestHub, TestSpoke, make_dataset, spoke_options, token_file};
use shardcache_wan::{LinkConfig, WanProxy};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const RECORD: u64 = 16 * KIB;

/// Every record of `shards` shards, in a shuffled order (shard, offset).
fn shuffled(shards: u32, shard_size: u64, seed: u64) -> Vec<(u32, u64)> {
    shardcache_tests::shuffled_records(shards, shard_size, RECORD, seed)
}

/// Reads `order` in batches of 32 records (a DataLoader's), 4 in flight, checking every
/// byte against the files in `dir`.
async fn read_records(client: &Client, dataset: &str, dir: &std::path::Path, order: &[(u32, u64)]) {
    let files: HashMap<u32, Vec<u8>> = order
        .iter()
        .map(|&(s, _)| s)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|s| (s, std::fs::read(dir.join(shardcache_cli::dataset_gen::shard_name(s))).unwrap()))
        .collect();
    stream::iter(order.chunks(32))
        .map(|batch| {
            let client = client.clone();
            let ranges: Vec<Range> = batch
                .iter()
                .map(|&(s, o)| Range::new(dataset, shardcache_cli::dataset_gen::shard_name(s), o, RECORD))
                .collect();
            async move { (batch, client.read_ranges(&ranges).await.unwrap()) }
        })
        .buffer_unordered(4)
        .for_each(|(batch, read)| {
            for (&(s, o), got) in batch.iter().zip(read) {
                assert!(got.data == files[&s][o as usize..(o + RECORD) as usize], "shard {s} at {o}");
            }
            async {}
        })
        .await;
}

/// The status row of `job`'s `epoch`.
fn job(status: &StatusResponse, job: &str, epoch: u64) -> shardcache_proto::v1::JobStatus {
    status
        .jobs
        .iter()
        .find(|j| j.job == job && j.epoch == epoch)
        .cloned()
        .unwrap_or_else(|| panic!("{status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_reader_through_a_half_size_spoke_brings_what_it_reads_plus_one_fill_and_less_next_epoch() {
    // 32 MiB of 16 KiB records in 512 KiB chunks, through a spoke with room for 16 MiB.
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "maps", 16, 2 * MIB);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    let capacity = 16 * MIB;
    options.cache.capacity = capacity;
    options.cache.chunk_size = 512 * KIB;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let client = spoke.client().await;
    for epoch in 0..2 {
        let reader = client.for_job("maps", epoch).unwrap();
        read_records(&reader, "maps", &dir, &shuffled(16, 2 * MIB, epoch + 1)).await;
        spoke.settled().await;
    }
    let status = spoke.control().await.status().await.unwrap();
    let (first, second) = (job(&status, "maps", 0), job(&status, "maps", 1));
    assert_eq!(first.bytes, 32 * MIB);
    assert!(first.hub_bytes <= first.bytes + capacity, "epoch 1: {first:?}");
    assert!(second.hub_bytes < first.hub_bytes && second.hub_bytes <= second.bytes, "epoch 2: {second:?}");
    assert!(second.hit_bytes > 0, "what was kept was read from the cache: {second:?}");
    // What status shows per job is what crossed: the hub's count of what it served.
    assert_eq!(first.hub_bytes + second.hub_bytes, hub.stats.snapshot().bytes_served);
    assert!(status.used_bytes <= capacity);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefetch_counts_in_its_own_row_not_in_the_reads_beside_it() {
    // An operator's prefetch brings the dataset; the reads after it cost the link nothing
    // and must not be shown (or warned about) as reads that cost more than they read.
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "pre", 4, MIB);
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    spoke.control().await.prefetch("pre", &[], 0).await.unwrap().finish().await.unwrap();
    read_records(&spoke.client().await, "pre", &dir, &shuffled(4, MIB, 7)).await;
    let status = spoke.control().await.status().await.unwrap();
    let prefetch = job(&status, spoke_cache::observe::job_counters::PREFETCH_JOB, 0);
    assert_eq!((prefetch.bytes, prefetch.hub_bytes), (0, 4 * MIB), "{status:?}");
    assert!(prefetch.link_bytes > 0 && hub.stats.snapshot().bytes_served == 4 * MIB, "{prefetch:?}");
    let reads = job(&status, "", 0);
    assert_eq!((reads.bytes, reads.hit_bytes, reads.link_bytes), (4 * MIB, 4 * MIB, 0), "{reads:?}");
}

fn tenant(token: &str) -> ConnectOptions {
    ConnectOptions { tls: None, token: Some(token.to_owned()) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_scan_of_three_times_the_cache_leaves_anothers_working_set() {
    // Alice trains on 16 MiB, half the cache; Bob scans 96 MiB once, while Alice reads
    // her next epoch. Both with tokens, as tenants of a shared spoke are.
    let (root, cache_dir, files) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let train = make_dataset(root.path(), "train", 8, 2 * MIB);
    let scan = make_dataset(root.path(), "scan", 12, 8 * MIB);
    let hub = TestHub::start(root.path()).await;
    let tokens_path = files.path().join("tokens");
    let tokens = token_file(&tokens_path, &[("alice", "train"), ("bob", "scan"), ("ops", "* control")]);
    let mut options = spoke_options(&hub.endpoint);
    options.security = Security { tls: None, auth: Authenticator::with_token_file(&tokens_path).unwrap() };
    options.cache.capacity = 32 * MIB;
    options.cache.chunk_size = 512 * KIB;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let alice = Client::connect_with(&spoke.endpoint, &tenant(&tokens[0])).await.unwrap();
    let bob = Client::connect_with(&spoke.endpoint, &tenant(&tokens[1])).await.unwrap();
    read_records(&alice.for_job("train", 0).unwrap(), "train", &train, &shuffled(8, 2 * MIB, 1)).await;
    spoke.settled().await;
    let scanning = tokio::spawn(async move {
        for s in 0..12 {
            let name = shardcache_cli::dataset_gen::shard_name(s);
            let mut stream = bob.stream_shard("scan", &name, 0, None).await.unwrap();
            let mut got = Vec::new();
            while let Some(chunk) = stream.next_chunk().await.unwrap() {
                got.extend_from_slice(&chunk.data);
            }
            assert!(got == std::fs::read(scan.join(&name)).unwrap(), "{name}");
        }
    });
    read_records(&alice.for_job("train", 1).unwrap(), "train", &train, &shuffled(8, 2 * MIB, 2)).await;
    scanning.await.unwrap();
    spoke.settled().await;
    let ops = CacheClient::connect_with(&spoke.endpoint, &tenant(&tokens[2])).await.unwrap();
    let status = ops.status().await.unwrap();
    let next = job(&status, "train", 1);
    assert!(next.hit_bytes * 100 >= next.bytes * 95, "alice's next epoch: {next:?}");
    let held: HashMap<&str, u64> =
        status.principals.iter().map(|p| (p.principal.as_str(), p.held_bytes)).collect();
    assert_eq!(held.get("alice"), Some(&(16 * MIB)), "{status:?}");
    // Bob's scan cost the link what it read, no more.
    let scanned = status.datasets.iter().find(|d| d.dataset == "scan").unwrap();
    assert!(scanned.upstream_bytes <= 96 * MIB, "{scanned:?}");
    // Alice sees her own row, not Bob's.
    let hers = CacheClient::connect_with(&spoke.endpoint, &tenant(&tokens[0]))
        .await
        .unwrap()
        .status()
        .await
        .unwrap();
    assert_eq!(hers.principals.iter().map(|p| p.principal.as_str()).collect::<Vec<_>>(), ["alice"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_to_another_member_joins_the_owners_fetch_and_the_group_fetches_once() {
    // Three spokes, each 200 ms from the hub. The client learns the members' answer
    // times on a warm dataset (milliseconds), so that cold reads (a round trip to the
    // hub and more) outlast its hedge delay and are hedged to the next member.
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "warm", 6, MIB);
    make_dataset(root.path(), "cold", 12, MIB);
    let hub = TestHub::start(root.path()).await;
    let link = WanProxy::start(
        "127.0.0.1:0".parse().unwrap(),
        hub.addr,
        LinkConfig::rtt(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let members = TestGroup::start(3, |_| link.endpoint()).await;
    let group = Client::connect(&members.spec()).await.unwrap();
    CacheClient::connect(&members.spec())
        .await
        .unwrap()
        .prefetch("warm", &[], 0)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let warm: Vec<Range> =
        (0..6).map(|s| Range::new("warm", shardcache_cli::dataset_gen::shard_name(s), 0, 4 * KIB)).collect();
    for _ in 0..20 {
        group.read_ranges(&warm).await.unwrap();
    }
    let before = hub.stats.snapshot().bytes_served;
    let sent_before = group.hedges().sent.load(std::sync::atomic::Ordering::Relaxed);
    let cold: Vec<Range> = (0..12)
        .flat_map(|s| {
            (0..4).map(move |q| {
                Range::new("cold", shardcache_cli::dataset_gen::shard_name(s), q * MIB / 4, MIB / 4)
            })
        })
        .collect();
    stream::iter(cold.chunks(3))
        .map(|batch| {
            let group = group.clone();
            async move { group.read_ranges(batch).await.unwrap() }
        })
        .buffer_unordered(8)
        .for_each(|_| async {})
        .await;
    for spoke in &members.spokes {
        spoke.settled().await;
    }
    let hedges = group.hedges().sent.load(std::sync::atomic::Ordering::Relaxed) - sent_before;
    assert!(hedges >= 1, "the cold reads were hedged");
    // The members hedged to answered with the owners' bytes, and said so: no owner lost
    // a race for it, so none was demoted (its shards then fetched by the next member).
    let demoted = group.hedges().demotions.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((demoted, group.failing_members()), (0, vec![]), "{hedges} hedges");
    assert_eq!(
        hub.stats.snapshot().bytes_served - before,
        12 * MIB,
        "each chunk crossed once, {hedges} hedges"
    );
}
