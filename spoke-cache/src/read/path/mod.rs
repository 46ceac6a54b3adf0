//! The read path of the cache: stored parts from the store in one hop to the blocking
//! pool, missing chunks from the fetch owner (all started at once), parts of fetched
//! chunks copied out; a stored chunk that fails its check is forgotten and refetched.
//! Asked by the cache's facade; it asks the store, the fetch owner, the admission and
//! the bets beyond a read (`read_ahead.rs`), never back.
//!
//! A missing chunk is fetched whole and stored only when the admission says it pays
//! (`policy::admit`: room below the low watermark, a plan, or a chunk read far more than
//! what it would displace); otherwise the part the read wants is fetched as read and
//! served without being stored. Every part read, stored or not, counts in the filter.

mod parts;
mod samples;
mod stored;

use parts::{Part, Provenance, record_parts};

use std::sync::{Arc, atomic::Ordering::Relaxed};

use futures::FutureExt;
use shardcache_transport::telemetry;

use shardcache_proto::checksum::Checked;

use crate::{
    Error, Result,
    fetch::suppliers::{Chain, Joined},
    fetch::{Alongside, FetchFor, FetchOwner, Filled, KnownPart, Offer},
    observe::job_counters::JobRow,
    observe::metrics::Metrics,
    plans::{Plans, Step},
    policy::admit::{self, AdmissionFilter},
    read::ahead::ReadAhead,
    read::index_reads::IndexReads,
    store::Store,
    store::admission::Admission,
    store::capacity::Capacity,
    store::entry::{ChunkIndex, Entry},
    store::kept::Keeper,
    store::locate::PageSpan,
};

/// A range's bytes, or part of them, as the same-node door hands them out.
#[derive(Debug, Clone)]
pub enum Piece {
    Bytes(Checked),
    /// Stored pages, in the store's files (`store::locate`).
    Pages(Vec<PageSpan>),
}

impl Piece {
    /// The bytes, when it carries them.
    pub fn bytes(self) -> Option<Checked> {
        match self {
            Self::Bytes(bytes) => Some(bytes),
            Self::Pages(_) => None,
        }
    }
}

/// The read path, with the parts it uses.
#[derive(Debug)]
pub struct ReadPath {
    pub store: Arc<Store>,
    /// What each read is to the plans (asked once per call), and the samples they
    /// fetched ahead.
    pub plans: Arc<Plans>,
    /// Every part read counts in it, hit or miss (`policy::admit`).
    pub filter: Arc<AdmissionFilter>,
    pub fetch: FetchOwner,
    pub admission: Arc<Admission>,
    /// Samples kept for a later epoch (`store/kept/`).
    pub keeper: Arc<Keeper>,
    pub capacity: Arc<Capacity>,
    /// Whether a read was sent to the owner first (a hedge: its fetch is joined).
    pub chain: Arc<Chain>,
    /// What index reads fetched as read (`index_reads.rs`).
    pub index_reads: Arc<IndexReads>,
    /// Whether a miss is stored, and what starts after a read.
    pub read_ahead: Arc<ReadAhead>,
    pub metrics: Arc<Metrics>,
}

/// Who a read is for: its job (a plan's straggler is told by it), the row its reads
/// (and what they fetch) are counted in, and the group members its client already asked
/// (`shardcache_proto::hedge`), not to be asked again for what it lacks.
#[derive(Debug, Clone, Default)]
pub struct ReadFor {
    pub job: Option<String>,
    /// Who reads: its job is that principal's.
    pub principal: Arc<str>,
    pub row: JobRow,
    pub avoid: Arc<[String]>,
    /// A format's index reads (`shardcache-index-read`): their misses are fetched as
    /// read and kept in memory (`index_reads.rs`), and start no read-ahead or
    /// whole-shard fetch.
    pub index_read: bool,
    /// The reads started alongside the shard's first stat for this request, kept until
    /// it ends (so that a part fetched as read takes them up: `ColdOpen::entry_for`).
    pub alongside: Option<Arc<Alongside>>,
    /// Set when a part of the answer came from the owner its client asked first (a join):
    /// the answer says so, and the client does not count its race as the owner's loss.
    pub relayed: shardcache_reader::Relayed,
}

impl ReadFor {
    /// A fetch for this reader's reads.
    pub fn fetch(&self) -> FetchFor<'_> {
        FetchFor::read(&self.row, &self.principal, &self.avoid)
    }
}

/// Shards one read call may start read-ahead or a whole-shard fetch for (the rest of a
/// batch's shards are fetched as read): a trainer's batch spans a few shards, and
/// speculation past that is the fan-out of one request, not a reader's next reads.
pub const SPECULATIVE_SHARDS_PER_CALL: usize = 16;

/// Tries to read a chunk that failed its check once more before giving up: it is
/// refetched, unless another reader's fetch stored it again meanwhile.
const FAULT_RETRIES: usize = 3;

impl ReadPath {
    /// Reads `[offset, offset + length)` of `entry` (inside the shard: checked by the
    /// caller), from the store where present and upstream where not.
    pub async fn read(
        &self,
        entry: &Arc<Entry>,
        offset: u64,
        length: u64,
        reader: &ReadFor,
    ) -> Result<Checked> {
        let mut read = self.read_many(&[(entry, offset, length)], reader).await?;
        Ok(read.pop().unwrap_or_default())
    }

    /// Reads several ranges (each inside its shard: checked by the caller) for one call.
    ///
    /// Every missing chunk's fetch starts before anything is awaited, so a cold read of
    /// n chunks costs one round trip upstream, not n; and every stored part is read in
    /// one trip to the blocking pool, so a warm batch makes one hop off the runtime.
    /// A range that is a kept sample, or a sample its job's plan had fetched ahead, is
    /// read whole from there; a job that follows samples keeps what its plan reads again.
    pub async fn read_many(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        reader: &ReadFor,
    ) -> Result<Vec<Checked>> {
        let read = self.read_or_place(wants, reader, false).await?;
        // (Each range read whole comes as one piece of bytes: `assemble`.)
        Ok(read
            .into_iter()
            .map(|pieces| Checked::concat(pieces.into_iter().filter_map(Piece::bytes).collect()))
            .collect())
    }

    /// The ranges of one call of the same-node door (`serve/local_door.rs`), read as
    /// [`read_many`](Self::read_many) reads them (counted the same, a hit as a hit), but
    /// with the stored parts placed in the store's files rather than read; `None`, with
    /// nothing read or counted, when some chunk of them is not stored (the reader reads
    /// the call over gRPC, which fetches it). A part that cannot be placed, or that is
    /// not stored by the time it is read (evicted meanwhile, a sample kept for its job),
    /// comes as bytes.
    pub async fn locate_many(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        reader: &ReadFor,
    ) -> Result<Option<Vec<Vec<Piece>>>> {
        let stored = |&(entry, offset, length): &(&Arc<Entry>, u64, u64)| {
            entry.chunks_of(offset, offset + length).all(|index| entry.has_chunk(index))
        };
        if !wants.iter().all(stored) {
            return Ok(None);
        }
        self.read_or_place(wants, reader, true).await.map(Some)
    }

    /// [`read_many`](Self::read_many), placing the stored parts rather than reading them
    /// when `place` and every part of the call is stored.
    async fn read_or_place(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        reader: &ReadFor,
        place: bool,
    ) -> Result<Vec<Vec<Piece>>> {
        // What each range is to the plans, asked before any admission this read causes
        // makes room by them: what its misses do and what starts after it follow from it.
        let steps = self.plans.to_read(wants, (&reader.principal, reader.job.as_deref()), reader.index_read);
        let mut parts = Vec::new();
        // Per range, the reads in a row of its shard that began where the one before
        // ended (0: not sequential): what read-ahead follows, and what the filter counts.
        let mut runs = vec![0; wants.len()];
        for (want, (&(entry, offset, length), &step)) in wants.iter().zip(&steps).enumerate() {
            if length == 0 {
                continue;
            }
            let end = offset + length;
            if step.counts() {
                runs[want] = entry.read_from(offset, end);
            }
            if let Some(sample) = self.sample_part((want, step), entry, offset, length) {
                parts.push(sample);
                continue;
            }
            for index in entry.chunks_of(offset, end) {
                let (chunk_start, chunk_len) = entry.chunk_range(index);
                let (from, to) = (offset.max(chunk_start), end.min(chunk_start + chunk_len));
                if step.counts() && admit::counts(runs[want] > 0, from == chunk_start) {
                    // Every part read counts, hit or miss: a stored chunk's count is what
                    // an admission would weigh against.
                    self.filter.read(entry.chunk_key(index), to - from);
                }
                let (provenance, bytes) = self.provenance(entry, index, (from, to), reader, step);
                let missed = !matches!(provenance, Provenance::Stored | Provenance::IndexHeld);
                parts.push(Part {
                    want,
                    step,
                    entry,
                    index,
                    from,
                    to,
                    provenance,
                    missed,
                    bytes,
                    placed: None,
                    pending: None,
                });
            }
        }
        let span = tracing::Span::current();
        record_parts(&span, &parts);
        let started = std::time::Instant::now();
        let place = place && parts.iter().all(|p| matches!(p.provenance, Provenance::Stored));
        self.read_stored_parts(&mut parts, reader, place).await?;
        self.read_kept_samples(&mut parts).await?;
        let stored = started.elapsed();
        self.fetch_parts(&mut parts, reader).await?;
        // Answered: the plans that name these shards open their windows behind the reads.
        self.plans.shards.answered(wants.iter().map(|(e, ..)| (e.dataset.as_str(), e.shard.as_str())));
        telemetry::attribute(&span, "store_us", stored.as_micros() as i64);
        telemetry::attribute(&span, "fetch_us", (started.elapsed() - stored).as_micros() as i64);
        Ok(self.assemble(wants, (parts, &runs), reader, &steps))
    }

    /// Fetches the parts that are not at hand: those fetched as read, and those whose
    /// chunk is filled beside them, in one batch (one round trip upstream for the call's
    /// misses), then the fills; chunks being fetched joined; samples fetched ahead taken.
    async fn fetch_parts(&self, parts: &mut [Part<'_>], reader: &ReadFor) -> Result<()> {
        let as_read = |p: &&mut Part<'_>| {
            p.bytes.is_none() && matches!(p.provenance, Provenance::Direct | Provenance::Fill(_))
        };
        let asked: Vec<(&Arc<Entry>, u64, u64)> =
            parts.iter_mut().filter(as_read).map(|p| (p.entry, p.from, p.to - p.from)).collect();
        let mut started = self.fetch.start_direct(&asked, reader.fetch()).into_iter();
        for part in parts.iter_mut().filter(as_read) {
            let shared = started.next();
            if let (Provenance::Fill(fill), Some(bytes)) = (&mut part.provenance, &shared)
                && let Some(fill) = fill.take()
            {
                // The chunk's fill takes this part from this fetch.
                let bytes = bytes.clone();
                tokio::spawn(async move {
                    let _ = fill.send(bytes.await);
                });
            }
            part.pending = shared;
        }
        // (A part placed in the store's files for the same-node door is answered.)
        let fetched = parts.iter().filter(|p| !p.answered()).map(|part| {
            let chunk_start = part.index.start(part.entry.chunk_size);
            let range = (part.from - chunk_start) as usize..(part.to - chunk_start) as usize;
            let chunk = match &part.provenance {
                Provenance::Chunk(fetch) => Some((fetch.fetched.clone(), chunk_start)),
                Provenance::Piece(piece, start) | Provenance::Lent(piece, start) => {
                    Some((piece.clone(), *start))
                }
                _ => None,
            };
            let lent = matches!(part.provenance, Provenance::Lent(..));
            let (hedged, staged) = (
                matches!(part.provenance, Provenance::Hedged),
                matches!(part.provenance, Provenance::Staged),
            );
            let (pending, index_read) = (part.pending.clone(), part.step == Step::Index);
            let (entry, index, from, length) = (part.entry, part.index, part.from, part.to - part.from);
            async move {
                match (chunk, pending) {
                    // A part of a chunk is copied out rather than sliced: a slice would
                    // keep the whole chunk alive as long as the response, so a batch of
                    // small reads in many chunks would hold chunk size x ranges instead
                    // of what it returns.
                    (Some((chunk, start)), _) => {
                        let within = (from - start) as usize..(from - start + length) as usize;
                        match chunk.await {
                            Ok(bytes) => Ok::<_, Error>(bytes.part(within.start, within.end)),
                            // Another read that failed (or whose call ended): this part
                            // fetched as read, rather than fail a read that did not.
                            Err(_) if lent => self.fetch.direct(entry, from, length, reader.fetch()).await,
                            Err(e) => Err(e),
                        }
                    }
                    // A sample fetched ahead that failed is fetched again for its read.
                    (None, Some(pending)) if staged => match pending.await {
                        Ok(bytes) => Ok(bytes),
                        Err(_) => self.fetch.direct(entry, from, length, reader.fetch()).await,
                    },
                    (None, Some(pending)) => {
                        let bytes = pending.await?;
                        if index_read {
                            self.index_reads.put((entry.id, from, length), bytes.clone());
                        }
                        Ok(bytes)
                    }
                    _ if hedged => self.hedged_part(entry, index, (from, length), range, reader).await,
                    _ => self.fetch.direct(entry, from, length, reader.fetch()).await,
                }
            }
        });
        let mut fetched = futures::future::try_join_all(fetched).await?.into_iter();
        for part in parts.iter_mut().filter(|p| !p.answered()) {
            part.bytes = fetched.next();
        }
        Ok(())
    }

    /// Where the part `[from, to)` of chunk `index` of `entry` comes from for `reader`
    /// (and its bytes when they are at hand): the store; an index read kept in memory; a
    /// fetch running now; a fetch started to store the chunk, if the admission says it
    /// pays (`ReadAhead::stores`) and its `step` may store; else the part fetched as read
    /// (always for a plan's stragglers and for index reads).
    fn provenance(
        &self,
        entry: &Arc<Entry>,
        index: ChunkIndex,
        (from, to): (u64, u64),
        reader: &ReadFor,
        step: Step,
    ) -> (Provenance, Option<Checked>) {
        let (stored, unread) = entry.has_chunk_for_read(index);
        if stored {
            if unread {
                self.admission.speculation().used(entry.chunk_range(index).1);
            }
            return (Provenance::Stored, None);
        }
        if step == Step::Index {
            return match self.index_reads.get((entry.id, from, to - from)) {
                Some(bytes) => (Provenance::IndexHeld, Some(bytes)),
                None => (Provenance::Direct, None),
            };
        }
        if step == Step::Straggler {
            return (Provenance::Direct, None);
        }
        // A read a client sent the owner first (a hedge, a failover): the owner's fetch
        // is joined (`suppliers`).
        if self.chain.owner_was_asked(&entry.dataset, &entry.shard, &reader.avoid) {
            return (Provenance::Hedged, None);
        }
        if let Some(running) = self.fetch.running(entry, index) {
            return self.beside_running(running, entry, index, (from, to));
        }
        // A job followed sample by sample stores no chunk: its room is its window's and
        // its keeps' (`policy::keep`).
        if step.speculates() && self.read_ahead.stores(entry, index, &reader.principal) {
            // The whole chunk is being read alongside the shard's first stat (another reader's
            // cold open): its fetch takes those bytes, and this read waits for them, not
            // for a fetch of its own part.
            if self.chunk_alongside(entry, index)
                && let Some(fetch) = self.fetch.chunk(entry, index, reader.fetch())
            {
                return (Provenance::Chunk(fetch), None);
            }
            // The read is answered by its own bytes; the chunk is filled beside it. The fill
            // is registered now (readers of the chunk arriving meanwhile join it), its part
            // handed over once this call's batch fetches it (`fetch_parts`).
            // (Asked anew under the fetches' lock: a fetch of the chunk that ended since
            // left it stored, and one started since brings the part unless it takes it.)
            let (part, known) = part_for_fill(from, to);
            return match self.fetch.fill(entry, index, known, reader.fetch()) {
                Filled::Taken(_) => (Provenance::Fill(Some(part)), None),
                // (One registered since it was looked for above: as any running fetch, not
                // joined while it waits for room if the part's own bytes are on their way.
                // Joined whole, a job's first batch waited 1.3-2.6 s behind the gate's queue
                // in 1 of 8-40 readers at 200 Mbit/s, `cold-start-bench`.)
                Filled::Running(running) => self.beside_running(running, entry, index, (from, to)),
                Filled::Stored => self.provenance(entry, index, (from, to), reader, step),
            };
        }
        self.filter.fetched_as_read(entry.chunk_key(index), to - from);
        (Provenance::Direct, None)
    }

    /// Where the part `[from, to)` of chunk `index` comes from when a fetch of the chunk is
    /// running. Joined once it has asked upstream (its bytes come no later than a fetch of
    /// the part's own would), or when it takes up the whole chunk read alongside a first
    /// stat. While it waits for its room (a prefetch's queue, a fill behind the link gate),
    /// it is lent this read's part, fetched as read now, and asks only for the rest when it
    /// starts; one it holds already that covers the part (another reader's, or read
    /// alongside the shard's stat) answers it. A part only partly over one it holds: one
    /// read alongside the shard's stat answers it (not after the fetch's turn at the link
    /// gate); else the chunk does (rather than bring the part twice).
    fn beside_running(
        &self,
        running: crate::fetch::ChunkFetch,
        entry: &Arc<Entry>,
        index: ChunkIndex,
        (from, to): (u64, u64),
    ) -> (Provenance, Option<Checked>) {
        if running.is_started() || self.chunk_alongside(entry, index) {
            return joined(running, from, to);
        }
        let (part, known) = part_for_fill(from, to);
        match running.offer(known) {
            Offer::Held(start, held) => (Provenance::Lent(held, start), None),
            Offer::Taken => (Provenance::Fill(Some(part)), None),
            Offer::Refused
                if self.fetch.speculation(&entry.dataset, &entry.shard, from, to - from).is_some() =>
            {
                (Provenance::Direct, None)
            }
            Offer::Refused => joined(running, from, to),
        }
    }

    /// Whether chunk `index` of `entry` is being read whole alongside the shard's first stat.
    fn chunk_alongside(&self, entry: &Arc<Entry>, index: ChunkIndex) -> bool {
        let (start, length) = entry.chunk_range(index);
        self.fetch.speculation(&entry.dataset, &entry.shard, start, length).is_some()
    }

    /// The part `[from, from + length)` (`range` of chunk `index`) of a read a client sent
    /// the owner first: the owner's bytes when it serves; when it is down, the chunk as
    /// any miss of this spoke's (it may own the shard now); else fetched as read.
    async fn hedged_part(
        &self,
        entry: &Arc<Entry>,
        index: ChunkIndex,
        (from, length): (u64, u64),
        range: std::ops::Range<usize>,
        reader: &ReadFor,
    ) -> Result<Checked> {
        match self.fetch.join_owner(entry, from, length, reader.fetch()).await {
            Joined::Bytes(supplied) => {
                reader.relayed.set();
                return Ok(supplied.data);
            }
            Joined::Down if self.read_ahead.stores(entry, index, &reader.principal) => {
                if let Some(fetch) = self.fetch.chunk(entry, index, reader.fetch()) {
                    return Ok(fetch.fetched.await?.part(range.start, range.end));
                }
                if let Some(stored) = self.read_stored(entry, index, from, from + length).await? {
                    return Ok(stored);
                }
            }
            Joined::Down | Joined::NotThere => {}
        }
        self.fetch.direct(entry, from, length, reader.fetch()).await
    }

    /// Each range's parts joined, counted as hits or misses; starts speculation where its
    /// step may (not for a plan's stragglers, nor for index reads, nor for a job followed
    /// sample by sample, whose plan says what it reads again: kept here when it crossed
    /// the link).
    fn assemble(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        (parts, runs): (Vec<Part<'_>>, &[u32]),
        reader: &ReadFor,
        steps: &[Step],
    ) -> Vec<Vec<Piece>> {
        let row = &reader.row;
        // Parts were planned in the order of the ranges: each range takes its run.
        let mut parts = parts.into_iter().peekable();
        let mut out = Vec::with_capacity(wants.len());
        let mut speculated = std::collections::HashSet::new();
        for (want, &(entry, _, length)) in wants.iter().enumerate() {
            let (mut mine, mut missed, mut stored_miss, mut last) = (Vec::new(), false, false, None);
            while let Some(part) = parts.next_if(|p| p.want == want) {
                missed |= part.missed;
                stored_miss |= matches!(part.provenance, Provenance::Chunk(_) | Provenance::Fill(_));
                last = Some(part.index);
                mine.extend(part.placed.map(Piece::Pages).or(part.bytes.map(Piece::Bytes)));
            }
            // One call starts read-ahead or a whole-shard fetch for a bounded number of
            // shards: a batch of 1-byte reads over thousands of cold shards must not
            // start a background fetch of each.
            let share = steps[want].speculates()
                && (speculated.len() < SPECULATIVE_SHARDS_PER_CALL || speculated.contains(&entry.id));
            if let Some(last) = last.filter(|_| share) {
                speculated.insert(entry.id);
                self.read_ahead.after_read(
                    entry,
                    (last, runs[want]),
                    stored_miss,
                    (&reader.row, &reader.principal),
                );
            }
            let counters = self.metrics.dataset(&entry.dataset);
            let (requests, bytes) = if missed {
                (&counters.miss_requests, &counters.miss_bytes)
            } else {
                (&counters.hit_requests, &counters.hit_bytes)
            };
            requests.fetch_add(1, Relaxed);
            bytes.fetch_add(length, Relaxed);
            row.read(length, !missed);
            let planned = match steps[want] {
                Step::Sample { planned: true, next_use } => Some(next_use),
                _ => None,
            };
            if planned.is_some() {
                row.planned_reads.fetch_add(1, Relaxed);
            }
            // A range read whole (not placed for the same-node door): its parts joined once.
            if mine.iter().all(|piece| matches!(piece, Piece::Bytes(_))) {
                mine =
                    vec![Piece::Bytes(Checked::concat(mine.into_iter().filter_map(Piece::bytes).collect()))];
            }
            // A sample of a job followed sample by sample that crossed the link is kept if the
            // plan reads it again (`Keeper::keep`). (Not one read through the same-node door
            // whose stored chunk failed as it was read: its other parts are placed, not read.)
            if let (Some(next_use), true, [Piece::Bytes(read)]) = (planned, missed, &mine[..]) {
                self.keeper.keep(entry, wants[want].1, read.clone(), &reader.principal, next_use);
                // A copy the follower fetched ahead as this read fetched it is no one's now.
                drop(self.plans.staged.take(&(entry.id, wants[want].1, length)));
            }
            out.push(mine);
        }
        // While the cache has room what crossed beyond the reads is kept for later reads
        // (whole shards fetched for a reader that reads half of each): an investment, not
        // a waste. Once it evicts, bytes brought and not read are lost.
        if self.capacity.over_low() && row.warn_amplified(crate::store::catalog::now_ms()) {
            let snapshot = row.snapshot();
            tracing::warn!(
                principal = %reader.principal,
                job = reader.job.as_deref().unwrap_or("(untagged)"),
                read = snapshot.bytes,
                over_the_link = snapshot.link_bytes,
                amplification = format_args!("{:.2}", snapshot.amplification()),
                "this job's reads cost more over the long link than they read: its reads are small and scattered \
                 over a cache smaller than what they read. Send an access plan (StreamingShardDataset with \
                 plan=True), read in larger pieces, or give the spoke a --capacity that holds what the job reads"
            );
        }
        out
    }
}

/// The part `[from, to)` from a running fetch of its chunk: the fill's piece that holds it
/// (waited for alone, not the whole chunk), else the chunk.
fn joined(running: crate::fetch::ChunkFetch, from: u64, to: u64) -> (Provenance, Option<Checked>) {
    match running.piece_for(from, to) {
        Some((start, piece)) => (Provenance::Piece(piece, start), None),
        None => (Provenance::Chunk(running), None),
    }
}

/// `[from, to)` as a part a chunk's fetch takes from a reader's fetch as read: the end
/// the read sends its bytes into (`fetch_parts`), and the part the chunk's fetch awaits.
fn part_for_fill(from: u64, to: u64) -> (tokio::sync::oneshot::Sender<Result<Checked>>, KnownPart) {
    let (part, bytes) = tokio::sync::oneshot::channel();
    let bytes = async move {
        bytes.await.unwrap_or_else(|_| Err(Error::Internal("the read a fill waited for ended".into())))
    };
    (part, KnownPart { from, to, bytes: bytes.boxed().shared() })
}
