//! Where a chunk the spoke lacks comes from: a chain of suppliers, asked in order, each
//! answering verified bytes at the asked version or "not here":
//! 1. the members of the spoke's group ranked before it for the shard (`peers.rs`), which
//!    fetch what they lack from their own chain;
//! 2. what the next members ranked after it hold (`ReadCached`, never a fetch);
//! 3. the hubs (`hubs.rs`), whose answer is final.
//!
//! The chain is asked with the SDK's hedged calls (`shardcache_routing`): a
//! supplier that fails as an unwell one would is paused and the next is asked; one that
//! has not answered within its hedge delay has the next asked as well, and the first
//! verified answer wins. So a member whose own link to the hub hangs while its health
//! says SERVING costs a chunk one hedge delay, and after a few lost races it is demoted
//! and not asked at all for a while.
//!
//! A read a client's hedge (or failover) brought here names the members it asked
//! already (`shardcache_proto::hedge`). A member among them ranked before this spoke is
//! the one fetching the chunk, most likely: [`Chain::join_owner`] asks it to join that
//! fetch (`ReadCached` with `JOIN_HEADER`), for as long as a fetch from the hub takes as
//! a rule, so that a hedge to a slow but healthy owner costs the long link nothing; one
//! that neither holds nor fetches it, or does not answer in that time (a gray member,
//! whose own link hangs), is passed over for the next supplier, and one that is down
//! leaves its shards to this spoke.
//!
//! The chain only answers where bytes came from ([`SuppliedBy`]); the fetch owner
//! (`fetch/`) counts them, bounds what is in flight and hands them to the store.

pub mod compression;
pub mod hubs;
pub mod peers;
pub mod supply;

use std::{collections::HashMap, sync::Arc, time::Duration};
use tracing::Instrument as _;

use futures::{FutureExt, future::BoxFuture};

use shardcache_client::ConnectOptions;
use shardcache_proto::{checksum::Checked, v1::ShardInfo};
use shardcache_routing::{Candidate, Health, HedgeCounters, HedgePolicy, Verdict, hedged};

pub use self::supply::{Failed, Joined, Supplied, SuppliedBy, Supply, Want};
use self::{
    hubs::{HubSlot, HubTransport, Hubs},
    peers::{PROBED_BEHIND, PeerSlot, Peers},
};
use crate::{Error, Result};

/// How long a member asked to join its fetch is waited for before the next supplier,
/// until the hub's answer times are learned; and the bounds of the learned wait.
pub const JOIN_WAIT: Duration = Duration::from_millis(500);
pub const JOIN_WAIT_MIN: Duration = Duration::from_millis(50);
pub const JOIN_WAIT_MAX: Duration = Duration::from_secs(2);

/// One supplier asked for one chunk.
enum Ask {
    /// A member ranked before this spoke.
    Ahead(Arc<PeerSlot>),
    /// A member ranked after it, for what it holds.
    Held(Arc<PeerSlot>),
    Hub(Arc<HubSlot>),
}

impl Ask {
    fn candidate(&self) -> Candidate<'_> {
        match self {
            Ask::Ahead(m) | Ask::Held(m) => Candidate::new(&m.health, &m.url),
            Ask::Hub(h) => Candidate::new(&h.health, &h.url),
        }
    }
}

impl Supply for Chain {
    fn fetch<'a>(&'a self, want: Want<'a>, avoid: &'a [String]) -> BoxFuture<'a, Result<Supplied>> {
        Chain::fetch(self, want, avoid).boxed()
    }

    fn fetch_many<'a>(
        &'a self,
        wants: &'a [Want<'a>],
        avoid: &'a [String],
    ) -> BoxFuture<'a, Vec<Result<Supplied>>> {
        Chain::fetch_many(self, wants, avoid).boxed()
    }

    fn join_owner<'a>(&'a self, want: Want<'a>, avoid: &'a [String]) -> BoxFuture<'a, Joined> {
        Chain::join_owner(self, want, avoid).boxed()
    }

    fn stat<'a>(&'a self, dataset: &'a str, shard: &'a str) -> BoxFuture<'a, Result<ShardInfo>> {
        Chain::stat(self, dataset, shard).boxed()
    }
}

/// The suppliers of the spoke's chunks, in the order they are asked.
#[derive(Debug)]
pub struct Chain {
    peers: Option<Peers>,
    hubs: Hubs,
    counters: Arc<HedgeCounters>,
    late_joins: Arc<LateJoins>,
    /// The last candidate of a probe of the members behind ([`Chain::held_behind`]): "the
    /// hubs, batched", answered at once. Its health is never judged (nothing follows it).
    batched_hubs: Health,
}

/// Bytes one batch of ranges asks a hub for (one `ReadRanges`): a chunk's worth at the
/// default `--chunk-size`, so a batch is on the link no longer than a chunk fetch, and far
/// under a hub's `--max-read` (16 MiB by default); several batches in flight fill the link.
pub const BATCH_BYTES: u64 = 4 << 20;
/// Ranges one batch carries at most (a hub takes `MAX_RANGES_PER_CALL`, 4096).
pub const BATCH_RANGES: usize = 1024;

/// A join not answered in this many of its waits was never going to be: the owner is
/// demoted (a healthy owner behind a full link answers within a few).
pub const JOIN_GIVE_UP_AFTER_WAITS: u32 = 8;

/// A join's states ([`Chain::join_owner`]).
const WAITED: u8 = 0;
const GIVEN_UP: u8 = 1;
const FINISHED: u8 = 2;

/// Joins given up on and still running, per owner, and when each owner last answered a
/// join with bytes ([`Chain::join_owner`]).
#[derive(Debug, Default)]
struct LateJoins {
    late: std::sync::Mutex<HashMap<String, u32>>,
    last_answer: std::sync::Mutex<HashMap<String, std::time::Instant>>,
}

impl LateJoins {
    fn joins(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.late.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, HashMap<String, std::time::Instant>> {
        self.last_answer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `owner` answered a join with bytes just now.
    fn answered(&self, owner: &str) {
        self.answers().insert(owner.to_owned(), std::time::Instant::now());
    }

    /// Whether `owner` answered a join with bytes within `within`: it is busy, not hung.
    fn answered_within(&self, owner: &str, within: Duration) -> bool {
        self.answers().get(owner).is_some_and(|at| at.elapsed() < within)
    }

    fn is_late(&self, owner: &str) -> bool {
        self.joins().contains_key(owner)
    }

    fn started(&self, owner: &str) {
        *self.joins().entry(owner.to_owned()).or_default() += 1;
    }

    fn done(&self, owner: &str) {
        let mut joins = self.joins();
        if let Some(late) = joins.get_mut(owner) {
            *late -= 1;
            if *late == 0 {
                joins.remove(owner);
            }
        }
    }
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
        Ok(Self { peers, hubs, counters, late_joins: Arc::default(), batched_hubs: Health::default() })
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

    /// Whether a read that names `avoid` (members its client already asked) was sent
    /// to the owner of `dataset/shard` first: one of them ranks before this spoke. Its
    /// misses then ask that owner to join its fetch ([`Chain::join_owner`]) and are not
    /// stored here while it serves: the owner keeps the group's copy.
    pub fn owner_was_asked(&self, dataset: &str, shard: &str, avoid: &[String]) -> bool {
        !avoid.is_empty()
            && self.peers.as_ref().is_some_and(|peers| peers.asked_before(dataset, shard, avoid).is_some())
    }

    /// `want` from the owner the client asked first (the first member of `avoid` ranked
    /// before this spoke): from its store, or the fetch of it that it is running, waited
    /// for as long as a fetch from the hub takes as a rule (twice its p95, learned; within
    /// [`JOIN_WAIT_MIN`]..[`JOIN_WAIT_MAX`]); then `NotThere` (the read is fetched as read,
    /// not stored). A join not answered in that time goes on in the background: a slow
    /// owner (a link that fills, queued fetches) answers it late and stays the owner, so
    /// the group keeps one copy; one that does not answer it in
    /// [`JOIN_GIVE_UP_AFTER_WAITS`] waits (its link to the hub hangs) is demoted
    /// (`Health::demote`), and its shards are this spoke's to store (`Joined::Down`)
    /// until it answers again. While a join to an owner is late, the next ones skip it
    /// (a gray owner costs a read one wait, not one each).
    pub async fn join_owner(&self, want: Want<'_>, avoid: &[String]) -> Joined {
        let Some(owner) = self.peers.as_ref().and_then(|p| p.asked_before(want.dataset, want.shard, avoid))
        else {
            return Joined::NotThere;
        };
        // The owner's own span of the join is this one's child (the join carries it).
        let span = shardcache_transport::telemetry::traced(
            || tracing::info_span!("spoke.join_owner", owner = %owner.url, bytes = want.length, outcome = tracing::field::Empty),
        );
        let joined = self.join(&owner, want).instrument(span.clone()).await;
        span.record(
            "outcome",
            match &joined {
                Joined::Bytes(_) => "the owner's bytes",
                Joined::Down => "owner down: fetched here",
                Joined::NotThere => "not there in time: fetched as read",
            },
        );
        joined
    }

    /// [`Self::join_owner`] of `owner`.
    async fn join(&self, owner: &Arc<PeerSlot>, want: Want<'_>) -> Joined {
        if !owner.health.is_live() {
            return Joined::Down;
        }
        let Some(version) = want.version.map(str::to_owned) else {
            return Joined::NotThere;
        };
        if self.late_joins.is_late(&owner.url) {
            return Joined::NotThere;
        }
        let wait = self
            .hubs
            .fetch_time(want.dataset, want.shard)
            .map_or(JOIN_WAIT, |t| t.clamp(JOIN_WAIT_MIN, JOIN_WAIT_MAX));
        let started = std::time::Instant::now();
        // WAITED, then GIVEN_UP by this call or FINISHED by the join, whichever is first.
        let state = Arc::new(std::sync::atomic::AtomicU8::new(WAITED));
        // Within the member's own bound on a peer's answer, so that this one decides.
        let give_up =
            (wait * JOIN_GIVE_UP_AFTER_WAITS).clamp(Duration::from_secs(1), peers::PEER_TIMEOUT / 2);
        let join = {
            let (owner, state, late_joins, counters) =
                (owner.clone(), state.clone(), self.late_joins.clone(), self.counters.clone());
            let (dataset, shard, offset, length) =
                (want.dataset.to_owned(), want.shard.to_owned(), want.offset, want.length);
            tokio::spawn(
                async move {
                    let want =
                        Want { dataset: &dataset, shard: &shard, offset, length, version: Some(&version) };
                    let answer = tokio::time::timeout(give_up, Peers::held(&owner, want, true)).await;
                    let given_up = state.swap(FINISHED, std::sync::atomic::Ordering::AcqRel) == GIVEN_UP;
                    if given_up {
                        late_joins.done(&owner.url);
                    }
                    if let Ok(Ok(_)) = &answer {
                        late_joins.answered(&owner.url);
                    }
                    answer.unwrap_or_else(|_| Err(never_answered(&owner, &late_joins, &counters, give_up)))
                }
                .instrument(tracing::Span::current()),
            )
        };
        match tokio::time::timeout(wait, join).await {
            Ok(Ok(Ok((data, version)))) => {
                owner.health.answered(started.elapsed());
                let wire_len = data.data.len() as u64;
                Joined::Bytes(Supplied { data, version, from: SuppliedBy::Peer, wire_len })
            }
            Ok(Ok(Err(failed))) if failed.verdict == Verdict::Unwell => {
                owner.health.failed();
                Joined::Down
            }
            Ok(_) => Joined::NotThere,
            Err(_) => {
                // The join's task goes on and judges the owner by how it ends (unless it
                // ended just now).
                self.late_joins.started(&owner.url);
                let ordering = std::sync::atomic::Ordering::AcqRel;
                if state
                    .compare_exchange(WAITED, GIVEN_UP, ordering, std::sync::atomic::Ordering::Acquire)
                    .is_err()
                {
                    self.late_joins.done(&owner.url);
                }
                Joined::NotThere
            }
        }
    }

    /// `want` from the first supplier that has it (hedged), leaving out the members
    /// named in `avoid` (a client already asked them: `shardcache_proto::hedge`).
    /// Members ranked before this spoke are asked only for a known version.
    pub async fn fetch(&self, want: Want<'_>, avoid: &[String]) -> Result<Supplied> {
        let mut asks = Vec::new();
        if let Some(peers) = &self.peers {
            let (ahead, behind) = peers.around(want.dataset, want.shard);
            let wanted = |m: &Arc<PeerSlot>| !avoid.contains(&m.url);
            if want.version.is_some() {
                asks.extend(ahead.into_iter().filter(wanted).map(Ask::Ahead));
            }
            asks.extend(behind.into_iter().filter(wanted).take(PROBED_BEHIND).map(Ask::Held));
        }
        asks.extend(self.hubs.route(Some((want.dataset, want.shard))).into_iter().map(Ask::Hub));
        self.first_of(&asks, want).await
    }

    /// `want` from the hubs alone.
    async fn fetch_from_hubs(&self, want: Want<'_>) -> Result<Supplied> {
        let asks: Vec<Ask> =
            self.hubs.route(Some((want.dataset, want.shard))).into_iter().map(Ask::Hub).collect();
        self.first_of(&asks, want).await
    }

    /// `want` from the first of `asks` that has it (hedged).
    async fn first_of(&self, asks: &[Ask], want: Want<'_>) -> Result<Supplied> {
        let candidates: Vec<Candidate> = asks.iter().map(Ask::candidate).collect();
        let answer =
            hedged(&candidates, &HedgePolicy::UPSTREAM, &self.counters, |i| self.ask(&asks[i], want)).await;
        answer.map_err(|failed| failed.map_or_else(|| Error::Config("no hubs".into()), |f| f.error))
    }

    /// `want` from what the members ranked after this spoke hold, asked as
    /// [`Chain::fetch`] asks them (the same candidates, hedge delays and races), where the
    /// hubs would come next, "ask the hubs" answers at once instead: `None`, for the
    /// caller to batch. A member back from being away owns shards the next one fetched
    /// and kept meanwhile; asking the hubs first brought 0.05-0.29 of the dataset over
    /// the link again in the demo's warm epoch.
    async fn held_behind(&self, peers: &Peers, want: Want<'_>, avoid: &[String]) -> Option<Supplied> {
        let (_, behind) = peers.around(want.dataset, want.shard);
        let asks: Vec<Ask> = behind
            .into_iter()
            .filter(|m| !avoid.contains(&m.url))
            .take(PROBED_BEHIND)
            .map(Ask::Held)
            .collect();
        if asks.is_empty() {
            return None;
        }
        let mut candidates: Vec<Candidate> = asks.iter().map(Ask::candidate).collect();
        candidates.push(Candidate::new(&self.batched_hubs, "the hubs, batched"));
        let asks = &asks;
        let ask = |i: usize| async move {
            match asks.get(i) {
                Some(ask) => self.ask(ask, want).await.map(Some),
                None => Ok(None),
            }
        };
        hedged(&candidates, &HedgePolicy::UPSTREAM, &self.counters, ask).await.ok().flatten()
    }

    /// [`Chain::held_behind`] for the `indices` of `wants`, all of one shard this spoke
    /// owns: the first range is asked first, and the others only if a member held it. A
    /// member holds a shard this spoke owns only if it fetched it while this spoke was
    /// away, chunk after chunk as its readers went. Asking for each range of a cold batch
    /// was 64 `ReadCached` calls a batch in a group of 3, and on 2 cores the demo's group
    /// had 68-73% GPU in its cold epoch with them, 83-90% with this (BENCHMARKS.md,
    /// seed-demo). A member that holds some of a shard's chunks, and not the one asked
    /// first, costs those chunks' bytes twice, never a wrong byte.
    async fn held_behind_shard(
        &self,
        peers: &Peers,
        wants: &[Want<'_>],
        indices: Vec<usize>,
        avoid: &[String],
    ) -> Vec<(usize, Option<Supplied>)> {
        let Some((&first, rest)) = indices.split_first() else { return Vec::new() };
        let scout = self.held_behind(peers, wants[first], avoid).await;
        let held_some = scout.is_some();
        let rest = rest.iter().map(|&i| async move {
            (i, if held_some { self.held_behind(peers, wants[i], avoid).await } else { None })
        });
        let mut answers = vec![(first, scout)];
        answers.extend(futures::future::join_all(rest).await);
        answers
    }

    /// `wants` in as few calls as their hubs allow: ranges whose shards go first to the
    /// same hub (each at its known version, or, read alongside a first stat, at whatever
    /// version the hub has: each answer says which), in batches of at most [`BATCH_BYTES`]
    /// and [`BATCH_RANGES`] (one `ReadRanges` each); each answer in order.
    ///
    /// In a group, a range of a shard another member owns goes its own way
    /// ([`Chain::fetch`]: that member first); one of a shard this spoke owns is asked of
    /// the members that may hold it ([`Chain::held_behind_shard`]), and what none holds is
    /// batched to the hubs as with no group. (Each on its own, a cold batch's misses and
    /// the reads alongside its stats were as many `ReadRange` calls at once: the hub shed
    /// past its 256 in flight, and the demo's group of 3 fell from 90% to 52-65% GPU in
    /// its cold epoch, BENCHMARKS.md, seed-demo.)
    pub async fn fetch_many(&self, wants: &[Want<'_>], avoid: &[String]) -> Vec<Result<Supplied>> {
        if wants.len() == 1 {
            return vec![self.fetch(wants[0], avoid).await];
        }
        let mut out: Vec<Option<Result<Supplied>>> = (0..wants.len()).map(|_| None).collect();
        let to_hubs: Vec<usize> = match &self.peers {
            None => (0..wants.len()).collect(),
            Some(peers) => {
                let (mine, theirs): (Vec<usize>, Vec<usize>) =
                    (0..wants.len()).partition(|&i| peers.owns(wants[i].dataset, wants[i].shard));
                let theirs =
                    theirs.into_iter().map(|i| async move { (i, self.fetch(wants[i], avoid).await) });
                let mut by_shard: std::collections::BTreeMap<(&str, &str), Vec<usize>> =
                    std::collections::BTreeMap::new();
                for i in mine {
                    by_shard.entry((wants[i].dataset, wants[i].shard)).or_default().push(i);
                }
                let mine = by_shard
                    .into_values()
                    .map(|indices| self.held_behind_shard(peers, wants, indices, avoid));
                let (theirs, mine) =
                    futures::future::join(futures::future::join_all(theirs), futures::future::join_all(mine))
                        .await;
                for (i, answer) in theirs {
                    out[i] = Some(answer);
                }
                let mut to_hubs = Vec::new();
                for (i, held) in mine.into_iter().flatten() {
                    match held {
                        Some(supplied) => out[i] = Some(Ok(supplied)),
                        None => to_hubs.push(i),
                    }
                }
                to_hubs
            }
        };
        for (i, answer) in self.batched_to_hubs(wants, to_hubs).await {
            out[i] = Some(answer);
        }
        out.into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| Err(Error::Internal("a range of a batch went unasked".into())))
            })
            .collect()
    }

    /// The `indices` of `wants` from the hubs, batched by the hub each goes to first
    /// ([`Chain::fetch_many`]); each with its index.
    async fn batched_to_hubs(
        &self,
        wants: &[Want<'_>],
        indices: Vec<usize>,
    ) -> Vec<(usize, Result<Supplied>)> {
        let mut by_hub: std::collections::BTreeMap<String, (Vec<Arc<HubSlot>>, Vec<usize>)> =
            std::collections::BTreeMap::new();
        let mut single = Vec::new();
        for i in indices {
            let want = &wants[i];
            let route = self.hubs.route(Some((want.dataset, want.shard)));
            match route.first() {
                Some(first) => {
                    by_hub.entry(first.url.clone()).or_insert_with(|| (route.clone(), Vec::new())).1.push(i)
                }
                None => single.push(i),
            }
        }
        let mut batches: Vec<(Vec<Arc<HubSlot>>, Vec<usize>)> = Vec::new();
        for (route, indices) in by_hub.into_values() {
            let mut batch: Vec<usize> = Vec::new();
            let mut bytes = 0;
            for i in indices {
                if !batch.is_empty() && (bytes + wants[i].length > BATCH_BYTES || batch.len() == BATCH_RANGES)
                {
                    batches.push((route.clone(), std::mem::take(&mut batch)));
                    bytes = 0;
                }
                bytes += wants[i].length;
                batch.push(i);
            }
            batches.push((route, batch));
        }
        let batched = batches.into_iter().map(|(route, indices)| async move {
            let asked: Vec<Want<'_>> = indices.iter().map(|&i| wants[i]).collect();
            indices.into_iter().zip(self.fetch_batch(&route, &asked).await).collect::<Vec<_>>()
        });
        let single = single.into_iter().map(|i| async move { (i, self.fetch_from_hubs(wants[i]).await) });
        let (batched, single) =
            futures::future::join(futures::future::join_all(batched), futures::future::join_all(single))
                .await;
        batched.into_iter().flatten().chain(single).collect()
    }

    /// One batch of `wants` from the hubs of `route` in one `ReadRanges`. A batch the hubs
    /// refuse whole for one range's sake (a shard changed: ABORTED; a `--max-read`
    /// smaller than the batch) is asked range by range, so that only that range's readers
    /// see its answer.
    async fn fetch_batch(&self, route: &[Arc<HubSlot>], wants: &[Want<'_>]) -> Vec<Result<Supplied>> {
        if wants.len() == 1 {
            return vec![self.fetch_from_hubs(wants[0]).await];
        }
        let ranges: Vec<shardcache_client::Range> = wants.iter().map(hub_range).collect();
        match self.hubs.fetch_batch(route, &ranges).await {
            Ok(read) => read
                .into_iter()
                .map(|read| {
                    let data = Checked { data: read.data, crc32c: read.crc32c };
                    Ok(Supplied {
                        data,
                        version: read.version,
                        from: SuppliedBy::Hub,
                        wire_len: read.wire_len,
                    })
                })
                .collect(),
            Err(e) if matches!(e.code(), tonic::Code::Aborted | tonic::Code::InvalidArgument) => {
                futures::future::join_all(wants.iter().map(|&want| self.fetch_from_hubs(want))).await
            }
            Err(e) => wants.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn ask(&self, ask: &Ask, want: Want<'_>) -> std::result::Result<Supplied, Failed> {
        let Want { dataset, shard, offset, length, version } = want;
        match ask {
            Ask::Ahead(member) => {
                let version = version.unwrap_or_default();
                let data = Peers::read(member, dataset, shard, offset, length, version).await?;
                let wire_len = data.data.len() as u64;
                Ok(Supplied { data, version: version.to_owned(), from: SuppliedBy::Peer, wire_len })
            }
            Ask::Held(member) => {
                let (data, version) = Peers::held(member, want, false).await?;
                let wire_len = data.data.len() as u64;
                Ok(Supplied { data, version, from: SuppliedBy::Peer, wire_len })
            }
            Ask::Hub(hub) => {
                let read = self.hubs.fetch(hub, &hub_range(&want)).await.map_err(Failed::judged)?;
                let data = Checked { data: read.data, crc32c: read.crc32c };
                Ok(Supplied { data, version: read.version, from: SuppliedBy::Hub, wire_len: read.wire_len })
            }
        }
    }
}

/// What a hub is asked for `want`: the range at its version; or, at no version (read
/// alongside the shard's first stat, its size not known yet), cut at the shard's end, so
/// that the chunk a stream's head covers may run past a shard smaller than a chunk (the
/// fetch that takes it up checks its length against the shard's).
fn hub_range(want: &Want<'_>) -> shardcache_client::Range {
    let mut range = shardcache_client::Range::new(want.dataset, want.shard, want.offset, want.length);
    range.expected_version = want.version.map(str::to_owned);
    if want.version.is_none() { range.cut_at_end() } else { range }
}

/// The failure of a join `owner` did not answer within `give_up`: no slow owner takes this
/// long, so it is demoted and its shards are the next member's to fetch and store until it
/// answers again; joins that were late together end together (one demotion, one line).
/// Unless it answered another join with bytes meanwhile: an owner whose link is full at a
/// cold start answers its joins seconds late, and taking its chunks over then brings them
/// twice (1.2-2.1x the dataset in `group-bench --gray`'s healthy group); a hung link
/// answers none.
fn never_answered(
    owner: &PeerSlot,
    late_joins: &LateJoins,
    counters: &HedgeCounters,
    give_up: Duration,
) -> Failed {
    if late_joins.answered_within(&owner.url, give_up) {
        return Failed::not_here(Error::Peer {
            peer: owner.url.clone(),
            message: "answered a join too late".into(),
        });
    }
    if !owner.health.is_demoted() {
        let pause = owner.health.demote();
        counters.demotions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(member = owner.url, pause = ?pause, "it did not answer a join at all (its link to the hub hangs?): its shards are taken over for a while");
    }
    Failed::unwell(Error::Peer { peer: owner.url.clone(), message: "did not answer a join".into() })
}
