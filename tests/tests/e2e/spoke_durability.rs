//! The spoke across restarts, crashes, damaged files, changed shards and a hub that is
//! down: it serves only correct bytes, or a precise error.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use shardcache_client::{CacheClient, Client, Range};
use shardcache_tests::{
    SpokeProcess, TestHub, TestSpoke, assert_dataset_reads_back, make_dataset, rewrite_in_place, sha256,
    spoke_options, write_pattern,
};
use tonic::Code;

#[tokio::test]
async fn restart_serves_at_once_without_the_hub() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 2, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    spoke.control().await.prefetch("ds", &[], 0).await.unwrap().finish().await.unwrap();
    spoke.stop().await;
    let endpoint = hub.endpoint.clone();
    hub.stop().await.unwrap();

    // Hub gone, TTL expired: cached shards are served as they are.
    let mut options = spoke_options(&endpoint);
    options.cache.revalidate_after = Duration::ZERO;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let client = spoke.client().await;
    for shard in ["shard-00000.bin", "shard-00001.bin"] {
        let got = client.stream_shard("ds", shard, 0, None).await.unwrap().read_to_end().await.unwrap();
        assert_eq!(sha256(&got), sha256(&std::fs::read(dir.join(shard)).unwrap()));
    }
    // Not cached: UNAVAILABLE naming the hub, promptly rather than hanging.
    let err = client.read_range(&Range::new("ds", "shard-00009.bin", 0, 10)).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
    assert!(err.to_string().contains(&endpoint), "{err}");
}

#[tokio::test]
async fn a_shard_changed_on_the_hub_is_served_new_after_the_ttl_never_mixed() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let path = root.path().join("ds/s.bin");
    let old = write_pattern(&path, 4 * (256 << 10), 1);
    let hub = TestHub::start(root.path()).await;

    // A long TTL: the cached version keeps being served, whole and consistent.
    let cache_long = tempfile::tempdir().unwrap();
    let spoke_long = TestSpoke::start(cache_long.path(), spoke_options(&hub.endpoint)).await;
    let long = spoke_long.client().await;
    spoke_long.control().await.prefetch("ds", &[], 0).await.unwrap().finish().await.unwrap();

    // TTL zero: every access checks the version.
    let mut options = spoke_options(&hub.endpoint);
    options.cache.revalidate_after = Duration::ZERO;
    let spoke = TestSpoke::start(cache_dir.path(), options).await;
    let client = spoke.client().await;
    let first = client.read_range(&Range::new("ds", "s.bin", 0, 4 * (256 << 10))).await.unwrap();
    assert_eq!(first.data, old);

    let new: Vec<u8> = old.iter().map(|b| b.wrapping_add(1)).collect();
    rewrite_in_place(&path, &new);
    let second = client.read_range(&Range::new("ds", "s.bin", 0, 4 * (256 << 10))).await.unwrap();
    assert_eq!(second.data, new, "after the TTL the new bytes");
    assert_ne!(second.version, first.version);
    let stale = long.read_range(&Range::new("ds", "s.bin", 0, 4 * (256 << 10))).await.unwrap();
    assert_eq!(stale.data, old, "inside the TTL: the cached version, whole");
    assert_eq!(stale.version, first.version);
}

#[tokio::test]
async fn a_corrupted_page_on_disk_is_detected_refetched_and_counted() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Bytes that never repeat a page, so the damaged page can be found in the files.
    let mut state = 9u64;
    // (High bits: an LCG's low bits repeat with a short period.)
    let data: Vec<u8> =
        (0..1 << 20).map(|_| (shardcache_tests::next_random(&mut state) >> 40) as u8).collect();
    std::fs::create_dir_all(root.path().join("ds")).unwrap();
    std::fs::write(root.path().join("ds/s.bin"), &data).unwrap();
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    spoke.control().await.prefetch("ds", &[], 0).await.unwrap().finish().await.unwrap();
    spoke.stop().await;

    // Flip one byte of page 2 in its file on disk, as a bad disk would: the page's
    // bytes are stored once, in the SST file of the chunk that holds them.
    let page2 = &data[2 * (64 << 10)..2 * (64 << 10) + 64];
    let mut flipped = 0;
    for entry in std::fs::read_dir(cache_dir.path()).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "sst") {
            let mut bytes = std::fs::read(&path).unwrap();
            if let Some(at) = bytes.windows(page2.len()).position(|w| w == page2) {
                bytes[at + 100] ^= 0xff;
                std::fs::write(&path, bytes).unwrap();
                flipped += 1;
            }
        }
    }
    assert_eq!(flipped, 1, "page 2 is stored in exactly one file");

    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    let before = hub.stats.snapshot().bytes_served;
    let got = spoke.client().await.read_range(&Range::new("ds", "s.bin", 0, 1 << 20)).await.unwrap();
    assert_eq!(got.data, data, "the damaged page was not served");
    assert_eq!(spoke.metric("shardcache_spoke_checksum_failures_total").await, 1.0);
    assert_eq!(
        hub.stats.snapshot().bytes_served - before,
        256 << 10,
        "exactly the damaged chunk was refetched"
    );
    let again = spoke.client().await.read_range(&Range::new("ds", "s.bin", 0, 1 << 20)).await.unwrap();
    assert_eq!(again.data, data);
    assert_eq!(spoke.metric("shardcache_spoke_checksum_failures_total").await, 1.0, "and stored again, good");
}

/// `kill -9` while chunks are being written, after some have reached the disk: the
/// restarted spoke keeps what was admitted (it is not empty, and its first reads of those
/// chunks are hits) and serves every byte exactly, refetching only what was lost.
#[tokio::test]
async fn kill_9_during_prefetch_then_restart_serves_only_correct_bytes() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 8, 4 << 20);
    let hub = TestHub::start(root.path()).await;
    let mut kept = 0;
    for round in 0..3 {
        let spoke = SpokeProcess::start(&hub.endpoint, cache_dir.path(), &["--chunk-size", "256KiB"]);
        let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
        let mut progress = control.prefetch("ds", &[], 2).await.unwrap();
        // Let it get some way (a different way each round: shards are fetched two at a
        // time, so others are mid-write), then kill it.
        for _ in 0..=round + 1 {
            progress.next().await.unwrap();
        }
        kept = control.status().await.unwrap().used_bytes;
        spoke.kill();
    }
    assert!(kept > 0, "the spoke had admitted chunks when it was killed");

    let spoke = SpokeProcess::start(&hub.endpoint, cache_dir.path(), &["--chunk-size", "256KiB"]);
    let control = CacheClient::connect(&spoke.endpoint).await.unwrap();
    let restored = control.status().await.unwrap().used_bytes;
    assert!(restored >= kept, "chunks admitted before the kill are still there: {restored} < {kept}");
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    let before = hub.stats.snapshot().bytes_served;
    assert_dataset_reads_back(&client, "ds", &dir).await;
    let refetched = hub.stats.snapshot().bytes_served - before;
    assert!(refetched <= 8 * (4 << 20) - restored, "only what was not kept came from the hub: {refetched}");
    let status = control.status().await.unwrap();
    assert!(status.datasets[0].hit_bytes >= restored, "the kept chunks were served as hits");
}

/// A reader gets a fetched chunk's bytes before the chunk is stored; a clean stop
/// (SIGTERM) right after the read still keeps it: the next start serves it as a hit.
/// The read is 256 chunks, all missing at once: the spoke must not send them all to the
/// hub together (this test hub sheds over 64 requests in flight).
#[tokio::test]
async fn sigterm_right_after_a_cold_read_keeps_what_was_read() {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 1, 16 << 20);
    let want = std::fs::read(dir.join("shard-00000.bin")).unwrap();
    let hub = TestHub::start(root.path()).await;
    // 256 small chunks: many admissions still queued when the read has its bytes.
    let args = ["--chunk-size", "64KiB", "--fetch-whole-shard", "false", "--read-ahead-chunks", "0"];
    let mut spoke = SpokeProcess::start(&hub.endpoint, cache_dir.path(), &args);
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    let got = client.read_range(&Range::new("ds", "shard-00000.bin", 0, 16 << 20)).await.unwrap();
    assert_eq!(got.data, want);
    let pid = spoke.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // Waited for off the runtime: the client's connection must go on running to see the
    // spoke's GOAWAY, or the graceful stop waits for it.
    let stopped = tokio::task::spawn_blocking(move || spoke.child.wait().unwrap()).await.unwrap();
    assert!(stopped.success(), "the spoke stops cleanly on SIGTERM");

    let spoke = SpokeProcess::start(&hub.endpoint, cache_dir.path(), &args);
    let before = hub.stats.snapshot().bytes_served;
    let again = Client::connect(&spoke.endpoint).await.unwrap();
    let got = again.read_range(&Range::new("ds", "shard-00000.bin", 0, 16 << 20)).await.unwrap();
    assert_eq!(got.data, want);
    assert_eq!(hub.stats.snapshot().bytes_served, before, "every chunk read before the stop was kept");
}

/// A hub over two 1 MiB shards of `ds` and a cache dir holding both (the spoke that
/// filled it stopped): (root, cache dir, dataset dir, hub).
async fn warm_cache_then_stop() -> (tempfile::TempDir, tempfile::TempDir, std::path::PathBuf, TestHub) {
    let (root, cache_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "ds", 2, 1 << 20);
    let hub = TestHub::start(root.path()).await;
    let spoke = TestSpoke::start(cache_dir.path(), spoke_options(&hub.endpoint)).await;
    spoke.control().await.prefetch("ds", &[], 0).await.unwrap().finish().await.unwrap();
    spoke.stop().await;
    (root, cache_dir, dir, hub)
}

#[tokio::test]
async fn damaged_cache_files_do_not_crash_the_spoke() {
    let (_root, cache_dir, dir, hub) = warm_cache_then_stop().await;
    // The user's own files in --cache-dir, which recovery must leave alone.
    std::fs::write(cache_dir.path().join("NOTES.txt"), b"mine").unwrap();
    std::fs::create_dir(cache_dir.path().join("keep")).unwrap();
    std::fs::write(cache_dir.path().join("keep/data.bin"), b"also mine").unwrap();
    // Scribble over every RocksDB file: SSTs, manifest, WAL, options.
    for entry in std::fs::read_dir(cache_dir.path()).unwrap().flatten() {
        let path = entry.path();
        if path.is_file() && !path.ends_with("LOCK") && !path.ends_with("NOTES.txt") {
            let mut bytes = std::fs::read(&path).unwrap();
            for b in bytes.iter_mut().skip(7).step_by(97) {
                *b ^= 0x5a;
            }
            std::fs::write(&path, bytes).unwrap();
        }
    }
    let spoke = SpokeProcess::start(&hub.endpoint, cache_dir.path(), &[]);
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    assert_dataset_reads_back(&client, "ds", &dir).await;
    assert_eq!(std::fs::read(cache_dir.path().join("NOTES.txt")).unwrap(), b"mine");
    assert_eq!(std::fs::read(cache_dir.path().join("keep/data.bin")).unwrap(), b"also mine");
}

#[tokio::test]
async fn a_bad_store_option_stops_the_start_and_deletes_nothing() {
    let (_root, cache_dir, dir, hub) = warm_cache_then_stop().await;
    std::fs::write(cache_dir.path().join("NOTES.txt"), b"mine").unwrap();
    let files_before = std::fs::read_dir(cache_dir.path()).unwrap().count();

    // A typo in an option: the start fails naming it, and nothing is removed.
    let out = std::process::Command::new(shardcache_tests::binary("spoke-cache"))
        .args(["--hub", &hub.endpoint, "--cache-dir", cache_dir.path().to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--chunk-size", "256KiB", "--rocksdb-pages-options", "max_write_bufer_number=3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--rocksdb-pages-options") && stderr.contains("max_write_bufer_number"),
        "{stderr}"
    );
    assert!(!stderr.contains("damaged"), "a bad option is not damage: {stderr}");
    assert_eq!(std::fs::read_dir(cache_dir.path()).unwrap().count(), files_before);
    assert_eq!(std::fs::read(cache_dir.path().join("NOTES.txt")).unwrap(), b"mine");

    // Fixed, the cache is all there: every read a hit, nothing from the hub.
    let served_before = hub.stats.snapshot().bytes_served;
    // (The chunk size of spoke_options: a cache of another chunk size is refetched.)
    let spoke = SpokeProcess::start(&hub.endpoint, cache_dir.path(), &["--chunk-size", "256KiB"]);
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    assert_dataset_reads_back(&client, "ds", &dir).await;
    assert_eq!(hub.stats.snapshot().bytes_served, served_before, "the cache survived the typo");
}
