//! Access plans (`SetPlan`): a cache smaller than the data keeps what the jobs read
//! again soonest. Read the same way twice, a spoke evicting least recently used fetches
//! the whole dataset again in the second epoch; one that knows the plan keeps part of
//! it. Plans are checked: shards that do not exist and bad job names are refused.

#![allow(clippy::unwrap_used)]

use shardcache_client::{CacheClient, Range};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, spoke_options};
use tonic::Code;

const MIB: u64 = 1 << 20;

/// Hub bytes of a second epoch over 6 shards of 1 MiB through a spoke with room for 3
/// (4 MiB, evicting above 3.8 down to 3.4), reading shards in the same order both
/// epochs, with the plan of both epochs told beforehand or not.
async fn second_epoch_hub_bytes(with_plan: bool) -> u64 {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "ds", 6, MIB);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.capacity = 4 * MIB;
    options.cache.read_ahead_chunks = 0;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let names: Vec<String> = (0..6).map(shardcache_cli::dataset_gen::shard_name).collect();
    if with_plan {
        let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
        assert_eq!(control.set_plan("trainer", 0, "ds", &[names.clone(), names.clone()]).await.unwrap(), 6);
    }
    let client = spoke.client().await;
    let mut before = 0;
    for epoch in 0..2 {
        if epoch == 1 {
            before = hub.stats.snapshot().bytes_served;
        }
        for name in &names {
            client.read_range(&Range::new("ds", name, 0, MIB)).await.unwrap();
            spoke.settled().await;
        }
    }
    hub.stats.snapshot().bytes_served - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_keeps_what_is_read_again_soonest_where_lru_keeps_nothing() {
    let lru = second_epoch_hub_bytes(false).await;
    let planned = second_epoch_hub_bytes(true).await;
    assert_eq!(lru, 6 * MIB, "least recently used evicts each shard just before it is read again");
    // The plan keeps two shards through the first epoch and the last one of the second
    // (Belady's choice, see plan.rs): half the second epoch is a hit.
    assert!((MIB..=3 * MIB).contains(&planned), "the plan-aware spoke fetched {planned} bytes again");
}

#[tokio::test]
async fn plans_are_checked_before_they_are_kept() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "ds", 2, MIB);
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    let good = vec!["shard-00000.bin".to_owned(), "shard-00001.bin".to_owned()];

    let err = control.set_plan("trainer", 0, "ds", &[vec!["shard-00009.bin".into()]]).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    let err = control.set_plan("", 0, "ds", std::slice::from_ref(&good)).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    let err = control.set_plan("trainer", 0, "ds", &[vec!["../x".into()]]).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    assert!(!spoke.cache.plans().any(), "nothing was kept from refused plans");

    // Two jobs, each its own plan; a job withdraws its plan with no epochs.
    assert_eq!(control.set_plan("a", 0, "ds", std::slice::from_ref(&good)).await.unwrap(), 2);
    assert_eq!(control.set_plan("b", 3, "ds", &[good[..1].to_vec()]).await.unwrap(), 1);
    assert_eq!(control.set_plan("a", 0, "ds", &[]).await.unwrap(), 0);
    assert!(spoke.cache.plans().any(), "job b's plan stays");
    assert_eq!(control.set_plan("b", 3, "ds", &[]).await.unwrap(), 0);
    assert!(!spoke.cache.plans().any());
}
