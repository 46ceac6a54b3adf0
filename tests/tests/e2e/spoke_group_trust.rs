//! Members are checked, not trusted: a member whose answers arrive garbled (every Nth
//! byte flipped on its link, as bad memory or a bad NIC would) never gets a wrong byte
//! to a trainer. Each failed chunk is counted and logged with the member's URL, the
//! member is skipped for a while, and the chunk comes from the hub.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shardcache_client::{Client, Range};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, spoke_options};
use shardcache_wan::{Fault, LinkConfig, WanProxy};
use spoke_cache::PeerGroup;
use tokio::net::TcpListener;

const SHARDS: u32 = 16;
const SHARD: u64 = 1 << 20;

#[tokio::test]
async fn a_member_whose_bytes_fail_verification_is_skipped_and_the_hub_serves() {
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "c4", SHARDS, SHARD);
    let hub = TestHub::start(root.path()).await;
    let (a, b) =
        (TcpListener::bind("127.0.0.1:0").await.unwrap(), TcpListener::bind("127.0.0.1:0").await.unwrap());
    // The group knows member b by the address of a link that garbles its answers.
    let garbling = WanProxy::start(
        "127.0.0.1:0".parse().unwrap(),
        b.local_addr().unwrap(),
        LinkConfig::rtt(Duration::ZERO),
    )
    .await
    .unwrap();
    garbling.set_fault(Fault::Corrupt(65_537));
    let urls = [format!("http://{}", a.local_addr().unwrap()), garbling.endpoint()];
    let mut spokes = Vec::new();
    let mut dirs = Vec::new();
    for (i, listener) in [a, b].into_iter().enumerate() {
        let mut options = spoke_options(&hub.endpoint);
        options.group =
            Some(PeerGroup { spec: urls.join(","), me: urls[i].clone(), credentials: Default::default() });
        let dir = tempfile::tempdir().unwrap();
        spokes.push(TestSpoke::start_on(listener, dir.path(), options).await);
        dirs.push(dir);
    }

    let owned_by_b = (0..SHARDS)
        .filter(|&i| !spokes[0].cache.owns("c4", &shardcache_cli::dataset_gen::shard_name(i)))
        .count();
    assert!(owned_by_b > 0, "b owns some shards (else the test proves nothing)");

    // A trainer through member a reads everything, byte for byte: a asks b for b's
    // shards, and b's answers arrive garbled.
    let client = Client::connect(&spokes[0].endpoint).await.unwrap();
    for i in 0..SHARDS {
        let name = shardcache_cli::dataset_gen::shard_name(i);
        let want = std::fs::read(files.join(&name)).unwrap();
        let quarter = SHARD / 4;
        let ranges: Vec<Range> = (0..4).map(|q| Range::new("c4", &name, q * quarter, quarter)).collect();
        for (q, part) in client.read_ranges(&ranges).await.unwrap().iter().enumerate() {
            let at = q * quarter as usize;
            assert!(part.data == want[at..at + quarter as usize], "{name} quarter {q}");
        }
    }
    let reports = spokes[0].cache.chain().peers().unwrap().reports();
    assert!(reports.bad_chunks() > 0, "failed chunks from b are counted");
}
