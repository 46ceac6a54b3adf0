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

use std::sync::{Arc, atomic::Ordering::Relaxed};

use shardcache_proto::checksum::Checked;

use crate::{
    Error, Result,
    admission::Admission,
    capacity::Capacity,
    entry::Entry,
    fetch::{Alongside, ChunkFetch, FetchFor, FetchOwner},
    index_reads::IndexReads,
    jobs::JobRow,
    metrics::Metrics,
    plan::Plans,
    policy::admit::{self, AdmissionFilter},
    read_ahead::ReadAhead,
    store::{PageFault, Store, blocking},
    suppliers::{Chain, Joined},
};

/// The read path, with the parts it uses.
#[derive(Debug)]
pub struct ReadPath {
    pub store: Arc<Store>,
    pub plans: Arc<Plans>,
    /// Every part read counts in it, hit or miss (`policy::admit`).
    pub filter: Arc<AdmissionFilter>,
    pub fetch: FetchOwner,
    pub admission: Arc<Admission>,
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
    pub async fn read_many(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        reader: &ReadFor,
    ) -> Result<Vec<Checked>> {
        // The jobs that planned these shards have reached them (before any admission
        // this read causes makes room by the plans). A straggler's miss (the reader's own
        // plan has moved past the shard) is fetched as read and not stored: its room is
        // the plan's, for what is read next.
        let mut stragglers = std::collections::HashSet::new();
        // A format's index reads are no step of a plan (the SDK sends them untagged; an
        // older one may not).
        if self.plans.any() && !reader.index_read {
            let mut seen = std::collections::HashSet::new();
            for (entry, ..) in wants.iter().filter(|(entry, ..)| seen.insert(entry.id)) {
                if self.plans.read(&entry.dataset, &entry.shard, &reader.principal, reader.job.as_deref()) {
                    stragglers.insert(entry.id);
                }
            }
        }
        let mut parts = Vec::new();
        // Per range, the reads in a row of its shard that began where the one before
        // ended (0: not sequential): what read-ahead follows, and what the filter counts.
        let mut runs = vec![0; wants.len()];
        for (want, &(entry, offset, length)) in wants.iter().enumerate() {
            if length == 0 {
                continue;
            }
            let end = offset + length;
            if !reader.index_read {
                runs[want] = entry.read_from(offset, end);
            }
            for index in offset / entry.chunk_size..=(end - 1) / entry.chunk_size {
                let (chunk_start, chunk_len) = entry.chunk_range(index);
                let (from, to) = (offset.max(chunk_start), end.min(chunk_start + chunk_len));
                if !reader.index_read && admit::counts(runs[want] > 0, from == chunk_start) {
                    // Every part read counts, hit or miss: a stored chunk's count is what
                    // an admission would weigh against.
                    self.filter.read(entry.chunk_key(index), to - from);
                }
                let (provenance, bytes) = self.provenance(entry, index, (from, to), reader, &stragglers);
                let missed =
                    matches!(provenance, Provenance::Chunk(_) | Provenance::Direct | Provenance::Hedged);
                parts.push(Part { want, entry, index, from, to, provenance, missed, bytes });
            }
        }
        self.read_stored_parts(&mut parts, reader).await?;
        let fetched = parts.iter().filter(|p| p.bytes.is_none()).map(|part| {
            let chunk_start = part.index * part.entry.chunk_size;
            let range = (part.from - chunk_start) as usize..(part.to - chunk_start) as usize;
            let chunk = match &part.provenance {
                Provenance::Chunk(fetch) => Some(fetch.fetched.clone()),
                Provenance::Stored | Provenance::Direct | Provenance::Kept | Provenance::Hedged => None,
            };
            let hedged = matches!(part.provenance, Provenance::Hedged);
            let (entry, index, from, length) = (part.entry, part.index, part.from, part.to - part.from);
            async move {
                match chunk {
                    // A part of a chunk is copied out rather than sliced: a slice would
                    // keep the whole chunk alive as long as the response, so a batch of
                    // small reads in many chunks would hold chunk size x ranges instead
                    // of what it returns.
                    Some(chunk) => Ok::<_, Error>(chunk.await?.part(range.start, range.end)),
                    None if hedged => self.hedged_part(entry, index, (from, length), range, reader).await,
                    None => {
                        let bytes = self.fetch.direct(entry, from, length, reader.fetch()).await?;
                        if reader.index_read {
                            self.index_reads.put((entry.id, from, length), bytes.clone());
                        }
                        Ok(bytes)
                    }
                }
            }
        });
        let mut fetched = futures::future::try_join_all(fetched).await?.into_iter();
        for part in parts.iter_mut().filter(|p| p.bytes.is_none()) {
            part.bytes = fetched.next();
        }
        Ok(self.assemble(wants, (parts, &runs), reader, &stragglers))
    }

    /// Where the part `[from, to)` of chunk `index` of `entry` comes from for `reader`
    /// (and its bytes when they are at hand): the store; an index read kept in memory; a
    /// fetch running now; a fetch started to store the chunk, if the admission says it
    /// pays (`ReadAhead::stores`); else the part fetched as read (always for a plan's
    /// stragglers and for index reads).
    fn provenance(
        &self,
        entry: &Arc<Entry>,
        index: u64,
        (from, to): (u64, u64),
        reader: &ReadFor,
        stragglers: &std::collections::HashSet<u64>,
    ) -> (Provenance, Option<Checked>) {
        let (stored, unread) = entry.has_chunk_for_read(index);
        if stored {
            if unread {
                self.admission.speculation().used(entry.chunk_range(index).1);
            }
            return (Provenance::Stored, None);
        }
        if reader.index_read {
            return match self.index_reads.get((entry.id, from, to - from)) {
                Some(bytes) => (Provenance::Kept, Some(bytes)),
                None => (Provenance::Direct, None),
            };
        }
        if stragglers.contains(&entry.id) {
            return (Provenance::Direct, None);
        }
        // A read a client sent the owner first (a hedge, a failover): the owner's fetch
        // is joined (`suppliers`).
        if self.chain.owner_was_asked(&entry.dataset, &entry.shard, &reader.avoid) {
            return (Provenance::Hedged, None);
        }
        if let Some(running) = self.fetch.running(entry, index) {
            return (Provenance::Chunk(running), None);
        }
        if self.read_ahead.stores(entry, index, &reader.principal) {
            // `None`: stored since it was looked at.
            return (
                self.fetch.chunk(entry, index, reader.fetch()).map_or(Provenance::Stored, Provenance::Chunk),
                None,
            );
        }
        self.filter.fetched_as_read(entry.chunk_key(index), to - from);
        (Provenance::Direct, None)
    }

    /// The part `[from, from + length)` (`range` of chunk `index`) of a read a client sent
    /// the owner first: the owner's bytes when it serves; when it is down, the chunk as
    /// any miss of this spoke's (it may own the shard now); else fetched as read.
    async fn hedged_part(
        &self,
        entry: &Arc<Entry>,
        index: u64,
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

    /// Reads the parts that are stored, in one trip to the blocking pool; a part whose
    /// stored copy fails its check is read again (refetched).
    async fn read_stored_parts(&self, parts: &mut [Part<'_>], reader: &ReadFor) -> Result<()> {
        let is_stored = |p: &&mut Part<'_>| matches!(p.provenance, Provenance::Stored);
        let stored: Vec<(u64, u64, u64)> =
            parts.iter_mut().filter(is_stored).map(|p| (p.entry.id, p.from, p.to - p.from)).collect();
        if stored.is_empty() {
            return Ok(());
        }
        let store = self.store.clone();
        let read: Vec<Result<Checked, PageFault>> =
            blocking(move || stored.into_iter().map(|(id, from, len)| store.read(id, from, len)).collect())
                .await?;
        for (part, result) in parts.iter_mut().filter(is_stored).zip(read) {
            match result {
                Ok(bytes) => part.bytes = Some(bytes),
                Err(fault) => {
                    self.stored_fault(part.entry, part.index, fault).await;
                    part.missed = true;
                    part.bytes = Some(self.reread(part.entry, part.index, part.from, part.to, reader).await?);
                }
            }
        }
        Ok(())
    }

    /// Bytes `[from, to)` of chunk `index` of `entry` after its stored copy failed: from
    /// its refetch, or from the store when another reader's fetch stored it meanwhile.
    async fn reread(
        &self,
        entry: &Arc<Entry>,
        index: u64,
        from: u64,
        to: u64,
        reader: &ReadFor,
    ) -> Result<Checked> {
        for _ in 0..FAULT_RETRIES {
            match self.fetch.chunk(entry, index, reader.fetch()) {
                Some(fetch) => {
                    let start = (from - index * entry.chunk_size) as usize;
                    return Ok(fetch.fetched.await?.part(start, start + (to - from) as usize));
                }
                None => {
                    if let Some(bytes) = self.read_stored(entry, index, from, to).await? {
                        return Ok(bytes);
                    }
                }
            }
        }
        Err(Error::Internal(format!(
            "chunk {index} of {}/{} kept failing its check after {FAULT_RETRIES} refetches",
            entry.dataset, entry.shard
        )))
    }

    /// Each range's parts joined, counted as hits or misses; starts speculation (not for a
    /// plan's stragglers, nor for index reads).
    fn assemble(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        (parts, runs): (Vec<Part<'_>>, &[u32]),
        reader: &ReadFor,
        stragglers: &std::collections::HashSet<u64>,
    ) -> Vec<Checked> {
        let row = &reader.row;
        // Parts were planned in the order of the ranges: each range takes its run.
        let mut parts = parts.into_iter().peekable();
        let mut out = Vec::with_capacity(wants.len());
        let mut speculated = std::collections::HashSet::new();
        for (want, &(entry, _, length)) in wants.iter().enumerate() {
            let (mut mine, mut missed, mut stored_miss, mut last) = (Vec::new(), false, false, None);
            while let Some(part) = parts.next_if(|p| p.want == want) {
                missed |= part.missed;
                stored_miss |= matches!(part.provenance, Provenance::Chunk(_));
                last = Some(part.index);
                mine.extend(part.bytes);
            }
            // One call starts read-ahead or a whole-shard fetch for a bounded number of
            // shards: a batch of 1-byte reads over thousands of cold shards must not
            // start a background fetch of each.
            let share = !reader.index_read
                && (speculated.len() < SPECULATIVE_SHARDS_PER_CALL || speculated.contains(&entry.id));
            if let Some(last) = last.filter(|_| share && !stragglers.contains(&entry.id)) {
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
            out.push(Checked::concat(mine));
        }
        // While the cache has room what crossed beyond the reads is kept for later reads
        // (whole shards fetched for a reader that reads half of each): an investment, not
        // a waste. Once it evicts, bytes brought and not read are lost.
        if self.capacity.over_low() && row.warn_amplified(crate::catalog::now_ms()) {
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

    /// `[offset, offset + length)` of `entry` (inside the shard) from the store only:
    /// `None` when any chunk of it is not stored (or fails its check), never a fetch.
    pub async fn read_cached(&self, entry: &Arc<Entry>, offset: u64, length: u64) -> Result<Option<Checked>> {
        if length == 0 {
            return Ok(Some(Checked::default()));
        }
        let end = offset + length;
        let mut parts = Vec::new();
        for index in offset / entry.chunk_size..=(end - 1) / entry.chunk_size {
            let (chunk_start, chunk_len) = entry.chunk_range(index);
            if !entry.has_chunk(index) {
                return Ok(None);
            }
            let (from, to) = (offset.max(chunk_start), end.min(chunk_start + chunk_len));
            match self.read_stored(entry, index, from, to).await? {
                Some(bytes) => parts.push(bytes),
                None => return Ok(None),
            }
        }
        Ok(Some(Checked::concat(parts)))
    }

    /// Stored bytes `[from, to)` of chunk `index`, or `None` when they must be fetched
    /// (a missing or corrupt page: the chunk is then marked absent).
    async fn read_stored(
        &self,
        entry: &Arc<Entry>,
        index: u64,
        from: u64,
        to: u64,
    ) -> Result<Option<Checked>> {
        let (store, id) = (self.store.clone(), entry.id);
        match blocking(move || store.read(id, from, to - from)).await? {
            Ok(bytes) => Ok(Some(bytes)),
            Err(fault) => {
                self.stored_fault(entry, index, fault).await;
                Ok(None)
            }
        }
    }

    /// A stored chunk that cannot be served: counted and logged, then forgotten so that
    /// it is fetched again.
    async fn stored_fault(&self, entry: &Arc<Entry>, index: u64, fault: PageFault) {
        match fault {
            PageFault::Corrupt { page } => {
                self.metrics.checksum_failures.fetch_add(1, Relaxed);
                tracing::error!(dataset = %entry.dataset, shard = %entry.shard, page, "stored page failed its checksum; refetching");
            }
            PageFault::Unreadable { page, error } => {
                self.metrics.store_read_errors.fetch_add(1, Relaxed);
                tracing::error!(dataset = %entry.dataset, shard = %entry.shard, page, %error, "the disk could not read a stored page; refetching (check the cache disk)");
            }
            PageFault::Missing { .. } => {
                tracing::warn!(dataset = %entry.dataset, shard = %entry.shard, ?fault, "stored chunk incomplete; refetching");
            }
        }
        self.admission.forget_chunk(entry, index).await;
    }
}

/// Where a part's bytes come from (its provenance: "source" is the read service's trait).
enum Provenance {
    Stored,
    /// The chunk's fetch (it is stored once fetched).
    Chunk(ChunkFetch),
    /// Fetched as read, not stored (not admitted, a plan's straggler, an index read).
    Direct,
    /// Asked of the owner the reader's client asked first (a hedge, a failover), else as
    /// any miss (`ReadPath::hedged_part`).
    Hedged,
    /// An index read's bytes kept in memory.
    Kept,
}

/// One chunk's share of one range of a `read_many` call.
struct Part<'a> {
    /// Which range of the call.
    want: usize,
    entry: &'a Arc<Entry>,
    index: u64,
    /// Shard offsets `[from, to)` of the part.
    from: u64,
    to: u64,
    /// Where its bytes come from.
    provenance: Provenance,
    /// It did not come from the store (a miss).
    missed: bool,
    bytes: Option<Checked>,
}
