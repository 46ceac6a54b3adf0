//! The spoke's group (`--peers URL1,URL2,...`, `file:PATH` or `dns+http://NAME:PORT`,
//! kept current as the SDK keeps it: `shardcache_client::members`; itself included as
//! `--peer-self`): the spokes that share one copy of the data over the long link.
//!
//! Each shard's members are ranked by the SDK's rendezvous hashing
//! (`shardcache_client::group`), the owner first. A spoke that must fetch a chunk asks
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
//! Planned prefetch fetches only the shards a spoke owns (`Peers::owns`); a member that
//! is down is skipped by the others for a while (`Health`), so its shards pass to the
//! next member and come back when it answers again.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use shardcache_client::{
    Client, ConnectOptions, Range,
    connect::{AuthChannel, connect_channel_lazy},
    members::{self, Members, Slot, Source},
};
use shardcache_proto::v1::{ReadRangeRequest, cache_control_client::CacheControlClient};

use crate::{Error, Result};

/// One other member: its read API, its cache control (for `ReadCached`) and its health
/// (asked while it is failing).
#[derive(Debug)]
struct Peer {
    client: Client,
    control: CacheControlClient<AuthChannel>,
    health: members::HealthClient,
}

/// A member of the group: `None` for this spoke.
type Member = Slot<Option<Peer>>;

/// The group as this spoke sees it.
#[derive(Debug)]
pub struct Peers {
    members: Arc<Members<Option<Peer>>>,
    /// This spoke's URL as the group lists it.
    me: String,
    /// Deadline of one call to a peer: it is near, so a slow one is a failing one.
    timeout: Duration,
}

/// Deadline of a call to a peer: a chunk over a local network takes milliseconds; a
/// peer that is itself fetching from the hub takes a round trip of the long link more.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// Members ranked after the owner that it asks for what they hold before the hub: one
/// change of membership moves a shard by one place, so the member now second is the one
/// that owned it; the next one covers a second change (a join while one was away).
pub const PROBED_BEHIND: usize = 2;

impl Peers {
    /// The group `spec` with this spoke as `me`, connecting lazily with `credentials`
    /// (the ones the spoke presents to its hubs). A fixed list must name `me`; a file or
    /// DNS group is read in the background (until it lists this spoke, the spoke asks
    /// the members it lists as a client would, and owns nothing).
    pub fn new(spec: &str, me: &str, credentials: &ConnectOptions) -> Result<Self> {
        let source = Source::parse(spec).map_err(|e| Error::Config(format!("--peers: {e}")))?;
        let token = shardcache_client::Credentials::token(credentials.token.as_deref())
            .map_err(|e| Error::Config(format!("--hub-token-file: {e}")))?;
        let (me_owned, credentials) = (me.to_owned(), source.connect_options(credentials));
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
                health: members::HealthClient::new(channel),
            }))
        };
        let initial = match &source {
            Source::List(list) => {
                if !list.iter().any(|m| m.url == me) {
                    let urls: Vec<&str> = list.iter().map(|m| m.url.as_str()).collect();
                    return Err(Error::Config(format!(
                        "--peer-self {me:?} is not one of --peers ({}); list this spoke too",
                        urls.join(",")
                    )));
                }
                list.clone()
            }
            _ => Vec::new(),
        };
        let members = Arc::new(Members::new(&initial, &make).map_err(Error::Config)?);
        members::watch(&members, source, "--peers".into(), make, true);
        members::probe_failed(&members, |peer: &Option<Peer>| match peer {
            Some(peer) => members::serving(&peer.health),
            None => Box::pin(async { true }),
        });
        Ok(Self { members, me: me.to_owned(), timeout: PEER_TIMEOUT })
    }

    /// The members now ranked for `dataset/shard`: those before this spoke, and those
    /// after it.
    fn around(&self, dataset: &str, shard: &str) -> (Vec<Arc<Member>>, Vec<Arc<Member>>) {
        let ranked = members::ranked(&self.members.current(), dataset, shard);
        let at = ranked.iter().position(|m| m.url == self.me).unwrap_or(ranked.len());
        let mut ahead = ranked;
        let behind = ahead.split_off(at.min(ahead.len()));
        (ahead, behind.into_iter().skip(1).collect())
    }

    /// Whether this spoke owns `dataset/shard`: no live member is ranked before it.
    pub fn owns(&self, dataset: &str, shard: &str) -> bool {
        !self.around(dataset, shard).0.iter().any(|m| m.health.is_live())
    }

    /// The group's URLs now.
    pub fn urls(&self) -> Vec<String> {
        self.members.current().iter().map(|m| m.url.clone()).collect()
    }

    /// `[offset, offset + length)` of `dataset/shard` at `version` from the group: the
    /// live members ranked before this spoke (which fetch what they lack), then what the
    /// next members after it hold; `None` when none of them could serve it (then the hub).
    pub async fn read(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
        version: &str,
    ) -> Option<Bytes> {
        let (ahead, _) = self.around(dataset, shard);
        let mut range = Range::new(dataset, shard, offset, length);
        range.expected_version = Some(version.to_owned());
        for member in ahead.iter().filter(|m| m.health.is_live()) {
            let Some(peer) = &member.conn else { continue };
            match tokio::time::timeout(self.timeout, peer.client.read_range(&range)).await {
                Ok(Ok(read)) => {
                    member.health.answered();
                    return Some(read.data);
                }
                Ok(Err(e)) => {
                    // A peer at another version (ABORTED) is not down: the hub decides.
                    if e.code() != Some(tonic::Code::Aborted) {
                        member.health.failed();
                    }
                    tracing::debug!(peer = member.url, error = %e, "peer could not serve a chunk");
                }
                Err(_) => {
                    member.health.failed();
                    tracing::warn!(peer = member.url, "peer did not answer within {:?}", self.timeout);
                }
            }
        }
        self.held(dataset, shard, offset, length, Some(version)).await.map(|(data, _)| data)
    }

    /// `[offset, offset + length)` of `dataset/shard` from what the next members ranked
    /// after this spoke hold (`ReadCached`: nothing is fetched for it), at `version` or,
    /// when `None`, at whatever version they hold (a first read's speculation, checked
    /// against the hub's answer later); with the version.
    pub async fn held(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
        version: Option<&str>,
    ) -> Option<(Bytes, String)> {
        let (_, behind) = self.around(dataset, shard);
        let request = ReadRangeRequest {
            dataset: dataset.to_owned(),
            shard: shard.to_owned(),
            offset,
            length,
            expected_version: version.unwrap_or_default().to_owned(),
        };
        for member in behind.iter().filter(|m| m.health.is_live()).take(PROBED_BEHIND) {
            let Some(peer) = &member.conn else { continue };
            let mut control = peer.control.clone();
            match tokio::time::timeout(self.timeout, control.read_cached(request.clone())).await {
                Ok(Ok(chunk)) => {
                    let chunk = chunk.into_inner();
                    let intact = shardcache_proto::checksum::verify(chunk.offset, &chunk.data, chunk.crc32c);
                    if chunk.offset == offset
                        && chunk.data.len() as u64 == length
                        && version.is_none_or(|v| v == chunk.version)
                        && intact.is_ok()
                    {
                        return Some((chunk.data, chunk.version));
                    }
                    tracing::warn!(peer = member.url, "a peer's cached chunk failed its check; not used");
                }
                // Not held there (FAILED_PRECONDITION) or at another version: the hub.
                Ok(Err(status)) => {
                    if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown) {
                        member.health.failed();
                    }
                    tracing::debug!(peer = member.url, %status, "peer does not hold a chunk");
                }
                Err(_) => member.health.failed(),
            }
        }
        None
    }
}
