//! Where a chunk the spoke lacks comes from: a chain of suppliers, asked in order, each
//! answering verified bytes at the asked version or "not here":
//! 1. the members of the spoke's group ranked before it for the shard (`peers.rs`), which
//!    fetch what they lack from their own chain;
//! 2. what the next members ranked after it hold (`ReadCached`, never a fetch);
//! 3. the hubs (`hubs.rs`), whose answer is final.
//!
//! The chain is asked with the SDK's hedged calls (`shardcache_client::routing`): a
//! supplier that fails as an unwell one would is paused and the next is asked; one that
//! has not answered within its hedge delay has the next asked as well, and the first
//! verified answer wins. So a member whose own link to the hub hangs while its health
//! says SERVING costs a chunk one hedge delay, and after a few lost races it is demoted
//! and not asked at all for a while.
//!
//! The chain only answers where bytes came from ([`Origin`]); the fetch owner
//! (`fetch/`) counts them, bounds what is in flight and hands them to the store.

pub mod hubs;
pub mod peers;

use std::sync::Arc;

use shardcache_client::{
    ConnectOptions,
    routing::{Candidate, HedgeCounters, HedgePolicy, Judged, Verdict, hedged},
};
use shardcache_proto::{checksum::Checked, v1::ShardInfo};

use self::{
    hubs::{HubSlot, HubTransport, Hubs},
    peers::{Member, PROBED_BEHIND, Peers},
};
use crate::{Error, Result};

/// Who supplied a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A member of the spoke's group, over the local network.
    Peer,
    /// A hub, over the long link.
    Hub,
}

/// Bytes a supplier answered, verified (with their checksum), with the version they
/// belong to and who sent them.
#[derive(Debug, Clone)]
pub struct Supplied {
    pub data: Checked,
    pub version: String,
    pub from: Origin,
    /// Bytes it took on the link (less than `data`'s where the hub compressed them).
    pub wire_len: u64,
}

/// What is wanted: `[offset, offset + length)` of `dataset/shard`, at `version` or (a
/// first read's speculation, `None`) at whatever version the supplier has.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub dataset: &'a str,
    pub shard: &'a str,
    pub offset: u64,
    pub length: u64,
    pub version: Option<&'a str>,
}

/// A supplier's failure, with what it says about the supplier.
#[derive(Debug)]
pub struct Failed {
    pub error: Error,
    verdict: Verdict,
}

impl Failed {
    pub fn unwell(error: Error) -> Self {
        Self { error, verdict: Verdict::Unwell }
    }

    pub fn not_here(error: Error) -> Self {
        Self { error, verdict: Verdict::NotHere }
    }

    fn judged(error: Error) -> Self {
        let verdict = error.verdict();
        Self { error, verdict }
    }
}

impl Judged for Failed {
    fn verdict(&self) -> Verdict {
        self.verdict
    }
}

/// One supplier asked for one chunk.
enum Ask {
    /// A member ranked before this spoke.
    Ahead(Arc<Member>),
    /// A member ranked after it, for what it holds.
    Held(Arc<Member>),
    Hub(Arc<HubSlot>),
}

impl Ask {
    fn candidate(&self) -> Candidate<'_> {
        match self {
            Ask::Ahead(m) | Ask::Held(m) => Candidate { health: &m.health, name: &m.url },
            Ask::Hub(h) => Candidate { health: &h.health, name: &h.url },
        }
    }
}

/// The suppliers of the spoke's chunks, in the order they are asked.
#[derive(Debug)]
pub struct Chain {
    peers: Option<Peers>,
    hubs: Hubs,
    counters: Arc<HedgeCounters>,
}

impl Chain {
    /// The hubs at `urls`, and the group `peers` (`(spec, me)`) when the spoke has one;
    /// hedging counted in `counters`.
    pub fn new(
        urls: &[String],
        transport: &HubTransport,
        credentials: &ConnectOptions,
        peers: Option<(&str, &str, &ConnectOptions)>,
        counters: Arc<HedgeCounters>,
    ) -> Result<Self> {
        let hubs = Hubs::new(urls, transport, credentials, counters.clone())?;
        let peers = peers
            .map(|(spec, me, credentials)| Peers::new(spec, me, credentials, counters.clone()))
            .transpose()?;
        Ok(Self { peers, hubs, counters })
    }

    /// The hubs (stats and listings go to them only: they are the authority).
    pub fn hubs(&self) -> &Hubs {
        &self.hubs
    }

    /// The spoke's group, if it has one.
    pub fn peers(&self) -> Option<&Peers> {
        self.peers.as_ref()
    }

    /// Whether this spoke fetches `dataset/shard` from the hubs itself: no group, or no
    /// live member ranks before it.
    pub fn owns(&self, dataset: &str, shard: &str) -> bool {
        self.peers.as_ref().is_none_or(|peers| peers.owns(dataset, shard))
    }

    pub async fn stat(&self, dataset: &str, shard: &str) -> Result<ShardInfo> {
        self.hubs.stat(dataset, shard).await
    }

    /// `want` from the first supplier that has it (hedged), leaving out the members
    /// named in `avoid` (a client already asked them: `shardcache_proto::hedge`).
    /// Members ranked before this spoke are asked only for a known version.
    pub async fn fetch(&self, want: Want<'_>, avoid: &[String]) -> Result<Supplied> {
        let mut asks = Vec::new();
        if let Some(peers) = &self.peers {
            let (ahead, behind) = peers.around(want.dataset, want.shard);
            let wanted = |m: &Arc<Member>| !avoid.contains(&m.url);
            if want.version.is_some() {
                asks.extend(ahead.into_iter().filter(wanted).map(Ask::Ahead));
            }
            asks.extend(behind.into_iter().filter(wanted).take(PROBED_BEHIND).map(Ask::Held));
        }
        asks.extend(self.hubs.route(Some((want.dataset, want.shard))).into_iter().map(Ask::Hub));
        let candidates: Vec<Candidate> = asks.iter().map(Ask::candidate).collect();
        let answer =
            hedged(&candidates, &HedgePolicy::UPSTREAM, &self.counters, |i| self.ask(&asks[i], want)).await;
        answer.map_err(|failed| failed.map_or_else(|| Error::Config("no hubs".into()), |f| f.error))
    }

    async fn ask(&self, ask: &Ask, want: Want<'_>) -> std::result::Result<Supplied, Failed> {
        let Want { dataset, shard, offset, length, version } = want;
        match ask {
            Ask::Ahead(member) => {
                let version = version.unwrap_or_default();
                let data = Peers::read(member, dataset, shard, offset, length, version).await?;
                let wire_len = data.data.len() as u64;
                Ok(Supplied { data, version: version.to_owned(), from: Origin::Peer, wire_len })
            }
            Ask::Held(member) => {
                let (data, version) = Peers::held(member, dataset, shard, offset, length, version).await?;
                let wire_len = data.data.len() as u64;
                Ok(Supplied { data, version, from: Origin::Peer, wire_len })
            }
            Ask::Hub(hub) => {
                let mut range = shardcache_client::Range::new(dataset, shard, offset, length);
                range.expected_version = version.map(str::to_owned);
                let range = &range;
                let read = self.hubs.ask(hub, |client| async move { client.read_range(range).await }).await;
                let read = read.map_err(Failed::judged)?;
                let data = Checked { data: read.data, crc32c: read.crc32c };
                Ok(Supplied { data, version: read.version, from: Origin::Hub, wire_len: read.wire_len })
            }
        }
    }
}
