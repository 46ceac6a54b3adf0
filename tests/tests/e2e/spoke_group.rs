//! A group of spokes (`--peers`): clients route each shard to its owner (rendezvous
//! hashing in the SDK), owners fetch from the hub, the others ask the owner. Two trainer
//! nodes through three spokes fetch the dataset over the long link once; a member that
//! stops costs no failed read (the next member serves), only its share of hub bytes; and
//! back, it serves what it had cached at once.

#![allow(clippy::unwrap_used)]

use shardcache_client::{Client, Range};
use shardcache_tests::{KeptAddress, TestHub, TestSpoke, make_dataset, spoke_options};
use spoke_cache::PeerGroup;

const MIB: u64 = 1 << 20;
const SHARDS: u32 = 12;

fn names() -> Vec<String> {
    (0..SHARDS).map(shardcache_cli::dataset_gen::shard_name).collect()
}

/// Every shard whole, checked against the files: ReadRanges of a quarter of four shards
/// each (1 MiB, the reads' limit), so a batch spans owners and is split and put back.
async fn read_all(client: &Client, files: &std::path::Path) {
    let quarter = MIB / 4;
    for part in 0..4 {
        for group in names().chunks(4) {
            let ranges: Vec<Range> =
                group.iter().map(|n| Range::new("ds", n, part * quarter, quarter)).collect();
            let read = client.read_ranges(&ranges).await.unwrap();
            for (name, got) in group.iter().zip(read) {
                let file = std::fs::read(files.join(name)).unwrap();
                let want = &file[(part * quarter) as usize..((part + 1) * quarter) as usize];
                assert!(got.data == want, "{name} part {part}");
            }
        }
    }
}

/// Reads the running members have answered.
fn reads_served(group: &Group) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    group
        .spokes
        .iter()
        .flatten()
        .map(|s| {
            let counters = s.cache.metrics().dataset("ds");
            counters.hit_requests.load(Relaxed) + counters.miss_requests.load(Relaxed)
        })
        .sum()
}

struct Group {
    /// Each member's address, kept while it is stopped.
    addresses: Vec<KeptAddress>,
    urls: Vec<String>,
    dirs: Vec<tempfile::TempDir>,
    spokes: Vec<Option<TestSpoke>>,
    hub: String,
}

impl Group {
    async fn start(hub: &str, members: usize) -> Self {
        let addresses: Vec<KeptAddress> = (0..members).map(|_| KeptAddress::new()).collect();
        let urls = addresses.iter().map(KeptAddress::url).collect();
        let dirs: Vec<_> = (0..members).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut group = Self { addresses, urls, dirs, spokes: Vec::new(), hub: hub.to_owned() };
        for i in 0..members {
            let spoke = group.start_member(i).await;
            group.spokes.push(Some(spoke));
        }
        group
    }

    async fn start_member(&self, i: usize) -> TestSpoke {
        let listener = self.addresses[i].listener();
        let mut options = spoke_options(&self.hub);
        options.group = Some(PeerGroup {
            spec: self.urls.join(","),
            me: self.urls[i].clone(),
            credentials: Default::default(),
        });
        TestSpoke::start_on(listener, self.dirs[i].path(), options).await
    }

    fn spec(&self) -> String {
        self.urls.join(",")
    }

    async fn settled(&self) {
        for spoke in self.spokes.iter().flatten() {
            spoke.settled().await;
        }
    }
}

/// The test dataset (`SHARDS` shards of 1 MiB) on a hub, and a group of three in front
/// of it: the directory (kept for the test's length), the shards' files, hub and group.
async fn three_members() -> (tempfile::TempDir, std::path::PathBuf, TestHub, Group) {
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "ds", SHARDS, MIB);
    let hub = TestHub::start(root.path()).await;
    let group = Group::start(&hub.endpoint, 3).await;
    (root, files, hub, group)
}

/// A job's first batch of one shard that member 0 owns: 32 samples of 4 KiB spread
/// over it, and the shard's file to check them against.
struct OwnedBatch {
    shard: String,
    samples: Vec<(u64, u64)>,
    file: Vec<u8>,
}

impl OwnedBatch {
    fn of_member_0(group: &Group, client: &Client, files: &std::path::Path) -> Self {
        let shard = names()
            .into_iter()
            .find(|n| client.owners("ds", n)[0] == group.urls[0])
            .expect("a shard member 0 owns");
        let file = std::fs::read(files.join(&shard)).unwrap();
        Self { samples: (0..32).map(|i| ((i * 32) << 10, 4 << 10)).collect(), shard, file }
    }

    fn ranges(&self) -> Vec<Range> {
        self.samples.iter().map(|&(at, len)| Range::new("ds", &self.shard, at, len)).collect()
    }

    /// Every sample read from `who` is the file's bytes.
    fn check(&self, read: &[shardcache_client::Verified], who: &str) {
        assert_eq!(read.len(), self.samples.len(), "every sample from {who}");
        for (got, &(at, len)) in read.iter().zip(&self.samples) {
            assert!(
                got.data == self.file[at as usize..(at + len) as usize],
                "{} at {at} from {who}",
                self.shard
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_through_three_spokes_fetch_once_and_survive_a_member_stopping() {
    let (_root, files, hub, mut group) = three_members().await;
    let dataset = u64::from(SHARDS) * MIB;

    // Two trainer nodes, each with its own group client.
    let (node_a, node_b) =
        (Client::connect(&group.spec()).await.unwrap(), Client::connect(&group.spec()).await.unwrap());
    read_all(&node_a, &files).await;
    read_all(&node_b, &files).await;
    group.settled().await;
    assert_eq!(hub.stats.snapshot().bytes_served, dataset, "the group fetched the dataset once");
    // Each member holds what it owns.
    let owned = |member: usize| {
        names().iter().filter(|n| node_a.owners("ds", n)[0] == group.urls[member]).count() as u64
    };
    for (i, spoke) in group.spokes.iter().flatten().enumerate() {
        assert_eq!(spoke.cache.used_bytes(), owned(i) * MIB, "member {i}");
    }

    // A member stops: no read fails, and only its share crosses the link again.
    let stopped = 1;
    group.spokes[stopped].take().unwrap().stop().await;
    let (before, served_before) = (hub.stats.snapshot().bytes_served, reads_served(&group));
    let hedges_before = node_a.hedges().sent.load(std::sync::atomic::Ordering::Relaxed);
    read_all(&node_a, &files).await;
    group.settled().await;
    let refetched = hub.stats.snapshot().bytes_served - before;
    assert!(
        refetched <= owned(stopped) * MIB,
        "{refetched} bytes again, its share is {}",
        owned(stopped) * MIB
    );
    let served = reads_served(&group) - served_before;
    // Each read was served by a member still up. A batch's ranges owned by the stopped
    // member go together to the next member in the first one's ranking; for a shard
    // ranked otherwise, that member reads it from the one ranked before it (a local hop,
    // counted there too), and a hedged read may be served twice.
    let hedges = node_a.hedges().sent.load(std::sync::atomic::Ordering::Relaxed) - hedges_before;
    let reads = 4 * u64::from(SHARDS);
    assert!(
        (reads..=reads + 4 * owned(stopped) + hedges).contains(&served),
        "the members still up served every read: {served} served for {reads} reads, {hedges} hedges"
    );

    // Back on its address with its cache: the client that saw it fail (or that found
    // its calls hanging and demoted it: either way it is failing until it answers)
    // finds it serving again (its health check, every 500 ms), and it serves its shards
    // from its cache.
    assert_eq!(node_a.failing_members(), [group.urls[stopped].clone()]);
    group.spokes[stopped] = Some(group.start_member(stopped).await);
    shardcache_tests::until("the client seeing the member serve again", || {
        node_a.failing_members().is_empty()
    })
    .await;
    let before = hub.stats.snapshot().bytes_served;
    let back = group.spokes[stopped].as_ref().unwrap();
    let hits_before =
        back.cache.metrics().dataset("ds").hit_requests.load(std::sync::atomic::Ordering::Relaxed);
    let hedges_before = node_a.hedges().sent.load(std::sync::atomic::Ordering::Relaxed);
    read_all(&node_a, &files).await;
    group.settled().await;
    assert_eq!(hub.stats.snapshot().bytes_served, before, "nothing crossed the link");
    let hits = back.cache.metrics().dataset("ds").hit_requests.load(std::sync::atomic::Ordering::Relaxed);
    // A hedged read may have been cancelled at the member before it counted.
    let hedges = node_a.hedges().sent.load(std::sync::atomic::Ordering::Relaxed) - hedges_before;
    assert!(
        (4 * owned(stopped)).saturating_sub(hedges) <= hits - hits_before
            && hits - hits_before <= 4 * owned(stopped),
        "the restarted member served its shards from its cache: {} hits, {hedges} hedges",
        hits - hits_before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_asked_for_a_shard_it_does_not_own_reads_it_from_the_owner() {
    let (_root, files, hub, group) = three_members().await;
    // Warm the owners through the group, then read everything from member 0 alone (a
    // node that talks to its local spoke only).
    read_all(&Client::connect(&group.spec()).await.unwrap(), &files).await;
    group.settled().await;
    let served = hub.stats.snapshot().bytes_served;
    let local = group.spokes[0].as_ref().unwrap();
    read_all(&local.client().await, &files).await;
    group.settled().await;
    assert_eq!(hub.stats.snapshot().bytes_served, served, "the other shards came from their owners");
    let counters = local.cache.metrics().dataset("ds");
    let peer_bytes = counters.peer_bytes.load(std::sync::atomic::Ordering::Relaxed);
    let client = Client::connect(&group.spec()).await.unwrap();
    let not_owned = names().iter().filter(|n| client.owners("ds", n)[0] != group.urls[0]).count() as u64;
    assert_eq!(peer_bytes, not_owned * MIB, "member 0 fetched the others' shards from them");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_prefetch_brings_each_shard_over_the_link_once_and_status_adds_up() {
    let (_root, files, hub, group) = three_members().await;
    let control = shardcache_client::CacheClient::connect(&group.spec()).await.unwrap();
    let done = control.prefetch("ds", &[], 0).await.unwrap().finish().await.unwrap();
    assert_eq!((done.shards_done, done.bytes_fetched), (u64::from(SHARDS), u64::from(SHARDS) * MIB));
    group.settled().await;
    assert_eq!(
        hub.stats.snapshot().bytes_served,
        u64::from(SHARDS) * MIB,
        "each shard fetched by its owner only"
    );
    let status = control.status().await.unwrap();
    assert_eq!(status.used_bytes, u64::from(SHARDS) * MIB, "the group holds one copy");
    assert_eq!(status.datasets[0].cached_shards, u64::from(SHARDS));
    // Warm: reading through the group costs the link nothing.
    read_all(&Client::connect(&group.spec()).await.unwrap(), &files).await;
    assert_eq!(hub.stats.snapshot().bytes_served, u64::from(SHARDS) * MIB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_goes_on_from_the_next_member_when_its_member_dies() {
    // Spokes as processes, so the owner can be killed mid-stream (no graceful end). The
    // shard is larger than what HTTP/2 lets the owner send ahead, so the rest must come
    // from the next member, at the version already read.
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "ds", 1, 48 * MIB);
    let hub = TestHub::start(root.path()).await;
    let addrs: Vec<String> = (0..3).map(|_| shardcache_tests::free_loopback_addr()).collect();
    let urls: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    let peers = urls.join(",");
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut members: Vec<Option<shardcache_tests::SpokeProcess>> = addrs
        .iter()
        .zip(&urls)
        .zip(&dirs)
        .map(|((addr, url), dir)| {
            // Chunks within the test hub's 1 MiB read limit.
            let args = ["--peers", &peers, "--peer-self", url, "--chunk-size", "1MiB"];
            Some(shardcache_tests::SpokeProcess::start_at(&hub.endpoint, dir.path(), addr, &args))
        })
        .collect();
    let client = Client::connect(&peers).await.unwrap();
    let shard = names()[0].clone();
    let owner = urls.iter().position(|u| *u == client.owners("ds", &shard)[0]).unwrap();
    let mut stream = client.stream_shard("ds", &shard, 0, None).await.unwrap();
    assert_eq!(stream.endpoint(), urls[owner]);
    let mut got = stream.next_chunk().await.unwrap().unwrap().data.to_vec();
    members[owner].take().unwrap().kill();
    while let Some(chunk) = stream.next_chunk().await.unwrap() {
        got.extend_from_slice(&chunk.data);
    }
    assert_ne!(stream.endpoint(), urls[owner], "the stream went on from another member");
    assert!(got == std::fs::read(files.join(&shard)).unwrap(), "every byte, in order, verified");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_asks_the_hub_for_a_cold_batch_of_its_own_shard_in_one_call() {
    // A job's first batch of small samples, all in a shard this member owns: the reads
    // alongside the stat (and the fills beside them) go to the hub batched, as with no
    // group, not as one ReadRange per sample at once (a group of 3 under `make demo`
    // drove the hub past its 256 requests in flight that way, and it shed them).
    let (_root, files, hub, group) = three_members().await;
    let client = Client::connect(&group.spec()).await.unwrap();
    let batch = OwnedBatch::of_member_0(&group, &client, &files);
    let local = group.spokes[0].as_ref().unwrap();
    let before = hub.stats.snapshot().read_requests;
    let probes = || -> u64 {
        let asked =
            |s: &TestSpoke| s.cache.metrics().held_reads_asked.load(std::sync::atomic::Ordering::Relaxed);
        group.spokes.iter().flatten().map(asked).sum()
    };
    let probes_before = probes();
    batch.check(&local.client().await.read_ranges(&batch.ranges()).await.unwrap(), "member 0");
    group.settled().await;
    let asked = hub.stats.snapshot().read_requests - before;
    // One call for the 32 samples alongside the stat, and the chunks' fills and fetches
    // around them (four 256 KiB chunks): a handful, where one per sample was 32 and more.
    assert!(asked <= 12, "the hub was asked {asked} times for one batch of 32 samples of one shard");
    // The members that may hold the shard (it is cold: they hold none of it) are asked
    // about the batch's first range and about each of its four chunks' fills (two
    // members each: 10), not about each of the 32 samples (72).
    let probed = probes() - probes_before;
    assert!(probed <= 16, "the other members were asked {probed} times what they hold of one cold shard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_back_takes_a_batch_of_its_own_shard_from_the_member_that_fetched_it_meanwhile() {
    // While a member is away the next one fetches and keeps its shards; back, it owns
    // them again and a job's batch of one of them is answered by the member that holds
    // it, not fetched over the link again (batched to the hub, the demo's restarted
    // member brought 0.05-0.29 of the dataset again in its warm epoch).
    let (_root, files, hub, mut group) = three_members().await;
    let client = Client::connect(&group.spec()).await.unwrap();
    let batch = OwnedBatch::of_member_0(&group, &client, &files);
    let next = group.urls.iter().position(|u| *u == client.owners("ds", &batch.shard)[1]).unwrap();

    group.spokes[0].take().unwrap().stop().await;
    let meanwhile = group.spokes[next].as_ref().unwrap();
    batch.check(&meanwhile.client().await.read_ranges(&batch.ranges()).await.unwrap(), "the next member");
    group.settled().await;
    assert!(meanwhile.cache.used_bytes() > 0, "the next member kept what it fetched");

    group.spokes[0] = Some(group.start_member(0).await);
    let before = hub.stats.snapshot().read_requests;
    let back = group.spokes[0].as_ref().unwrap();
    batch.check(&back.client().await.read_ranges(&batch.ranges()).await.unwrap(), "the member back");
    group.settled().await;
    let asked = hub.stats.snapshot().read_requests - before;
    assert_eq!(asked, 0, "the member back asked the hub {asked} times for chunks the next member holds");
}
