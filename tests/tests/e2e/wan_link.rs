//! The WAN emulator and the spoke across it: bytes are never changed, delay and rate are
//! what was asked (lower bounds only: the emulator guarantees them, the machine can only
//! add), and the tuned spoke spreads its fetches over several connections.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup should fail the test loudly

use std::{
    net::SocketAddr,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use hub_server::ServeOptions;
use shardcache_tests::{
    TestHub, TestSpoke, assert_dataset_reads_back, make_dataset, sha256, spoke_options, test_options,
    wan::{self, LinkConfig, WanProxy},
};
use shardcache_transport::http2::Http2Settings;
use spoke_cache::fetch::suppliers::hubs::HubTransport;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// An echo server on 127.0.0.1:0.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = socket.into_split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
                let _ = write.shutdown().await;
            });
        }
    });
    addr
}

/// Writes `data` through `addr` to an echo server and reads all of it back.
async fn echo_through(addr: SocketAddr, data: Vec<u8>) -> Vec<u8> {
    let socket = TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = socket.into_split();
    let writer = tokio::spawn(async move {
        // Uneven pieces, so the proxy sees many sizes.
        for piece in data.chunks(7919) {
            write.write_all(piece).await.unwrap();
        }
        write.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    read.read_to_end(&mut back).await.unwrap();
    writer.await.unwrap();
    back
}

#[tokio::test]
async fn bytes_cross_unchanged_in_order_and_no_sooner_than_the_rtt() {
    let echo = echo_server().await;
    let rtt = Duration::from_millis(60);
    let link = LinkConfig { rtt, rate_bps: None, jitter: Duration::from_millis(5) };
    let proxy = WanProxy::start("127.0.0.1:0".parse().unwrap(), echo, link).await.unwrap();

    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let want = sha256(&data);
    let back = echo_through(proxy.addr, data).await;
    assert_eq!(back.len(), 3_000_000);
    assert_eq!(sha256(&back), want, "jitter must delay bytes, never reorder or change them");

    // One small round trip: never faster than the RTT minus both jitters.
    let started = Instant::now();
    assert_eq!(echo_through(proxy.addr, b"ping".to_vec()).await, b"ping");
    assert!(started.elapsed() >= rtt - Duration::from_millis(10), "round trip took {:?}", started.elapsed());
}

#[tokio::test]
async fn the_upstream_may_be_a_host_name() {
    // Containers name the hub (`--upstream hub:7070`); the name is looked up per connection.
    let echo = echo_server().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let link = LinkConfig { rtt: Duration::from_millis(2), rate_bps: None, jitter: Duration::ZERO };
    let upstream = format!("localhost:{}", echo.port());
    let (_fault, faults) = tokio::sync::watch::channel(wan::Fault::None);
    let proxy = tokio::spawn(wan::run(listener, upstream, link, Default::default(), faults));
    for round in 0..2u8 {
        assert_eq!(echo_through(addr, vec![round; 100_000]).await, vec![round; 100_000]);
    }
    proxy.abort();
}

#[tokio::test]
async fn the_rate_cap_is_shared_by_all_connections() {
    let echo = echo_server().await;
    // 40 Mbit/s: 4 connections x 1 MB each way take at least 4 MB * 8 / 40e6 = 0.8 s.
    let link =
        LinkConfig { rtt: Duration::from_millis(2), rate_bps: Some(40_000_000), jitter: Duration::ZERO };
    let proxy = WanProxy::start("127.0.0.1:0".parse().unwrap(), echo, link).await.unwrap();
    let started = Instant::now();
    let copies = (0..4).map(|i| echo_through(proxy.addr, vec![i as u8; 1_000_000]));
    for (i, back) in futures::future::join_all(copies).await.into_iter().enumerate() {
        assert_eq!(back, vec![i as u8; 1_000_000]);
    }
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "4 MB at 40 Mbit/s took {:?}",
        started.elapsed()
    );
    assert_eq!(proxy.counters.accepted.load(Ordering::Relaxed), 4);
    // What crossed the link each way, counted as delivered (benchmarks read it).
    assert_eq!(proxy.counters.bytes_to_upstream.load(Ordering::Relaxed), 4_000_000);
    assert_eq!(proxy.counters.bytes_to_client.load(Ordering::Relaxed), 4_000_000);
    assert_eq!(proxy.counters.line(), "4000000 4000000 4\n");
}

#[tokio::test]
async fn a_spoke_across_the_link_serves_the_hubs_bytes_over_several_connections() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dataset = make_dataset(root.path(), "ds", 6, 3 << 20);
    // Explicit socket buffers on both ends (the flags' non-default path: the hub sets
    // SO_SNDBUF on accepted sockets, the spoke connects through its own connector).
    let sized = Http2Settings { socket_buffer: 1 << 20, ..Http2Settings::TUNED };
    let hub = TestHub::start_with(root.path(), ServeOptions { http2: sized, ..test_options() }).await;
    let link = LinkConfig::rtt(Duration::from_millis(60));
    let proxy = WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, link).await.unwrap();

    let mut options = spoke_options(&format!("http://{}", proxy.addr));
    options.hub_transport = HubTransport { connections: 3, http2: sized, ..Default::default() };
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let progress = spoke.control().await.prefetch("ds", &[], 0).await.unwrap().finish().await.unwrap();
    assert_eq!(progress.bytes_fetched, 6 * (3 << 20));
    assert_eq!(proxy.counters.accepted.load(Ordering::Relaxed), 3, "one connection per --hub-connections");
    let before = hub.stats.snapshot();
    assert_dataset_reads_back(&spoke.client().await, "ds", &dataset).await;
    assert_eq!(hub.stats.snapshot().read_requests, before.read_requests, "warm reads stay local");
}

#[tokio::test]
async fn a_stalled_link_moves_nothing_until_healed_and_a_down_link_closes_connections() {
    let echo = echo_server().await;
    let proxy =
        WanProxy::start("127.0.0.1:0".parse().unwrap(), echo, LinkConfig::rtt(Duration::ZERO)).await.unwrap();
    let mut socket = TcpStream::connect(proxy.addr).await.unwrap();
    socket.write_all(b"one").await.unwrap();
    let mut buf = [0u8; 3];
    socket.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"one");

    // Stalled: what is written does not come back (a bounded wait is the failure bound)...
    proxy.set_fault(wan::Fault::Stall);
    socket.write_all(b"two").await.unwrap();
    let stalled = tokio::time::timeout(Duration::from_millis(300), socket.read_exact(&mut buf)).await;
    assert!(stalled.is_err(), "bytes crossed a stalled link");
    // ...until the link heals, and then nothing was lost.
    proxy.set_fault(wan::Fault::None);
    socket.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"two");

    // Down: the open connection is closed, and a new one is closed at once.
    proxy.set_fault(wan::Fault::Down);
    let mut rest = Vec::new();
    assert_eq!(socket.read_to_end(&mut rest).await.unwrap_or(0), 0, "the connection was closed");
    let mut again = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(again.read_to_end(&mut rest).await.unwrap_or(0), 0);
    proxy.set_fault(wan::Fault::None);
    assert_eq!(echo_through(proxy.addr, b"three".to_vec()).await, b"three");
}

/// The SDK fails a call left with no connection (`shardcache_transport::liveness`), and
/// must fail nothing else: a call whose connection is open but silent (a stalled link)
/// waits past `ORPHAN_GRACE` and is answered once the link heals; a call on a link
/// that is down fails at once (tonic's own transport error), and the next, once the
/// link is up, is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_call_waits_on_a_silent_connection_past_the_orphan_grace_and_is_answered() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "ds", 1, 64 << 10);
    let hub = TestHub::start(root.path()).await;
    let proxy = WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, LinkConfig::rtt(Duration::ZERO))
        .await
        .unwrap();
    let client = shardcache_client::Client::connect(&proxy.endpoint()).await.unwrap();
    assert_eq!(client.list_datasets().await.unwrap()[0].name, "ds");

    proxy.set_fault(wan::Fault::Stall);
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.list_datasets().await }
    });
    // Not a bound on anything: the call must still be waiting after the grace has passed.
    tokio::time::sleep(shardcache_transport::liveness::ORPHAN_GRACE * 2).await;
    assert!(!call.is_finished(), "a call on an open connection was failed: {:?}", call.await);
    proxy.set_fault(wan::Fault::None);
    assert_eq!(call.await.unwrap().unwrap()[0].name, "ds", "answered once the link healed");

    proxy.set_fault(wan::Fault::Down);
    let down = client.list_datasets().await.unwrap_err();
    // (tonic's code for it depends on where the close caught the call: any of these.)
    let transport = [tonic::Code::Unknown, tonic::Code::Unavailable, tonic::Code::Cancelled];
    assert!(down.code().is_some_and(|code| transport.contains(&code)), "{down}");
    proxy.set_fault(wan::Fault::None);
    assert_eq!(client.list_datasets().await.unwrap()[0].name, "ds", "the channel connects again");
}
