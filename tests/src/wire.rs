//! What crossed an emulated link, counted at the wire: the one way every benchmark and
//! test that reports link bytes takes them. The WAN emulator counts every byte it
//! delivers each way (`wan-proxy --counters-file` for a process, `WanProxy::counters`
//! in-process); a figure is read once the link is quiet: the readers' side has nothing
//! in flight (a spoke's `fetches_in_flight` is 0, a reader with no cache has returned)
//! and the counts have not moved across at least one fresh write of the counters (100
//! ms). A condition waited for, never a sleep that decides the outcome: bytes of fills
//! still arriving after the last read belong to the epoch that caused them.

use std::{sync::atomic::Ordering::Relaxed, time::Duration};

use shardcache_client::CacheClient;

/// What an emulated link delivered so far, each way, and the connections it accepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCount {
    /// Bytes delivered toward the client (a spoke, or a reader with no cache): every
    /// byte the hub sent through the link.
    pub to_client: u64,
    /// Bytes delivered toward the hub (requests).
    pub to_upstream: u64,
    pub accepted: u64,
}

impl LinkCount {
    /// What crossed between `before` and this count.
    pub fn since(self, before: LinkCount) -> LinkCount {
        LinkCount {
            to_client: self.to_client - before.to_client,
            to_upstream: self.to_upstream - before.to_upstream,
            accepted: self.accepted - before.accepted,
        }
    }

    /// `wan-proxy --counters-file`'s line (`TO_CLIENT TO_UPSTREAM CONNECTIONS WRITES`):
    /// the counts and how many times the file was written.
    pub fn parse_line(line: &str) -> Option<(LinkCount, u64)> {
        let numbers: Vec<u64> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
        let &[to_client, to_upstream, accepted, writes] = numbers.as_slice() else { return None };
        Some((LinkCount { to_client, to_upstream, accepted }, writes))
    }
}

/// Where a link's counts are read: the emulator's counters file, or its live counters.
pub trait LinkMeter {
    /// The counts now and a stamp that moves each time they are refreshed (the file's
    /// write number; for live counters, a clock in tenths of a second).
    fn read(&self) -> (LinkCount, u64);
}

impl LinkMeter for crate::wan::WanProxy {
    fn read(&self) -> (LinkCount, u64) {
        let c = &self.counters;
        let count = LinkCount {
            to_client: c.bytes_to_client.load(Relaxed),
            to_upstream: c.bytes_to_upstream.load(Relaxed),
            accepted: c.accepted.load(Relaxed),
        };
        (count, tenths_of_a_second())
    }
}

/// Tenths of a second since this process first asked.
fn tenths_of_a_second() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    (START.get_or_init(std::time::Instant::now).elapsed().as_millis() / 100) as u64
}

/// How often a settling link is looked at.
const POLL: Duration = Duration::from_millis(25);
/// How long a link may take to settle before the run fails: a fill of a few chunks over
/// a slow emulated link takes seconds, not this.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(120);

/// The link's counts once it is quiet: `idle()` held at two readings between which the
/// counts did not move and were refreshed at least once (at least 100 ms of a still
/// link with nothing in flight). Panics naming the counts after [`SETTLE_LIMIT`].
pub async fn settled<F, Fut>(meter: &impl LinkMeter, mut idle: F) -> LinkCount
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    let mut last: Option<(LinkCount, u64)> = None;
    loop {
        let quiet = idle().await;
        let (count, stamp) = meter.read();
        match last {
            Some((before, at)) if quiet && before == count && stamp > at => return count,
            Some((before, _)) if quiet && before == count => {}
            _ => last = quiet.then_some((count, stamp)),
        }
        assert!(
            started.elapsed() < SETTLE_LIMIT,
            "the link did not settle within {SETTLE_LIMIT:?}: {count:?}, nothing in flight: {quiet}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The link's counts once `spoke`'s fetches have ended and the link is quiet
/// ([`settled`]); with them the spoke's own count of what its hub connections read.
pub async fn settled_spoke(meter: &impl LinkMeter, spoke: &CacheClient) -> (LinkCount, u64) {
    // Kept across the waits as an atomic: the caller's future must stay `Send`.
    let received = std::sync::atomic::AtomicU64::new(0);
    let count = settled(meter, || async {
        let status = spoke.status().await.expect("the spoke answers Status");
        assert!(status.server_view, "the bench's control client may control the spoke");
        received.store(status.hub_bytes_received, Relaxed);
        status.fetches_in_flight == 0
    })
    .await;
    (count, received.load(Relaxed))
}

/// The link's counts once a reader with no cache has returned and the link is quiet.
pub async fn settled_link(meter: &impl LinkMeter) -> LinkCount {
    settled(meter, || async { true }).await
}

/// Whether a spoke's own count of what its hub connections read (`received`) agrees with
/// the wire's (`wire`, the emulator's `to_client` over the same interval) within 2%: the
/// same bytes counted at the two ends of the link, told apart only by what was in flight
/// at either reading.
pub fn agrees(received: u64, wire: u64) -> bool {
    received.abs_diff(wire) as f64 <= wire as f64 * 0.02
}
