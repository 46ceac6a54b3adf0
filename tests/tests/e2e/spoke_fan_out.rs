//! What one request can make the spoke do is bounded: a batch of 1-byte reads over many
//! cold shards does not start a background fetch of every shard it touches, and
//! `ReadCached` (a member's read) obeys `--max-read` like every other read.
#![allow(clippy::unwrap_used)]

use shardcache_client::{Client, Range};
use shardcache_proto::v1::{ReadRangeRequest, cache_control_client::CacheControlClient};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, spoke_options};
use spoke_cache::read::path::SPECULATIVE_SHARDS_PER_CALL;
use tonic::Code;

#[tokio::test]
async fn a_batch_over_many_cold_shards_fetches_what_it_reads_and_a_bounded_share_more() {
    const SHARDS: u32 = 200;
    const SHARD: u64 = 1 << 20;
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "wide", SHARDS, SHARD);
    let hub = TestHub::start(root.path()).await;
    let options = spoke_options(&hub.endpoint);
    let chunk = options.cache.chunk_size;
    let dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(dir.path(), options).await;
    let client = Client::connect(&spoke.endpoint).await.unwrap();

    // One byte of each shard, in batches of the largest count a call takes.
    let ranges: Vec<Range> =
        (0..SHARDS).map(|i| Range::new("wide", format!("shard-{i:05}.bin"), 0, 1)).collect();
    for batch in ranges.chunks(100) {
        let read = client.read_ranges(batch).await.unwrap();
        assert!(read.iter().all(|r| r.data.len() == 1));
    }
    spoke.settled().await;

    // Each shard's first chunk was read; whole-shard fetches and read-ahead were started
    // for at most SPECULATIVE_SHARDS_PER_CALL shards of each call. Before the bound,
    // every shard touched was fetched whole: 200 MiB for 200 bytes read.
    let served = hub.stats.snapshot().bytes_served;
    let calls = SHARDS.div_ceil(100) as u64;
    let bound = SHARDS as u64 * chunk + calls * SPECULATIVE_SHARDS_PER_CALL as u64 * SHARD;
    assert!(served <= bound, "the hub served {served} bytes for 200 one-byte reads (bound {bound})");
    assert!(served < SHARDS as u64 * SHARD / 2, "{served}");
}

#[tokio::test]
async fn read_cached_obeys_max_read() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 1, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.max_read = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(dir.path(), options).await;
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    client.stream_shard("c4", "shard-00000.bin", 0, None).await.unwrap().read_to_end().await.unwrap();
    spoke.settled().await;

    let mut control = CacheControlClient::connect(spoke.endpoint.clone()).await.unwrap();
    let request = |length| ReadRangeRequest {
        dataset: "c4".into(),
        shard: "shard-00000.bin".into(),
        offset: 0,
        length,
        ..Default::default()
    };
    assert_eq!(control.read_cached(request(64 << 10)).await.unwrap().into_inner().data.len(), 64 << 10);
    let refused = control.read_cached(request(256 << 10)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("65536"), "names the limit: {refused:?}");
}

#[tokio::test]
async fn entries_that_hold_no_bytes_are_bounded_and_cached_ones_stay() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 40, 64 << 10);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.empty_entries_kept = 8;
    let dir = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(dir.path(), options).await;
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    // One shard read (it holds bytes), then a stat of every shard: each stat makes an
    // entry with no bytes.
    client.read_range(&Range::new("c4", "shard-00000.bin", 0, 10)).await.unwrap();
    spoke.settled().await;
    for i in 0..40 {
        client.stat("c4", &format!("shard-{i:05}.bin")).await.unwrap();
    }
    let entries = spoke.cache.entries();
    let empty = entries.iter().filter(|e| e.cached_bytes() == 0).count();
    assert!(empty <= 8 + 1, "{empty} entries with no bytes kept (bound 8, and the newest)");
    assert!(
        entries.iter().any(|e| e.shard == "shard-00000.bin" && e.cached_bytes() > 0),
        "the cached one stays"
    );
    // A swept shard is looked up again when read.
    let read = client.read_range(&Range::new("c4", "shard-00001.bin", 0, 10)).await.unwrap();
    assert_eq!(read.data.len(), 10);
}
