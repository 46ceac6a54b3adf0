//! The same-node door (`spoke-cache --local-socket`): a reader on the spoke's node finds
//! it by itself and reads warm bytes from the cache's files, byte-identical to the
//! dataset and counted as hits; what is not stored is read over gRPC; the door refuses
//! what the gRPC port refuses (tokens, another tenant's dataset, ranges past the end,
//! bad names, a changed version, what is not a question) with the same codes, and the
//! spoke serves on; a door that cannot be opened leaves the SDK on gRPC.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use prost::Message;
use shardcache_client::{Client, ConnectOptions, Range};
use shardcache_proto::v1::{LocalAnswer, LocalQuestion, ReadRangeRequest};
use shardcache_serving::{auth::Authenticator, server::Security};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, spoke_options, token_file};
use shardcache_transport::local_socket;
use tokio::net::UnixStream;
use tonic::Code;

const SHARD: u64 = 1 << 20;

fn token(token: &str) -> ConnectOptions {
    ConnectOptions { tls: None, token: Some(token.to_owned()) }
}

/// A hub with datasets `c4` (4 shards) and `wiki` (1), and a spoke with tokens (`alice`:
/// c4, `bob`: wiki) and its door at `local.sock` in its cache directory.
async fn spoke_with_door(root: &Path, cache_dir: &Path) -> (TestHub, TestSpoke, Vec<String>) {
    make_dataset(root, "c4", 4, SHARD);
    make_dataset(root, "wiki", 1, SHARD);
    let hub = TestHub::start(root).await;
    let tokens_path = cache_dir.join("tokens");
    let tokens = token_file(&tokens_path, &[("alice", "c4"), ("bob", "wiki")]);
    let mut options = spoke_options(&hub.endpoint);
    options.security = Security { tls: None, auth: Authenticator::with_token_file(&tokens_path).unwrap() };
    options.local_socket = Some(cache_dir.join("local.sock"));
    let spoke = TestSpoke::start(&cache_dir.join("cache"), options).await;
    (hub, spoke, tokens)
}

fn shard_bytes(root: &Path, dataset: &str, shard: &str) -> Vec<u8> {
    std::fs::read(root.join(dataset).join(shard)).unwrap()
}

#[tokio::test]
async fn warm_reads_come_through_the_door_byte_identical_and_counted_as_hits_and_cold_ones_over_grpc() {
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_hub, spoke, tokens) = spoke_with_door(root.path(), dir.path()).await;
    let alice =
        Client::connect_with(&spoke.endpoint, &token(&tokens[0])).await.unwrap().for_job("train", 0).unwrap();
    let shard0 = shard_bytes(root.path(), "c4", "shard-00000.bin");
    // Cold: over gRPC (the door says nothing is stored), whole shards stored behind it.
    for shard in ["shard-00000.bin", "shard-00001.bin"] {
        alice.read_range(&Range::new("c4", shard, 0, SHARD)).await.unwrap();
    }
    spoke.settled().await;
    let fetched = spoke.metric("shardcache_spoke_upstream_requests_total").await;
    // (The first answer named the door: the second cold read asked it, and was sent back.)
    assert_eq!(spoke.metric("shardcache_spoke_local_door_calls_total").await, 0.0);
    assert_eq!(spoke.metric("shardcache_spoke_local_door_not_stored_total").await, 1.0);

    // Warm: whole pages, parts of pages, ranges across pages and chunks, a batch over two
    // shards, the shard's last byte.
    let shard1 = shard_bytes(root.path(), "c4", "shard-00001.bin");
    let ranges = [
        Range::new("c4", "shard-00000.bin", 0, 65536),
        Range::new("c4", "shard-00000.bin", 100, 16384),
        Range::new("c4", "shard-00000.bin", 65536 - 10, 300_000),
        Range::new("c4", "shard-00001.bin", 262_144 - 1, 2),
        Range::new("c4", "shard-00001.bin", SHARD - 1, 1),
    ];
    let read = alice.read_ranges(&ranges).await.unwrap();
    for (range, read) in ranges.iter().zip(&read) {
        let shard = if range.shard.ends_with("0.bin") { &shard0 } else { &shard1 };
        let want = &shard[range.offset as usize..][..range.length as usize];
        assert!(read.data == want, "{}+{} through the door", range.offset, range.length);
        assert_eq!(read.crc32c, crc32c::crc32c(want));
        assert_eq!(read.wire_len, 0, "no byte crossed a socket");
    }
    let whole = alice.read_range(&Range::new("c4", "shard-00000.bin", 0, SHARD)).await.unwrap();
    assert!(whole.data == shard0);
    // Warm: nothing of it crossed the link.
    assert_eq!(spoke.metric("shardcache_spoke_upstream_requests_total").await, fetched);
    let asked: f64 = ranges.iter().map(|r| r.length as f64).sum::<f64>() + SHARD as f64;
    assert_eq!(spoke.metric("shardcache_spoke_local_door_calls_total").await, 2.0);
    assert_eq!(spoke.metric("shardcache_spoke_local_door_placed_bytes_total").await, asked);
    assert_eq!(spoke.metric("shardcache_spoke_local_door_carried_bytes_total").await, 0.0);
    // Counted as any read: hits of dataset c4, in the job's row.
    let hits = spoke.metric("shardcache_spoke_hit_requests_total{dataset=\"c4\"}").await;
    assert!(hits >= 6.0, "{hits} hits");

    // A stream of a stored shard comes through the door too; one of a shard not stored
    // goes on over gRPC from where the door sent it back.
    let streamed =
        alice.stream_shard("c4", "shard-00001.bin", 1000, None).await.unwrap().read_to_end().await.unwrap();
    assert!(streamed == shard1[1000..]);
    assert_eq!(spoke.metric("shardcache_spoke_local_door_calls_total").await, 3.0);
    let shard2 = shard_bytes(root.path(), "c4", "shard-00002.bin");
    let streamed =
        alice.stream_shard("c4", "shard-00002.bin", 0, None).await.unwrap().read_to_end().await.unwrap();
    assert!(streamed == shard2);
    assert_eq!(spoke.metric("shardcache_spoke_local_door_not_stored_total").await, 2.0);

    // A shard not stored: the door answers so and the read goes over gRPC.
    let shard3 = shard_bytes(root.path(), "c4", "shard-00003.bin");
    let cold = alice.read_range(&Range::new("c4", "shard-00003.bin", 5, 1000)).await.unwrap();
    assert!(cold.data == shard3[5..1005]);
    assert_eq!(spoke.metric("shardcache_spoke_local_door_not_stored_total").await, 3.0);
}

/// One question to the door at `socket`, its answer.
async fn ask(socket: &Path, question: &LocalQuestion) -> LocalAnswer {
    let stream = UnixStream::connect(socket).await.unwrap();
    local_socket::send(&stream, &question.encode_to_vec(), &[]).await.unwrap();
    let (answer, _files) = local_socket::recv(&stream, 1 << 20).await.unwrap().unwrap();
    LocalAnswer::decode(&answer[..]).unwrap()
}

fn question(token: Option<&str>, ranges: &[(&str, &str, u64, u64)]) -> LocalQuestion {
    LocalQuestion {
        headers: token.map(|t| ("authorization".to_owned(), format!("Bearer {t}"))).into_iter().collect(),
        ranges: ranges
            .iter()
            .map(|&(dataset, shard, offset, length)| ReadRangeRequest {
                dataset: dataset.into(),
                shard: shard.into(),
                offset,
                length,
                ..Default::default()
            })
            .collect(),
    }
}

#[tokio::test]
async fn the_door_refuses_what_the_grpc_port_refuses_and_the_spoke_serves_on() {
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_hub, spoke, tokens) = spoke_with_door(root.path(), dir.path()).await;
    let (alice, bob) = (tokens[0].as_str(), tokens[1].as_str());
    let reader = Client::connect_with(&spoke.endpoint, &token(alice)).await.unwrap();
    reader.read_range(&Range::new("c4", "shard-00000.bin", 0, SHARD)).await.unwrap();
    spoke.settled().await;
    let used = spoke.cache.used_bytes();
    let socket = dir.path().join("local.sock");
    let shard = "shard-00000.bin";

    let cases: [(LocalQuestion, Code, &str); 7] = [
        (question(None, &[("c4", shard, 0, 10)]), Code::Unauthenticated, "missing credentials"),
        (question(Some("sct_forged"), &[("c4", shard, 0, 10)]), Code::Unauthenticated, "unknown or revoked"),
        // Another tenant's dataset, stored on this spoke: refused, not placed.
        (question(Some(bob), &[("c4", shard, 0, 10)]), Code::PermissionDenied, "may not read dataset \"c4\""),
        (question(Some(alice), &[("c4", shard, SHARD - 5, 10)]), Code::InvalidArgument, "past the end"),
        (question(Some(alice), &[("c4", "../wiki/x", 0, 10)]), Code::InvalidArgument, "shard name"),
        (question(Some(alice), &[("c4", shard, 0, 2 << 20)]), Code::InvalidArgument, "max"),
        (
            LocalQuestion {
                ranges: vec![ReadRangeRequest {
                    expected_version: "v-forged".into(),
                    ..question(Some(alice), &[("c4", shard, 0, 10)]).ranges[0].clone()
                }],
                ..question(Some(alice), &[])
            },
            Code::Aborted,
            "not v-forged",
        ),
    ];
    for (question, code, words) in cases {
        let answer = ask(&socket, &question).await;
        assert_eq!(Code::from(answer.code as i32), code, "{}", answer.message);
        assert!(answer.message.contains(words), "{:?} lacks {words:?}", answer.message);
        assert!(answer.ranges.is_empty(), "nothing placed for a refused question");
    }
    // What is not a question: bytes that are no message, a length past the limit.
    let stream = UnixStream::connect(&socket).await.unwrap();
    local_socket::send(&stream, &[0xff; 40], &[]).await.unwrap();
    let (answer, _) = local_socket::recv(&stream, 1 << 20).await.unwrap().unwrap();
    let answer = LocalAnswer::decode(&answer[..]).unwrap();
    assert_eq!(Code::from(answer.code as i32), Code::InvalidArgument, "{}", answer.message);
    let raw = UnixStream::connect(&socket).await.unwrap();
    raw.writable().await.unwrap();
    raw.try_write(&u32::MAX.to_le_bytes()).unwrap();
    let (answer, _) = local_socket::recv(&raw, 1 << 20).await.unwrap().unwrap();
    assert!(LocalAnswer::decode(&answer[..]).unwrap().message.contains("not a question"));
    assert!(local_socket::recv(&raw, 1 << 20).await.unwrap().is_none(), "then the connection is closed");

    // The spoke serves on, nothing of the store changed, and a good question is answered
    // with the page's place and its file.
    assert_eq!(spoke.cache.used_bytes(), used);
    let stream = UnixStream::connect(&socket).await.unwrap();
    local_socket::send(&stream, &question(Some(alice), &[("c4", shard, 10, 100)]).encode_to_vec(), &[])
        .await
        .unwrap();
    let (answer, files) = local_socket::recv(&stream, 1 << 20).await.unwrap().unwrap();
    let answer = LocalAnswer::decode(&answer[..]).unwrap();
    assert_eq!((answer.code, answer.ranges.len(), files.len()), (0, 1, 1), "{}", answer.message);
    let piece = &answer.ranges[0].pieces[0];
    assert!(piece.page && (piece.from, piece.to) == (10, 110));
    let read = reader.read_range(&Range::new("c4", shard, 0, 1000)).await.unwrap();
    assert!(read.data == shard_bytes(root.path(), "c4", shard)[..1000]);
}

#[tokio::test]
async fn a_door_that_cannot_be_opened_leaves_reads_on_grpc() {
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_hub, spoke, tokens) = spoke_with_door(root.path(), dir.path()).await;
    // As in a container without the socket: the path the spoke names is not there.
    let socket = dir.path().join("local.sock");
    shardcache_tests::until("the door is open", || socket.exists()).await;
    std::fs::remove_file(&socket).unwrap();
    let reader = Client::connect_with(&spoke.endpoint, &token(&tokens[0])).await.unwrap();
    let shard = shard_bytes(root.path(), "c4", "shard-00002.bin");
    for _ in 0..3 {
        let read = reader.read_range(&Range::new("c4", "shard-00002.bin", 0, SHARD)).await.unwrap();
        assert!(read.data == shard);
        spoke.settled().await;
    }
    assert_eq!(spoke.metric("shardcache_spoke_local_door_calls_total").await, 0.0);
}

#[tokio::test]
async fn a_spoke_that_knows_its_readers_by_certificate_alone_opens_no_door() {
    use shardcache_serving::tls::{ServerTls, ServerTlsFiles};
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "c4", 1, SHARD);
    let hub = TestHub::start(root.path()).await;
    let pki = shardcache_tests::pki::Pki::new("door-mtls");
    let files = ServerTlsFiles { ..pki.server("spoke-server", Some(pki.ca())) };
    let mut options = spoke_options(&hub.endpoint);
    // Client certificates and no token file: a Unix socket carries no certificate, so a
    // door would read for anyone on the node.
    options.security = Security { tls: Some(ServerTls::load(&files).unwrap()), auth: Authenticator::open() };
    options.local_socket = Some(dir.path().join("local.sock"));
    let spoke = TestSpoke::start(&dir.path().join("cache"), options).await;
    let certified = ConnectOptions {
        tls: Some(pki.client(Some(("trainer", shardcache_tests::pki::valid())))),
        token: None,
    };
    let client = Client::connect_with(&spoke.endpoint, &certified).await.unwrap();
    for _ in 0..2 {
        client.read_range(&Range::new("c4", "shard-00000.bin", 0, SHARD)).await.unwrap();
        spoke.settled().await;
    }
    // Served over gRPC: the door is decided before the gRPC port serves.
    assert!(!dir.path().join("local.sock").exists(), "no socket");
    // (Its metrics listener is TLS too: read in-process.)
    let metrics = spoke.cache.metrics();
    assert_eq!(metrics.door_calls.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_second_spoke_leaves_a_live_door_alone_and_its_stop_does_not_remove_it() {
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (hub, first, tokens) = spoke_with_door(root.path(), dir.path()).await;
    let socket = dir.path().join("local.sock");
    shardcache_tests::until("the first door is open", || socket.exists()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.local_socket = Some(socket.clone());
    let second = TestSpoke::start(&dir.path().join("second"), options).await;
    // The second spoke serves (over gRPC only), then stops: the first door still answers.
    let plain = Client::connect(&second.endpoint).await.unwrap();
    plain.read_range(&Range::new("c4", "shard-00000.bin", 0, 10)).await.unwrap();
    second.stop().await;
    assert!(socket.exists(), "the first spoke's socket is still there");
    let alice = Client::connect_with(&first.endpoint, &token(&tokens[0])).await.unwrap();
    let whole = Range::new("c4", "shard-00001.bin", 0, SHARD);
    alice.read_range(&whole).await.unwrap();
    first.settled().await;
    alice.read_range(&whole).await.unwrap();
    assert_eq!(first.metric("shardcache_spoke_local_door_calls_total").await, 1.0, "the first door answered");
}

#[tokio::test]
async fn a_damaged_page_in_the_cache_is_never_handed_out_through_the_door() {
    let (root, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_hub, spoke, tokens) = spoke_with_door(root.path(), dir.path()).await;
    let alice = Client::connect_with(&spoke.endpoint, &token(&tokens[0])).await.unwrap();
    let want = shard_bytes(root.path(), "c4", "shard-00000.bin");
    let whole = Range::new("c4", "shard-00000.bin", 0, SHARD);
    alice.read_range(&whole).await.unwrap();
    spoke.settled().await;
    // One byte of page data flipped in every chunk file (a disk that rots under the cache).
    let mut damaged = 0;
    for entry in std::fs::read_dir(dir.path().join("cache")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sst") && std::fs::metadata(&path).unwrap().len() > 200_000 {
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[1000] ^= 0x40;
            std::fs::write(&path, bytes).unwrap();
            damaged += 1;
        }
    }
    assert!(damaged >= 4, "the shard's chunk files: {damaged}");
    let read = alice.read_range(&Range::new("c4", "shard-00000.bin", 0, 100_000)).await.unwrap();
    assert!(read.data == want[..100_000], "the reader checks each page: never the damaged bytes");
    assert!(alice.read_range(&whole).await.unwrap().data == want);
}
