//! Counters of what the hub served, read in-process (tests assert that a warm spoke
//! never calls the hub) and logged at shutdown.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use shardcache_reader::Observer;

/// Requests and bytes served since start. Cheap to update: relaxed atomics.
#[derive(Debug, Default)]
pub struct HubStats {
    stat_requests: AtomicU64,
    read_requests: AtomicU64,
    bytes_served: AtomicU64,
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
}

impl HubStats {
    pub fn snapshot(&self) -> HubStatsSnapshot {
        HubStatsSnapshot {
            stat_requests: self.stat_requests.load(Relaxed),
            read_requests: self.read_requests.load(Relaxed),
            bytes_served: self.bytes_served.load(Relaxed),
        }
    }
}
