//! The spoke's S3 door (`spoke-cache --s3-listen`): an S3 client (the AWS SDK, as boto3
//! and the aws CLI are built) lists the hub's datasets as buckets and their shards as
//! keys, folders and pages as S3 has them, and reads them through the cache, byte-
//! identical, ranged and conditional, as hits once warm; S3's errors for what S3 refuses;
//! with a token file, only requests signed with a key of `--s3-keys`, each reading what
//! its principal's token reads, counted under its job.
#![allow(clippy::unwrap_used)]

use std::{path::Path, time::Duration};

use aws_sdk_s3::{Client, error::ProvideErrorMetadata, presigning::PresigningConfig};
use hub_server::source::s3::{S3Options, client};
use shardcache_client::{CacheClient, ConnectOptions};
use shardcache_serving::{auth::Authenticator, s3_keys::S3Key, server::Security};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, spoke_options, token_file};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SHARD: u64 = 1 << 20;

async fn s3_client(spoke: &TestSpoke, key: (&str, &str)) -> Client {
    client(&S3Options {
        endpoint: Some(format!("http://{}", spoke.s3_addr.unwrap())),
        region: Some("us-east-1".into()),
        path_style: true,
        static_credentials: Some((key.0.into(), key.1.into())),
    })
    .await
}

/// The HTTP status and body of a plain `GET target` (no signature, or the one the
/// target's query carries).
async fn get(spoke: &TestSpoke, target: &str) -> (u16, Vec<u8>) {
    get_from(spoke, &spoke.s3_addr.unwrap().to_string(), target).await
}

fn status_of<E>(err: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> Option<u16> {
    err.raw_response().map(|r| r.status().as_u16())
}

/// A dataset of nested keys: `train/shard-NNNNN.bin` (1,100 small ones), two in
/// `val/`, one at the top, one hidden.
fn nested_dataset(root: &Path) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..1100 {
        keys.push(format!("train/shard-{i:05}.bin"));
    }
    keys.extend(["val/a.bin", "val/b.bin", "README", "empty"].map(String::from));
    for key in &keys {
        let path = root.join("nested").join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let data = if key == "empty" { &b""[..] } else { key.as_bytes() };
        std::fs::write(&path, data).unwrap();
    }
    std::fs::write(root.join("nested/train/.hidden"), b"not served").unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn an_s3_client_lists_and_reads_the_hubs_datasets_through_an_open_spoke() {
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "c4", 2, SHARD);
    let keys = nested_dataset(root.path());
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start_with_s3(&dir.path().join("cache"), spoke_options(&hub.endpoint)).await;
    // An open spoke takes requests signed with any key (clients such as the AWS CRT
    // always sign).
    let s3 = s3_client(&spoke, ("ANYKEY", "anysecret")).await;

    let buckets = s3.list_buckets().send().await.unwrap();
    let names: Vec<&str> = buckets.buckets().iter().filter_map(|b| b.name()).collect();
    assert_eq!(names, ["c4", "nested"]);
    s3.head_bucket().bucket("c4").send().await.unwrap();
    let missing = s3.head_bucket().bucket("nope").send().await.unwrap_err();
    assert_eq!(status_of(&missing), Some(404));

    lists_as_s3_does(&s3, &keys).await;

    // Whole objects, ranges and a suffix: the dataset's bytes.
    let shard = std::fs::read(root.path().join("c4/shard-00000.bin")).unwrap();
    let whole = s3.get_object().bucket("c4").key("shard-00000.bin").send().await.unwrap();
    let etag = whole.e_tag().unwrap().to_owned();
    assert_eq!(whole.content_length(), Some(SHARD as i64));
    assert!(whole.body.collect().await.unwrap().into_bytes() == shard[..]);
    let ranged =
        s3.get_object().bucket("c4").key("shard-00000.bin").range("bytes=100-65636").send().await.unwrap();
    assert_eq!(ranged.content_range(), Some("bytes 100-65636/1048576"));
    assert!(ranged.body.collect().await.unwrap().into_bytes() == shard[100..65637]);
    let tail = s3.get_object().bucket("c4").key("shard-00000.bin").range("bytes=-10").send().await.unwrap();
    assert!(tail.body.collect().await.unwrap().into_bytes() == shard[shard.len() - 10..]);
    let empty = s3.get_object().bucket("nested").key("empty").send().await.unwrap();
    assert_eq!(empty.content_length(), Some(0));
    assert!(empty.body.collect().await.unwrap().into_bytes().is_empty());
    let nested = s3.get_object().bucket("nested").key("train/shard-00007.bin").send().await.unwrap();
    assert_eq!(&nested.body.collect().await.unwrap().into_bytes()[..], b"train/shard-00007.bin");
    // The ETag is the shard's version: HEAD says the same, and conditions compare it.
    let head = s3.head_object().bucket("c4").key("shard-00000.bin").send().await.unwrap();
    assert_eq!(head.e_tag(), Some(etag.as_str()));
    assert_eq!(head.content_length(), Some(SHARD as i64));
    let unchanged =
        s3.get_object().bucket("c4").key("shard-00000.bin").if_none_match(&etag).send().await.unwrap_err();
    assert_eq!(status_of(&unchanged), Some(304));
    let changed =
        s3.get_object().bucket("c4").key("shard-00000.bin").if_match("\"other\"").send().await.unwrap_err();
    assert_eq!(changed.code(), Some("PreconditionFailed"));
    s3.get_object().bucket("c4").key("shard-00000.bin").if_match(&etag).send().await.unwrap();
    // Last-Modified is the file's mtime (whole seconds), in HEAD, GET and listings, and
    // the time conditions compare it (`aws s3 sync` and HTTP caches go by it).
    let mtime = std::fs::metadata(root.path().join("c4/shard-00000.bin")).unwrap().modified().unwrap();
    let mtime = mtime.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let at = aws_sdk_s3::primitives::DateTime::from_secs;
    assert_eq!(head.last_modified(), Some(&at(mtime)));
    let listed = s3.list_objects_v2().bucket("c4").send().await.unwrap();
    assert_eq!(listed.contents()[0].last_modified(), Some(&at(mtime)));
    let get = || s3.get_object().bucket("c4").key("shard-00000.bin");
    let unchanged = get().if_modified_since(at(mtime)).send().await.unwrap_err();
    assert_eq!(status_of(&unchanged), Some(304));
    let since_before = get().if_modified_since(at(mtime - 1)).send().await.unwrap();
    assert_eq!(since_before.last_modified(), Some(&at(mtime)));
    assert!(since_before.body.collect().await.unwrap().into_bytes() == shard[..]);
    let changed_since = get().if_unmodified_since(at(mtime - 1)).send().await.unwrap_err();
    assert_eq!(changed_since.code(), Some("PreconditionFailed"));
    get().if_unmodified_since(at(mtime)).send().await.unwrap();

    // Warm: the last reads were hits, and nothing more came from the hub.
    spoke.settled().await;
    let fetched = spoke.metric("shardcache_spoke_upstream_requests_total").await;
    let hits = spoke.metric("shardcache_spoke_hit_requests_total{dataset=\"c4\"}").await;
    let again = s3.get_object().bucket("c4").key("shard-00000.bin").send().await.unwrap();
    assert!(again.body.collect().await.unwrap().into_bytes() == shard[..]);
    assert_eq!(spoke.metric("shardcache_spoke_upstream_requests_total").await, fetched);
    assert!(spoke.metric("shardcache_spoke_hit_requests_total{dataset=\"c4\"}").await > hits);

    refuses_as_s3_does(&s3, &spoke).await;
}

/// Pages, folders, prefixes and v1 markers of the `nested` dataset (`keys`).
async fn lists_as_s3_does(s3: &Client, keys: &[String]) {
    // A listing of more than 1,000 keys, page by page: every key once, in order, none hidden.
    let mut listed = Vec::new();
    let mut pages = s3.list_objects_v2().bucket("nested").into_paginator().send();
    let mut count = 0;
    while let Some(page) = pages.next().await {
        let page = page.unwrap();
        count += 1;
        listed.extend(page.contents().iter().map(|o| o.key().unwrap().to_owned()));
    }
    assert_eq!(listed, keys);
    assert_eq!(count, 2, "1,104 keys in pages of 1,000");
    // Folders, as S3 lists them with a delimiter; then one folder.
    let top = s3.list_objects_v2().bucket("nested").delimiter("/").send().await.unwrap();
    let folders: Vec<&str> = top.common_prefixes().iter().filter_map(|p| p.prefix()).collect();
    assert_eq!(folders, ["train/", "val/"]);
    let files: Vec<&str> = top.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(files, ["README", "empty"]);
    let val = s3.list_objects_v2().bucket("nested").prefix("val/").delimiter("/").send().await.unwrap();
    assert_eq!(val.contents().iter().filter_map(|o| o.key()).collect::<Vec<_>>(), ["val/a.bin", "val/b.bin"]);
    assert_eq!(val.contents()[0].size(), Some(9));
    // The v1 listing, with a marker.
    let v1 = s3
        .list_objects()
        .bucket("nested")
        .prefix("train/")
        .marker("train/shard-01097.bin")
        .send()
        .await
        .unwrap();
    let v1_keys: Vec<&str> = v1.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(v1_keys, ["train/shard-01098.bin", "train/shard-01099.bin"]);
    assert_eq!(v1.is_truncated(), Some(false));
}

/// What S3 refuses, S3's way; the spoke serves on.
async fn refuses_as_s3_does(s3: &Client, spoke: &TestSpoke) {
    let past =
        s3.get_object().bucket("c4").key("shard-00000.bin").range("bytes=2000000-").send().await.unwrap_err();
    assert_eq!((past.code(), status_of(&past)), (Some("InvalidRange"), Some(416)));
    let inverted =
        s3.get_object().bucket("c4").key("shard-00000.bin").range("bytes=500-100").send().await.unwrap_err();
    // Not a range at all (RFC 9110: last before first): the request is refused as such.
    assert_eq!((inverted.code(), status_of(&inverted)), (Some("InvalidArgument"), Some(400)));
    let message = inverted.message().unwrap_or_default();
    assert!(message.to_lowercase().contains("range"), "{message}");
    let absent = s3.get_object().bucket("c4").key("shard-00009.bin").send().await.unwrap_err();
    assert_eq!(absent.code(), Some("NoSuchKey"));
    let no_bucket = s3.get_object().bucket("nope").key("shard-00000.bin").send().await.unwrap_err();
    assert_eq!(no_bucket.code(), Some("NoSuchBucket"));
    let hidden = s3.get_object().bucket("nested").key("train/.hidden").send().await.unwrap_err();
    assert_eq!(hidden.code(), Some("NoSuchKey"));
    let (status, body) = get(spoke, "/c4/a/../shard-00000.bin").await;
    assert!(status == 400 || status == 404, "{status}: {}", String::from_utf8_lossy(&body));
    let (status, body) = get(spoke, "/c4/shard%00.bin").await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("<Code>InvalidArgument</Code>"));
    let bogus = s3.list_objects_v2().bucket("nested").continuation_token("zz").send().await.unwrap_err();
    assert_eq!(bogus.code(), Some("InvalidArgument"));
    let many = s3.list_objects_v2().bucket("nested").max_keys(1_000_000_000).send().await.unwrap();
    assert_eq!(many.key_count(), Some(1000));
    let writes = s3.delete_object().bucket("c4").key("shard-00000.bin").send().await.unwrap_err();
    assert_eq!(writes.code(), Some("NotImplemented"));
    // Unsigned reads work on an open spoke.
    let (status, body) = get(spoke, "/nested/val/a.bin").await;
    assert_eq!((status, &body[..]), (200, &b"val/a.bin"[..]));
}

/// A hub with `c4` and `wiki`; a spoke with tokens (alice: c4, bob: wiki), S3 keys for
/// both, and its S3 door.
async fn secured(root: &Path, dir: &Path) -> (TestHub, TestSpoke, S3Key, S3Key, String) {
    make_dataset(root, "c4", 2, SHARD);
    make_dataset(root, "wiki", 1, SHARD);
    let hub = TestHub::start(root).await;
    let tokens = dir.join("tokens");
    let made = token_file(&tokens, &[("alice", "c4"), ("bob", "wiki"), ("ops", "* control")]);
    let (alice, bob) = (S3Key::new("alice").unwrap(), S3Key::new("bob").unwrap());
    let keys = dir.join("s3-keys");
    std::fs::write(&keys, format!("{}\n{}\n", alice.line(), bob.line())).unwrap();
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut options = spoke_options(&hub.endpoint);
    options.security = Security { tls: None, auth: Authenticator::with_token_file(&tokens).unwrap() };
    options.s3.keys = Some(keys);
    let spoke = TestSpoke::start_with_s3(&dir.join("cache"), options).await;
    (hub, spoke, alice, bob, made[2].clone())
}

#[tokio::test]
async fn a_secured_spoke_reads_only_signed_requests_each_as_its_principal_and_counts_them_under_its_job() {
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_hub, spoke, alice, bob, ops) = secured(root.path(), dir.path()).await;
    let as_alice = s3_client(&spoke, (&alice.access_key, &alice.secret)).await;
    let shard = std::fs::read(root.path().join("c4/shard-00001.bin")).unwrap();
    let read = as_alice.get_object().bucket("c4").key("shard-00001.bin").send().await.unwrap();
    assert!(read.body.collect().await.unwrap().into_bytes() == shard[..]);
    // Each principal sees and reads its own datasets only.
    let buckets = as_alice.list_buckets().send().await.unwrap();
    assert_eq!(buckets.buckets().iter().filter_map(|b| b.name()).collect::<Vec<_>>(), ["c4"]);
    let other = as_alice.get_object().bucket("wiki").key("shard-00000.bin").send().await.unwrap_err();
    assert_eq!(other.code(), Some("AccessDenied"));
    let listing = as_alice.list_objects_v2().bucket("wiki").send().await.unwrap_err();
    assert_eq!(listing.code(), Some("AccessDenied"));
    let as_bob = s3_client(&spoke, (&bob.access_key, &bob.secret)).await;
    as_bob.head_object().bucket("wiki").key("shard-00000.bin").send().await.unwrap();

    // A wrong secret, an unknown key, no signature: refused as S3 refuses them.
    let forged = s3_client(&spoke, (&alice.access_key, "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY00")).await;
    let err = forged.get_object().bucket("c4").key("shard-00001.bin").send().await.unwrap_err();
    assert_eq!(err.code(), Some("SignatureDoesNotMatch"));
    let stranger =
        s3_client(&spoke, ("SCUNKNOWNKEY00000000", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY00")).await;
    let err = stranger.get_object().bucket("c4").key("shard-00001.bin").send().await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidAccessKeyId"));
    let (status, body) = get(&spoke, "/c4/shard-00001.bin").await;
    assert_eq!(status, 403);
    assert!(String::from_utf8_lossy(&body).contains("<Code>AccessDenied</Code>"));

    // A presigned URL reads until it expires.
    let presigned = as_alice
        .get_object()
        .bucket("c4")
        .key("shard-00001.bin")
        .presigned(PresigningConfig::expires_in(Duration::from_secs(300)).unwrap())
        .await
        .unwrap();
    let target = presigned.uri().split_once(&spoke.s3_addr.unwrap().to_string()).unwrap().1.to_owned();
    let (status, body) = get(&spoke, &target).await;
    assert_eq!(status, 200);
    assert!(body == shard);
    let expired = PresigningConfig::builder()
        .start_time(std::time::SystemTime::now() - Duration::from_secs(3600))
        .expires_in(Duration::from_secs(60))
        .build()
        .unwrap();
    let old = as_alice.get_object().bucket("c4").key("shard-00001.bin").presigned(expired).await.unwrap();
    let target = old.uri().split_once(&spoke.s3_addr.unwrap().to_string()).unwrap().1.to_owned();
    let (status, body) = get(&spoke, &target).await;
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));

    // Alice's reads are counted under her access key's job, as hers.
    let ops = CacheClient::connect_with(&spoke.endpoint, &ConnectOptions { tls: None, token: Some(ops) })
        .await
        .unwrap();
    let status = ops.status().await.unwrap();
    let job = status.jobs.iter().find(|j| j.job == alice.access_key).expect("alice's S3 job in the status");
    assert_eq!(job.principal, "alice");
    assert!(job.reads >= 2 && job.bytes >= 2 * SHARD, "{job:?}");
}

/// Across the 60 ms link: a cold ranged `GetObject` brings its range and at most the
/// chunk around it over the link (a spoke that does not fetch whole shards), and the
/// same range read again brings nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_ranged_get_brings_at_most_its_chunk_over_the_link_and_a_warm_one_nothing() {
    use shardcache_tests::{
        wan::{LinkConfig, WanProxy},
        wire,
    };
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "c4", 2, 4 * SHARD);
    let hub = TestHub::start(root.path()).await;
    let link =
        WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, LinkConfig::rtt(Duration::from_millis(60)))
            .await
            .unwrap();
    let mut options = spoke_options(&link.endpoint());
    options.cache.fetch_whole_shard = false;
    let chunk = options.cache.chunk_size;
    let spoke = TestSpoke::start_with_s3(&dir.path().join("cache"), options).await;
    let (s3, control) = (s3_client(&spoke, ("ANYKEY", "anysecret")).await, spoke.control().await);
    let shard = std::fs::read(root.path().join("c4/shard-00001.bin")).unwrap();
    let before = wire::settled_spoke(&link, &control).await.0;
    let (from, to) = (3 * chunk + 1000, 3 * chunk + 5000);
    let read = |s3: Client| async move {
        let got = s3
            .get_object()
            .bucket("c4")
            .key("shard-00001.bin")
            .range(format!("bytes={from}-{to}"))
            .send()
            .await;
        got.unwrap().body.collect().await.unwrap().into_bytes()
    };
    assert!(read(s3.clone()).await == shard[from as usize..=to as usize]);
    let cold = wire::settled_spoke(&link, &control).await.0.since(before);
    // The chunk holding the range, and the stat and headers around it (a few KiB).
    assert!(cold.to_client <= chunk + (16 << 10), "a cold 4 KiB range brought {} bytes", cold.to_client);
    let before = wire::settled_spoke(&link, &control).await.0;
    assert!(read(s3).await == shard[from as usize..=to as usize]);
    let warm = wire::settled_spoke(&link, &control).await.0.since(before);
    assert_eq!(warm.to_client, 0, "a warm range brings nothing over the link");
}

/// The bytes a connection to the door at `door` answered to `request` (then `trickle`, a byte every
/// 500 ms, for a client that sends its headers slowly) before the door closed it; bounded:
/// a door that keeps the connection open fails the test, never hangs it.
async fn answered(door: std::net::SocketAddr, request: Vec<u8>, trickle: &'static [u8]) -> Vec<u8> {
    let socket = tokio::net::TcpStream::connect(door).await.unwrap();
    let (mut read, mut write) = socket.into_split();
    let writer = tokio::spawn(async move {
        // The door may close the connection before it has read everything: a failed write
        // is its answer, read below.
        if write.write_all(&request).await.is_err() {
            return;
        }
        for byte in trickle {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if write.write_all(&[*byte]).await.is_err() {
                return;
            }
        }
        // Never closes its side: a server that sees a client's end of input closes
        // without answering, which would pass for a refusal.
        std::future::pending::<()>().await;
    });
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(60), read.read_to_end(&mut answer)).await;
    assert!(
        closed.is_ok(),
        "the door kept the connection open past a minute: {}",
        String::from_utf8_lossy(&answer)
    );
    writer.abort();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_header_and_a_client_that_sends_its_headers_slowly_are_cut_off_and_the_door_serves_on() {
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "c4", 1, SHARD);
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start_with_s3(&dir.path().join("cache"), spoke_options(&hub.endpoint)).await;
    let addr = spoke.s3_addr.unwrap();

    // A 1 MiB header: refused (431) without reading it all, and nothing served.
    let mut huge = format!("GET /c4/shard-00000.bin HTTP/1.1\r\nHost: {addr}\r\nX-Padding: ").into_bytes();
    huge.extend(std::iter::repeat_n(b'a', 1 << 20));
    huge.extend_from_slice(b"\r\n\r\n");
    let answer = answered(addr, huge, b"").await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 431"), "{}", &text[..text.len().min(300)]);

    // Headers one byte every 500 ms (80 bytes would take 40 s): cut off after the door's
    // 10 s for a request's head, while another client is served meanwhile.
    let head = format!("GET /c4/shard-00000.bin HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ").into_bytes();
    let slow = tokio::spawn(answered(addr, head, &[b'x'; 80]));
    let (status, body) = get(&spoke, "/c4/shard-00000.bin").await;
    assert_eq!((status, body.len() as u64), (200, SHARD), "served while a slow client holds a connection");
    let answer = slow.await.unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(!text.contains(" 200 "), "the slow client was served: {text}");

    // A request without a body that claims another body's SHA-256 (versitygw's
    // Authentication_incorrect_payload_hash): S3's 400, not a 500 a client retries.
    // SHA-256 of no bytes ends in b855.
    let claimed = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b854";
    let lying = format!(
        "PUT /c4/object?tagging HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nx-amz-content-sha256: {claimed}\r\nConnection: close\r\n\r\n"
    );
    let answer = answered(addr, lying.into_bytes(), b"").await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("<Code>XAmzContentSHA256Mismatch</Code>"), "{text}");

    let (status, _) = get(&spoke, "/c4/shard-00000.bin").await;
    assert_eq!(status, 200, "the door serves on");
}

/// A plain `GET target` with `Host: host` (no signature, or the one the target's query
/// carries).
async fn get_from(spoke: &TestSpoke, host: &str, target: &str) -> (u16, Vec<u8>) {
    let mut socket = tokio::net::TcpStream::connect(spoke.s3_addr.unwrap()).await.unwrap();
    let request = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body =
        answer.windows(4).position(|w| w == b"\r\n\r\n").map_or(Vec::new(), |at| answer[at + 4..].to_vec());
    (status, body)
}

#[tokio::test]
async fn with_s3_domain_a_bucket_is_addressed_by_its_host_name_and_by_its_path() {
    // `--s3-domain s3.test`: `nested.s3.test/val/a.bin` (as a client configured for
    // virtual-hosted style asks, behind DNS that sends *.s3.test to the spoke) and
    // `s3.test/nested/val/a.bin` both read the dataset's shard.
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    nested_dataset(root.path());
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.s3.domains = vec!["s3.test".into()];
    let spoke = TestSpoke::start_with_s3(&dir.path().join("cache"), options).await;
    let port = spoke.s3_addr.unwrap().port();

    let (status, body) = get_from(&spoke, &format!("nested.s3.test:{port}"), "/val/a.bin").await;
    assert_eq!((status, &body[..]), (200, &b"val/a.bin"[..]), "{}", String::from_utf8_lossy(&body));
    let (status, body) = get_from(&spoke, &format!("s3.test:{port}"), "/nested/val/b.bin").await;
    assert_eq!((status, &body[..]), (200, &b"val/b.bin"[..]), "{}", String::from_utf8_lossy(&body));
    // By the spoke's address (a client that knows no domain): path style, not a bucket
    // named after the address.
    let (status, body) = get_from(&spoke, &format!("127.0.0.1:{port}"), "/nested/val/a.bin").await;
    assert_eq!((status, &body[..]), (200, &b"val/a.bin"[..]), "{}", String::from_utf8_lossy(&body));
    // A listing by host name (in capitals: host names are case-insensitive), and a bucket
    // that is no dataset.
    let (status, body) =
        get_from(&spoke, &format!("nested.s3.test:{port}"), "/?list-type=2&prefix=val/").await;
    let listing = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{listing}");
    assert!(
        listing.contains("<Key>val/a.bin</Key>") && listing.contains("<Key>val/b.bin</Key>"),
        "{listing}"
    );
    let (status, body) = get_from(&spoke, &format!("nope.s3.test:{port}"), "/val/a.bin").await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("<Code>NoSuchBucket</Code>"));
}
