//! `spoke-cache` as a process with the `shardcache` CLI's cache commands against it.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use shardcache_tests::{HubProcess, SpokeProcess, binary, make_dataset, sha256};

fn shardcache(endpoint: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(binary("shardcache")).arg("--endpoint").arg(endpoint).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn warm_status_pin_evict_and_get_through_the_spoke() {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dir = make_dataset(root.path(), "c4", 3, 1 << 20);
    let hub = HubProcess::start(root.path(), &[]);
    let spoke = SpokeProcess::start(&hub.endpoint, cache.path(), &[]);

    let (ok, _, err) = shardcache(&spoke.endpoint, &["warm", "c4"]);
    assert!(ok, "{err}");
    assert!(err.contains("warmed c4: 3 shards, 3145728 bytes cached, 3145728 fetched from the hub"), "{err}");
    let (ok, _, err) = shardcache(&spoke.endpoint, &["warm", "c4", "shard-00001.bin"]);
    assert!(ok && err.contains("0 fetched from the hub"), "already cached: {err}");

    let (ok, out, _) = shardcache(&spoke.endpoint, &["status"]);
    assert!(ok);
    let line = out.lines().find(|l| l.starts_with("c4")).unwrap_or_else(|| panic!("{out}"));
    let columns: Vec<_> = line.split_whitespace().collect();
    assert_eq!(&columns[1..3], ["3", "3MiB"], "sizes for people: {out}");
    // The warm-up's fetches count in the prefetch row, not as any job's reads.
    let jobs = out.lines().find(|l| l.starts_with("(prefetch)")).unwrap_or_else(|| panic!("{out}"));
    assert_eq!(jobs.split_whitespace().nth(5), Some("3MiB"), "its hub bytes: {out}");

    // With its hub answering: the hub's listing, unmarked, and health says only SERVING.
    let (ok, out, err) = shardcache(&spoke.endpoint, &["ls", "c4"]);
    assert!(ok && out.lines().count() == 4 && !err.contains("STALE"), "{out}{err}");
    let (ok, out, _) = shardcache(&spoke.endpoint, &["health"]);
    assert!(ok && out == "SERVING\n", "{out}");

    let (ok, out, _) = shardcache(&spoke.endpoint, &["pin", "c4"]);
    assert!(ok && out.contains("pinned 3 shards"), "{out}");
    let (ok, out, _) = shardcache(&spoke.endpoint, &["evict", "c4", "shard-00002.bin"]);
    assert!(ok && out.contains("evicted 1 shards, 1048576 bytes"), "{out}");

    // The read API through the spoke, with the same CLI as against the hub.
    let target = cache.path().join("out.bin");
    let (ok, _, err) =
        shardcache(&spoke.endpoint, &["get", "c4", "shard-00002.bin", "-o", target.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(
        sha256(&std::fs::read(&target).unwrap()),
        sha256(&std::fs::read(dir.join("shard-00002.bin")).unwrap())
    );

    // Cache commands against a hub fail with a clear status, not a crash.
    let (ok, _, err) = shardcache(&hub.endpoint, &["status"]);
    assert!(!ok && err.contains("Unimplemented"), "{err}");

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
