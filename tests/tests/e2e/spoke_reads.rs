//! The spoke answers exactly like the hub, cold and warm; a warm read never calls the
//! hub; concurrent cold readers of one shard cause one upstream transfer of it.

#![allow(clippy::unwrap_used)]

use futures::future::join_all;
use shardcache_client::{Client, Range};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, sha256, spoke_options, write_pattern};
use spoke_cache::store::entry::ChunkIndex;

async fn stream_all(
    client: &Client,
    dataset: &str,
    shard: &str,
    offset: u64,
    length: Option<u64>,
) -> Vec<u8> {
    client.stream_shard(dataset, shard, offset, length).await.unwrap().read_to_end().await.unwrap()
}

/// Every read RPC, compared between hub and spoke.
async fn same_answers(hub: &Client, spoke: &Client, len: u64) {
    let (hs, ss) = (hub.stat("ds", "s.bin").await.unwrap(), spoke.stat("ds", "s.bin").await.unwrap());
    assert_eq!((hs.size, &hs.version, hs.record_size), (ss.size, &ss.version, ss.record_size));
    let chunk = 256 << 10;
    for (offset, length) in
        [(0, 0), (0, 1), (chunk - 1, 2), (chunk, chunk), (len - 10, 10), (12345, 16384), (len, 0)]
    {
        let range = Range::new("ds", "s.bin", offset, length);
        let (a, b) = (hub.read_range(&range).await.unwrap(), spoke.read_range(&range).await.unwrap());
        assert_eq!((a.data, a.version), (b.data, b.version), "{offset}+{length}");
    }
    let batch: Vec<_> =
        (0..24).map(|i| Range::new("ds", "s.bin", (i * 37_000) % (len - 16384), 16384)).collect();
    let (a, b) = (hub.read_ranges(&batch).await.unwrap(), spoke.read_ranges(&batch).await.unwrap());
    // The same bytes, versions and CRCs (not the same bytes on the wire: the hub
    // compresses what pays, the spoke does not).
    let same = |v: &[shardcache_client::Verified]| {
        v.iter().map(|r| (r.offset, r.data.clone(), r.version.clone(), r.crc32c)).collect::<Vec<_>>()
    };
    assert_eq!(same(&a), same(&b));
    for (offset, length) in [(0, None), (100, Some(chunk * 2)), (chunk * 3 + 7, None)] {
        assert_eq!(
            sha256(&stream_all(hub, "ds", "s.bin", offset, length).await),
            sha256(&stream_all(spoke, "ds", "s.bin", offset, length).await)
        );
    }
    let (hl, sl) = (hub.list_shards("ds").await.unwrap(), spoke.list_shards("ds").await.unwrap());
    assert_eq!(
        hl.iter().map(|s| (&s.shard, s.size, &s.version)).collect::<Vec<_>>(),
        sl.iter().map(|s| (&s.shard, s.size, &s.version)).collect::<Vec<_>>()
    );
    // Errors too: same code, same words (one read service serves both).
    let mut stale = Range::new("ds", "s.bin", 0, 1);
    stale.expected_version = Some("an-old-version".into());
    for range in [
        Range::new("ds", "../x", 0, 1),
        Range::new("ds", "nope.bin", 0, 1),
        Range::new("ds", "s.bin", len, 1),
        Range::new("ds", "s.bin", 0, 1 << 30),
        stale,
    ] {
        let (a, b) = (hub.read_range(&range).await.unwrap_err(), spoke.read_range(&range).await.unwrap_err());
        assert_eq!(status(a), status(b), "{range:?}");
    }
    let (a, b) = (
        hub.list_shards_page("ds", 10, "../bad-token").await.unwrap_err(),
        spoke.list_shards_page("ds", 10, "../bad-token").await.unwrap_err(),
    );
    assert_eq!(status(a), status(b));
}

/// The code and message of a failed call.
fn status(err: shardcache_client::Error) -> (tonic::Code, String) {
    match err {
        shardcache_client::Error::Status { status, .. } => (status.code(), status.message().to_owned()),
        other => panic!("not a status: {other}"),
    }
}

#[tokio::test]
async fn spoke_bytes_equal_hub_bytes_cold_and_warm_and_warm_reads_stay_local() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let len = 10 * (256 << 10) + 777; // ten chunks and a short one
    write_pattern(&root.path().join("ds/s.bin"), len as usize, 3);
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    let (hub_client, spoke_client) = (hub.client().await, spoke.client().await);

    same_answers(&hub_client, &spoke_client, len).await; // cold (and warming)
    // Make sure the whole shard is in, then count hub traffic during warm reads.
    spoke.control().await.prefetch("ds", &["s.bin".into()], 0).await.unwrap().finish().await.unwrap();
    let before = hub.stats.snapshot();
    let mut again = Vec::new();
    for _ in 0..3 {
        again.push(stream_all(&spoke_client, "ds", "s.bin", 0, None).await);
        spoke_client.read_range(&Range::new("ds", "s.bin", 5000, 16384)).await.unwrap();
        spoke_client.stat("ds", "s.bin").await.unwrap();
    }
    let after = hub.stats.snapshot();
    assert_eq!(after.read_requests, before.read_requests, "a warm read went to the hub");
    assert_eq!(after.bytes_served, before.bytes_served);
    assert_eq!(after.stat_requests, before.stat_requests, "inside the TTL no revalidation");
    assert_eq!(sha256(&again[2]), sha256(&std::fs::read(root.path().join("ds/s.bin")).unwrap()));
    same_answers(&hub_client, &spoke_client, len).await; // warm

    let status = spoke.control().await.status().await.unwrap();
    let ds = status.datasets.iter().find(|d| d.dataset == "ds").unwrap();
    assert_eq!(ds.cached_bytes, len);
    assert!(ds.hit_requests > 0 && ds.miss_requests > 0, "{ds:?}");
    assert_eq!(ds.upstream_bytes, len, "each byte crossed the link once");
    assert_eq!(spoke.metric("shardcache_spoke_upstream_bytes_total{dataset=\"ds\"}").await, len as f64);
    assert_eq!(spoke.metric("shardcache_spoke_used_bytes").await, len as f64);
}

#[tokio::test]
async fn sixty_four_cold_readers_cause_one_upstream_transfer() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 1, 4 << 20); // 16 chunks of 256 KiB
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    let client = spoke.client().await;
    let readers = (0..64).map(|_| {
        let client = client.clone();
        async move { stream_all(&client, "ds", "shard-00000.bin", 0, None).await }
    });
    let results = join_all(readers).await;
    let want = sha256(&std::fs::read(dir.join("shard-00000.bin")).unwrap());
    assert!(results.iter().all(|r| sha256(r) == want));
    let served = hub.stats.snapshot();
    assert_eq!(served.bytes_served, 4 << 20, "the shard crossed the link exactly once");
    assert_eq!(served.read_requests, 16, "one fetch per chunk");
}

#[tokio::test]
async fn prefetch_reports_progress_and_pin_evict_work() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "ds", 4, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    let control = spoke.control().await;

    let plan = vec!["shard-00002.bin".to_owned(), "shard-00000.bin".to_owned()];
    let mut stream = control.prefetch("ds", &plan, 1).await.unwrap();
    let mut reports = Vec::new();
    while let Some(progress) = stream.next().await.unwrap() {
        reports.push(progress);
    }
    let last = reports.last().unwrap();
    assert_eq!(
        (last.shards_total, last.shards_done, last.bytes_done, last.bytes_fetched),
        (2, 2, 2 << 20, 2 << 20)
    );
    assert_eq!(reports[1].last_shard, "ds/shard-00002.bin", "the plan's order is kept");
    // Whole dataset: the two cached shards are not fetched again.
    let all = control.prefetch("ds", &[], 0).await.unwrap().finish().await.unwrap();
    assert_eq!((all.shards_done, all.bytes_fetched), (4, 2 << 20));

    assert_eq!(control.pin("ds", &["shard-00001.bin".into()], true).await.unwrap(), 1);
    let evicted = control.evict("ds", &[]).await.unwrap();
    assert_eq!((evicted.shards, evicted.bytes), (4, 4 << 20), "evict ignores pins: it is an explicit order");
    let status = control.status().await.unwrap();
    assert_eq!(status.used_bytes, 0);
    // Evicted means refetched on the next read, and still correct.
    let before = hub.stats.snapshot().bytes_served;
    let data = spoke.client().await.read_range(&Range::new("ds", "shard-00003.bin", 0, 16384)).await.unwrap();
    assert_eq!(data.data, std::fs::read(root.path().join("ds/shard-00003.bin")).unwrap()[..16384]);
    assert!(hub.stats.snapshot().bytes_served > before);
}

/// Polls (bounded) until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen within 10 s");
}

#[tokio::test]
async fn first_touch_fetches_the_whole_shard_or_reads_ahead_when_configured() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "ds", 2, 4 << 20); // 16 chunks of 256 KiB each
    let hub = TestHub::start(root.path()).await;

    // Whole-shard fetch (the default): one 16 KiB read brings the whole shard in.
    let cache = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache.path(), spoke_options(&hub.endpoint)).await;
    spoke.client().await.read_range(&Range::new("ds", "shard-00000.bin", 0, 16384)).await.unwrap();
    let entry = spoke.cache.cached_entry("ds", "shard-00000.bin").unwrap();
    eventually("whole-shard fetch", || entry.is_complete()).await;
    assert_eq!(hub.stats.snapshot().bytes_served, 4 << 20);

    // Whole-shard fetch off, read-ahead of 2: a reader going on where its last read
    // ended in chunk 5 brings chunk 6, then 6 and 7 (the window grows with the run).
    let cache = tempfile::tempdir().unwrap();
    let mut options = spoke_options(&hub.endpoint);
    options.cache.fetch_whole_shard = false;
    let spoke = TestSpoke::start(cache.path(), options).await;
    let client = spoke.client().await;
    let read = |offset: u64| {
        let client = client.clone();
        async move { client.read_range(&Range::new("ds", "shard-00001.bin", offset, 16384)).await.unwrap() }
    };
    read(5 * (256 << 10)).await;
    spoke.settled().await;
    let entry = spoke.cache.cached_entry("ds", "shard-00001.bin").unwrap();
    let present = || (0..16).filter(|&i| entry.has_chunk(ChunkIndex(i))).collect::<Vec<u64>>();
    assert_eq!(present(), [5], "one read is no sequential reader: nothing read ahead");
    read(5 * (256 << 10) + 16384).await;
    read(5 * (256 << 10) + 2 * 16384).await;
    eventually("read-ahead", || entry.has_chunk(ChunkIndex(6)) && entry.has_chunk(ChunkIndex(7))).await;
    spoke.settled().await;
    assert_eq!(present(), [5, 6, 7]);
    // A read elsewhere starts no run.
    read(12 * (256 << 10) + 100).await;
    spoke.settled().await;
    assert_eq!(present(), [5, 6, 7, 12]);
}

#[tokio::test]
async fn concurrent_first_reads_of_a_shard_ask_the_hub_once() {
    // A trainer's first step touches each shard from hundreds of reads at once; each
    // asking the hub for the shard's version would be shed by the hub's limit.
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 1, 4 << 20);
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    let client = spoke.client().await;
    let want = std::fs::read(dir.join("shard-00000.bin")).unwrap();
    let reads = (0..200u64).map(|i| {
        let client = client.clone();
        async move {
            let offset = (i * 16384) % (4 << 20);
            let got = client.read_range(&Range::new("ds", "shard-00000.bin", offset, 16384)).await.unwrap();
            (offset, got.data)
        }
    });
    for (offset, data) in join_all(reads).await {
        assert_eq!(data, want[offset as usize..offset as usize + 16384]);
    }
    assert_eq!(hub.stats.snapshot().stat_requests, 1, "one StatShard for 200 concurrent first reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_reads_ending_on_one_chunk_fetch_it_once() {
    // Reads that cover a whole chunk start its fetch alongside the shard's stat; many at
    // once (ranks touching a new shard) must not each bring it over the link.
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 1, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    (options.cache.fetch_whole_shard, options.cache.read_ahead_chunks) = (false, 0);
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let client = spoke.client().await;
    let want = std::fs::read(dir.join("shard-00000.bin")).unwrap();
    let chunk = 256 << 10; // spoke_options' chunk size
    let reads = (0..32u64).map(|i| {
        let client = client.clone();
        async move {
            // Each read ends where chunk 0 ends.
            let offset = chunk - 4096 * (i + 1);
            let got = client
                .read_range(&Range::new("ds", "shard-00000.bin", offset, 4096 * (i + 1)))
                .await
                .unwrap();
            (offset, got.data)
        }
    });
    for (offset, data) in join_all(reads).await {
        assert_eq!(data, want[offset as usize..chunk as usize]);
    }
    spoke.settled().await;
    assert_eq!(hub.stats.snapshot().bytes_served, chunk, "chunk 0 crossed the link once");
}
