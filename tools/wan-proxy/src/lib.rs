//! The WAN emulator: a TCP proxy that makes loopback look like a long link.
//!
//! This kernel has no `netem`, so the link lives in userspace. Each direction of each
//! proxied connection is a delay line: a reader task takes bytes off one socket as fast as
//! they come and stamps each piece with its delivery time, a writer task hands the piece
//! to the other socket when that time comes. Delay therefore costs no throughput: the
//! line holds a bandwidth-delay product of bytes in flight, like a real link.
//!
//! - `rtt`: each direction adds `rtt / 2`.
//! - `rate`: a bottleneck shared by all connections of one proxy, per direction (as a
//!   peering link is). Bytes are serialised onto it in arrival order; when its queue holds
//!   more than [`BOTTLENECK_QUEUE`] the reader stops reading, so TCP pushes back on the
//!   sender instead of the proxy buffering without bound.
//! - `jitter`: each piece gets up to +-jitter extra delay, never reordering a connection's
//!   bytes (a piece is never delivered before the one before it).
//!
//! Bytes are never changed, dropped or reordered; only their timing is. A [`Fault`]
//! (`faults.rs`), set at run time or cycled by a [`Schedule`], makes the link misbehave
//! and heal again: stall, go down, stall each connection after some bytes, hold one
//! direction, or throttle.

mod faults;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::{Bytes, BytesMut};
pub use faults::{Fault, Schedule, Toward, parse_schedule, run_schedule};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, tcp},
    sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch},
    task::JoinSet,
    time::Instant,
};

/// Largest piece read at once. Small enough that a piece's serialisation time at 2 Gbit/s
/// (0.5 ms) is below the timer's 1 ms resolution, large enough that an uncapped proxy is
/// not the bottleneck (`wan-bench`'s calibration row).
const PIECE: usize = 256 << 10;

/// Bytes one direction of one connection may hold in its delay line before the reader
/// waits: 128 MiB covers 60 ms at ~2 GB/s on one connection, and bounds the memory of a
/// proxy whose receiver stops reading.
const MAX_IN_FLIGHT: usize = 128 << 20;

/// Queueing the bottleneck allows before the sender is pushed back (a router's buffer).
const BOTTLENECK_QUEUE: Duration = Duration::from_millis(2);

/// What the emulated link does to traffic.
#[derive(Debug, Clone, Copy)]
pub struct LinkConfig {
    pub rtt: Duration,
    /// Bottleneck rate in bits per second, per direction; `None` = as fast as the CPU.
    pub rate_bps: Option<u64>,
    pub jitter: Duration,
}

impl LinkConfig {
    pub fn rtt(rtt: Duration) -> Self {
        Self { rtt, rate_bps: None, jitter: Duration::ZERO }
    }
}

/// Parses a link rate: `10Gbit`, `2Gbit`, `500Mbit`, `100kbit`, `1000000` (bits/s).
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let lower = text.trim().to_ascii_lowercase();
    let (number, unit) = match lower.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => lower.split_at(i),
        None => (lower.as_str(), ""),
    };
    let scale = match unit {
        "" | "bit" | "bps" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => return Err(format!("unknown rate unit {unit:?} in {text:?}: use bit, kbit, Mbit or Gbit")),
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("{text:?} is not a rate like 2Gbit"))?;
    let bps = value * scale;
    if bps.is_nan() || bps < 1.0 {
        return Err(format!("rate {text:?} must be positive"));
    }
    Ok(bps as u64)
}

/// One direction of the link, shared by every connection through the proxy.
#[derive(Debug)]
struct Direction {
    delay: Duration,
    jitter: Duration,
    /// Seconds per byte at the bottleneck.
    byte_time: Option<f64>,
    /// When the bottleneck finishes sending what it has been given.
    free_at: Mutex<Instant>,
}

impl Direction {
    fn new(config: &LinkConfig) -> Self {
        Self {
            delay: config.rtt / 2,
            jitter: config.jitter,
            byte_time: config.rate_bps.map(|bps| 8.0 / bps as f64),
            free_at: Mutex::new(Instant::now()),
        }
    }

    /// Puts `len` bytes on the bottleneck; returns when their last bit leaves it and how
    /// long the reader should wait before taking more (the queue's back-pressure).
    fn serialise(&self, len: usize, now: Instant) -> (Instant, Duration) {
        let Some(byte_time) = self.byte_time else { return (now, Duration::ZERO) };
        let mut free_at = self.free_at.lock().unwrap_or_else(|p| p.into_inner());
        *free_at = (*free_at).max(now) + Duration::from_secs_f64(len as f64 * byte_time);
        let backlog = *free_at - now;
        (*free_at, backlog.saturating_sub(BOTTLENECK_QUEUE))
    }
}

/// What crossed the link so far.
#[derive(Debug, Default)]
pub struct LinkCounters {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Bytes delivered to the upstream (requests).
    pub bytes_to_upstream: AtomicU64,
    /// Bytes delivered to the clients (answers: what a cache fetched over the link).
    pub bytes_to_client: AtomicU64,
}

impl LinkCounters {
    /// `to_client to_upstream accepted`, one line (what `wan-proxy --counters-file`
    /// writes).
    pub fn line(&self) -> String {
        format!(
            "{} {} {}\n",
            self.bytes_to_client.load(Ordering::Relaxed),
            self.bytes_to_upstream.load(Ordering::Relaxed),
            self.accepted.load(Ordering::Relaxed)
        )
    }
}

/// A running emulator; stops (with its connections) when dropped.
#[derive(Debug)]
pub struct WanProxy {
    pub addr: SocketAddr,
    /// What crossed the link so far.
    pub counters: Arc<LinkCounters>,
    fault: watch::Sender<Fault>,
    task: tokio::task::JoinHandle<()>,
}

impl WanProxy {
    /// Listens on `listen` (port 0 picks one) and relays each connection to `upstream`.
    pub async fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        config: LinkConfig,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(LinkCounters::default());
        let (fault, faults) = watch::channel(Fault::None);
        let task = tokio::spawn(run(listener, upstream, config, counters.clone(), faults));
        Ok(Self { addr, counters, fault, task })
    }

    /// Sets the link's fault (`Fault::None` heals it).
    pub fn set_fault(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// A handle that sets the link's fault (for a [`run_schedule`] task).
    pub fn fault_sender(&self) -> watch::Sender<Fault> {
        self.fault.clone()
    }

    /// `http://ADDR`, for gRPC clients.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for WanProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections until the task is dropped; each connection's tasks live in a
/// `JoinSet` owned here, so they stop with it. `upstream` is an address or a `HOST:PORT`
/// looked up for each connection (containers: the hub's address changes when it restarts).
/// `faults` switches the link's [`Fault`].
pub async fn run<U>(
    listener: TcpListener,
    upstream: U,
    config: LinkConfig,
    counters: Arc<LinkCounters>,
    faults: watch::Receiver<Fault>,
) where
    U: tokio::net::ToSocketAddrs + Clone + Send + Sync + 'static,
{
    let forward = Arc::new(Direction::new(&config));
    let backward = Arc::new(Direction::new(&config));
    let mut connections = JoinSet::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                counters.accepted.fetch_add(1, Ordering::Relaxed);
                if *faults.borrow() == Fault::Down {
                    continue; // closed as soon as accepted
                }
                seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let (forward, backward) = (forward.clone(), backward.clone());
                let upstream = upstream.clone();
                let faults = faults.clone();
                let counters = counters.clone();
                connections.spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else { return };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let mut down = faults.clone();
                    // Dropping the delay lines closes both sockets: the link went down.
                    tokio::select! {
                        _ = async {
                            tokio::join!(
                                delay_line(client_read, server_write, forward, seed, Toward::Upstream, faults.clone(), counters.clone()),
                                delay_line(server_read, client_write, backward, seed ^ 1, Toward::Client, faults, counters),
                            )
                        } => {}
                        _ = async {
                            // No one left to set faults: the link never goes down.
                            if down.wait_for(|f| *f == Fault::Down).await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        } => {}
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One direction of one connection: bytes from `from` reach `to` after the link's delay.
/// The end of the stream travels the same way, so a half-close arrives after the data.
async fn delay_line(
    mut from: tcp::OwnedReadHalf,
    mut to: tcp::OwnedWriteHalf,
    link: Arc<Direction>,
    seed: u64,
    toward: Toward,
    mut faults: watch::Receiver<Fault>,
    counters: Arc<LinkCounters>,
) {
    let delivered = match toward {
        Toward::Upstream => &counters.bytes_to_upstream,
        Toward::Client => &counters.bytes_to_client,
    };
    type Piece = (Instant, Option<Bytes>, Option<OwnedSemaphorePermit>);
    let (tx, mut rx) = mpsc::unbounded_channel::<Piece>();
    let budget = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let reader = async move {
        let mut rng = seed;
        let mut last = Instant::now();
        // Pieces are split off this buffer without copying; small pieces share one
        // allocation.
        let mut buf = BytesMut::new();
        loop {
            buf.reserve(PIECE);
            let n = from.read_buf(&mut buf).await.unwrap_or(0);
            let permit = budget.clone().acquire_many_owned(n.max(1) as u32).await.ok();
            let now = Instant::now();
            let (sent, wait) = link.serialise(n, now);
            let mut due = sent + link.delay;
            if !link.jitter.is_zero() {
                let span = link.jitter.as_nanos() as u64 * 2 + 1;
                due = (due + Duration::from_nanos(next_random(&mut rng) % span))
                    .checked_sub(link.jitter)
                    .unwrap_or(due);
            }
            // Never before the previous piece: a link does not reorder a stream.
            due = due.max(last);
            last = due;
            if n == 0 {
                let _ = tx.send((due, None, None));
                return;
            }
            if tx.send((due, Some(buf.split().freeze()), permit)).is_err() {
                return;
            }
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
    };
    let writer = async move {
        // Bytes this direction of this connection has delivered (for `StallAfter`).
        let mut written = 0u64;
        while let Some((due, piece, _permit)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            // A fault may hold what the link has (the reader stops once its budget is
            // full) or slow it down.
            let len = piece.as_ref().map_or(0, Bytes::len);
            let Ok(fault) = faults::pass(&mut faults, toward, written, len).await else { return };
            let piece = match (fault, piece) {
                (faults::Fault::Corrupt(every), Some(bytes)) if toward == Toward::Client => {
                    Some(faults::corrupt(bytes, written, every))
                }
                (_, piece) => piece,
            };
            match piece {
                Some(bytes) => {
                    if to.write_all(&bytes).await.is_err() {
                        return;
                    }
                    written += bytes.len() as u64;
                    delivered.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
                None => {
                    let _ = to.shutdown().await;
                    return;
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

/// A small LCG for the jitter: reproducible, and no dependency for it.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    *state >> 11
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_like_tc() {
        assert_eq!(parse_rate("10Gbit").unwrap(), 10_000_000_000);
        assert_eq!(parse_rate("2gbit").unwrap(), 2_000_000_000);
        assert_eq!(parse_rate("500Mbit").unwrap(), 500_000_000);
        assert_eq!(parse_rate("1.5Gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("64000").unwrap(), 64_000);
        assert!(parse_rate("10GB").unwrap_err().contains("unknown rate unit"));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0Mbit").is_err());
    }
}
