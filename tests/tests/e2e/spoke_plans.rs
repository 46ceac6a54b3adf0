//! Access plans (`SetPlan`): a cache smaller than the data keeps what the jobs read
//! again soonest. Read the same way twice, a spoke evicting least recently used would
//! fetch the whole dataset again in the second epoch; one that knows the plan keeps part
//! of it, and one without stops storing once full (its admission) and keeps what it
//! stored. Plans are checked: shards that do not exist and bad job names are refused.

#![allow(clippy::unwrap_used)]

use shardcache_client::{CacheClient, PlannedEpoch, Range};
use shardcache_tests::{TestHub, TestSpoke, make_dataset, spoke_options};
use tonic::Code;

const MIB: u64 = 1 << 20;

/// Hub bytes of a second epoch over 6 shards of 1 MiB through a spoke with room for 3
/// (4 MiB, evicting above 3.8 down to 3.4), reading shards in the same order both
/// epochs, with the plan of both epochs told beforehand (for eviction; no planned
/// prefetch) or not.
async fn second_epoch_hub_bytes(with_plan: bool) -> u64 {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "ds", 6, MIB);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.capacity = 4 * MIB;
    options.cache.read_ahead_chunks = 0;
    // Eviction alone: no planned prefetch (its window would take most of this cache).
    options.cache.plan_window = spoke_cache::policy::window::PlanWindow::Bytes(0);
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let names: Vec<String> = (0..6).map(shardcache_cli::dataset_gen::shard_name).collect();
    if with_plan {
        let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
        let epoch = PlannedEpoch::in_order(names.clone());
        assert_eq!(control.set_plan("trainer", 0, "ds", &[epoch.clone(), epoch]).await.unwrap(), 6);
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
async fn a_plan_keeps_what_is_read_again_soonest_where_lru_would_keep_nothing() {
    let unplanned = second_epoch_hub_bytes(false).await;
    let planned = second_epoch_hub_bytes(true).await;
    // Least recently used would evict each shard just before it is read again (6 MiB).
    // Without a plan the spoke stores what fits, then fetches the rest as read: the
    // shards it kept are hits.
    assert!(unplanned <= 3 * MIB, "the spoke without a plan fetched {unplanned} bytes again");
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
    let good = PlannedEpoch::in_order(vec!["shard-00000.bin".to_owned(), "shard-00001.bin".to_owned()]);
    let named = |shards: &[&str]| [PlannedEpoch::in_order(shards.iter().map(|s| s.to_string()).collect())];

    let err = control.set_plan("trainer", 0, "ds", &named(&["shard-00009.bin"])).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    let err = control.set_plan("", 0, "ds", std::slice::from_ref(&good)).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    let err = control.set_plan("trainer", 0, "ds", &named(&["../x"])).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    let overlapping = PlannedEpoch { until: vec![0], ..good.clone() };
    let err = control.set_plan("trainer", 0, "ds", &[overlapping]).await.unwrap_err();
    assert!(err.to_string().contains("one per shard or none"), "{err}");
    let backwards = PlannedEpoch { until: vec![1, 0], ..good.clone() };
    let err = control.set_plan("trainer", 0, "ds", &[backwards]).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("must be from 1 to 1"), "{err}");
    assert!(!spoke.cache.plans().shards.any(), "nothing was kept from refused plans");

    // Two jobs, each its own plan; a job withdraws its plan with no epochs.
    assert_eq!(control.set_plan("a", 0, "ds", std::slice::from_ref(&good)).await.unwrap(), 2);
    assert_eq!(control.set_plan("b", 3, "ds", &named(&["shard-00000.bin"])).await.unwrap(), 1);
    assert_eq!(control.set_plan("a", 0, "ds", &[]).await.unwrap(), 0);
    assert!(spoke.cache.plans().shards.any(), "job b's plan stays");
    assert_eq!(control.set_plan("b", 3, "ds", &[]).await.unwrap(), 0);
    assert!(!spoke.cache.plans().shards.any());
}

/// Reads `blocks` of shards with each block's ranges interleaved (a block shuffle), one
/// `ReadRanges` per 4 records of 64 KiB, as job `job`.
async fn read_blocks(client: &shardcache_client::Client, blocks: &[&[u32]]) {
    for block in blocks {
        let records: Vec<(u32, u64)> =
            (0..16).flat_map(|record| block.iter().map(move |&shard| (shard, record * (64 << 10)))).collect();
        for batch in records.chunks(4) {
            let ranges: Vec<Range> = batch
                .iter()
                .map(|&(shard, offset)| {
                    Range::new("ds", shardcache_cli::dataset_gen::shard_name(shard), offset, 64 << 10)
                })
                .collect();
            client.read_ranges(&ranges).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_read_together_are_kept_to_their_last_read_and_counted_per_job() {
    // 8 shards of 1 MiB read in blocks of two, interleaved, through room for 3.4 MiB:
    // told that each block's shards are read together, the spoke keeps them to their
    // last read and prefetches the next block within the room left, so every shard
    // crosses the link once. Each read says its job and epoch; the rows add up to the
    // dataset's totals.
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "ds", 8, MIB);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.capacity = 4 * MIB;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let blocks: [&[u32]; 4] = [&[5, 2], &[7, 0], &[1, 6], &[3, 4]];
    let names = |shards: &[u32]| {
        shards.iter().map(|&s| shardcache_cli::dataset_gen::shard_name(s)).collect::<Vec<_>>()
    };
    let reads: Vec<String> = blocks.iter().flat_map(|b| (0..16).flat_map(move |_| names(b))).collect();
    let plan = PlannedEpoch::from_reads(reads.iter().map(String::as_str));
    assert_eq!(plan.until, [1, 1, 3, 3, 5, 5, 7, 7], "each block's shards are in use together");
    spoke.control().await.set_plan("trainer/worker0", 0, "ds", &[plan]).await.unwrap();

    let client = spoke.client().await.for_job("trainer", 0).unwrap();
    read_blocks(&client, &blocks).await;
    // Shard 4 is in the last block, still cached.
    spoke.client().await.read_range(&Range::new("ds", names(&[4])[0].clone(), 0, 100)).await.unwrap();
    spoke.settled().await;
    assert_eq!(hub.stats.snapshot().bytes_served, 8 * MIB, "no shard was fetched twice");

    let status = spoke.control().await.status().await.unwrap();
    let row = |job: &str| {
        status.jobs.iter().find(|j| j.job == job).unwrap_or_else(|| panic!("no row {job}: {status:?}"))
    };
    let trainer = row("trainer");
    assert_eq!((trainer.epoch, trainer.reads, trainer.bytes), (0, 8 * 16, 8 * MIB));
    assert_eq!(row("").reads, 1, "the untagged read");
    let dataset = &status.datasets[0];
    let rows = |f: fn(&shardcache_proto::v1::JobStatus) -> u64| status.jobs.iter().map(f).sum::<u64>();
    assert_eq!(rows(|j| j.reads), dataset.hit_requests + dataset.miss_requests, "reads add up");
    assert_eq!(rows(|j| j.hit_reads), dataset.hit_requests, "hits add up");
    assert_eq!(rows(|j| j.hub_bytes), dataset.upstream_bytes, "hub bytes add up");
    assert_eq!(dataset.upstream_bytes, 8 * MIB);
    let plan = &status.plans[0];
    assert_eq!((plan.job.as_str(), plan.cursor, plan.positions, plan.lag), ("trainer/worker0", 7, 8, 0));
    let page = spoke.scrape().await;
    assert!(
        page.contains(&format!(
            "shardcache_spoke_job_reads_total{{job_id=\"trainer\",epoch=\"0\"}} {}",
            8 * 16
        )),
        "{page}"
    );
}

#[tokio::test]
async fn bad_job_headers_are_refused_with_the_reason() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "ds", 1, MIB);
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    let channel =
        tonic::transport::Channel::from_shared(spoke.endpoint.clone()).unwrap().connect().await.unwrap();
    let mut reader = shardcache_proto::v1::shard_reader_client::ShardReaderClient::new(channel);
    let mut request = tonic::Request::new(shardcache_proto::v1::ReadRangeRequest {
        dataset: "ds".into(),
        shard: "shard-00000.bin".into(),
        offset: 0,
        length: 10,
        expected_version: String::new(),
        cut_at_end: false,
    });
    request.metadata_mut().insert("shardcache-job", "trainer".parse().unwrap());
    request.metadata_mut().insert("shardcache-epoch", "-1".parse().unwrap());
    let err = reader.read_range(request).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("decimal epoch number"), "{}", err.message());
    assert!(spoke.client().await.for_job("", 0).is_err(), "the SDK refuses an empty job name");
}

/// Readers are not in lockstep: once the first reader has moved on to the next block, a
/// slower one still reads the block before. Its misses are fetched as it asks (the range,
/// not a chunk or the whole shard) and not stored, so the plan's room stays with what is
/// read next; the same miss from a reader without that plan fetches and keeps the chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stragglers_miss_is_fetched_as_read_and_not_stored() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = make_dataset(root.path(), "ds", 4, MIB);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    (options.cache.fetch_whole_shard, options.cache.read_ahead_chunks) = (false, 0);
    options.cache.plan_window = spoke_cache::policy::window::PlanWindow::Bytes(0);
    let chunk = options.cache.chunk_size;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let names: Vec<String> = (0..4).map(shardcache_cli::dataset_gen::shard_name).collect();
    let control = spoke.control().await;
    control.set_plan("trainer/rank0", 0, "ds", &[PlannedEpoch::in_order(names.clone())]).await.unwrap();
    let trainer = spoke.client().await.for_job("trainer", 0).unwrap();
    for name in &names[..3] {
        trainer.read_range(&Range::new("ds", name, 0, 16 << 10)).await.unwrap();
    }
    spoke.settled().await;
    control.evict("ds", &[names[1].clone()]).await.unwrap();
    let (served, used) = (hub.stats.snapshot().bytes_served, spoke.cache.used_bytes());

    // The trainer's plan is at shard 2: a read of shard 1 is a straggler's.
    let late = trainer.read_range(&Range::new("ds", &names[1], 300 << 10, 16 << 10)).await.unwrap();
    let file = std::fs::read(files.join(&names[1])).unwrap();
    assert_eq!(late.data, file[300 << 10..316 << 10]);
    spoke.settled().await;
    assert_eq!(hub.stats.snapshot().bytes_served - served, 16 << 10, "the range, not its chunk");
    assert_eq!(spoke.cache.used_bytes(), used, "and not stored");
    assert_eq!(
        spoke.cache.plans().shards.progress()[0].cursor,
        2,
        "the cursor stayed at the block being read"
    );

    // Another job's read of it is an ordinary miss: its chunk is fetched and kept.
    let other = spoke.client().await.for_job("evaluator", 0).unwrap();
    other.read_range(&Range::new("ds", &names[1], 300 << 10, 16 << 10)).await.unwrap();
    spoke.settled().await;
    assert_eq!(hub.stats.snapshot().bytes_served - served, (16 << 10) + chunk);
    assert_eq!(spoke.cache.used_bytes(), used + chunk);
}
