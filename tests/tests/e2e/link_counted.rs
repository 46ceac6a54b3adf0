//! The spoke's own count of the long link against the wire's. A spoke reads across the
//! WAN emulator in every way it fetches (whole shards filled chunk by chunk, a uniform
//! shuffle followed sample by sample through a cache half its size, listings and stats);
//! once it has nothing in flight and the link is still (`shardcache_tests::wire`), what
//! its hub connections read (`hub_bytes_received`) is what the emulator delivered toward
//! it within 2%, and its per-dataset count of the hubs' answers
//! (`upstream_wire_bytes`, the payload without framing, stats or listings) within 2% below
//! that. Benchmarks print the two beside each other; this holds them to it.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::{StreamExt, stream};
use shardcache_client::{PlannedEpoch, PlannedSample, Range, order::SamplerOrder};
use shardcache_tests::{
    TestHub, TestSpoke, make_dataset, spoke_options, test_options,
    wan::{LinkConfig, WanProxy},
    wire,
};

const MIB: u64 = 1 << 20;
const RECORD: u64 = 16 << 10;

fn name(shard: u32) -> String {
    shardcache_cli::dataset_gen::shard_name(shard)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spokes_count_of_what_its_hub_connections_read_is_the_wires() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "whole", 4, 2 * MIB);
    make_dataset(root.path(), "shuffled", 8, MIB);
    // Its compression off: the bytes read cross as they are.
    let mut options = test_options();
    options.limits.compression = None;
    let hub = TestHub::start_with(root.path(), options).await;
    let link =
        WanProxy::start("127.0.0.1:0".parse().unwrap(), hub.addr, LinkConfig::rtt(Duration::from_millis(10)))
            .await
            .unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let mut options = spoke_options(&link.endpoint());
    // Half the shuffled dataset, with the whole one read first and evicted meanwhile.
    options.cache.capacity = 4 * MIB;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let (control, client) = (spoke.control().await, spoke.client().await);

    // Listings and stats, then whole shards streamed cold (chunks filled as read).
    assert_eq!(client.list_shards("whole").await.unwrap().len(), 4);
    for shard in 0..4 {
        client.stat("whole", &name(shard)).await.unwrap();
        let read =
            client.stream_shard("whole", &name(shard), 0, None).await.unwrap().read_to_end().await.unwrap();
        assert_eq!(read.len() as u64, 2 * MIB);
    }

    // A uniform shuffle followed sample by sample, its plan sent ahead of its reads.
    let n = 8 * MIB / RECORD;
    let order = SamplerOrder { n, seed: 3, shuffle: true, ranks: 1, drop_last: false };
    let samples = order.rank_samples(0, 0, (0, 0), n);
    let block = PlannedEpoch { shards: (0..8).map(name).collect(), until: vec![7; 8] };
    assert!(control.plan("reader/rank0/worker0", 0, "shuffled", &[block]).await.unwrap().samples);
    let at = |sample: u64| ((sample / (MIB / RECORD)) as u32, sample % (MIB / RECORD) * RECORD);
    let planned: Vec<PlannedSample> = samples
        .iter()
        .enumerate()
        .map(|(place, &sample)| PlannedSample {
            position: place as u64,
            shard: name(at(sample).0),
            offset: at(sample).1,
            length: RECORD,
            next_use: None,
        })
        .collect();
    control.plan_samples("reader/rank0/worker0", "shuffled", n, &planned).await.unwrap();
    let reader = client.for_job("reader", 0).unwrap();
    stream::iter(samples.chunks(32))
        .map(|batch| {
            let ranges: Vec<Range> =
                batch.iter().map(|&s| Range::new("shuffled", name(at(s).0), at(s).1, RECORD)).collect();
            let reader = reader.clone();
            async move { reader.read_ranges(&ranges).await.unwrap().len() }
        })
        .buffer_unordered(4)
        .for_each(|read| {
            assert_eq!(read, 32);
            async {}
        })
        .await;

    let (wire, received) = wire::settled_spoke(&link, &control).await;
    let status = control.status().await.unwrap();
    let payload: u64 = status.datasets.iter().map(|d| d.upstream_wire_bytes).sum();
    eprintln!("wire {:?}, the spoke: {received} read from its hubs, {payload} in answers", wire);
    let read = 8 * MIB + 8 * MIB;
    assert!(wire.to_client >= read, "the link carried at least what was read: {wire:?}");
    assert!(
        wire::agrees(received, wire.to_client),
        "the spoke counted {received} bytes from its hubs, the wire {}",
        wire.to_client
    );
    assert!(
        payload <= wire.to_client && wire::agrees(payload, wire.to_client),
        "the hubs' answers the spoke counted, {payload} bytes, are the wire's {} less its framing",
        wire.to_client
    );
}
