//! The hubs this spoke fetches from, through the verifying client SDK.
//!
//! Connections are lazy: the spoke starts (and serves what it has cached) while its hubs
//! are down. With several `--hub` URLs (stateless hubs over one shared source) a shard
//! always goes to the same hub first (rendezvous hashing, so adding a hub moves few
//! shards), and a hub that cannot be reached is skipped for the next one. Each hub gets
//! several HTTP/2 connections with large windows (`shardcache_serving::transport`), over
//! TLS for `https://` hubs (`--hub-ca`, `--hub-cert`, `--hub-key`, reloaded when the
//! files change) and with the spoke's bearer token when it has one (`--hub-token-file`).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::Bytes;
use shardcache_client::{Client, ConnectOptions, Credentials, Range, connect::client_tls};
use shardcache_proto::v1::ShardInfo;
use shardcache_serving::transport::{DEFAULT_HUB_CONNECTIONS, Http2Settings};
use tonic::transport::Endpoint;

use crate::{Error, Result, peers::Peers};

/// How long to wait for a TCP connection to a hub. A hub across a 60 ms link answers a
/// SYN in ~60 ms; 3 s covers retransmits without letting an uncached read hang.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Default of `--hub-timeout`, the deadline of every call to a hub: a 4 MiB chunk at
/// ~1 Mbit/s, or a listing of the largest datasets, still fits; a hub that hangs does
/// not hold a fetch's room in the in-flight bounds for longer.
pub const DEFAULT_HUB_TIMEOUT: Duration = Duration::from_secs(30);

/// HTTP/2 PINGs on idle hub connections, and how long an answer may take: a connection
/// whose peer vanished (no RST: a cut link, a frozen host) is found dead within
/// ~20 s instead of when TCP gives up (minutes), so new calls go to a fresh one.
pub const HUB_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const HUB_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How the spoke talks to its hubs (flags `--hub-connections`, `--hub-*-window`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubTransport {
    /// HTTP/2 connections per hub; fetches take them in turn.
    pub connections: usize,
    pub http2: Http2Settings,
    /// Deadline of every call to a hub (`--hub-timeout`).
    pub timeout: Duration,
}

impl Default for HubTransport {
    fn default() -> Self {
        Self {
            connections: DEFAULT_HUB_CONNECTIONS,
            http2: Http2Settings::TUNED,
            timeout: DEFAULT_HUB_TIMEOUT,
        }
    }
}

/// One hub: its connections, used in turn.
#[derive(Debug)]
struct Hub {
    url: String,
    connections: Vec<Client>,
    next: AtomicUsize,
}

impl Hub {
    fn connect_lazy(url: &str, transport: &HubTransport, credentials: &ConnectOptions) -> Result<Self> {
        let tls = client_tls(url, credentials.tls.as_ref())
            .map_err(|e| Error::Config(format!("--hub {url}: {e}")))?;
        let token = Credentials::token(credentials.token.as_deref())
            .map_err(|e| Error::Config(format!("--hub-token-file: {e}")))?;
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| Error::Config(format!("--hub {url:?} is not a valid URL: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(HUB_KEEPALIVE_INTERVAL)
            .keep_alive_timeout(HUB_KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let endpoint = transport.http2.endpoint(endpoint);
        let connections = (0..transport.connections.max(1))
            .map(|_| {
                // Each lazily connected channel is its own TCP connection.
                let channel = endpoint.connect_with_connector_lazy(transport.http2.connector(tls.clone()));
                Client::from_channel_with(channel, url, token.clone())
            })
            .collect();
        Ok(Self { url: url.to_owned(), connections, next: AtomicUsize::new(0) })
    }

    /// The next connection in turn.
    fn client(&self) -> Client {
        let turn = self.next.fetch_add(1, Relaxed) % self.connections.len();
        self.connections[turn].clone()
    }
}

/// The hubs, in `--hub` order, and the spoke's group when it has one.
#[derive(Debug, Clone)]
pub struct Upstream {
    hubs: Arc<Vec<Hub>>,
    timeout: Duration,
    peers: Option<Arc<Peers>>,
}

impl Upstream {
    /// Prepares (lazy) connections to `urls`.
    pub fn new(urls: &[String], transport: &HubTransport, credentials: &ConnectOptions) -> Result<Self> {
        if urls.is_empty() {
            return Err(Error::Config("at least one --hub URL is needed".into()));
        }
        let hubs = urls
            .iter()
            .map(|url| Hub::connect_lazy(url, transport, credentials))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { hubs: Arc::new(hubs), timeout: transport.timeout, peers: None })
    }

    /// Fetches ask `peers` (the members ranked before this spoke) before the hubs.
    pub fn with_peers(self, peers: Peers) -> Self {
        Self { peers: Some(Arc::new(peers)), ..self }
    }

    /// The spoke's group, if it has one.
    pub fn peers(&self) -> Option<&Peers> {
        self.peers.as_deref()
    }

    /// Whether this spoke fetches `dataset/shard` from the hub itself: no group, or it
    /// is the shard's owner among the live members.
    pub fn owns(&self, dataset: &str, shard: &str) -> bool {
        self.peers.as_ref().is_none_or(|peers| peers.owns(dataset, shard))
    }

    pub fn urls(&self) -> Vec<String> {
        self.hubs.iter().map(|h| h.url.clone()).collect()
    }

    /// Hubs in the order to try for `dataset/shard`: highest rendezvous score first.
    fn order(&self, dataset: &str, shard: &str) -> Vec<&Hub> {
        let mut hubs: Vec<_> = self.hubs.iter().collect();
        if hubs.len() > 1 {
            hubs.sort_by_key(|hub| std::cmp::Reverse(score(&hub.url, dataset, shard)));
        }
        hubs
    }

    /// Runs `call` on the hubs for this shard until one answers; errors other than
    /// "unreachable" are final (the hubs share one source, so they would agree).
    async fn first_answer<T, F, Fut>(&self, dataset: &str, shard: &str, call: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = shardcache_client::Result<T>>,
    {
        let mut last = None;
        for hub in self.order(dataset, shard) {
            let answer = match tokio::time::timeout(self.timeout, call(hub.client())).await {
                Ok(answer) => answer,
                // A hung hub: the call is dropped (its stream reset) and counts as
                // unreachable, so the next hub is tried and cached data is served.
                Err(_) => {
                    let message = format!(
                        "no answer within --hub-timeout {}",
                        humantime::format_duration(self.timeout)
                    );
                    tracing::warn!(hub = hub.url, %message, "hub timed out");
                    last = Some(Error::HubUnavailable { hub: hub.url.clone(), message });
                    continue;
                }
            };
            match answer {
                Ok(answer) => return Ok(answer),
                Err(e) => {
                    let e = classify(&hub.url, e);
                    if !matches!(e, Error::HubUnavailable { .. }) {
                        return Err(e);
                    }
                    tracing::warn!(hub = hub.url, error = %e, "hub unreachable");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Config("no hubs".into())))
    }

    pub async fn stat(&self, dataset: &str, shard: &str) -> Result<ShardInfo> {
        self.first_answer(dataset, shard, |hub| async move { hub.stat(dataset, shard).await }).await
    }

    /// Reads one range at `version`; the SDK has verified CRC, offset and length.
    pub async fn read(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
        version: &str,
    ) -> Result<Bytes> {
        Ok(self.read_at_any_version(dataset, shard, offset, length, Some(version)).await?.0)
    }

    /// Reads one range at `version`, or at whatever version the hub has when `None`;
    /// returns the bytes with the version they were read at (the SDK has verified CRC,
    /// offset and length).
    pub async fn read_at_any_version(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
        version: Option<&str>,
    ) -> Result<(Bytes, String)> {
        let mut range = Range::new(dataset, shard, offset, length);
        range.expected_version = version.map(str::to_owned);
        let range = &range;
        self.first_answer(dataset, shard, |hub| async move {
            hub.read_range(range).await.map(|v| (v.data, v.version))
        })
        .await
    }

    /// The hub for listing calls (the first one that answers).
    pub async fn list<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = shardcache_client::Result<T>>,
    {
        self.first_answer("", "", call).await
    }
}

/// Rendezvous (highest random weight) score of a hub for a shard: FNV-1a.
fn score(hub: &str, dataset: &str, shard: &str) -> u64 {
    [hub.as_bytes(), &[0], dataset.as_bytes(), &[0], shard.as_bytes()]
        .concat()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Maps an SDK error to the spoke's: unreachable hubs become `HubUnavailable`.
fn classify(hub: &str, err: shardcache_client::Error) -> Error {
    use shardcache_client::Error as E;
    let hub = hub.to_owned();
    match err {
        // tonic reports a refused or failed connection as UNAVAILABLE, and one closed
        // under a request (a link that went down, the hub's own request timeout) as
        // CANCELLED: either way the hub did not answer.
        E::Status { status, .. }
            if matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
            ) || std::error::Error::source(&status).is_some() =>
        {
            // (A status with a source was made here, from a transport failure: tonic
            // calls a connection reset mid-call "Unknown: transport error". A status the
            // hub sent has no source.)
            Error::HubUnavailable { hub, message: status.message().to_owned() }
        }
        E::Status { status, .. }
            if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) =>
        {
            Error::HubRefused { hub, message: format!("{:?}: {}", status.code(), status.message()) }
        }
        E::Status { status, .. } => {
            Error::Hub { hub, code: status.code(), message: status.message().to_owned() }
        }
        E::Endpoint { source, .. } | E::Connect { source, .. } => {
            Error::HubUnavailable { hub, message: source.to_string() }
        }
        E::Config(message) => Error::Config(message),
        e @ (E::Checksum { .. } | E::Protocol { .. } | E::VersionChanged { .. }) => {
            Error::HubCorrupt { hub, message: e.to_string() }
        }
    }
}
