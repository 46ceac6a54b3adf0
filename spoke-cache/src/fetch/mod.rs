//! The fetch owner: one shared fetch per missing chunk (request coalescing), bounded by
//! bytes and by requests in flight upstream; it asks the chain of suppliers
//! (`suppliers/`), counts what each supplied (here, and nowhere else), and hands the
//! bytes to the admission sink (`admission.rs`). Data flows one way: reads ask the
//! owner, the owner asks the suppliers, the bytes go to the readers and the store.
//!
//! A fetch runs in its own task, so a reader that goes away does not cancel it for the
//! others waiting on the same chunk. Readers get the verified bytes as soon as they
//! arrive; the task then admits the chunk and only then leaves `inflight`, after its
//! presence bit is set, so a chunk is always either present or being fetched by exactly
//! one task (and a reader arriving meanwhile takes the bytes from memory). While it runs,
//! its bytes are reserved in the capacity (`Capacity::reserve`), so that the misses
//! deciding meanwhile whether the cache has room see them.
//!
//! A miss the cache does not store (`policy::admit`) is fetched as read ([`FetchOwner::
//! direct`], `as_read.rs`): just the range, shared by concurrent readers of the same
//! range, never stored, a call's misses in one batch upstream. A miss it stores is
//! answered the same way, its chunk filled beside it (`fill.rs`).
//!
//! The folder: the fetch owner (here, with `as_read.rs`, `fill.rs`, `upstream.rs`,
//! `speculation.rs`), the link gate that keeps chunk fetches behind reads within the
//! link's measured bandwidth-delay product (`link_gate.rs`), the shard lookups
//! (`lookup.rs`, `revalidation.rs`), work shared by concurrent callers (`shared.rs`) and the chain of suppliers (`suppliers/`: peers,
//! hubs, hedging, compression).
//!
//! Owns: every byte that crosses to this spoke from a hub or a peer, and what it is
//! counted as. May import `store`, `policy`, `observe`; never `plans`, `read`, the facade
//! or the services.

mod as_read;
mod fill;
mod link_gate;
pub mod lookup;
pub mod revalidation;
pub mod shared;
mod speculation;
pub mod suppliers;
#[cfg(test)]
mod tests;
mod upstream;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, atomic::Ordering::Relaxed},
};

use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
use shardcache_proto::checksum::Checked;

pub use self::{speculation::Alongside, upstream::UPSTREAM_REQUESTS_IN_FLIGHT};
use self::{speculation::Speculations, upstream::Upstream};
use crate::{
    Error, Result,
    fetch::shared::spawn_shared,
    fetch::suppliers::{Joined, Supply},
    observe::job_counters::JobRow,
    observe::metrics::Metrics,
    store::admission::Admission,
    store::capacity::Capacity,
    store::entry::{ChunkIndex, Entry},
};

/// A chunk's bytes (with their checksum), shared by everyone waiting for them.
pub type SharedFetch = Shared<BoxFuture<'static, Result<Checked>>>;

/// One chunk's fetch, shared by everyone who needs the chunk while it runs.
#[derive(Debug, Clone)]
pub struct ChunkFetch {
    /// The chunk's bytes, verified, as soon as they have arrived (what readers wait for).
    pub(crate) fetched: SharedFetch,
    /// Bytes that crossed the link, once the chunk is stored (what a prefetch waits for:
    /// when it reports a shard done, the shard is on disk).
    pub(crate) stored: Shared<BoxFuture<'static, Result<u64>>>,
    /// A read has used (or waits for) its bytes: stored, it is no unread speculation.
    read: Arc<std::sync::atomic::AtomicBool>,
    /// It has its room and has asked upstream: a reader joining it waits no longer than a
    /// fetch of its own would (one still waiting for room is not joined: `ReadPath`).
    started: Arc<std::sync::atomic::AtomicBool>,
    /// Parts of the chunk readers fetch as read, to be taken instead of asked for when
    /// the fetch starts (a fill's, and those lent while it waited for room).
    known: Arc<Mutex<Vec<KnownPart>>>,
    /// A fill's pieces once it has started: each `(from, to)` of the shard and its bytes
    /// as they arrive (`fill.rs`).
    pieces: Arc<Pieces>,
}

impl ChunkFetch {
    /// Whether it has asked upstream already.
    pub fn is_started(&self) -> bool {
        self.started.load(Relaxed)
    }
}

/// What became of a reader's part offered to its chunk's fill ([`FetchOwner::fill`]).
#[derive(Debug)]
pub enum Filled {
    /// The chunk is stored: the part is read from the store.
    Stored,
    /// A fetch of the chunk takes the part from the reader's fetch as read (one started
    /// for it, or one still waiting for room that was lent it).
    Taken(ChunkFetch),
    /// A fetch of the chunk that asks for the part itself (it has started, or holds
    /// another reader's part over it): the reader joins it.
    Running(ChunkFetch),
}

impl Filled {
    /// The fetch that took the part, if one did.
    #[cfg(test)]
    pub fn taken(self) -> Option<ChunkFetch> {
        match self {
            Filled::Taken(fetch) => Some(fetch),
            _ => None,
        }
    }
}

/// What a chunk fetch waiting for room did with a reader's part ([`ChunkFetch::offer`]).
#[derive(Debug)]
pub enum Offer {
    /// It took the part.
    Taken,
    /// A part it holds already covers it: those bytes, and where they start.
    Held(u64, SharedFetch),
    /// It has started, or the part is over one it holds, or it holds enough parts.
    Refused,
}

/// The part of a chunk a reader's fetch as read brings (`[from, to)` of the shard), which
/// the chunk's fill takes instead of fetching it again (`FetchOwner::fill`).
#[derive(Debug)]
pub struct KnownPart {
    pub from: u64,
    pub to: u64,
    pub bytes: SharedFetch,
}

/// A fill's pieces, published once it has asked for them: `(from, to)` of the shard
/// each, and its bytes as they arrive.
type Pieces = std::sync::OnceLock<Vec<(u64, u64, SharedFetch)>>;

/// Whom a fetch is for.
#[derive(Debug, Clone, Copy)]
pub struct FetchFor<'a> {
    /// The row its bytes over the link are counted in.
    pub row: &'a JobRow,
    /// The principal whose share the chunk it stores counts in (`policy::shares`).
    pub principal: &'a str,
    /// Group members its caller's client already asked (`shardcache_proto::hedge`).
    pub avoid: &'a [String],
    /// No read waits for it: read-ahead or a whole-shard fetch (`policy::speculation`).
    pub speculative: bool,
}

impl<'a> FetchFor<'a> {
    /// For a read (or a prefetch or plan someone asked for) by `principal`.
    pub fn read(row: &'a JobRow, principal: &'a str, avoid: &'a [String]) -> Self {
        Self { row, principal, avoid, speculative: false }
    }

    /// For speculation on behalf of `principal`'s reads.
    pub fn speculation(row: &'a JobRow, principal: &'a str) -> Self {
        Self { row, principal, avoid: &[], speculative: true }
    }
}

/// The fetches of the spoke's missing chunks.
#[derive(Debug, Clone)]
pub struct FetchOwner {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The suppliers, through the byte and request bounds (`upstream.rs`).
    upstream: Arc<Upstream>,
    admission: Arc<Admission>,
    capacity: Arc<Capacity>,
    /// Running fetches by `(entry id, chunk index)`.
    inflight: Mutex<HashMap<(u64, ChunkIndex), ChunkFetch>>,
    /// Running fetches of ranges as read, by `(entry id, offset, length)`.
    direct: Mutex<HashMap<(u64, u64, u64), SharedFetch>>,
    speculations: Arc<Speculations>,
}

impl FetchOwner {
    /// Fetches from `supply` into `admission`, with at most `bytes_in_flight` fetched and
    /// not yet stored (never less than one `chunk_size`).
    pub fn new(
        supply: Arc<dyn Supply>,
        (admission, capacity): (Arc<Admission>, Arc<Capacity>),
        metrics: Arc<Metrics>,
        bytes_in_flight: u64,
        chunk_size: u64,
    ) -> Self {
        let upstream = Arc::new(Upstream::new(supply, metrics, bytes_in_flight, chunk_size));
        let inner = Inner {
            upstream,
            admission,
            capacity,
            inflight: Mutex::default(),
            direct: Mutex::default(),
            speculations: Arc::default(),
        };
        Self { inner: Arc::new(inner) }
    }

    /// The link gate its fetches go through (the lookups tell it their stats' answer
    /// times: `Lookups::with_link_gate`).
    pub fn link_gate(&self) -> Arc<link_gate::LinkGate> {
        self.inner.upstream.gate()
    }

    /// Chunk fetches running (fetched chunks not yet stored among them).
    pub fn in_flight(&self) -> usize {
        self.inner.inflight().len()
    }

    /// Calls to the suppliers running now (chunks, ranges fetched as read, joins).
    pub fn upstream_calls(&self) -> usize {
        self.inner.upstream.calls()
    }

    /// The running fetch of chunk `index` of `entry`, if there is one (a read joining it).
    pub fn running(&self, entry: &Entry, index: ChunkIndex) -> Option<ChunkFetch> {
        let running = self.inner.inflight().get(&(entry.id, index)).cloned()?;
        running.read.store(true, Relaxed);
        Some(running)
    }

    /// The shared fetch of chunk `index` of `entry`, to be stored: started here unless
    /// one is already running (then the bytes it fetches are counted in `fetch.row`).
    /// `None` when the chunk is stored: read it from the store.
    pub fn chunk(&self, entry: &Arc<Entry>, index: ChunkIndex, fetch: FetchFor<'_>) -> Option<ChunkFetch> {
        match self.start_chunk(entry, index, fetch, None) {
            Filled::Stored => None,
            Filled::Taken(fetch) | Filled::Running(fetch) => Some(fetch),
        }
    }

    /// Chunk `index` of `entry` filled beside a reader's fetch as read of `part` of it (a
    /// miss the admission stores): the rest of the chunk is fetched (the part's bytes are
    /// the reader's fetch's, not asked again), the whole verified and stored. The reader is
    /// answered as soon as its own bytes arrive, never after the chunk's; the link carries
    /// the chunk once.
    ///
    /// Decided under the lock of the fetches in flight, so that whatever a reader saw a
    /// moment before (the chunk absent, no fetch of it) the answer is true now: a fetch
    /// that ended meanwhile left the chunk stored, and one that started meanwhile takes
    /// the part while it waits for room or else brings it itself. Either way the reader
    /// does not fetch bytes that cross the link anyway (the race that brought one sample
    /// twice in the seed demo's prefetched setups).
    pub fn fill(
        &self,
        entry: &Arc<Entry>,
        index: ChunkIndex,
        part: KnownPart,
        fetch: FetchFor<'_>,
    ) -> Filled {
        self.start_chunk(entry, index, fetch, Some(part))
    }

    fn start_chunk(
        &self,
        entry: &Arc<Entry>,
        index: ChunkIndex,
        fetch: FetchFor<'_>,
        part: Option<KnownPart>,
    ) -> Filled {
        let key = (entry.id, index);
        let mut inflight = self.inner.inflight();
        if let Some(running) = inflight.get(&key) {
            if !fetch.speculative {
                running.read.store(true, Relaxed);
            }
            return match part.map(|part| running.lend(part)) {
                Some(true) => Filled::Taken(running.clone()),
                _ => Filled::Running(running.clone()),
            };
        }
        // Checked under the lock: a fetch sets the presence bit before it leaves
        // `inflight`, so a chunk is either present here or its fetch is registered.
        if entry.has_chunk(index) {
            return Filled::Stored;
        }
        // A read of this chunk that started alongside the shard's stat: its bytes, when
        // at this version, are this fetch's (not a second trip over the link). Taken now:
        // the read is forgotten once the request that started it has ended.
        let (offset, length) = entry.chunk_range(index);
        let speculated = self.inner.speculations.get(&entry.dataset, &entry.shard, offset, length);
        let (bytes_tx, bytes_rx) = tokio::sync::oneshot::channel();
        let read = Arc::new(std::sync::atomic::AtomicBool::new(!fetch.speculative));
        // Room at hand: the fetch asks upstream as soon as its task runs (readers join it).
        // A fill asks for the rest of its chunk only once its reader's own part has
        // arrived: the reader's bytes have the link to themselves (`ChunkTask::after`).
        let after = part.as_ref().map(|part| part.bytes.clone());
        let room = match (&after, &speculated) {
            (Some(_), _) => None,
            (None, Some(_)) => self.inner.upstream.room_off_link(length, false).now_or_never().flatten(),
            (None, None) => self.inner.upstream.room_now(length),
        };
        let started = Arc::new(std::sync::atomic::AtomicBool::new(room.is_some()));
        let mut known: Vec<KnownPart> = part.into_iter().collect();
        if speculated.is_none() {
            known.extend(self.speculated_parts(entry, (offset, length), &known));
        }
        let known = Arc::new(Mutex::new(known));
        let pieces = Arc::new(std::sync::OnceLock::new());
        let task = ChunkTask {
            entry: entry.clone(),
            index,
            fetch: Owned::of(fetch),
            known: known.clone(),
            pieces: pieces.clone(),
            speculated,
            read: read.clone(),
            after,
            room,
            started: started.clone(),
            _reserved: self.inner.capacity.reserve(length),
        };
        let job = self.inner.clone().fetch(task, bytes_tx);
        // Removed only after this fetch was registered: the lock is held until then.
        let done = self.inner.clone();
        let stored = spawn_shared("chunk fetch", job, move || {
            done.inflight().remove(&key);
        });
        let fetched = async move {
            bytes_rx
                .await
                .unwrap_or_else(|_| Err(Error::Internal("a chunk fetch ended without an answer".into())))
        };
        let fetch = ChunkFetch { fetched: fetched.boxed().shared(), stored, read, started, known, pieces };
        inflight.insert(key, fetch.clone());
        Filled::Taken(fetch)
    }

    /// The reads alongside the shard's stat of ranges within chunk `[offset, offset +
    /// length)` of `entry` (a job's first samples), as parts its fetch takes rather than
    /// asks for again, none over one of `known`: a plan's window or a prefetch that
    /// reaches the chunk while they run brings only the rest (the demo's prefetched
    /// setups brought a first batch twice without this). One read at another version
    /// than the entry's is fetched by the fill itself.
    fn speculated_parts(
        &self,
        entry: &Entry,
        (offset, length): (u64, u64),
        known: &[KnownPart],
    ) -> Vec<KnownPart> {
        let end = offset + length;
        let version = entry.version.clone();
        self.inner
            .speculations
            .overlapping(&entry.dataset, &entry.shard, offset, length)
            .into_iter()
            .filter(|&(from, len, _)| from >= offset && from + len <= end)
            .filter(|&(from, len, _)| !known.iter().any(|k| k.from < from + len && from < k.to))
            .map(|(from, len, read)| {
                let version = version.clone();
                let bytes = async move {
                    match read.await {
                        Some((data, v)) if v == version && data.data.len() as u64 == len => Ok(data),
                        _ => Err(Error::Internal("a read alongside the stat brought another version".into())),
                    }
                };
                KnownPart { from, to: from + len, bytes: bytes.boxed().shared() }
            })
            .collect()
    }

    /// The bytes of `[offset, offset + length)` of `entry` from a fetch running now (of
    /// its chunk, or of exactly that range as read), if there is one: what a member
    /// hedged to asks the owner for, so that the hedge does not fetch it again.
    pub fn running_range(
        &self,
        entry: &Entry,
        offset: u64,
        length: u64,
    ) -> Option<BoxFuture<'static, Result<Checked>>> {
        if let Some(direct) = self.inner.direct().get(&(entry.id, offset, length)).cloned() {
            return Some(direct.boxed());
        }
        let index = entry.chunk_of(offset);
        let (start, chunk_len) = entry.chunk_range(index);
        if length == 0 || offset + length > start + chunk_len {
            return None;
        }
        let from = (offset - start) as usize;
        if let Some(running) = self.running(entry, index) {
            // A fill's piece (or its reader's part) that holds the range, else the chunk:
            // the owner's reader waits no longer than that, and neither does a member
            // joining it.
            let (at, bytes) = running.piece_for(offset, offset + length).unwrap_or((start, running.fetched));
            let within = (offset - at) as usize;
            return Some(async move { Ok(bytes.await?.part(within, within + length as usize)) }.boxed());
        }
        // Its whole chunk read alongside the shard's first stat (taken up by the read that
        // started it a moment later).
        let read = self.inner.speculations.get(&entry.dataset, &entry.shard, start, chunk_len)?;
        let version = entry.version.clone();
        Some(
            async move {
                match read.await {
                    Some((data, v)) if v == version && data.data.len() as u64 == chunk_len => {
                        Ok(data.part(from, from + length as usize))
                    }
                    _ => Err(Error::Internal("the read alongside the stat brought another version".into())),
                }
            }
            .boxed(),
        )
    }

    /// Fetches every absent chunk of `entry`, `parallelism` at a time, and returns once
    /// they are stored, with the bytes that crossed the link (counted in `fetch.row`).
    pub async fn fetch_shard(
        &self,
        entry: &Arc<Entry>,
        parallelism: usize,
        fetch: FetchFor<'_>,
    ) -> Result<u64> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let missing: Vec<ChunkIndex> =
            (0..entry.chunk_count()).map(ChunkIndex).filter(|&i| !entry.has_chunk(i)).collect();
        stream::iter(missing)
            .map(|index| match self.chunk(entry, index, fetch) {
                Some(fetch) => fetch.stored,
                None => futures::future::ready(Ok(0)).boxed().shared(),
            })
            .buffer_unordered(parallelism.max(1))
            .try_fold(0, |sum, n| async move { Ok(sum + n) })
            .await
    }

    /// `[offset, offset + length)` of `entry` from the owner its reader's client asked
    /// first, out of its store or the fetch of it that it runs (`Chain::join_owner`): a
    /// hedge or failover that reached this spoke costs the long link nothing while the
    /// owner serves. What a member sent counts as a member's bytes in `fetch.row`.
    pub async fn join_owner(&self, entry: &Entry, offset: u64, length: u64, fetch: FetchFor<'_>) -> Joined {
        self.inner.upstream.join_owner(entry, offset, length, fetch.row, fetch.avoid).await
    }

    /// Starts reading `parts` (`(offset, length)` each) of a shard the cache has no entry
    /// for yet, alongside its `StatShard`, in one batch (see [`speculation`]).
    pub fn speculate(&self, (dataset, shard): (&str, &str), parts: &[(u64, u64)], row: &JobRow) {
        self.inner.speculations.start(&self.inner.upstream, (dataset, shard), parts, row);
    }

    /// The guard of the speculative reads of `parts` (`(offset, length)`) of
    /// `dataset/shard`: they are forgotten when it is dropped (what takes them up has
    /// them, or nothing will).
    pub fn alongside(&self, dataset: &str, shard: &str, parts: Vec<(u64, u64)>) -> Alongside {
        Alongside::new(self.inner.speculations.clone(), dataset, shard, parts)
    }

    /// The speculative read of `[offset, offset + length)` of `dataset/shard`, if one
    /// is running or done and not yet forgotten.
    pub fn speculation(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
    ) -> Option<speculation::SpeculativeRead> {
        self.inner.speculations.get(dataset, shard, offset, length)
    }
}

impl Inner {
    fn inflight(&self) -> MutexGuard<'_, HashMap<(u64, ChunkIndex), ChunkFetch>> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn direct(&self) -> MutexGuard<'_, HashMap<(u64, u64, u64), SharedFetch>> {
        self.direct.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fetch of chunk `index` of `entry`: its bytes to `readers` as soon as they are
    /// verified, then to the store (as unread speculation unless a read joined it); the
    /// bytes that crossed the link once stored. With a known `part` (a fill), only the rest
    /// of the chunk is asked for, and the part's bytes are taken from its reader's fetch.
    async fn fetch(
        self: Arc<Self>,
        task: ChunkTask,
        readers: tokio::sync::oneshot::Sender<Result<Checked>>,
    ) -> Result<u64> {
        let ChunkTask {
            entry,
            index,
            fetch,
            known,
            pieces,
            speculated,
            read,
            after,
            room,
            started,
            _reserved,
        } = task;
        let (offset, length) = entry.chunk_range(index);
        if let Some(after) = after {
            // Whatever it brought: a failed part is fetched by the fill.
            let _ = after.await;
        }
        // Held until the chunk is stored (see `Upstream::room`).
        let mut room = match (room, &speculated) {
            (Some(room), _) => room,
            (None, Some(_)) => self
                .upstream
                .room_off_link(length, true)
                .await
                .ok_or_else(|| Error::Internal("upstream budget closed".into()))?,
            (None, None) => self.upstream.room(length).await?,
        };
        // Started under the parts' lock: a part lent from now on is refused (`lend`).
        let parts = {
            let mut known = known.lock().unwrap_or_else(|p| p.into_inner());
            started.store(true, Relaxed);
            std::mem::take(&mut *known)
        };
        let speculated = match speculated {
            Some(read) => read
                .await
                .filter(|(read, version)| *version == entry.version && read.data.len() as u64 == length),
            None => None,
        };
        let fetched = match speculated {
            Some((data, _)) => Ok(data),
            None if !parts.is_empty() => self.fill(&entry, (offset, length), (parts, &pieces), &fetch).await,
            None => self.upstream.supply(&entry, offset, length, &fetch.row, &fetch.avoid).await,
        };
        room.answered();
        let _ = readers.send(fetched.clone());
        // Serving the verified bytes was still right when caching them failed (counted
        // and logged by the admission, which also acts on a full disk).
        let unread = !read.load(Relaxed);
        let _ = self.admission.admit(&entry, index, fetched?, &fetch.principal, unread).await;
        Ok(length)
    }
}

/// What a chunk's fetch task holds.
struct ChunkTask {
    entry: Arc<Entry>,
    index: ChunkIndex,
    fetch: Owned,
    /// Readers' parts of it, taken instead of asked for ([`ChunkFetch::lend`]).
    known: Arc<Mutex<Vec<KnownPart>>>,
    /// Where a fill says its pieces are ([`ChunkFetch::piece_for`]).
    pieces: Arc<Pieces>,
    /// A read of it alongside the shard's first stat, whose bytes it takes.
    speculated: Option<speculation::SpeculativeRead>,
    /// A read used (or waits for) its bytes.
    read: Arc<std::sync::atomic::AtomicBool>,
    /// A fill's opening read, awaited before it asks for room: at a job's start its
    /// readers' own bytes cross the link before the rest of their chunks (issue 58).
    after: Option<SharedFetch>,
    /// Its room upstream when there was some at once; else waited for.
    room: Option<upstream::Room>,
    started: Arc<std::sync::atomic::AtomicBool>,
    /// Its bytes counted as being fetched to be stored, until it ends.
    _reserved: crate::store::capacity::Reservation,
}

/// A [`FetchFor`] a fetch task keeps.
#[derive(Debug)]
struct Owned {
    row: JobRow,
    principal: String,
    avoid: Vec<String>,
}

impl Owned {
    fn of(fetch: FetchFor<'_>) -> Self {
        Self { row: fetch.row.clone(), principal: fetch.principal.to_owned(), avoid: fetch.avoid.to_vec() }
    }
}
