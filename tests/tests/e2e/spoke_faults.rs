//! The spoke when its hub misbehaves: a hub that hangs fails uncached reads within
//! `--hub-timeout` and never holds up cached ones; whatever the hub answers during a
//! revalidation (hung, down, refusing the spoke), cached data stays served and counted;
//! listings and stats come from the spoke's index, marked stale, while the hub is away.
//! The link's faults come from the WAN emulator (`WanProxy::set_fault`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use hub_server::ServeOptions;
use shardcache_client::{CacheClient, Client, ConnectOptions, Range};
use shardcache_proto::v1::{ListShardsRequest, StatShardRequest, shard_reader_client::ShardReaderClient};
use shardcache_reader::STALE_METADATA;
use shardcache_serving::{auth::Authenticator, server::Security};
use shardcache_tests::{
    TestHub, TestSpoke, make_dataset, spoke_options, test_options, token_file,
    wan::{Fault, LinkConfig, WanProxy},
};
use tonic::Code;

/// The bound past which a call counts as hung (the test fails instead of waiting).
const HUNG: Duration = Duration::from_secs(20);

/// A spoke whose hub is behind a WAN emulator with no delay, with `shard-00000.bin` of
/// `ds` (two 1 MiB shards) cached and every cached read revalidated.
struct Setup {
    _root: tempfile::TempDir,
    _cache: tempfile::TempDir,
    dir: std::path::PathBuf,
    hub: TestHub,
    proxy: WanProxy,
    spoke: TestSpoke,
    client: Client,
}

async fn setup(hub_options: ServeOptions, hub_token: Option<String>) -> Setup {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 2, 1 << 20);
    let hub = TestHub::start_with(root.path(), hub_options).await;
    let proxy = WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, LinkConfig::rtt(Duration::ZERO))
        .await
        .unwrap();
    let mut options = spoke_options(&proxy.endpoint());
    options.hub_transport.timeout = Duration::from_millis(1500);
    options.hub_credentials = ConnectOptions { token: hub_token, ..Default::default() };
    options.cache.revalidate_after = Duration::ZERO;
    options.cache.fetch_whole_shard = false;
    options.cache.read_ahead_chunks = 0;
    let spoke = TestSpoke::start(cache.path(), options).await;
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    control.prefetch("ds", &["shard-00000.bin".into()], 0).await.unwrap().finish().await.unwrap();
    let client = spoke.client().await;
    Setup { _root: root, _cache: cache, dir, hub, proxy, spoke, client }
}

impl Setup {
    /// The first 64 KiB of a shard through the spoke, failing the test if it hangs.
    async fn read(&self, shard: &str) -> shardcache_client::Result<Vec<u8>> {
        let range = Range::new("ds", shard, 0, 64 << 10);
        let read = tokio::time::timeout(HUNG, self.client.read_range(&range)).await;
        Ok(read.unwrap_or_else(|_| panic!("a read of {shard} hung"))?.data.to_vec())
    }

    fn file(&self, shard: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(shard)).unwrap()[..64 << 10].to_vec()
    }

    async fn metric(&self, name: &str) -> f64 {
        self.spoke.metric(name).await
    }
}

#[tokio::test]
async fn a_hung_hub_fails_uncached_reads_in_time_and_never_holds_up_cached_ones() {
    let s = setup(test_options(), None).await;
    s.proxy.set_fault(Fault::Stall);

    // Cached: served, though its revalidation gets no answer.
    assert!(s.read("shard-00000.bin").await.unwrap() == s.file("shard-00000.bin"));
    assert!(s.read("shard-00000.bin").await.unwrap() == s.file("shard-00000.bin"));
    assert!(s.metric("shardcache_spoke_revalidation_failures_total").await >= 1.0);

    // Not cached: UNAVAILABLE naming the deadline, and the fetch gave its room back.
    let err = s.read("shard-00001.bin").await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
    assert!(err.to_string().contains("--hub-timeout"), "{err}");
    for _ in 0..500 {
        if s.spoke.cache.fetches_in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.spoke.cache.fetches_in_flight(), 0, "a hung fetch kept its room");

    // Healed: the uncached shard is fetched.
    s.proxy.set_fault(Fault::None);
    assert!(s.read("shard-00001.bin").await.unwrap() == s.file("shard-00001.bin"));
}

#[tokio::test]
async fn with_the_hub_down_reads_listings_and_stats_come_from_the_cache_marked_stale() {
    let s = setup(test_options(), None).await;
    s.proxy.set_fault(Fault::Down);
    // Every read revalidates (TTL 0), but the hub is asked again only after a pause.
    for _ in 0..10 {
        assert!(s.read("shard-00000.bin").await.unwrap() == s.file("shard-00000.bin"));
    }
    let failures = s.metric("shardcache_spoke_revalidation_failures_total").await;
    assert!((1.0..10.0).contains(&failures), "{failures} revalidations for 10 reads: no backoff");
    assert_eq!(s.read("shard-00001.bin").await.unwrap_err().code(), Some(Code::Unavailable));

    // Listings and stats: the spoke's own view, marked stale.
    let mut raw = ShardReaderClient::connect(s.spoke.endpoint.clone()).await.unwrap();
    let listed = raw
        .list_shards(ListShardsRequest { dataset: "ds".into(), page_size: 0, page_token: String::new() })
        .await
        .unwrap();
    assert!(listed.metadata().get(STALE_METADATA).is_some(), "a listing from the cache is marked");
    let names: Vec<_> = listed.into_inner().shards.into_iter().map(|s| s.shard).collect();
    assert_eq!(names, ["shard-00000.bin"], "the shards this spoke has seen");
    let stat = raw
        .stat_shard(StatShardRequest { dataset: "ds".into(), shard: "shard-00000.bin".into() })
        .await
        .unwrap();
    assert!(stat.metadata().get(STALE_METADATA).is_some());
    assert_eq!(stat.into_inner().size, 1 << 20);
    let datasets = s.client.list_datasets().await.unwrap();
    assert_eq!(datasets.iter().map(|d| (d.name.as_str(), d.shard_count)).collect::<Vec<_>>(), [("ds", 1)]);

    // Back: listings are the hub's again, unmarked.
    s.proxy.set_fault(Fault::None);
    let mut listed = None;
    for _ in 0..200 {
        match raw.list_shards(ListShardsRequest { dataset: "ds".into(), ..Default::default() }).await {
            Ok(page) if page.metadata().get(STALE_METADATA).is_none() => {
                listed = Some(page.into_inner());
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(listed.expect("the hub's listing came back").shards.len(), 2);
}

#[tokio::test]
async fn a_hub_that_refuses_the_spoke_does_not_make_cached_data_unreadable() {
    let tokens = tempfile::tempdir().unwrap();
    let path = tokens.path().join("tokens");
    let token = token_file(&path, &[("spoke", "*")]).remove(0);
    let mut hub_options = test_options();
    hub_options.security = Security { tls: None, auth: Authenticator::with_token_file(&path).unwrap() };
    let s = setup(hub_options, Some(token.clone())).await;

    // The spoke's token is revoked on the hub: wait (bounded) until the hub refuses it.
    token_file(&path, &[("someone-else", "*")]);
    let direct =
        Client::connect_with(&s.hub.endpoint, &ConnectOptions { token: Some(token), ..Default::default() })
            .await
            .unwrap();
    for _ in 0..200 {
        if direct.stat("ds", "shard-00000.bin").await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(direct.stat("ds", "shard-00000.bin").await.unwrap_err().code(), Some(Code::Unauthenticated));

    // Cached data is still served; what is not cached says why it cannot be fetched.
    assert!(s.read("shard-00000.bin").await.unwrap() == s.file("shard-00000.bin"));
    assert!(s.metric("shardcache_spoke_revalidation_failures_total").await >= 1.0);
    let err = s.read("shard-00001.bin").await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
    assert!(err.to_string().contains("refused this spoke's credentials"), "{err}");
}
