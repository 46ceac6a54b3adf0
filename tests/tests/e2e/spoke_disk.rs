//! A cache whose disk fills degrades to pass-through: on a small tmpfs (mounting one
//! needs root: `make test` runs as root; elsewhere the test says it skipped), a
//! `--capacity` larger than the filesystem is cut to what it holds at start, and when
//! another tenant of the disk fills it, every read is still served with the right bytes
//! while the spoke lowers its capacity in effect, says so in its metrics, and evicts to
//! make room.
#![allow(clippy::unwrap_used)]

use shardcache_client::Client;
use shardcache_tests::{
    TestHub, TestSpoke, assert_dataset_reads_back,
    disk::{Tmpfs, fill},
    make_dataset, spoke_options,
};

#[tokio::test]
async fn a_full_disk_degrades_to_pass_through_and_every_read_is_served() {
    const FS: u64 = 24 << 20;
    let Some(disk) = Tmpfs::mount(FS) else { return };
    let root = tempfile::tempdir().unwrap();
    let dataset = make_dataset(root.path(), "big", 40, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let options = spoke_options(&hub.endpoint);
    let configured = options.cache.capacity;
    assert!(configured > FS);
    let spoke = TestSpoke::start(&disk.path().join("cache"), options).await;
    let at_start = spoke.metric("shardcache_spoke_capacity_bytes").await as u64;
    assert!(at_start <= FS, "--capacity past the filesystem is cut to what it holds: {at_start}");
    assert_eq!(spoke.metric("shardcache_spoke_configured_capacity_bytes").await as u64, configured);

    // 40 MiB through a 24 MiB disk: evicted as it goes, every byte right.
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    assert_dataset_reads_back(&client, "big", &dataset).await;
    spoke.settled().await;

    // Another tenant of the disk takes all but 1 MiB of what the cache does not hold
    // (emptied first, so that its misses are stored: a full cache stores none of a scan):
    // reads go on, served from the hub where storing fails, and the spoke comes down to
    // what the disk holds.
    let evicted = spoke.control().await.evict("big", &[]).await.unwrap();
    assert!(evicted.shards > 0);
    spoke.settled().await;
    let tenant = fill(disk.path(), 1 << 20);
    for _ in 0..2 {
        assert_dataset_reads_back(&client, "big", &dataset).await;
    }
    spoke.settled().await;
    let lowered = spoke.metric("shardcache_spoke_capacity_bytes").await as u64;
    assert!(spoke.metric("shardcache_spoke_disk_full_total").await >= 1.0);
    assert!(lowered < at_start, "the capacity in effect came down: {lowered} of {at_start}");
    assert!(spoke.cache.used_bytes() <= lowered, "{} of {lowered}", spoke.cache.used_bytes());
    let status = spoke.control().await.status().await.unwrap();
    assert_eq!(status.capacity_bytes, lowered, "status shows the capacity in effect");

    // When the other tenant leaves, what is cached still reads right.
    std::fs::remove_file(tenant).unwrap();
    assert_dataset_reads_back(&client, "big", &dataset).await;
}
