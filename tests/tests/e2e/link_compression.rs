//! Compression on the long link (shardcache_proto::encoding), on `shardcache gen --tokens
//! zipf` data: a reader that says it takes zstd gets the messages that compress as zstd
//! frames, checked against the CRC32C of the decoded bytes; one that does not say so gets
//! the bytes as they are; incompressible messages go as they are. Through a spoke: the cached bytes are the shard's, and the
//! spoke counts what they took on the link.
#![allow(clippy::unwrap_used)]

use shardcache_client::Range;
use shardcache_proto::{
    checksum,
    encoding::{ACCEPT_ENCODING_HEADER, ZSTD},
    v1::{Encoding, ReadRangeRequest, StreamShardRequest, shard_reader_client::ShardReaderClient},
};
use shardcache_tests::{TestHub, TestSpoke, spoke_options};
use spoke_cache::fetch::suppliers::compression::PROBE_FETCHES;

/// `shardcache gen --tokens zipf`'s token windows in `root/d/shard-00000.bin`, `size`
/// bytes: ids with the frequencies of real tokenised text.
fn tokens(root: &std::path::Path, size: u64) -> Vec<u8> {
    use shardcache_cli::dataset_gen::{GenSpec, Tokens, generate};
    let spec = GenSpec {
        dir: root.to_owned(),
        dataset: "d".into(),
        shards: 1,
        shard_size: size,
        record_size: 16 << 10,
        seed: 28,
        tokens: Tokens::Zipf,
    };
    std::fs::read(&generate(&spec).unwrap().shards[0]).unwrap()
}

fn random(length: usize) -> Vec<u8> {
    shardcache_tests::incompressible(length, 0x9e37_79b9_7f4a_7c15)
}

fn read_request(offset: u64, length: u64, zstd: bool) -> tonic::Request<ReadRangeRequest> {
    let mut request = tonic::Request::new(ReadRangeRequest {
        dataset: "d".into(),
        shard: "shard-00000.bin".into(),
        offset,
        length,
        expected_version: String::new(),
        cut_at_end: false,
    });
    if zstd {
        request.metadata_mut().insert(ACCEPT_ENCODING_HEADER, ZSTD.parse().unwrap());
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_compresses_only_for_readers_that_take_zstd_and_only_what_shrinks() {
    let root = tempfile::tempdir().unwrap();
    let text = tokens(root.path(), 1 << 20);
    std::fs::write(root.path().join("d/random.bin"), random(1 << 20)).unwrap();
    let hub = TestHub::start(root.path()).await;
    let mut raw = ShardReaderClient::new(hub.channel().await);

    // A reader that does not say it takes zstd (an older SDK): the bytes as they are.
    let plain = raw.read_range(read_request(4096, 256 << 10, false)).await.unwrap().into_inner();
    assert_eq!(plain.encoding, Encoding::Identity as i32);
    assert_eq!(plain.data.as_ref(), &text[4096..4096 + (256 << 10)]);

    // One that does: a zstd frame, smaller, its CRC32C the decoded bytes'.
    let packed = raw.read_range(read_request(4096, 256 << 10, true)).await.unwrap().into_inner();
    assert_eq!(packed.encoding, Encoding::Zstd as i32);
    assert_eq!(packed.decoded_length, 256 << 10);
    assert!(packed.data.len() < (256 << 10) / 2, "{} bytes on the wire", packed.data.len());
    assert_eq!(packed.crc32c, checksum::crc32c(&text[4096..4096 + (256 << 10)]));
    let decoded = zstd::bulk::decompress(&packed.data, 256 << 10).unwrap();
    assert_eq!(decoded, &text[4096..4096 + (256 << 10)]);

    // A stream too, message by message; random bytes go as they are even when asked.
    let mut request = tonic::Request::new(StreamShardRequest {
        dataset: "d".into(),
        shard: "random.bin".into(),
        offset: 0,
        length: None,
        expected_version: String::new(),
    });
    request.metadata_mut().insert(ACCEPT_ENCODING_HEADER, ZSTD.parse().unwrap());
    let mut stream = raw.stream_shard(request).await.unwrap().into_inner();
    while let Some(message) = stream.message().await.unwrap() {
        assert_eq!(message.encoding, Encoding::Identity as i32, "random bytes do not shrink");
    }

    // The SDK takes zstd by default and hands out the decoded bytes; plain() does not ask.
    let client = hub.client().await;
    let read = client.read_range(&Range::new("d", "shard-00000.bin", 0, 1 << 20)).await.unwrap();
    assert_eq!(read.data.as_ref(), text.as_slice());
    assert!(read.wire_len < (1 << 20) / 2, "{}", read.wire_len);
    let read = client.plain().read_range(&Range::new("d", "shard-00000.bin", 0, 1 << 20)).await.unwrap();
    assert_eq!((read.data.as_ref(), read.wire_len), (text.as_slice(), 1 << 20));
    let stats = hub.stats.snapshot();
    assert!(stats.bytes_sent < stats.bytes_served, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoke_stores_the_decoded_bytes_and_counts_what_they_took_on_the_link() {
    let root = tempfile::tempdir().unwrap();
    let text = tokens(root.path(), 12 << 20); // three 4 MiB chunks
    std::fs::write(root.path().join("d/random.bin"), random(4 << 20)).unwrap();
    let hub = TestHub::start(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = spoke_options(&hub.endpoint);
    // Every fetch asks for zstd (`auto` would choose by what it measures).
    options.hub_transport.compression = spoke_cache::fetch::suppliers::compression::HubCompression::Always;
    let spoke = TestSpoke::start(cache.path(), options).await;
    let client = spoke.client().await;

    let cold = client.read_range(&Range::new("d", "shard-00000.bin", 100, 1 << 20)).await.unwrap();
    assert_eq!(cold.data.as_ref(), &text[100..100 + (1 << 20)]);
    let wire = r#"shardcache_spoke_upstream_wire_bytes_total{dataset="d"}"#;
    let fetched = r#"shardcache_spoke_upstream_bytes_total{dataset="d"}"#;
    spoke.settled().await; // the rest of the shard, fetched in the background
    let until = spoke.metric(fetched).await;
    assert_eq!(until, (12 << 20) as f64, "the whole shard was fetched once");
    let on_link = spoke.metric(wire).await;
    assert!(on_link < until / 2.0, "{on_link} bytes on the link for {until}");
    // Served again from the store: the shard's bytes, not the frames.
    for at in (0..12u64 << 20).step_by(1 << 20) {
        let warm = client.read_range(&Range::new("d", "shard-00000.bin", at, 1 << 20)).await.unwrap();
        assert_eq!(warm.data.as_ref(), &text[at as usize..(at + (1 << 20)) as usize]);
    }

    // Incompressible: as many bytes on the link as fetched.
    client.read_range(&Range::new("d", "random.bin", 0, 1 << 20)).await.unwrap();
    spoke.settled().await;
    let until = spoke.metric(fetched).await;
    let added = spoke.metric(wire).await - on_link;
    assert_eq!(added, until - (12 << 20) as f64, "random bytes went as they are");
    // And the status says both.
    let status = spoke.control().await.status().await.unwrap();
    let d = status.datasets.iter().find(|d| d.dataset == "d").unwrap();
    assert_eq!((d.upstream_bytes as f64, d.upstream_wire_bytes as f64), (until, on_link + added));
    // Every chunk fetch asked for zstd (`--hub-compression zstd`), each counted once, in
    // the status and the metrics alike; RocksDB's own files are named beside the capacity.
    // (A call is one request to the hub, however many ranges it carries.)
    let requests = hub.stats.snapshot().read_requests;
    assert_eq!((status.hub_fetches_plain, status.hub_fetches_zstd), (0, requests), "{status:?}");
    let asked = r#"shardcache_spoke_hub_fetches_total{encoding="zstd"}"#;
    assert_eq!(spoke.metric(asked).await, requests as f64);
    assert!(status.store_own_bytes > 0 && status.store_own_bytes < 16 << 20, "{}", status.store_own_bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_stops_asking_for_zstd_on_bytes_that_do_not_shrink_after_a_short_probe() {
    let root = tempfile::tempdir().unwrap();
    let text = tokens(root.path(), 8 << 20);
    std::fs::create_dir_all(root.path().join("img")).unwrap();
    let shards: Vec<Vec<u8>> = (0..4).map(|i| random((8 << 20) + i)).collect();
    for (i, bytes) in shards.iter().enumerate() {
        std::fs::write(root.path().join(format!("img/shard-{i}.bin")), bytes).unwrap();
    }
    let hub = TestHub::start(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache.path(), spoke_options(&hub.endpoint)).await; // `auto`
    let client = spoke.client().await;
    let control = spoke.control().await;
    let read_whole = |dataset: &'static str, shard: String, expected: Vec<u8>| {
        let (client, spoke) = (client.clone(), &spoke);
        async move {
            for at in (0..expected.len() as u64).step_by(1 << 20) {
                let length = (1u64 << 20).min(expected.len() as u64 - at);
                let read = client.read_range(&Range::new(dataset, &shard, at, length)).await.unwrap();
                assert_eq!(read.data.as_ref(), &expected[at as usize..(at + length) as usize]);
            }
            spoke.settled().await;
        }
    };

    // Random bytes (images, archives): the first shards probe, and what they learn holds.
    for (i, bytes) in shards.iter().enumerate().take(2) {
        read_whole("img", format!("shard-{i}.bin"), bytes.clone()).await;
    }
    let probed = control.status().await.unwrap();
    // (The probe learns from its first PROBE_FETCHES answers; the chunks a cold read covers
    // are read alongside the stat in one call, so it may take fewer calls than answers.)
    assert!(
        (1..=PROBE_FETCHES as u64).contains(&probed.hub_fetches_zstd),
        "the probe asked, and no more: {probed:?}"
    );
    for (i, bytes) in shards.iter().enumerate().skip(2) {
        read_whole("img", format!("shard-{i}.bin"), bytes.clone()).await;
    }
    let after = control.status().await.unwrap();
    let fetched = after.hub_fetches_plain - probed.hub_fetches_plain;
    assert!(fetched >= 32, "the last two shards came in {fetched} chunk fetches");
    assert_eq!(after.hub_fetches_zstd, probed.hub_fetches_zstd, "no zstd asked after the probe: {after:?}");

    // Text from the same hub still asks for zstd, and takes fewer bytes on the link.
    read_whole("d", "shard-00000.bin".into(), text).await;
    let text_done = control.status().await.unwrap();
    assert!(text_done.hub_fetches_zstd > after.hub_fetches_zstd, "{text_done:?}");
    let d = text_done.datasets.iter().find(|d| d.dataset == "d").unwrap();
    assert!(d.upstream_wire_bytes < d.upstream_bytes, "{d:?}");
    let img = text_done.datasets.iter().find(|d| d.dataset == "img").unwrap();
    assert_eq!(img.upstream_bytes, 4 * (8 << 20) + 6, "every image byte fetched once");
}
