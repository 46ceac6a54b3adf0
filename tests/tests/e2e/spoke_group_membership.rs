//! A group whose members come from a file (`file:PATH`) or from DNS
//! (`dns+http://NAME:PORT`, as a Kubernetes headless Service is discovered), re-read
//! while it runs: a member that joins is seen by the clients and by the other spokes,
//! takes its share of the shards on first use, and takes it from the member that held it
//! (over the local network), so the link carries nothing more.
//!
//! The DNS test resolves through a hosts file: the test binary runs that test again in a
//! child process with nss_wrapper (`libnss-wrapper`, which `make test` installs)
//! preloaded, so the SDK's and the spokes' ordinary resolver (getaddrinfo) reads
//! `NSS_WRAPPER_HOSTS` instead of `/etc/hosts`.

#![allow(clippy::unwrap_used)]

use std::{path::Path, sync::atomic::Ordering::Relaxed};

use shardcache_client::{Client, Range};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, spoke_options, until};
use spoke_cache::PeerGroup;
use tokio::net::TcpListener;

const MIB: u64 = 1 << 20;
/// Enough shards that the joining member owns some whatever ports it gets: with 12 it owned
/// none in (2/3)^12, ~0.8% of runs (seen once in CI); with 32, ~2 in a million.
const SHARDS: u32 = 32;
/// Shards of one chunk of the spoke's default size (4 MiB): a member hands a whole chunk
/// to another in one message (tonic's default 4 MiB message limit once refused it).
const SHARD: u64 = 4 * MIB;

fn names() -> Vec<String> {
    (0..SHARDS).map(shardcache_cli::dataset_gen::shard_name).collect()
}

/// Every shard read whole through `client`, each compared with its file.
async fn read_every_shard(client: &Client, files: &Path) {
    for name in names() {
        let read = client.read_range(&Range::new("ds", &name, 0, SHARD)).await.unwrap();
        assert!(read.data == std::fs::read(files.join(&name)).unwrap(), "{name}");
    }
}

/// Waits (bounded) until the client knows `n` members and each spoke `known[i]`.
async fn until_everyone_knows(client: &Client, spokes: &[TestSpoke], n: usize, known: [usize; 3]) {
    let knows = |(s, n): (&TestSpoke, &usize)| s.cache.chain().peers().unwrap().urls().len() == *n;
    until(&format!("the client seeing {n} members and the spokes {known:?}"), || {
        client.members().len() == n && spokes.iter().zip(&known).all(knows)
    })
    .await;
}

/// Three spokes on `listeners` (URLs `urls`), all given the group `spec`, which first
/// lists the first two; `add_third` then lists the third too.
async fn a_member_joins(spec: &str, listeners: Vec<TcpListener>, urls: &[String], add_third: impl FnOnce()) {
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "ds", SHARDS, SHARD);
    let mut hub_options = shardcache_tests::test_options();
    hub_options.limits.max_read = SHARD;
    let hub = TestHub::start_with(root.path(), hub_options).await;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut spokes = Vec::new();
    for ((listener, url), dir) in listeners.into_iter().zip(urls).zip(&dirs) {
        let mut options = spoke_options(&hub.endpoint);
        (options.cache.chunk_size, options.max_read) = (SHARD, SHARD);
        options.group =
            Some(PeerGroup { spec: spec.to_owned(), me: url.clone(), credentials: Default::default() });
        spokes.push(TestSpoke::start_on(listener, dir.path(), options).await);
    }
    let client = Client::connect(spec).await.unwrap();
    // The third spoke is not listed yet, but counts itself a member: a spoke whose
    // resolver lags its peers' must rank shards as they do once they list it.
    until_everyone_knows(&client, &spokes, 2, [2, 2, 3]).await;
    assert_eq!(client.members(), urls[..2], "the source's members, as listed");
    assert!(spokes[2].cache.chain().peers().unwrap().urls().contains(&urls[2]));

    read_every_shard(&client, &files).await;
    let dataset = u64::from(SHARDS) * SHARD;
    assert_eq!(hub.stats.snapshot().bytes_served, dataset, "two members fetched the dataset once");
    assert_eq!(spokes[2].cache.used_bytes(), 0, "the third is not a member yet");

    add_third();
    until_everyone_knows(&client, &spokes, 3, [3, 3, 3]).await;
    read_every_shard(&client, &files).await;
    for spoke in &spokes {
        spoke.settled().await;
    }
    let joined = names().iter().filter(|n| client.owners("ds", n)[0] == urls[2]).count() as u64;
    assert!(joined > 0, "the new member owns some of {SHARDS} shards");
    assert_eq!(spokes[2].cache.used_bytes(), joined * SHARD, "the new member holds its share");
    let from_peers = spokes[2].cache.metrics().dataset("ds").peer_bytes.load(Relaxed);
    assert_eq!(from_peers, joined * SHARD, "it took its share from the members that held it");
    assert_eq!(hub.stats.snapshot().bytes_served, dataset, "nothing more crossed the link");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_file_is_reread_and_a_joining_member_takes_its_share_from_its_peers() {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let urls: Vec<String> = listeners.iter().map(|l| format!("http://{}", l.local_addr().unwrap())).collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("spokes");
    std::fs::write(&file, format!("# the spokes of rack 7\n{}\n{}\n", urls[0], urls[1])).unwrap();
    let spec = format!("file:{}", file.display());
    a_member_joins(&spec, listeners, &urls, || {
        // Written aside and renamed in, as a config manager does: never read half-written.
        let next = dir.path().join("spokes.next");
        std::fs::write(&next, urls.join(",")).unwrap();
        std::fs::rename(&next, &file).unwrap();
    })
    .await;
}

/// Where Debian and others put nss_wrapper.
const NSS_WRAPPER: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/libnss_wrapper.so",
    "/usr/lib/aarch64-linux-gnu/libnss_wrapper.so",
    "/usr/lib64/libnss_wrapper.so",
];

/// Set in the child process that runs the DNS test under nss_wrapper.
const CHILD: &str = "SHARDCACHE_TEST_NSS_CHILD";

#[test]
fn members_are_discovered_from_dns_and_a_new_address_joins() {
    let Ok(hosts) = std::env::var("NSS_WRAPPER_HOSTS").map(std::path::PathBuf::from) else {
        assert!(std::env::var_os(CHILD).is_none(), "the child runs with NSS_WRAPPER_HOSTS");
        let library = NSS_WRAPPER.iter().find(|p| Path::new(p).exists()).unwrap_or_else(|| {
            panic!("nss_wrapper is not installed (apt-get install libnss-wrapper; make test does)")
        });
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "members_are_discovered_from_dns_and_a_new_address_joins", "--nocapture"])
            .env("LD_PRELOAD", library)
            .env("NSS_WRAPPER_HOSTS", dir.path().join("hosts"))
            .env(CHILD, "1")
            .status()
            .unwrap();
        assert!(status.success(), "the DNS test under nss_wrapper failed: {status}");
        return;
    };
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap().block_on(
        async move {
            // Three loopback addresses, one port: as pods behind a headless Service.
            let (listeners, port) = same_port_on(&["127.0.0.1", "127.0.0.2", "127.0.0.3"]).await;
            let urls: Vec<String> = (1..=3).map(|i| format!("http://127.0.0.{i}:{port}")).collect();
            std::fs::write(&hosts, "127.0.0.1 spokes.test\n127.0.0.2 spokes.test\n").unwrap();
            let spec = format!("dns+http://spokes.test:{port}");
            a_member_joins(&spec, listeners, &urls, || {
                let mut records = std::fs::read_to_string(&hosts).unwrap();
                records.push_str("127.0.0.3 spokes.test\n");
                let next = hosts.with_extension("next");
                std::fs::write(&next, records).unwrap();
                std::fs::rename(&next, &hosts).unwrap();
            })
            .await;
        },
    );
}

/// Listeners on one free port at each of `ips`.
async fn same_port_on(ips: &[&str]) -> (Vec<TcpListener>, u16) {
    for _ in 0..50 {
        let first = TcpListener::bind((ips[0], 0)).await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut listeners = vec![first];
        for ip in &ips[1..] {
            match TcpListener::bind((*ip, port)).await {
                Ok(listener) => listeners.push(listener),
                Err(_) => break,
            }
        }
        if listeners.len() == ips.len() {
            return (listeners, port);
        }
    }
    panic!("no port free on all of {ips:?} in 50 tries");
}
