//! `spoke-cache` as a process with the `shardcache` CLI's cache commands against it.

#![allow(clippy::unwrap_used)]

use shardcache_tests::{Cli, HubProcess, SpokeProcess, make_dataset, sha256};

#[test]
fn warm_status_pin_evict_and_get_through_the_spoke() {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "c4", 3, 1 << 20);
    let hub = HubProcess::start(root.path(), &[]);
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &[]);

    let err = Cli::at(&spoke.endpoint, &["warm", "c4"]).stderr;
    assert!(err.contains("warmed c4: 3 shards, 3145728 bytes cached, 3145728 fetched from the hub"), "{err}");
    let warm = Cli::at(&spoke.endpoint, &["warm", "c4", "shard-00001.bin"]);
    assert!(warm.ok && warm.stderr.contains("0 fetched from the hub"), "already cached: {warm:?}");

    let out = Cli::at(&spoke.endpoint, &["status"]).ok_text();
    let line = out.lines().find(|l| l.starts_with("c4")).unwrap_or_else(|| panic!("{out}"));
    let columns: Vec<_> = line.split_whitespace().collect();
    assert_eq!(&columns[1..3], ["3", "3MiB"], "sizes for people: {out}");
    // The warm-up's fetches count in the prefetch row, not as any job's reads.
    let jobs = out.lines().find(|l| l.starts_with("(prefetch)")).unwrap_or_else(|| panic!("{out}"));
    assert_eq!(jobs.split_whitespace().nth(5), Some("3MiB"), "its hub bytes: {out}");

    // With its hub answering: the hub's listing, unmarked, and health says only SERVING.
    let ls = Cli::at(&spoke.endpoint, &["ls", "c4"]);
    assert!(ls.ok && ls.text().lines().count() == 4 && !ls.stderr.contains("STALE"), "{ls:?}");
    let out = Cli::at(&spoke.endpoint, &["health"]).ok_text();
    assert_eq!(out, "SERVING\n");

    let out = Cli::at(&spoke.endpoint, &["pin", "c4"]).ok_text();
    assert!(out.contains("pinned 3 shards"), "{out}");
    let out = Cli::at(&spoke.endpoint, &["evict", "c4", "shard-00002.bin"]).ok_text();
    assert!(out.contains("evicted 1 shards, 1048576 bytes"), "{out}");

    // The read API through the spoke, with the same CLI as against the hub.
    let target = cache.path().join("out.bin");
    Cli::at(&spoke.endpoint, &["get", "c4", "shard-00002.bin", "-o", target.to_str().unwrap()]).ok_bytes();
    assert_eq!(
        sha256(&std::fs::read(&target).unwrap()),
        sha256(&std::fs::read(dir.join("shard-00002.bin")).unwrap())
    );

    // Cache commands against a hub fail with a clear status, not a crash.
    let status = Cli::at(&hub.endpoint, &["status"]);
    assert!(!status.ok && status.stderr.contains("Unimplemented"), "{status:?}");

    // Metrics over plain HTTP, as Prometheus scrapes them.
    let page = std::process::Command::new("bash")
        .args([
            "-c",
            &format!(
                "exec 3<>/dev/tcp/{}/{}; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3",
                spoke.metrics_addr.split(':').next().unwrap(),
                spoke.metrics_addr.split(':').nth(1).unwrap()
            ),
        ])
        .output()
        .unwrap();
    let page = String::from_utf8_lossy(&page.stdout);
    assert!(page.contains("shardcache_spoke_upstream_bytes_total{dataset=\"c4\"} 4194304"), "{page}");
    assert!(page.contains("shardcache_spoke_evicted_shards_total 1"), "{page}");
}
