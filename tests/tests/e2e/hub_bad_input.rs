//! Bad input gets a precise status and a message a person can act on; nothing outside
//! the root is ever read; a shard changed mid-read is ABORTED, never mixed; overload is
//! RESOURCE_EXHAUSTED; and the server keeps serving other clients throughout.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shardcache_client::{Client, Range};
use shardcache_proto::v1::{
    ListShardsRequest, ReadRangeRequest, StreamShardRequest, shard_reader_client::ShardReaderClient,
};
use shardcache_tests::{TestHub, rewrite_in_place, sha256, test_options, write_pattern};
use tonic::Code;

/// The hub still answers a good read correctly.
async fn still_serving(client: &Client, want: &[u8]) {
    let got = client.read_range(&Range::new("ds", "good.bin", 0, want.len() as u64)).await.unwrap();
    assert_eq!(got.data, want);
}

fn code_and_message(err: shardcache_client::Error) -> (Code, String) {
    match err {
        shardcache_client::Error::Status { status, .. } => (status.code(), status.message().to_owned()),
        other => panic!("expected a status, got {other}"),
    }
}

#[tokio::test]
async fn bad_names_are_refused_with_the_reason() {
    let root = tempfile::tempdir().unwrap();
    let good = write_pattern(&root.path().join("ds/good.bin"), 4096, 0);
    let hub = TestHub::start(root.path()).await;
    let client = hub.client().await;
    let long = "x".repeat(2000);
    let cases: &[(&str, &str, Code, &str)] = &[
        ("ds", "../ds/good.bin", Code::InvalidArgument, "'..' component"),
        ("ds", "/etc/passwd", Code::InvalidArgument, "absolute path"),
        ("ds", "good.bin\0", Code::InvalidArgument, "NUL byte"),
        ("ds", &long, Code::InvalidArgument, "the limit is 1024"),
        ("ds", ".shardcache.json", Code::InvalidArgument, "hidden"),
        ("..", "etc/passwd", Code::InvalidArgument, "'..' component"),
        ("a/b", "x", Code::InvalidArgument, "single top-level folder"),
        ("", "x", Code::InvalidArgument, "dataset name is empty"),
        ("nope", "x", Code::NotFound, "dataset \"nope\" not found"),
        ("ds", "missing.bin", Code::NotFound, "shard \"missing.bin\" not found in dataset \"ds\""),
    ];
    for &(dataset, shard, code, words) in cases {
        let (got, message) = code_and_message(client.stat(dataset, shard).await.unwrap_err());
        assert_eq!(got, code, "{dataset:?}/{shard:?}: {message}");
        assert!(message.contains(words), "{dataset:?}/{shard:?}: {message:?} should say {words:?}");
        let (got, _) =
            code_and_message(client.read_range(&Range::new(dataset, shard, 0, 1)).await.unwrap_err());
        assert_eq!(got, code);
        still_serving(&client, &good).await;
    }
    // A folder is not a shard.
    std::fs::create_dir_all(root.path().join("ds/sub")).unwrap();
    let (code, message) = code_and_message(client.stat("ds", "sub").await.unwrap_err());
    assert_eq!(code, Code::NotFound, "{message}");
    assert!(message.contains("not a regular file"));
}

#[tokio::test]
async fn symlinks_cannot_leave_the_root() {
    let outside = tempfile::tempdir().unwrap();
    let secret = write_pattern(&outside.path().join("secret.bin"), 100, 9);
    let root = tempfile::tempdir().unwrap();
    let good = write_pattern(&root.path().join("ds/good.bin"), 100, 0);
    std::os::unix::fs::symlink(outside.path().join("secret.bin"), root.path().join("ds/leak.bin")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("ds/leakdir")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("outside-ds")).unwrap();
    std::os::unix::fs::symlink(root.path().join("ds/good.bin"), root.path().join("ds/alias.bin")).unwrap();
    let hub = TestHub::start(root.path()).await;
    let client = hub.client().await;

    for (dataset, shard) in [("ds", "leak.bin"), ("ds", "leakdir/secret.bin"), ("outside-ds", "secret.bin")] {
        let err = client.read_range(&Range::new(dataset, shard, 0, 100)).await.unwrap_err();
        let (code, message) = code_and_message(err);
        assert!(matches!(code, Code::InvalidArgument | Code::NotFound), "{dataset}/{shard}: {code:?}");
        assert!(
            ["outside its dataset", "outside the served root", "not found"]
                .iter()
                .any(|m| message.contains(m)),
            "{message}"
        );
        let mut stream = client.stream_shard(dataset, shard, 0, Some(100)).await;
        if let Ok(s) = stream.as_mut() {
            assert!(s.next_chunk().await.is_err());
        }
    }
    // Listing shows neither the escaping links nor the escaping dataset, only what is inside.
    let names: Vec<_> = client.list_shards("ds").await.unwrap().into_iter().map(|s| s.shard).collect();
    assert_eq!(names, ["alias.bin", "good.bin"]);
    let datasets: Vec<_> = client.list_datasets().await.unwrap().into_iter().map(|d| d.name).collect();
    assert_eq!(datasets, ["ds"]);
    // A link that stays inside the root is served.
    assert_eq!(client.read_range(&Range::new("ds", "alias.bin", 0, 100)).await.unwrap().data, good);
    assert_ne!(good, secret);
}

#[tokio::test]
async fn symlinks_cannot_cross_from_one_dataset_into_another() {
    let root = tempfile::tempdir().unwrap();
    let private = write_pattern(&root.path().join("private/y.bin"), 100, 7);
    let public = write_pattern(&root.path().join("public/good.bin"), 100, 1);
    // Relative and absolute links into the other dataset, a dataset folder that is a link
    // to another dataset, and an absolute link that stays inside its own dataset.
    std::os::unix::fs::symlink("../private/y.bin", root.path().join("public/x.bin")).unwrap();
    std::os::unix::fs::symlink(root.path().join("private"), root.path().join("public/dir")).unwrap();
    std::os::unix::fs::symlink(root.path().join("private"), root.path().join("alias")).unwrap();
    std::os::unix::fs::symlink(root.path().join("public/good.bin"), root.path().join("public/same.bin"))
        .unwrap();
    // A token for `public` only: what a grant for one dataset may reach.
    let tokens = tempfile::tempdir().unwrap();
    let token =
        shardcache_tests::token_file(&tokens.path().join("t"), &[("reader", "public,alias")]).remove(0);
    let mut options = shardcache_tests::test_options();
    options.security = shardcache_serving::server::Security {
        tls: None,
        auth: shardcache_serving::auth::Authenticator::with_token_file(&tokens.path().join("t")).unwrap(),
    };
    let hub = TestHub::start_with(root.path(), options).await;
    let client = Client::connect_with(
        &hub.endpoint,
        &shardcache_client::ConnectOptions { token: Some(token), ..Default::default() },
    )
    .await
    .unwrap();

    for (dataset, shard) in [("public", "x.bin"), ("public", "dir/y.bin"), ("alias", "y.bin")] {
        let err = client.read_range(&Range::new(dataset, shard, 0, 100)).await.unwrap_err();
        let (code, message) = code_and_message(err);
        assert_eq!(code, Code::InvalidArgument, "{dataset}/{shard}: {message}");
        assert!(message.contains("outside its dataset"), "{message}");
    }
    let names: Vec<_> = client.list_shards("public").await.unwrap().into_iter().map(|s| s.shard).collect();
    assert_eq!(names, ["good.bin", "same.bin"], "links into another dataset are not listed");
    let datasets: Vec<_> = client.list_datasets().await.unwrap().into_iter().map(|d| d.name).collect();
    assert_eq!(datasets, ["public"], "a dataset folder that is a link is not a dataset");
    assert_eq!(client.read_range(&Range::new("public", "same.bin", 0, 100)).await.unwrap().data, public);
    assert_ne!(public, private);
}

#[tokio::test]
async fn ranges_past_the_end_or_over_the_limit_name_the_limit() {
    let root = tempfile::tempdir().unwrap();
    let good = write_pattern(&root.path().join("ds/good.bin"), 1000, 0);
    let hub = TestHub::start(root.path()).await; // max_read = 1 MiB
    let client = hub.client().await;

    let (code, message) =
        code_and_message(client.read_range(&Range::new("ds", "good.bin", 990, 11)).await.unwrap_err());
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("ends past the end of the shard (1000 bytes)"), "{message}");

    let (code, message) =
        code_and_message(client.read_range(&Range::new("ds", "good.bin", u64::MAX, 2)).await.unwrap_err());
    assert_eq!(code, Code::InvalidArgument, "{message}");

    let (code, message) = code_and_message(
        client.read_range(&Range::new("ds", "good.bin", 0, (1 << 20) + 1)).await.unwrap_err(),
    );
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("limit of 1048576 bytes per call (--max-read)"), "{message}");

    // A batch is limited by its total, not by each range.
    let batch: Vec<_> = (0..1100).map(|_| Range::new("ds", "good.bin", 0, 1000)).collect();
    let (code, message) = code_and_message(client.read_ranges(&batch).await.unwrap_err());
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("--max-read"), "{message}");
    let batch: Vec<_> = (0..5000).map(|_| Range::new("ds", "good.bin", 0, 0)).collect();
    let (code, message) = code_and_message(client.read_ranges(&batch).await.unwrap_err());
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("5000 ranges in one call is over the limit of 4096"), "{message}");

    let (code, message) =
        code_and_message(client.stream_shard("ds", "good.bin", 1001, None).await.map(|_| ()).unwrap_err());
    assert_eq!(code, Code::InvalidArgument, "{message}");
    let mut raw = ShardReaderClient::connect(hub.endpoint.clone()).await.unwrap();
    let status = raw
        .stream_shard(StreamShardRequest {
            dataset: "ds".into(),
            shard: "good.bin".into(),
            offset: 10,
            length: Some(991),
            expected_version: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = raw
        .list_shards(ListShardsRequest { dataset: "ds".into(), page_size: 1, page_token: "../x".into() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("page token"), "{}", status.message());
    still_serving(&client, &good).await;
}

#[tokio::test]
async fn a_stale_expected_version_is_aborted() {
    let root = tempfile::tempdir().unwrap();
    write_pattern(&root.path().join("ds/good.bin"), 1000, 0);
    let hub = TestHub::start(root.path()).await;
    let client = hub.client().await;
    let before = client.stat("ds", "good.bin").await.unwrap();
    let mut range = Range::new("ds", "good.bin", 0, 10);
    range.expected_version = Some(before.version.clone());
    assert!(client.read_range(&range).await.is_ok());

    let new: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    rewrite_in_place(&root.path().join("ds/good.bin"), &new);
    let (code, message) = code_and_message(client.read_range(&range).await.unwrap_err());
    assert_eq!(code, Code::Aborted);
    assert!(message.contains("stat it again"), "{message}");
    let (code, _) = code_and_message(
        client.read_ranges(&[Range::new("ds", "good.bin", 0, 1), range.clone()]).await.unwrap_err(),
    );
    assert_eq!(code, Code::Aborted);
    // Without a version pin the new bytes are served, with the new version.
    let fresh = client.read_range(&Range::new("ds", "good.bin", 0, 1000)).await.unwrap();
    assert_eq!(fresh.data, new);
    assert_ne!(fresh.version, before.version);
}

#[tokio::test]
async fn a_shard_rewritten_during_a_stream_is_aborted_never_mixed() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("ds/big.bin");
    // 64 chunks of 64 KiB: far more than the server's read-ahead plus 64 KiB windows.
    let old = write_pattern(&path, 64 * (64 << 10), 1);
    let hub = TestHub::start(root.path()).await;
    let client = hub.client_with_small_windows().await;
    let mut stream = client.stream_shard("ds", "big.bin", 0, None).await.unwrap();
    let first = stream.next_chunk().await.unwrap().unwrap();
    assert_eq!(first.data, old[..64 << 10]);

    // Rewrite in place (same size, same inode): only mtime/ctime tell.
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x55).collect();
    rewrite_in_place(&path, &new);
    let mut received = first.data.to_vec();
    let err = loop {
        match stream.next_chunk().await {
            Ok(Some(chunk)) => received.extend_from_slice(&chunk.data),
            Ok(None) => panic!("the stream finished although the shard changed under it"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Some(Code::Aborted), "{err}");
    // Everything delivered before the abort is the old version, byte for byte.
    assert_eq!(sha256(&received), sha256(&old[..received.len()]));
    // A new read sees the new bytes.
    let fresh = client.read_range(&Range::new("ds", "big.bin", 0, 1 << 10)).await.unwrap();
    assert_eq!(fresh.data, new[..1 << 10]);
}

#[tokio::test]
async fn overload_is_resource_exhausted_and_health_still_answers() {
    let root = tempfile::tempdir().unwrap();
    write_pattern(&root.path().join("ds/big.bin"), 64 * (64 << 10), 1);
    let good = write_pattern(&root.path().join("ds/good.bin"), 100, 0);
    let mut options = test_options();
    options.server.max_concurrency = 1;
    let hub = TestHub::start_with(root.path(), options).await;
    // Small windows, so the hub cannot send all 4 MiB and free the slot early.
    let client = hub.client_with_small_windows().await;

    // An open stream holds the one slot until it is finished or dropped.
    let mut stream = client.stream_shard("ds", "big.bin", 0, None).await.unwrap();
    stream.next_chunk().await.unwrap().unwrap();
    let (code, message) =
        code_and_message(client.read_range(&Range::new("ds", "good.bin", 0, 100)).await.unwrap_err());
    assert_eq!(code, Code::ResourceExhausted);
    assert!(message.contains("limit of 1 requests in flight (--max-concurrency)"), "{message}");

    let mut health = tonic_health::pb::health_client::HealthClient::new(hub.channel().await);
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest { service: "shardcache.v1.ShardReader".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(serving.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);

    // Once the stream is gone, the slot comes back (the server learns of the reset
    // asynchronously, so poll a bounded number of times).
    drop(stream);
    let mut served = false;
    for _ in 0..200 {
        match client.read_range(&Range::new("ds", "good.bin", 0, 100)).await {
            Ok(chunk) => {
                assert_eq!(chunk.data, good);
                served = true;
                break;
            }
            Err(e) if e.code() == Some(Code::ResourceExhausted) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(served, "the slot of a dropped stream was never released");
}

#[tokio::test]
async fn unary_reads_use_positioned_reads_that_honour_the_version_pin_per_range() {
    // ReadRange with a version pin from StatShard, via the raw API, as the spoke will use it.
    let root = tempfile::tempdir().unwrap();
    let data = write_pattern(&root.path().join("ds/good.bin"), 5000, 4);
    let hub = TestHub::start(root.path()).await;
    let client = hub.client().await;
    let version = client.stat("ds", "good.bin").await.unwrap().version;
    let mut raw = ShardReaderClient::connect(hub.endpoint.clone()).await.unwrap();
    let chunk = raw
        .read_range(ReadRangeRequest {
            dataset: "ds".into(),
            shard: "good.bin".into(),
            offset: 4000,
            length: 1000,
            expected_version: version.clone(),
            cut_at_end: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(chunk.version, version);
    assert_eq!(chunk.data, data[4000..]);
    assert_eq!(chunk.crc32c, shardcache_proto::checksum::crc32c(&data[4000..]));
}
