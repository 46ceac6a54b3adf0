//! Counters of what the hub served: read in-process (tests assert that a warm spoke
//! never calls the hub), logged at shutdown, and served to Prometheus on
//! `--metrics-listen` ([`HubStats::render`]).

use std::{
    fmt::Write,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use shardcache_reader::Observer;
use shardcache_serving::prom::Histogram;

/// Requests and bytes served since start. Cheap to update: relaxed atomics.
#[derive(Debug, Default)]
pub struct HubStats {
    stat_requests: AtomicU64,
    read_requests: AtomicU64,
    bytes_served: AtomicU64,
    /// Bytes of data messages as sent (compressed where that paid).
    bytes_sent: AtomicU64,
    /// Time to answer a read (ReadRange, ReadRanges, one StreamShard message).
    read_latency: Histogram,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HubStatsSnapshot {
    /// ListDatasets, ListShards and StatShard calls.
    pub stat_requests: u64,
    /// ReadRange, ReadRanges and StreamShard calls.
    pub read_requests: u64,
    /// Shard bytes sent in data messages.
    pub bytes_served: u64,
    /// What those messages took on the link (less where they went compressed).
    pub bytes_sent: u64,
}

/// The read service counts into the hub's stats.
impl Observer for HubStats {
    fn stat_request(&self) {
        self.stat_requests.fetch_add(1, Relaxed);
    }

    fn read_request(&self) {
        self.read_requests.fetch_add(1, Relaxed);
    }

    fn served(&self, bytes: usize) {
        self.bytes_served.fetch_add(bytes as u64, Relaxed);
    }

    fn sent(&self, bytes: usize) {
        self.bytes_sent.fetch_add(bytes as u64, Relaxed);
    }

    fn read_latency(&self, elapsed: Duration, _context: &shardcache_reader::ReadContext) {
        self.read_latency.observe(elapsed);
    }
}

impl HubStats {
    pub fn snapshot(&self) -> HubStatsSnapshot {
        HubStatsSnapshot {
            stat_requests: self.stat_requests.load(Relaxed),
            read_requests: self.read_requests.load(Relaxed),
            bytes_served: self.bytes_served.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
        }
    }

    /// The Prometheus text exposition of the counters and the read latency histogram.
    pub fn render(&self, token_file_broken: bool) -> String {
        let snapshot = self.snapshot();
        let mut out = String::new();
        let counters = [
            (
                "shardcache_hub_stat_requests_total",
                "ListDatasets, ListShards and StatShard calls",
                snapshot.stat_requests,
            ),
            (
                "shardcache_hub_read_requests_total",
                "ReadRange, ReadRanges and StreamShard calls",
                snapshot.read_requests,
            ),
            ("shardcache_hub_bytes_served_total", "Shard bytes sent in data messages", snapshot.bytes_served),
            (
                "shardcache_hub_bytes_sent_total",
                "What the data messages took on the link (less where they went compressed)",
                snapshot.bytes_sent,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        }
        let name = "shardcache_hub_token_file_broken";
        let _ = writeln!(
            out,
            "# HELP {name} 1 while --token-file cannot be read or parsed: requests with tokens are refused\n# TYPE {name} gauge\n{name} {}",
            u64::from(token_file_broken)
        );
        self.read_latency.render(&mut out, "shardcache_hub_read_seconds", "Time to answer a read");
        out
    }
}
