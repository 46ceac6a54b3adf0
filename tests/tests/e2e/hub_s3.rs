//! The hub over S3, against a real S3-compatible server (moto): listing, stat and reads
//! equal the objects; ranges at the edges; an object replaced mid-stream is ABORTED; a
//! spoke in front picks up a new ETag after its TTL; a missing bucket and bad
//! credentials say so.
#![allow(clippy::unwrap_used)]

use std::{sync::Arc, time::Duration};

use hub_server::source::{
    Storage,
    s3::{PART_SIZE, S3Location, S3Source},
};
use shardcache_client::{Client, Range};
use shardcache_proto::names::{DatasetName, ShardName};
use shardcache_tests::{
    TestHub, TestSpoke, binary,
    s3::{MotoServer, put},
    sha256, spoke_options, test_options,
};
use tonic::Code;

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) ^ (i >> 13) as u8).collect()
}

/// A bucket `shards` with, under `data/`: dataset `c4` (three shards, one in a sub-folder, a
/// metadata object and a hidden object) and dataset `wiki`.
async fn fill(moto: &MotoServer) -> Vec<(String, Vec<u8>)> {
    let client = moto.client().await;
    client.create_bucket().bucket("shards").send().await.unwrap();
    let objects = vec![
        ("data/c4/shard-0.bin".to_owned(), pattern(300_000, 1)),
        ("data/c4/shard-1.bin".to_owned(), pattern(4 << 20, 2)),
        ("data/c4/nested/shard-2.bin".to_owned(), pattern(65_536, 3)),
        ("data/wiki/w.bin".to_owned(), pattern(1000, 4)),
    ];
    for (key, data) in &objects {
        put(&client, "shards", key, data.clone()).await;
    }
    put(&client, "shards", "data/c4/.shardcache.json", br#"{"record_size": 16384}"#.to_vec()).await;
    put(&client, "shards", "data/c4/.hidden", b"never listed".to_vec()).await;
    put(&client, "shards", "elsewhere/x.bin", b"outside the prefix".to_vec()).await;
    objects
}

async fn s3_hub(moto: &MotoServer) -> (Arc<S3Source>, TestHub) {
    let source = Arc::new(
        S3Source::connect(S3Location::parse("s3://shards/data").unwrap(), &moto.options()).await.unwrap(),
    );
    let hub = TestHub::start_source(source.clone(), test_options()).await;
    (source, hub)
}

#[tokio::test]
async fn listing_stat_and_reads_equal_the_objects() {
    let moto = MotoServer::start(false);
    let objects = fill(&moto).await;
    let (_, hub) = s3_hub(&moto).await;
    let client = hub.client().await;

    let datasets = client.list_datasets().await.unwrap();
    let names: Vec<_> = datasets.iter().map(|d| (d.name.as_str(), d.shard_count, d.record_size)).collect();
    assert_eq!(names, [("c4", 3, 16384), ("wiki", 1, 0)]);
    let shards = client.list_shards("c4").await.unwrap();
    let listed: Vec<_> = shards.iter().map(|s| s.shard.as_str()).collect();
    assert_eq!(listed, ["nested/shard-2.bin", "shard-0.bin", "shard-1.bin"]);

    let s3 = moto.client().await;
    for (key, data) in &objects {
        let (dataset, shard) = key.strip_prefix("data/").unwrap().split_once('/').unwrap();
        let info = client.stat(dataset, shard).await.unwrap();
        assert_eq!(info.size, data.len() as u64);
        // When it changed: the object's LastModified, in the stat and the listing (whole
        // seconds: a HEAD's HTTP date has no finer ones).
        let head = s3.head_object().bucket("shards").key(key).send().await.unwrap();
        let modified = head.last_modified().unwrap().secs() as u64;
        assert_eq!(info.modified_ms / 1000, modified, "{key}");
        let listed = client.list_shards(dataset).await.unwrap();
        let listed = listed.iter().find(|s| s.shard == shard).unwrap();
        assert_eq!(listed.modified_ms / 1000, modified, "{key}");
        let streamed =
            client.stream_shard(dataset, shard, 0, None).await.unwrap().read_to_end().await.unwrap();
        assert_eq!(sha256(&streamed), sha256(data), "{key}");
        // Ranges at the edges: first byte, last byte, across a chunk boundary, empty at the end.
        let len = data.len() as u64;
        for (offset, length) in
            [(0, 1), (len - 1, 1), (65_535.min(len - 2), 2), (len, 0), (0, len.min(1 << 20))]
        {
            let got = client.read_range(&Range::new(dataset, shard, offset, length)).await.unwrap();
            assert_eq!(
                got.data,
                data[offset as usize..(offset + length) as usize],
                "{key} {offset}+{length}"
            );
            assert_eq!(got.version, info.version);
        }
    }

    let past = client.read_range(&Range::new("c4", "shard-0.bin", 299_999, 2)).await.unwrap_err();
    assert_eq!(past.code(), Some(Code::InvalidArgument), "{past}");
    for (dataset, shard) in [("c4", "missing.bin"), ("nope", "x.bin"), ("c4", ".hidden")] {
        let err = client.stat(dataset, shard).await.unwrap_err();
        assert!(
            matches!(err.code(), Some(Code::NotFound | Code::InvalidArgument)),
            "{dataset}/{shard}: {err}"
        );
    }
    assert_eq!(client.list_shards("nope").await.unwrap_err().code(), Some(Code::NotFound));
}

#[tokio::test]
async fn large_reads_are_split_into_parallel_ranged_gets_with_the_same_bytes() {
    let moto = MotoServer::start(false);
    let client = moto.client().await;
    client.create_bucket().bucket("shards").send().await.unwrap();
    let big = pattern((2 * PART_SIZE + 12_345) as usize, 9);
    put(&client, "shards", "data/big/all.bin", big.clone()).await;
    let source = Arc::new(
        S3Source::connect(S3Location::parse("s3://shards/data").unwrap(), &moto.options()).await.unwrap(),
    );
    let shard =
        source.open(&DatasetName::new("big").unwrap(), &ShardName::new("all.bin").unwrap()).await.unwrap();
    use hub_server::source::ShardHandle;
    let whole = shard.read_at(0, big.len()).await.unwrap();
    assert_eq!(sha256(&whole.data), sha256(&big));
    assert_eq!(whole.crc32c, shardcache_proto::checksum::crc32c(&big), "parts' checksums combined");
    let middle = shard.read_at(PART_SIZE - 10, (PART_SIZE + 20) as usize).await.unwrap();
    assert_eq!(middle.data, big[(PART_SIZE - 10) as usize..(2 * PART_SIZE + 10) as usize]);
}

#[tokio::test]
async fn an_object_replaced_mid_stream_is_aborted_never_mixed() {
    let moto = MotoServer::start(false);
    let s3 = moto.client().await;
    s3.create_bucket().bucket("shards").send().await.unwrap();
    // 64 chunks of 64 KiB: far more than the hub reads ahead (4 + 2 chunks) plus windows.
    let old = pattern(64 * (64 << 10), 5);
    put(&s3, "shards", "data/ds/big.bin", old.clone()).await;
    let (_, hub) = s3_hub(&moto).await;
    let client = hub.client_with_small_windows().await;
    let mut stream = client.stream_shard("ds", "big.bin", 0, None).await.unwrap();
    let mut received = stream.next_chunk().await.unwrap().unwrap().data.to_vec();

    let new = pattern(old.len(), 6);
    put(&s3, "shards", "data/ds/big.bin", new.clone()).await;
    let err = loop {
        match stream.next_chunk().await {
            Ok(Some(chunk)) => received.extend_from_slice(&chunk.data),
            Ok(None) => panic!("the stream finished although the object was replaced"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Some(Code::Aborted), "{err}");
    assert_eq!(sha256(&received), sha256(&old[..received.len()]), "only old bytes before the abort");
    let fresh = client.read_range(&Range::new("ds", "big.bin", 0, 1000)).await.unwrap();
    assert_eq!(fresh.data, new[..1000]);
}

#[tokio::test]
async fn a_spoke_in_front_of_an_s3_hub_picks_up_a_new_etag_after_its_ttl() {
    let moto = MotoServer::start(false);
    let s3 = moto.client().await;
    s3.create_bucket().bucket("shards").send().await.unwrap();
    let old = pattern(200_000, 7);
    put(&s3, "shards", "data/ds/s.bin", old.clone()).await;
    let (_, hub) = s3_hub(&moto).await;
    let cache_dir = tempfile::tempdir().unwrap();
    let mut options = spoke_options(&hub.endpoint);
    options.cache.revalidate_after = Duration::from_millis(300);
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let client = spoke.client().await;
    let read = |client: Client| async move {
        client.stream_shard("ds", "s.bin", 0, None).await?.read_to_end().await
    };
    assert_eq!(sha256(&read(client.clone()).await.unwrap()), sha256(&old));

    let new = pattern(200_000, 8);
    put(&s3, "shards", "data/ds/s.bin", new.clone()).await;
    let mut seen_new = false;
    for _ in 0..100 {
        let got = match read(client.clone()).await {
            Ok(got) => got,
            // A read that began on the old version and met the new one is refused, not mixed.
            Err(e) if e.code() == Some(Code::Aborted) => continue,
            Err(e) => panic!("{e}"),
        };
        // Every read is one version, whole: never a mix.
        assert!(got == old || got == new, "a read mixed two versions");
        if got == new {
            seen_new = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen_new, "the spoke never revalidated against the new ETag");
}

#[tokio::test]
async fn a_missing_bucket_and_bad_credentials_are_named_at_start() {
    let moto = MotoServer::start(false);
    let err = S3Source::connect(S3Location::parse("s3://no-such-bucket/x").unwrap(), &moto.options())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("bucket no-such-bucket does not exist"), "{err}");

    let strict = MotoServer::start(true);
    let err = S3Source::connect(
        S3Location::parse("s3://shards").unwrap(),
        &strict.options_with(("AKIDBAD", "nope")),
    )
    .await
    .unwrap_err();
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("s3://shards refused the hub: InvalidAccessKeyId"),
        "{}",
        status.message()
    );
    assert!(status.message().contains("s3:GetObject"), "{}", status.message());
}

#[tokio::test]
async fn the_binary_serves_a_bucket_with_credentials_from_the_environment() {
    let moto = MotoServer::start(false);
    let objects = fill(&moto).await;
    let mut hub = std::process::Command::new(binary("hub-server"))
        .args(["--source", "s3://shards/data", "--s3-endpoint", &moto.endpoint, "--listen", "127.0.0.1:0"])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(hub.stdout.take().unwrap()), &mut line).unwrap();
    let addr = line.trim().strip_prefix("hub-server listening on ").unwrap_or_else(|| panic!("{line:?}"));
    let client = Client::connect(&format!("http://{addr}")).await.unwrap();
    let (key, data) = &objects[1];
    let shard = key.strip_prefix("data/c4/").unwrap();
    let got = client.stream_shard("c4", shard, 0, None).await.unwrap().read_to_end().await.unwrap();
    assert_eq!(sha256(&got), sha256(data));
    let _ = hub.kill();
    let _ = hub.wait();
}
