//! The hubs this spoke fetches from, through the verifying client SDK, routed by the
//! SDK's one routing type (`shardcache_routing`).
//!
//! Connections are lazy: the spoke starts (and serves what it has cached) while its hubs
//! are down. With several `--hub` URLs (stateless hubs over one shared source) a shard
//! always goes to the same hub first (rendezvous hashing, so adding a hub moves few
//! shards); a hub that fails as an unwell member would is skipped for a backoff, and one
//! that has not answered within its hedge delay has the next hub asked too. Each hub gets
//! several HTTP/2 connections with large windows (`shardcache_transport::http2`), over
//! TLS for `https://` hubs (`--hub-ca`, `--hub-cert`, `--hub-key`, reloaded when the
//! files change) and with the spoke's bearer token when it has one (`--hub-token-file`).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
    time::Duration,
};

use shardcache_client::{Client, ConnectOptions, Credentials, connect::client_tls, discovery};
use shardcache_proto::v1::ShardInfo;
use shardcache_routing::{
    HedgeCounters, HedgePolicy, Judged, Router, Verdict,
    members::{MemberSpec, Members, Slot},
};
use shardcache_transport::{
    http2::{DEFAULT_HUB_CONNECTIONS, Http2Settings},
    liveness::LiveChannel,
};
use tonic::transport::Endpoint;

use crate::{Error, Result};

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
    /// Whether chunk fetches say they take zstd, so the hub compresses what pays on the
    /// link (`--hub-compression`: measured, always or never; `compression.rs`).
    pub compression: super::compression::HubCompression,
}

impl Default for HubTransport {
    fn default() -> Self {
        Self {
            connections: DEFAULT_HUB_CONNECTIONS,
            http2: Http2Settings::TUNED,
            timeout: DEFAULT_HUB_TIMEOUT,
            compression: super::compression::HubCompression::Auto,
        }
    }
}

/// One hub: its connections, used in turn, its health check, and whether its chunk
/// fetches ask for zstd.
#[derive(Debug)]
pub struct Hub {
    connections: Vec<Client>,
    /// The channels under `connections`, for what their sockets read.
    channels: Vec<LiveChannel>,
    next: AtomicUsize,
    health: discovery::HealthClient,
    compression: super::compression::Chooser,
}

/// A hub as the router holds it.
pub type HubSlot = Slot<Hub>;

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
        let channels: Vec<_> = (0..transport.connections.max(1))
            // Each lazily connected channel is its own TCP connection, counted so that a
            // fetch left with no connection ends before --hub-timeout
            // (`shardcache_transport::liveness`).
            .map(|_| LiveChannel::lazy(endpoint.clone(), transport.http2, tls.clone()))
            .collect();
        let health = discovery::HealthClient::new(channels[0].clone());
        // Listings and stats ask for bytes as they are; chunk fetches as the chooser says.
        let connections = channels
            .iter()
            .map(|channel| Client::from_channel_with(channel.clone(), url, token.clone()).plain())
            .collect();
        let compression = super::compression::Chooser::new(transport.compression);
        Ok(Self { connections, channels, next: AtomicUsize::new(0), health, compression })
    }

    /// The next connection in turn (for listings and stats).
    pub fn client(&self) -> Client {
        let turn = self.next.fetch_add(1, Relaxed) % self.connections.len();
        self.connections[turn].clone()
    }
}

/// The hubs, routed.
#[derive(Debug)]
pub struct Hubs {
    router: Router<Hub>,
    timeout: Duration,
    /// The last time a hub could not be reached or refused the spoke, and why; cleared
    /// when a hub answers. `Status` and the start check say it.
    trouble: std::sync::Mutex<Option<(String, std::time::Instant)>>,
    /// `trouble` is set.
    troubled: std::sync::atomic::AtomicBool,
}

impl Hubs {
    /// Prepares (lazy) connections to `urls`; hedging is counted in `counters`.
    pub fn new(
        urls: &[String],
        transport: &HubTransport,
        credentials: &ConnectOptions,
        counters: Arc<HedgeCounters>,
    ) -> Result<Self> {
        if urls.is_empty() {
            return Err(Error::Config("at least one --hub URL is needed".into()));
        }
        let specs: Vec<MemberSpec> = urls.iter().map(|url| MemberSpec::new(url)).collect();
        let members = Arc::new(Members::new(&specs, |url| Hub::connect_lazy(url, transport, credentials))?);
        // A hub that failed is used again as soon as its health check says SERVING.
        discovery::probe_failed(&members, |hub: &Hub| discovery::serving(&hub.health));
        Ok(Self {
            router: Router::new(members, HedgePolicy::UPSTREAM, counters),
            timeout: transport.timeout,
            trouble: Default::default(),
            troubled: Default::default(),
        })
    }

    pub fn urls(&self) -> Vec<String> {
        self.router.members().current().iter().map(|h| h.url.clone()).collect()
    }

    /// Chunk fetches asked of every hub as they are, and for zstd, since the spoke started
    /// (what `--hub-compression` chose: `Status`, the metrics).
    pub fn fetches_asked(&self) -> (u64, u64) {
        self.router.members().current().iter().fold((0, 0), |(plain, zstd), hub| {
            let (p, z) = hub.conn.compression.asked();
            (plain + p, zstd + z)
        })
    }

    /// Every byte the spoke's connections to its hubs have read since it started: what
    /// the long link carried toward it, whatever became of it (`Status`'s
    /// `hub_bytes_received`).
    pub fn bytes_received(&self) -> u64 {
        let hubs = self.router.members().current();
        hubs.iter().flat_map(|hub| &hub.conn.channels).map(LiveChannel::bytes_received).sum()
    }

    /// The hubs in the order to ask for `shard` (`None`: a listing): the owner by
    /// rendezvous first, hubs paused after failures last.
    pub fn route(&self, shard: Option<(&str, &str)>) -> Vec<Arc<HubSlot>> {
        self.router.route(shard, &[])
    }

    /// How long a fetch of `dataset/shard` from its hub takes as a rule: twice the p95 of
    /// the hub's recent answer times, once it has answered enough.
    pub fn fetch_time(&self, dataset: &str, shard: &str) -> Option<Duration> {
        self.route(Some((dataset, shard))).first()?.health.learned_delay()
    }

    /// `range` from `hub` (`Hubs::ask`), asking for zstd as its chooser says and timing
    /// the fetch for it (`compression.rs`).
    pub async fn fetch(
        &self,
        hub: &HubSlot,
        range: &shardcache_client::Range,
    ) -> Result<shardcache_client::Verified> {
        let compressed = hub.conn.compression.compress(&range.dataset);
        let started = std::time::Instant::now();
        let read = self
            .ask(hub, |client| async move {
                let client = if compressed { client.compressing() } else { client };
                client.read_range(range).await
            })
            .await?;
        self.timed(hub, compressed, started.elapsed(), read.data.len() as u64);
        if compressed {
            hub.conn.compression.answered(&range.dataset, read.data.len() as u64, read.wire_len);
        }
        Ok(read)
    }

    /// `ranges` in one `ReadRanges` call to the hubs of `route`, hedged as any call to
    /// them (`Hubs::first_answer`), each asking for zstd as its chooser says and timing
    /// the call for it: a batch of misses costs one round trip over the long link.
    pub async fn fetch_batch(
        &self,
        route: &[Arc<HubSlot>],
        ranges: &[shardcache_client::Range],
    ) -> Result<Vec<shardcache_client::Verified>> {
        let answer = self
            .router
            .call(route, |i, _| async move {
                let hub = &route[i];
                // A batch asks as its first range's dataset does (one job's reads as a
                // rule); each range's answer teaches its own dataset below.
                let dataset = ranges.first().map_or("", |r| r.dataset.as_str());
                let compressed = hub.conn.compression.compress(dataset);
                let started = std::time::Instant::now();
                let read = self
                    .ask(hub, |client| async move {
                        let client = if compressed { client.compressing() } else { client };
                        client.read_ranges(ranges).await
                    })
                    .await?;
                let bytes = read.iter().map(|r| r.data.len() as u64).sum();
                self.timed(hub, compressed, started.elapsed(), bytes);
                if compressed {
                    for (range, answer) in ranges.iter().zip(&read) {
                        let decoded = answer.data.len() as u64;
                        hub.conn.compression.answered(&range.dataset, decoded, answer.wire_len);
                    }
                }
                Ok(read)
            })
            .await;
        answer.map_err(|e| e.unwrap_or_else(|| Error::Config("no hubs".into())))
    }

    /// A fetch of `bytes` from `hub` took `elapsed`, compressed or not: its chooser learns
    /// from it, and says so when it changes its mind.
    fn timed(&self, hub: &HubSlot, compressed: bool, elapsed: Duration, bytes: u64) {
        if let Some((plain, zstd)) = hub.conn.compression.fetched(compressed, elapsed, bytes) {
            let asks =
                if super::compression::zstd_wins((plain, zstd)) { "zstd" } else { "bytes as they are" };
            // MB/s of decoded bytes beyond the round trip; a mode whose best fetch took no
            // time beyond it (its round trip, then) shows as 1000000.
            let rate = |cost: f64| (1e-6 / cost).min(1e6) as u64;
            let (plain_mb_s, zstd_mb_s) = (rate(plain), rate(zstd));
            tracing::info!(
                hub = hub.url,
                plain_mb_s,
                zstd_mb_s,
                "chunk fetches now ask for {asks} (--hub-compression auto)"
            );
        }
    }

    /// Runs `call` on a hub, bounded by `--hub-timeout`; its failure as the spoke's error.
    pub async fn ask<T, F, Fut>(&self, hub: &HubSlot, call: F) -> Result<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: std::future::Future<Output = shardcache_client::Result<T>>,
    {
        let answer = match tokio::time::timeout(self.timeout, call(hub.conn.client())).await {
            Ok(answer) => answer.map_err(|e| classify(&hub.url, e)),
            // A hung hub: the call is dropped (its stream reset) and counts as
            // unreachable, so the next hub is tried and cached data is served.
            Err(_) => {
                let message =
                    format!("no answer within --hub-timeout {}", humantime::format_duration(self.timeout));
                tracing::warn!(hub = hub.url, %message, "hub timed out");
                Err(Error::HubUnavailable { hub: hub.url.clone(), message })
            }
        };
        match &answer {
            Err(e @ (Error::HubUnavailable { .. } | Error::HubRefused { .. })) => {
                self.set_trouble(Some(e.to_string()))
            }
            // Every chunk fetch passes here: the lock only while there is trouble to clear.
            _ if self.troubled.load(std::sync::atomic::Ordering::Relaxed) => self.set_trouble(None),
            _ => {}
        }
        answer
    }

    /// Records why the hubs cannot be used (`None`: a hub answered).
    fn set_trouble(&self, why: Option<String>) {
        let mut trouble = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        self.troubled.store(why.is_some(), std::sync::atomic::Ordering::Relaxed);
        *trouble = why.map(|why| (why, std::time::Instant::now()));
    }

    /// Why the hubs could not be used, when the last call to one failed that way: what
    /// `Status` and `shardcache status` show (a spoke stays SERVING through a hub outage:
    /// its cache serves).
    pub fn trouble(&self) -> Option<(String, Duration)> {
        let trouble = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        trouble.as_ref().map(|(why, at)| (why.clone(), at.elapsed()))
    }

    /// Asks each hub's health service once (at start; it needs no token and reads
    /// nothing): the hubs that cannot be used, each with why and what to do (unreachable,
    /// the other scheme, a CA this spoke does not trust), as `Status` would say it.
    pub async fn check(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for hub in self.router.members().current().iter() {
            let mut health = hub.conn.health.clone();
            let service = shardcache_proto::v1::shard_reader_server::SERVICE_NAME.into();
            let request = tonic_health::pb::HealthCheckRequest { service };
            let why = match tokio::time::timeout(self.timeout, health.check(request)).await {
                Ok(Ok(_)) => continue,
                Ok(Err(status)) => shardcache_client::error::explained_status(&hub.url, &status),
                Err(_) => {
                    format!("no answer within --hub-timeout {}", humantime::format_duration(self.timeout))
                }
            };
            let problem = format!("hub {} cannot be used: {why}", hub.url);
            self.set_trouble(Some(problem.clone()));
            problems.push(problem);
        }
        problems
    }

    /// Runs `call` on the hubs for `shard` (hedged) until one answers; an answer that
    /// is not a hub's trouble (NOT_FOUND, a refusal of the spoke's credentials) is final:
    /// the hubs share one source, so they would agree.
    pub async fn first_answer<T, F, Fut>(&self, shard: Option<(&str, &str)>, call: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = shardcache_client::Result<T>>,
    {
        let route = self.route(shard);
        let answer = self.router.call(&route, |i, _| self.ask(&route[i], &call)).await;
        answer.map_err(|e| e.unwrap_or_else(|| Error::Config("no hubs".into())))
    }

    pub async fn stat(&self, dataset: &str, shard: &str) -> Result<ShardInfo> {
        self.first_answer(Some((dataset, shard)), |hub| async move { hub.stat(dataset, shard).await }).await
    }

    /// The hub for listing calls (the first one that answers).
    pub async fn list<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = shardcache_client::Result<T>>,
    {
        self.first_answer(None, call).await
    }
}

/// Which hub errors route to the next hub: the SDK's table (`routing::Verdict`) on the
/// hub's status; a hub that refused the spoke's credentials is the answer (every hub
/// would refuse them).
impl Judged for Error {
    fn verdict(&self) -> Verdict {
        match self {
            Error::HubUnavailable { .. } | Error::HubCorrupt { .. } => Verdict::Unwell,
            Error::Hub { code, .. } => shardcache_routing::of_code(*code),
            _ => Verdict::Answer,
        }
    }
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
            // hub sent has no source.) The cause and what to do, not tonic's outer words.
            // tonic's own status for a failed connection has the cause in its message.
            let message = shardcache_client::error::explained_status(&hub, &status);
            Error::HubUnavailable { hub, message }
        }
        E::Status { status, .. }
            if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) =>
        {
            Error::HubRefused { hub, message: format!("{:?}: {}", status.code(), status.message()) }
        }
        E::Status { status, .. } => {
            Error::Hub { hub, code: status.code(), message: status.message().to_owned() }
        }
        E::Endpoint { cause, .. } | E::Connect { cause, .. } => {
            // The precise cause and what to do (nothing listening, TLS the other way).
            let message = shardcache_client::error::explained(&hub, &shardcache_client::error::chain(&cause));
            Error::HubUnavailable { hub, message }
        }
        E::Config(message) => Error::Config(message),
        // A dataset file's reader's errors: the spoke reads ranges, not formats.
        e @ (E::Damaged { .. } | E::OverBudget { .. }) => Error::Config(e.to_string()),
        e @ (E::Checksum { .. } | E::Protocol { .. } | E::VersionChanged { .. }) => {
            Error::HubCorrupt { hub, message: e.to_string() }
        }
    }
}
