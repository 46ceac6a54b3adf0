//! A gray failure in a group of spokes: one member's own link to the hub hangs while it
//! stays up and its gRPC health says SERVING. Before hedging, every read of a shard it
//! owns waited for it until a timeout (a peer's 10 s, the hub's 30 s); now a read that
//! member has not answered within its hedge delay goes to the next member too, the
//! next member does not ask it again (the read names it: `shardcache-avoid`), and after
//! three lost races it is demoted (skipped for a backoff, whatever its health says). So
//! trainers reading through the group, and trainers reading through another member,
//! lose at most a hedge delay on a request, and no request fails.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use shardcache_client::{Client, Range};
use shardcache_tests::{
    TestGroup, TestHub, make_dataset,
    wan::{Fault, LinkConfig, WanProxy},
};

const MIB: u64 = 1 << 20;
const SHARDS: u32 = 12;
/// What one read may take here: a hedge delay (at most 2 s before anything is learned)
/// and the read itself, with room for a loaded machine. Waiting for the hung member
/// instead takes the hub timeout (30 s) or the peer timeout (10 s).
const ONE_READ: Duration = Duration::from_secs(6);

fn names() -> Vec<String> {
    (0..SHARDS).map(shardcache_cli::dataset_gen::shard_name).collect()
}

/// Whether `endpoint`'s gRPC health says the read service is SERVING.
async fn serving(endpoint: &str) -> bool {
    let channel =
        tonic::transport::Endpoint::from_shared(endpoint.to_owned()).unwrap().connect().await.unwrap();
    shardcache_client::discovery::serving(&shardcache_client::discovery::HealthClient::new(channel.into()))
        .await
}

/// Reads every shard of `dataset` through `client` in batches of a quarter of four
/// shards (a batch spans owners), checking each range against the files and that no
/// read took longer than [`ONE_READ`]. Returns how many calls were made.
async fn read_all(client: &Client, dataset: &str, files: &std::path::Path) -> u64 {
    let quarter = MIB / 4;
    let mut calls = 0;
    for part in 0..4 {
        for group in names().chunks(4) {
            let ranges: Vec<Range> =
                group.iter().map(|n| Range::new(dataset, n, part * quarter, quarter)).collect();
            let started = Instant::now();
            let read = client.read_ranges(&ranges).await.unwrap();
            let took = started.elapsed();
            assert!(took < ONE_READ, "a read of {dataset} took {took:?}: it waited for the hung member");
            calls += 1;
            for (name, got) in group.iter().zip(read) {
                let file = std::fs::read(files.join(name)).unwrap();
                let want = &file[(part * quarter) as usize..((part + 1) * quarter) as usize];
                assert!(got.data == want, "{dataset}/{name} part {part}");
            }
        }
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_hub_link_hangs_costs_a_hedge_delay_not_a_timeout() {
    let root = tempfile::tempdir().unwrap();
    let through_group = make_dataset(root.path(), "one", SHARDS, MIB);
    let through_a_member = make_dataset(root.path(), "two", SHARDS, MIB);
    let hub = TestHub::start(root.path()).await;
    // The gray member reaches the hub through its own link, which will hang.
    let gray_link =
        WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, LinkConfig::rtt(Duration::ZERO))
            .await
            .unwrap();

    let (listeners, urls) = TestGroup::bind(3).await;
    // The gray member: one that owns shards of both datasets (ownership hashes the
    // URLs, which the ports make different each run; a member owning none of a dataset
    // would prove nothing). The group client connects lazily: nothing is up yet.
    let ranking = Client::connect(&urls.join(",")).await.unwrap();
    let owns = |member: usize, dataset: &str| {
        names().iter().filter(|n| ranking.owners(dataset, n)[0] == urls[member]).count()
    };
    let gray = (0..3).rev().find(|&m| owns(m, "one") > 0 && owns(m, "two") > 0 && m != 0).unwrap_or(2);
    let upstream = |i| if i == gray { gray_link.endpoint() } else { hub.endpoint.clone() };
    let members = TestGroup::start_on(listeners, urls.clone(), upstream).await;
    gray_link.set_fault(Fault::Stall);
    let owned_by_gray = |client: &Client, dataset: &str| {
        names().iter().filter(|n| client.owners(dataset, n)[0] == urls[gray]).count()
    };

    // A trainer reading through another member (not a group client): that member asks
    // the gray one first for the shards it owns, hedges to the hub, then demotes it.
    let member = Client::connect(&urls[0]).await.unwrap();
    let group = Client::connect(&urls.join(",")).await.unwrap();
    assert!(owned_by_gray(&group, "two") > 0, "the gray member owns some shards of each dataset");
    read_all(&member, "two", &through_a_member).await;
    assert!(serving(&urls[gray]).await, "the gray member still says SERVING");
    let member_hedges = members.spokes[0].metric("shardcache_spoke_hedges_total").await;
    let member_demotions = members.spokes[0].metric("shardcache_spoke_demotions_total").await;
    assert!(
        member_hedges >= 1.0 && member_demotions >= 1.0,
        "hedges {member_hedges}, demotions {member_demotions}"
    );

    // A trainer reading through the group: the client hedges the gray member's shards to
    // the next member, which goes to the hub without asking the gray member again.
    assert!(owned_by_gray(&group, "one") > 0);
    let calls = read_all(&group, "one", &through_group).await;
    let hedges = group.hedges();
    let (sent, won, demoted) = [&hedges.sent, &hedges.won, &hedges.demotions]
        .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        .into();
    assert!(sent >= 1 && won >= 1 && demoted >= 1, "sent {sent}, won {won}, demotions {demoted}");
    assert!(sent <= calls * 2, "at most one hedge per part of a call ({sent} for {calls} calls)");
    assert!(group.failing_members().contains(&urls[gray]), "the gray member is skipped for now");
    assert!(serving(&urls[gray]).await, "and still says SERVING");
}
