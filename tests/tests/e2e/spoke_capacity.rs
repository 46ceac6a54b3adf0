//! The spoke stays under its capacity on disk (at every instant, sampled every
//! millisecond through reads that evict), evicts least recently used shards first,
//! never evicts pinned ones, and keeps serving correct bytes throughout; a scan of four
//! times its capacity costs no more over the link than reading it without a cache.

#![allow(clippy::unwrap_used)]

use shardcache_client::Range;
use shardcache_tests::{
    TestHub, TestSpoke, assert_dataset_reads_back, disk::DiskPeak, disk_usage, make_dataset, next_random,
    spoke_options,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_four_times_the_capacity_read_twice_stays_under_capacity_on_disk() {
    const MIB: u64 = 1 << 20;
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 16, 64 * MIB); // 1 GiB
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.capacity = 256 * MIB;
    options.cache.chunk_size = MIB;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let client = spoke.client().await;
    let bound = 256 * MIB * 11 / 10 + 64 * MIB;
    let mut peak = 0;
    for _pass in 0..2 {
        for shard in client.list_shards("ds").await.unwrap() {
            let mut stream = client.stream_shard("ds", &shard.shard, 0, None).await.unwrap();
            let mut got = Vec::new();
            while let Some(chunk) = stream.next_chunk().await.unwrap() {
                got.extend_from_slice(&chunk.data);
            }
            assert_eq!(got, std::fs::read(dir.join(&shard.shard)).unwrap(), "{}", shard.shard);
            spoke.settled().await;
            peak = peak.max(disk_usage(cache_dir.path()));
            let listing = || {
                let mut files: Vec<_> = std::fs::read_dir(cache_dir.path())
                    .unwrap()
                    .flatten()
                    .map(|e| format!("{} {}", e.file_name().to_string_lossy(), e.metadata().unwrap().len()))
                    .collect();
                files.sort();
                files.join("\n")
            };
            assert!(
                peak < bound,
                "du of the cache dir is {peak} bytes, over {bound}; used {}:\n{}",
                spoke.cache.used_bytes(),
                listing()
            );
        }
    }
    let status = spoke.control().await.status().await.unwrap();
    assert!(status.used_bytes <= 256 * MIB);
    // Each pass is a scan: what fits is stored, the rest is fetched as read (storing it
    // would evict what the next pass reads first). Never more than without a cache, and
    // what was kept is read from it the second time.
    let ds = &status.datasets[0];
    assert!(ds.upstream_bytes <= 2 << 30, "{status:?}");
    assert!(ds.hit_bytes >= status.used_bytes * 9 / 10, "the second pass read what was kept: {status:?}");
    eprintln!("peak du {} MiB for a 256 MiB cache", peak / MIB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_directory_never_holds_more_than_the_capacity_while_reads_evict() {
    const MIB: u64 = 1 << 20;
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // 48 MiB of 4 MiB shards through 16 MiB (1 MiB chunks, the tests' hubs' --max-read).
    let dir = make_dataset(root.path(), "ds", 12, 4 * MIB);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.capacity = 16 * MIB;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let names: Vec<String> = (0..12).map(shardcache_cli::dataset_gen::shard_name).collect();
    let peak = DiskPeak::start(cache_dir.path());
    // Four at once, twice: warms of three shards at a time around the dataset (each
    // evicts what the last stored), shards read in order and in reverse (whole-shard
    // fetches, read-ahead), and 64 KiB ranges anywhere.
    for _pass in 0..2 {
        let warms = async {
            let control = spoke.control().await;
            for first in (0..12).step_by(3) {
                let three = &names[first..first + 3];
                control.prefetch("ds", three, 0).await.unwrap().finish().await.unwrap();
            }
        };
        let whole = |order: Vec<String>| {
            let (client, dir) = (spoke.client(), dir.clone());
            async move {
                let client = client.await;
                for name in order {
                    let mut stream = client.stream_shard("ds", &name, 0, None).await.unwrap();
                    let mut got = Vec::new();
                    while let Some(chunk) = stream.next_chunk().await.unwrap() {
                        got.extend_from_slice(&chunk.data);
                    }
                    assert!(got == std::fs::read(dir.join(&name)).unwrap(), "{name}: its bytes");
                }
            }
        };
        let ranges = async {
            let client = spoke.client().await;
            let mut rng = 7;
            for _ in 0..150 {
                let name = &names[(next_random(&mut rng) % 12) as usize];
                let offset = next_random(&mut rng) % (4 * MIB - 65_536);
                let read = client.read_range(&Range::new("ds", name, offset, 65_536)).await.unwrap();
                let file = std::fs::read(dir.join(name)).unwrap();
                assert!(
                    read.data[..] == file[offset as usize..offset as usize + 65_536],
                    "{name} at {offset}"
                );
            }
        };
        let reversed = names.iter().rev().cloned().collect();
        tokio::join!(warms, whole(names.clone()), whole(reversed), ranges);
    }
    spoke.settled().await;
    let peak = peak.stop();
    let status = spoke.control().await.status().await.unwrap();
    assert!(status.evicted_shards > 0, "the run evicted: {status:?}");
    assert!(peak.samples > 100, "the directory was sampled through the run: {peak:?}");
    assert!(
        peak.data <= 16 * MIB,
        "chunk files peaked at {} bytes in a 16 MiB cache ({:.3}x)",
        peak.data,
        peak.data as f64 / (16 * MIB) as f64
    );
    // RocksDB's own files (log, MANIFEST, options) are beside it, and status says how much.
    assert!(peak.own < MIB, "RocksDB's own files: {} bytes", peak.own);
    assert!(status.store_own_bytes > 0 && status.store_own_bytes < MIB, "{}", status.store_own_bytes);
    eprintln!("peak {} bytes of chunk files (+{} KiB RocksDB's own) in 16 MiB", peak.data, peak.own >> 10);
}

#[tokio::test]
async fn least_recently_used_goes_first_and_pinned_shards_stay() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 6, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.capacity = 4 << 20; // room for four 1 MiB shards (3.4 at the low mark)
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let control = spoke.control().await;
    let names: Vec<String> = (0..6).map(shardcache_cli::dataset_gen::shard_name).collect();
    control.prefetch("ds", &names[..3], 1).await.unwrap().finish().await.unwrap();
    control.pin("ds", &names[..1], true).await.unwrap(); // shard 0: pinned, oldest
    // Touch shard 1 so that shard 2 is the least recently used unpinned one.
    let client = spoke.client().await;
    client.read_range(&shardcache_client::Range::new("ds", &names[1], 0, 10)).await.unwrap();
    control.prefetch("ds", &names[3..5], 1).await.unwrap().finish().await.unwrap();
    spoke.settled().await;
    let cached: Vec<bool> = names
        .iter()
        .map(|n| spoke.cache.cached_entry("ds", n).is_some_and(|e| e.cached_bytes() > 0))
        .collect();
    assert!(cached[0], "pinned shard evicted: {cached:?}");
    assert!(!cached[2], "the least recently used shard stayed: {cached:?}");
    assert!(spoke.cache.used_bytes() <= 4 << 20);
    assert_dataset_reads_back(&client, "ds", &dir).await;
}

#[tokio::test]
async fn pins_count_against_the_capacity_and_past_it_are_refused() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_dataset(root.path(), "ds", 6, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let mut options = spoke_options(&hub.endpoint);
    options.cache.capacity = 4 << 20; // 3.8 MiB below the high watermark: three 1 MiB shards
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let control = spoke.control().await;
    let names: Vec<String> = (0..6).map(shardcache_cli::dataset_gen::shard_name).collect();
    // Pinned before they are cached (pin, then prefetch): they count whole.
    assert_eq!(control.pin("ds", &names[..3], true).await.unwrap(), 3);
    let err = control.pin("ds", &names[3..5], true).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::ResourceExhausted), "{err}");
    assert!(err.to_string().contains("unpin or evict first"), "{err}");
    let pinned = |spoke: &TestSpoke| {
        names.iter().filter(|n| spoke.cache.cached_entry("ds", n).is_some_and(|e| e.is_pinned())).count()
    };
    assert_eq!(pinned(&spoke), 3, "a refused pin pins nothing");
    // Room again once one is unpinned.
    assert_eq!(control.pin("ds", &names[..1], false).await.unwrap(), 1);
    assert_eq!(control.pin("ds", &names[3..4], true).await.unwrap(), 1);
    assert_eq!(pinned(&spoke), 3);
}
