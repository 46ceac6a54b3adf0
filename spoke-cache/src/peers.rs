//! The spoke's group (`--peers URL1,URL2,...`, itself included as `--peer-self`): the
//! spokes that share one copy of the data over the long link.
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
//! Planned prefetch fetches only the shards a spoke owns (`Peers::owns`); a member that
//! is down is skipped by the others for a while (`Health`), so its shards pass to the
//! next member and come back when it answers again.

use std::time::Duration;

use bytes::Bytes;
use shardcache_client::{
    Client, ConnectOptions, Range,
    group::{self, Health},
};

use crate::{Error, Result};

/// One other member.
#[derive(Debug)]
struct Peer {
    url: String,
    client: Client,
    health: Health,
}

/// The group as this spoke sees it.
#[derive(Debug)]
pub struct Peers {
    /// Every member's URL, in `--peers` order (this spoke's among them).
    urls: Vec<String>,
    /// This spoke's index in `urls`.
    me: usize,
    /// The other members, by index in `urls` (`None` at `me`).
    peers: Vec<Option<Peer>>,
    /// Deadline of one call to a peer: it is near, so a slow one is a failing one.
    timeout: Duration,
}

/// Deadline of a call to a peer: a chunk over a local network takes milliseconds; a
/// peer that is itself fetching from the hub takes a round trip of the long link more.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(10);

impl Peers {
    /// The group `urls` with this spoke as `me` (one of them), connecting lazily with
    /// `credentials` (the ones the spoke presents to its hubs).
    pub fn new(urls: &[String], me: &str, credentials: &ConnectOptions) -> Result<Self> {
        let me_at = urls.iter().position(|u| u == me).ok_or_else(|| {
            Error::Config(format!(
                "--peer-self {me:?} is not one of --peers ({}); list this spoke too",
                urls.join(",")
            ))
        })?;
        let mut peers = Vec::with_capacity(urls.len());
        for (i, url) in urls.iter().enumerate() {
            if i == me_at {
                peers.push(None);
                continue;
            }
            let channel = shardcache_client::connect::connect_channel_lazy(url, credentials)
                .map_err(|e| Error::Config(format!("--peers {url}: {e}")))?;
            let token = shardcache_client::Credentials::token(credentials.token.as_deref())
                .map_err(|e| Error::Config(format!("--hub-token-file: {e}")))?;
            peers.push(Some(Peer {
                url: url.clone(),
                client: Client::from_channel_with(channel, url, token),
                health: Health::default(),
            }));
        }
        Ok(Self { urls: urls.to_vec(), me: me_at, peers, timeout: PEER_TIMEOUT })
    }

    /// Members ranked for `dataset/shard`, the owner first.
    fn ranking(&self, dataset: &str, shard: &str) -> Vec<usize> {
        let members: Vec<(&str, f64)> = self.urls.iter().map(|u| (u.as_str(), 1.0)).collect();
        group::rendezvous(&members, dataset, shard)
    }

    /// The live members ranked before this spoke for `dataset/shard`, in order.
    fn ahead(&self, dataset: &str, shard: &str) -> Vec<&Peer> {
        self.ranking(dataset, shard)
            .into_iter()
            .take_while(|&i| i != self.me)
            .filter_map(|i| self.peers[i].as_ref())
            .filter(|peer| peer.health.is_live())
            .collect()
    }

    /// Whether this spoke owns `dataset/shard`: no live member is ranked before it.
    pub fn owns(&self, dataset: &str, shard: &str) -> bool {
        self.ahead(dataset, shard).is_empty()
    }

    /// The group's URLs.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// `[offset, offset + length)` of `dataset/shard` at `version` from the members
    /// ranked before this spoke; `None` when none of them answered (then the hub).
    pub async fn read(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
        version: &str,
    ) -> Option<Bytes> {
        let mut range = Range::new(dataset, shard, offset, length);
        range.expected_version = Some(version.to_owned());
        for peer in self.ahead(dataset, shard) {
            match tokio::time::timeout(self.timeout, peer.client.read_range(&range)).await {
                Ok(Ok(read)) => {
                    peer.health.answered();
                    return Some(read.data);
                }
                Ok(Err(e)) => {
                    // A peer at another version (ABORTED) is not down: the hub decides.
                    if e.code() != Some(tonic::Code::Aborted) {
                        peer.health.failed();
                    }
                    tracing::debug!(peer = peer.url, error = %e, "peer could not serve a chunk");
                }
                Err(_) => {
                    peer.health.failed();
                    tracing::warn!(peer = peer.url, "peer did not answer within {:?}", self.timeout);
                }
            }
        }
        None
    }
}
