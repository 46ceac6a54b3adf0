//! The spoke's group (`--peers URL1,URL2,...`, `file:PATH` or `dns+http://NAME:PORT`,
//! kept current as the SDK keeps it: `shardcache_client::discovery`; itself included as
//! `--peer-self`): the spokes that share one copy of the data over the long link.
//!
//! Each shard's members are ranked by the SDK's routing type
//! (`shardcache_routing`), the owner first. A spoke that must fetch a chunk asks
//! the live members ranked before it, in order, over the fast local network (their read
//! API, at the version it holds), and the hub only when none of them answers; the owner
//! (first live member) fetches from the hub. So the group fetches each shard from the
//! hub once, and a spoke reading a shard it does not own keeps a copy. Asking only
//! members ranked before oneself cannot loop, whatever each member believes about the
//! others' health: every hop goes strictly up the ranking.
//!
//! Before the hub, the owner asks the next [`PROBED_BEHIND`] members ranked after it for
//! what they hold (`ReadCached`, which never fetches, so it cannot loop either): a member
//! that joins ranks first for about 1/N of the shards, which the member ranked after it
//! owned until then and holds, so it takes them over the local network, not the link.
//!
//! Planned prefetch fetches only the shards a spoke owns ([`Peers::owns`]); a member that
//! is down (or demoted for losing its hedges) is skipped by the others for a while, so
//! its shards pass to the next member and come back when it answers again.
//!
//! Members authenticate to each other with their own identity: the client certificate
//! of `--hub-cert` (a `spoke-client` certificate, granted by a `cert:` line in the
//! members' token files, verified against their `--client-ca`) or the token of
//! `--peer-token-file`; never the token the spoke presents to its hubs. A member that
//! refuses this spoke's credentials makes the group quietly fetch N copies over the long
//! link, so a refusal is loud ([`PeerReports`]): a warning naming the member and the fix, a
//! counter, and the member's state in `Status`.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use shardcache_client::{
    Client, ConnectOptions, Range,
    connect::{AuthChannel, connect_channel_lazy},
    discovery::{self, Origin},
};
use shardcache_proto::{
    checksum::Checked,
    v1::{ReadRangeRequest, cache_control_client::CacheControlClient},
};
use shardcache_routing::{
    self as routing, HedgeCounters, HedgePolicy, Router, Verdict,
    members::{MemberSpec, Members, Slot},
    normalize_url,
};

use super::supply::{Failed, Want};
use crate::{Error, Result};

/// One other member: its read API, its cache control (for `ReadCached`) and its health
/// (asked while it is failing).
#[derive(Debug)]
pub struct Peer {
    client: Client,
    control: CacheControlClient<AuthChannel>,
    health: discovery::HealthClient,
    reports: Arc<PeerReports>,
}

/// How long a member that refused this spoke's credentials shows as refusing, and how
/// often the warning about it is repeated.
pub const REFUSAL_MEMORY: Duration = Duration::from_secs(60);

/// What this spoke has seen its members do wrong: refuse its credentials
/// (UNAUTHENTICATED, PERMISSION_DENIED), or send bytes that failed verification.
#[derive(Debug, Default)]
pub struct PeerReports {
    total: AtomicU64,
    bad_chunks: AtomicU64,
    /// Per member: when it last refused, and when that was last logged.
    last: Mutex<HashMap<String, (Instant, Instant)>>,
}

impl PeerReports {
    /// `url` refused this spoke: counted, and logged as a warning at most once per
    /// [`REFUSAL_MEMORY`] per member.
    fn refused(&self, url: &str, status: &tonic::Status) {
        self.total.fetch_add(1, Relaxed);
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let warn = last.get(url).is_none_or(|&(_, logged)| now.duration_since(logged) >= REFUSAL_MEMORY);
        let logged = if warn { now } else { last.get(url).map_or(now, |&(_, logged)| logged) };
        last.insert(url.to_owned(), (now, logged));
        drop(last);
        if warn {
            tracing::warn!(
                peer = url,
                code = ?status.code(),
                message = status.message(),
                "a member of the group refused this spoke's credentials, so the group is not sharing one copy: \
                 each member fetches from the hub. Give the members --client-ca (this spoke presents its \
                 --hub-cert) and a line `peers cert:<its DNS name> DATASETS` in their token files, or give \
                 this spoke --peer-token-file with a token their token files hold"
            );
        }
    }

    /// Refusals since start.
    pub fn refusals(&self) -> u64 {
        self.total.load(Relaxed)
    }

    /// Chunks from members that failed verification since start.
    pub fn bad_chunks(&self) -> u64 {
        self.bad_chunks.load(Relaxed)
    }

    /// `url` sent bytes that failed verification (`why`): counted and logged with its
    /// URL; the caller skips it for a backoff and takes the chunk from the hub.
    fn bad_chunk(&self, url: &str, why: &dyn std::fmt::Display) {
        self.bad_chunks.fetch_add(1, Relaxed);
        tracing::warn!(peer = url, error = %why, "a member sent bytes that failed verification; skipping it for a while and fetching from the hub");
    }

    /// Whether `url` refused within the last [`REFUSAL_MEMORY`].
    pub fn recent(&self, url: &str) -> bool {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.get(url).is_some_and(|&(at, _)| at.elapsed() < REFUSAL_MEMORY)
    }

    fn check(&self, url: &str, status: &tonic::Status) {
        if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) {
            self.refused(url, status);
        }
    }
}

/// A member's state as this spoke sees it (`Status.members`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    pub url: String,
    /// `self`, `serving`, `unwell` (failed or demoted: skipped for a while) or
    /// `refusing this spoke` (refused its credentials lately).
    pub state: &'static str,
}

/// A member of the group: `None` for this spoke.
pub type PeerSlot = Slot<Option<Peer>>;

/// The group as this spoke sees it.
#[derive(Debug)]
pub struct Peers {
    router: Router<Option<Peer>>,
    /// This spoke's URL as the group lists it (normalised).
    me: String,
    reports: Arc<PeerReports>,
}

/// Deadline of a call to a peer: a chunk over a local network takes milliseconds; a
/// peer that is itself fetching from the hub takes a round trip of the long link more.
/// Hedging (`routing::HedgePolicy::UPSTREAM`) asks the next supplier long before this.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// Members ranked after the owner that it asks for what they hold before the hub: one
/// change of membership moves a shard by one place, so the member now second is the one
/// that owned it; the next one covers a second change (a join while one was away).
pub const PROBED_BEHIND: usize = 2;

impl Peers {
    /// The group `spec` with this spoke as `me`, connecting lazily with `credentials`
    /// (the TLS files the spoke presents to its hubs, and its `--peer-token-file`, never
    /// its hub token); hedging is counted in `counters`. A fixed list must name `me`; a
    /// file or DNS group is read in the background, and this spoke counts as a member
    /// whether or not the source lists it yet.
    pub fn new(
        spec: &str,
        me: &str,
        credentials: &ConnectOptions,
        counters: Arc<HedgeCounters>,
    ) -> Result<Self> {
        let source = Origin::parse(spec).map_err(|e| Error::Config(format!("--peers: {e}")))?;
        let token = shardcache_client::Credentials::token(credentials.token.as_deref())
            .map_err(|e| Error::Config(format!("--peer-token-file: {e}")))?;
        let me = normalize_url(me);
        let (me_owned, credentials) = (me.clone(), source.connect_options(credentials));
        let reports = Arc::new(PeerReports::default());
        let shared = reports.clone();
        let make = move |url: &str| -> std::result::Result<Option<Peer>, String> {
            if url == me_owned {
                return Ok(None);
            }
            let channel =
                connect_channel_lazy(url, &credentials).map_err(|e| format!("--peers {url}: {e}"))?;
            Ok(Some(Peer {
                client: Client::from_channel_with(channel.clone(), url, token.clone()),
                // A chunk in one message: tonic's default 4 MiB limit is below a 4 MiB
                // chunk and its framing (the demo's restarted member could take nothing).
                control: CacheControlClient::with_interceptor(channel.clone(), token.clone())
                    .max_decoding_message_size(shardcache_client::client::MAX_RESPONSE_BYTES),
                health: discovery::HealthClient::new(channel),
                reports: shared.clone(),
            }))
        };
        let initial = match &source {
            Origin::List(list) => {
                if !list.iter().any(|m| m.url == me) {
                    let urls: Vec<&str> = list.iter().map(|m| m.url.as_str()).collect();
                    return Err(Error::Config(format!(
                        "--peer-self {me:?} is not one of --peers ({}); list this spoke too",
                        urls.join(",")
                    )));
                }
                list.clone()
            }
            _ => vec![MemberSpec::new(&me)],
        };
        let members = Arc::new(Members::new(&initial, &make).map_err(Error::Config)?);
        discovery::watch(&members, source, "--peers".into(), make, true, Some(me.clone()));
        discovery::probe_failed(&members, |peer: &Option<Peer>| match peer {
            Some(peer) => discovery::serving(&peer.health),
            None => Box::pin(async { true }),
        });
        Ok(Self { router: Router::new(members, HedgePolicy::UPSTREAM, counters), me, reports })
    }

    /// This spoke's URL as the group lists it.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// What this spoke has seen its members do wrong.
    pub fn reports(&self) -> &PeerReports {
        &self.reports
    }

    /// Every member's state as this spoke sees it, in the group's order.
    pub fn states(&self) -> Vec<MemberState> {
        let members = self.router.members().current();
        members
            .iter()
            .map(|m| {
                let state = match &m.conn {
                    None => "self",
                    Some(_) if self.reports.recent(&m.url) => "refusing this spoke",
                    Some(_) if m.health.is_live() => "serving",
                    Some(_) => "unwell",
                };
                MemberState { url: m.url.clone(), state }
            })
            .collect()
    }

    /// The members now ranked for `dataset/shard`: the live ones before this spoke, and
    /// the live ones after it (neither includes this spoke).
    pub fn around(&self, dataset: &str, shard: &str) -> (Vec<Arc<PeerSlot>>, Vec<Arc<PeerSlot>>) {
        let ranked = self.router.ranked(Some((dataset, shard)));
        let at = ranked.iter().position(|m| m.url == self.me).unwrap_or(ranked.len());
        let mut ahead = ranked;
        let behind = ahead.split_off(at.min(ahead.len()));
        let live = |m: &Arc<PeerSlot>| m.conn.is_some() && m.health.is_live();
        ahead.retain(live);
        (ahead, behind.into_iter().filter(live).collect())
    }

    /// The first member named in `urls` that is ranked before this spoke for
    /// `dataset/shard` (live or not): the owner a client asked before this spoke.
    pub fn asked_before(&self, dataset: &str, shard: &str, urls: &[String]) -> Option<Arc<PeerSlot>> {
        let ranked = self.router.ranked(Some((dataset, shard)));
        ranked
            .into_iter()
            .take_while(|m| m.url != self.me)
            .find(|m| m.conn.is_some() && urls.contains(&m.url))
    }

    /// Whether this spoke owns `dataset/shard`: no live member is ranked before it.
    pub fn owns(&self, dataset: &str, shard: &str) -> bool {
        self.around(dataset, shard).0.is_empty()
    }

    /// The group's URLs now.
    pub fn urls(&self) -> Vec<String> {
        self.router.members().current().iter().map(|m| m.url.clone()).collect()
    }

    /// `[offset, offset + length)` of `dataset/shard` at `version` from `member`, a
    /// member ranked before this spoke (which fetches what it lacks). Any answer but the
    /// bytes is "not here" (the hub decides); a failure of the member's is "unwell".
    pub async fn read(
        member: &PeerSlot,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
        version: &str,
    ) -> std::result::Result<Checked, Failed> {
        let Some(peer) = &member.conn else {
            return Err(Failed::not_here(Error::Internal("asked itself".into())));
        };
        let mut range = Range::new(dataset, shard, offset, length);
        range.expected_version = Some(version.to_owned());
        match tokio::time::timeout(PEER_TIMEOUT, peer.client.read_range(&range)).await {
            Ok(Ok(read)) => Ok(Checked { data: read.data, crc32c: read.crc32c }),
            Ok(Err(e)) => {
                tracing::debug!(peer = member.url, error = %e, "peer could not serve a chunk");
                match &e {
                    shardcache_client::Error::Status { status, .. } => {
                        peer.reports.check(&member.url, status)
                    }
                    shardcache_client::Error::Checksum { .. } | shardcache_client::Error::Protocol { .. } => {
                        peer.reports.bad_chunk(&member.url, &e)
                    }
                    _ => {}
                }
                let verdict = routing::Judged::verdict(&e);
                let error = Error::Peer { peer: member.url.clone(), message: e.to_string() };
                Err(if verdict == Verdict::Unwell { Failed::unwell(error) } else { Failed::not_here(error) })
            }
            Err(_) => {
                tracing::warn!(peer = member.url, "peer did not answer within {PEER_TIMEOUT:?}");
                Err(Failed::unwell(Error::Peer {
                    peer: member.url.clone(),
                    message: "no answer in time".into(),
                }))
            }
        }
    }

    /// `want` from what `member` holds (`ReadCached`: nothing is fetched for it), at its
    /// version or, when it names none, at whatever version it holds (a first read's
    /// speculation, checked against the hub's answer later); with the version. A member
    /// ranked after this spoke is asked for what it holds; with `join`, the owner the
    /// client already asked, for what it holds or is fetching (`JOIN_HEADER`).
    pub async fn held(
        member: &PeerSlot,
        want: Want<'_>,
        join: bool,
    ) -> std::result::Result<(Checked, String), Failed> {
        let Want { dataset, shard, offset, length, version } = want;
        let Some(peer) = &member.conn else {
            return Err(Failed::not_here(Error::Internal("asked itself".into())));
        };
        let mut request = tonic::Request::new(ReadRangeRequest {
            dataset: dataset.to_owned(),
            shard: shard.to_owned(),
            offset,
            length,
            expected_version: version.unwrap_or_default().to_owned(),
            cut_at_end: false,
        });
        if join {
            request.metadata_mut().insert(
                shardcache_proto::hedge::JOIN_HEADER,
                tonic::metadata::MetadataValue::from_static("1"),
            );
        }
        let peer_error = |message: String| Error::Peer { peer: member.url.clone(), message };
        let mut control = peer.control.clone();
        match tokio::time::timeout(PEER_TIMEOUT, control.read_cached(request)).await {
            Ok(Ok(chunk)) => {
                // ReadCached answers as it is today; a member that sent it encoded is decoded
                // (bounded by what was asked), not taken for a damaged copy.
                let chunk = shardcache_proto::encoding::decode(chunk.into_inner(), length)
                    .map_err(|e| Failed::unwell(peer_error(format!("sent a held chunk that {e}"))))?;
                let intact = shardcache_proto::checksum::verify(chunk.offset, &chunk.data, chunk.crc32c);
                if chunk.offset == offset
                    && chunk.data.len() as u64 == length
                    && version.is_none_or(|v| v == chunk.version)
                    && intact.is_ok()
                {
                    return Ok((Checked { data: chunk.data, crc32c: chunk.crc32c }, chunk.version));
                }
                let why = "a cached chunk that is not the one asked for, or fails its checksum";
                peer.reports.bad_chunk(&member.url, &why);
                Err(Failed::unwell(peer_error(format!("sent {why}"))))
            }
            // Not held there (FAILED_PRECONDITION) or at another version: the next one.
            Ok(Err(status)) => {
                tracing::debug!(peer = member.url, %status, "peer does not hold a chunk");
                peer.reports.check(&member.url, &status);
                let error = peer_error(format!("{:?}: {}", status.code(), status.message()));
                Err(match routing::of_code(status.code()) {
                    Verdict::Unwell => Failed::unwell(error),
                    _ => Failed::not_here(error),
                })
            }
            Err(_) => Err(Failed::unwell(peer_error("no answer in time".into()))),
        }
    }
}
