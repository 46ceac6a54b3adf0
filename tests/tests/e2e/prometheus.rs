//! A real Prometheus (Debian's `prometheus`, installed by `make test`) scrapes a hub and
//! two spokes with the recording rules of `deploy/prometheus/rules.yml`, and answers the
//! recorded hit ratios: the rules the Grafana dashboard uses compute what the spokes
//! counted.

#![allow(clippy::unwrap_used)]

use std::{
    io::{Read, Write},
    process::{Child, Command, Stdio},
    time::Duration,
};

use shardcache_client::{Client, Range};
use shardcache_tests::{HubProcess, SpokeProcess, free_loopback_addr, make_dataset};

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` from `127.0.0.1:port`; the body, or `None` when nothing answers yet.
fn get(port: u16, path: &str) -> Option<String> {
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(socket, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut page = String::new();
    socket.read_to_string(&mut page).ok()?;
    let (head, body) = page.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_owned())
}

/// The instant vector `query` answers, as (labels, value) pairs.
fn query(port: u16, query: &str) -> Vec<(serde_json::Value, f64)> {
    let Some(body) = get(port, &format!("/api/v1/query?query={query}")) else { return Vec::new() };
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    answer["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap().parse().unwrap()))
        .collect()
}

/// What the spoke at `endpoint` counted of its one dataset: (hit reads, reads, bytes on
/// the link, bytes read).
async fn counted(endpoint: &str) -> (f64, f64, f64, f64) {
    let control = shardcache_client::CacheClient::connect(endpoint).await.unwrap();
    // A miss is answered by its own bytes and its chunk filled beside it: counted once
    // the fills are done (the link bytes stop growing; bounded).
    let mut status = control.status().await.unwrap();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = control.status().await.unwrap();
        let settled = now.datasets[0].upstream_wire_bytes == status.datasets[0].upstream_wire_bytes;
        status = now;
        if settled {
            break;
        }
    }
    let d = &status.datasets[0];
    let reads = (d.hit_requests + d.miss_requests) as f64;
    (d.hit_requests as f64, reads, d.upstream_wire_bytes as f64, (d.hit_bytes + d.miss_bytes) as f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_records_the_hit_ratio_per_dataset_and_per_member() {
    let binary = std::env::var("SHARDCACHE_PROMETHEUS").unwrap_or_else(|_| "/usr/bin/prometheus".into());
    assert!(
        std::path::Path::new(&binary).exists(),
        "{binary} is missing: apt-get install prometheus (make test's scripts/ensure-test-deps.sh does)"
    );
    let (root, cache_a, cache_b, work) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    make_dataset(root.path(), "ds", 2, 1 << 20);
    let hub = HubProcess::start(root.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let (a, b) = (
        SpokeProcess::start(&hub.endpoint, cache_a.path(), &[]),
        SpokeProcess::start(&hub.endpoint, cache_b.path(), &[]),
    );
    // Spoke a reads shard 0 three times (a miss, then hits once it is stored); spoke b
    // shard 1 once (a miss). Expected: what the spokes themselves counted.
    let shard0 = Range::new("ds", "shard-00000.bin", 0, 4096);
    let client_a = Client::connect(&a.endpoint).await.unwrap();
    for _ in 0..3 {
        client_a.read_range(&shard0).await.unwrap();
    }
    let shard1 = Range::new("ds", "shard-00001.bin", 0, 4096);
    Client::connect(&b.endpoint).await.unwrap().read_range(&shard1).await.unwrap();
    let ((hits_a, reads_a, link_a, read_a), (hits_b, reads_b, link_b, read_b)) =
        (counted(&a.endpoint).await, counted(&b.endpoint).await);
    assert_eq!((reads_a, reads_b, hits_b), (3.0, 1.0, 0.0));
    // Bytes on the link per byte read, as both spokes counted them.
    let (link, read) = (link_a + link_b, read_a + read_b);

    let rules = shardcache_tests::workspace_dir().join("deploy/prometheus/rules.yml").display().to_string();
    let hub_metrics = hub.metrics_addr.clone().unwrap();
    let config = work.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [{rules}]\nscrape_configs:\n  - job_name: shardcache\n    static_configs:\n      - targets: [{}, {}, {hub_metrics}]\n",
            a.metrics_addr, b.metrics_addr
        ),
    )
    .unwrap();
    let port: u16 = free_loopback_addr().rsplit(':').next().unwrap().parse().unwrap();
    let _prometheus = Prometheus(
        Command::new(&binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", work.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Bounded: scrapes and rule evaluations run every second, each target on its own
    // schedule; wait until every target's series made it into the rules.
    let expected = (hits_a + hits_b) / (reads_a + reads_b);
    let (mut per_dataset, mut per_member) = (Vec::new(), Vec::new());
    for _ in 0..120 {
        per_dataset = query(port, "shardcache:spoke_hit_ratio:total");
        per_member = query(port, "shardcache:spoke_member_hit_ratio:total");
        let hub_scraped = !query(port, "shardcache_hub_bytes_served_total").is_empty();
        let settled = per_dataset.len() == 1 && (per_dataset[0].1 - expected).abs() < 1e-9;
        if settled && per_member.len() == 2 && hub_scraped {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(per_dataset.len(), 1, "{per_dataset:?}");
    assert_eq!(per_dataset[0].0["dataset"], "ds");
    assert!((per_dataset[0].1 - expected).abs() < 1e-9, "{per_dataset:?}, the spokes counted {expected}");
    let member = |addr: &str| {
        let found = per_member.iter().find(|(labels, _)| labels["instance"] == addr);
        found.unwrap_or_else(|| panic!("no member {addr} in {per_member:?}")).1
    };
    assert_eq!((member(&a.metrics_addr), member(&b.metrics_addr)), (hits_a / reads_a, 0.0), "{per_member:?}");
    // The hub's page was scraped too: it served both shards whole.
    let served = query(port, "shardcache_hub_bytes_served_total");
    assert_eq!(served[0].1, f64::from(2 << 20), "{served:?}");
    // What the link cost per byte read (a whole 1 MiB shard for each 4 KiB read here).
    let amplification = query(port, "shardcache:link_per_read:total");
    assert_eq!(amplification.len(), 1, "{amplification:?}");
    assert!(
        (amplification[0].1 - link / read).abs() < 1e-9,
        "{amplification:?}, the spokes counted {}",
        link / read
    );
    assert!(amplification[0].1 > 1.0, "small reads of whole chunks: {amplification:?}");
}
