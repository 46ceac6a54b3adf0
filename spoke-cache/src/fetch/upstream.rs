//! The way upstream every fetch takes, below both the fetch owner (`mod.rs`) and the
//! reads alongside a first stat (`speculation.rs`): a chunk fetch's turn at the link gate
//! (`link_gate.rs`, which every hub answer feeds), room in the byte and request bounds,
//! the supplier asked, what it answered checked against what was asked (a supplier that
//! answers another length or another version is refused: nothing it sent is stored or
//! served), and the bytes counted by supplier, here and nowhere else.

use std::{
    sync::{Arc, atomic::Ordering::Relaxed},
    time::{Duration, Instant},
};
use tracing::Instrument as _;

use shardcache_proto::checksum::Checked;
use shardcache_reader::ReadError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};

use super::link_gate::{Admitted, LinkGate, Mark, Reading};
use crate::{
    Error, Result,
    fetch::suppliers::{Joined, Supplied, SuppliedBy, Supply, Want},
    observe::job_counters::JobRow,
    observe::metrics::Metrics,
    store::entry::Entry,
};

/// Chunk requests upstream in flight at once, whatever their size. The byte bound alone
/// let a cold read of many small chunks (16 MiB in 64 KiB chunks) send 256 requests at
/// once, and a hub sheds what is over its `--max-concurrency` (256 by default, for all
/// its spokes together) with RESOURCE_EXHAUSTED. 32 is what whole-shard fetches kept in
/// flight before reads started all their chunks at once (4 shards x 8); with the
/// default 4 MiB chunks the byte bound (16 chunks of the default 64 MiB) binds first.
pub const UPSTREAM_REQUESTS_IN_FLIGHT: usize = 32;

/// The suppliers, and the bounds and counters every fetch from them goes through.
#[derive(Debug)]
pub(super) struct Upstream {
    supply: Arc<dyn Supply>,
    /// Room for `--upstream-bytes-in-flight`, in KiB permits: a fetch waits for room
    /// before it asks upstream, and holds it until its chunk is on disk.
    budget: Arc<Semaphore>,
    /// As much room again for ranges fetched as read (they are served, never stored): a
    /// reader's own bytes never wait behind chunks being filled and stored beside it.
    reads: Semaphore,
    /// KiB permits each of the two holds: what one wait may take at most.
    permits: u32,
    /// Room for [`UPSTREAM_REQUESTS_IN_FLIGHT`] requests upstream.
    requests: Semaphore,
    /// Chunk fetches in flight over the link beside the reads, as its measured
    /// bandwidth-delay product allows (`link_gate.rs`); every answer is a sample of it.
    gate: Arc<LinkGate>,
    /// Calls to the suppliers running now, waiting for room or answered (`Status`'s
    /// `fetches_in_flight`).
    calls: Arc<std::sync::atomic::AtomicUsize>,
    metrics: Arc<Metrics>,
}

/// One call to the suppliers, counted in [`Upstream::calls`] until dropped.
struct Call(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Call {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Upstream {
    pub(super) fn new(
        supply: Arc<dyn Supply>,
        metrics: Arc<Metrics>,
        bytes_in_flight: u64,
        chunk_size: u64,
    ) -> Self {
        let permits = kib(bytes_in_flight.max(chunk_size));
        Self {
            supply,
            budget: Arc::new(Semaphore::new(permits as usize)),
            reads: Semaphore::new(permits as usize),
            permits,
            requests: Semaphore::new(UPSTREAM_REQUESTS_IN_FLIGHT),
            gate: Arc::new(LinkGate::new(bytes_in_flight, chunk_size)),
            calls: Arc::default(),
            metrics,
        }
    }

    pub(super) fn gate(&self) -> Arc<LinkGate> {
        self.gate.clone()
    }

    /// Calls to the suppliers running now.
    pub(super) fn calls(&self) -> usize {
        self.calls.load(Relaxed)
    }

    /// A call starting: counted until the returned guard is dropped.
    fn call(&self) -> Call {
        self.calls.fetch_add(1, Relaxed);
        Call(self.calls.clone())
    }

    /// Room for a chunk fetch of `length` bytes, waited for: its turn at the link gate
    /// (reads before it), then room in the byte bound.
    pub(super) async fn room(&self, length: u64) -> Result<Room> {
        let waiting = Instant::now();
        let link = self.gate.admit(length).await;
        let room = self.budget.clone().acquire_many_owned(kib(length).min(self.permits)).await;
        self.queued(waiting);
        let budget = room.map_err(|_| Error::Internal("upstream budget closed".into()))?;
        Ok(Room { _budget: budget, link: Some(link) })
    }

    /// Room for `length` bytes fetched as read, waited for (a batch larger than the whole
    /// bound waits for all of it); counted at the link gate, never held there.
    pub(super) async fn read_room(&self, length: u64) -> Result<ReadRoom<'_>> {
        let waiting = Instant::now();
        let room = self.reads.acquire_many(kib(length).min(self.permits)).await;
        self.queued(waiting);
        let room = room.map_err(|_| Error::Internal("upstream budget closed".into()))?;
        Ok(ReadRoom { _reads: room, _reading: self.gate.reading(length) })
    }

    /// Counts the time since `waiting` as queued for room upstream (the metric the
    /// "link saturated" alert reads, `shardcache_spoke_upstream_queue_seconds_total`);
    /// returns it.
    fn queued(&self, waiting: Instant) -> Duration {
        let queued = waiting.elapsed();
        self.metrics.upstream_queue_micros.fetch_add(queued.as_micros() as u64, Relaxed);
        queued
    }

    /// Room in the byte bound alone for a chunk fetch of `length` bytes that asks nothing
    /// over the link (it takes up a read alongside the stat): waited for if `wait`, else
    /// only if there is some now. (Held at the gate, it waited behind the very reads it
    /// takes up, and a group member hedged to gave up joining it.)
    pub(super) async fn room_off_link(&self, length: u64, wait: bool) -> Option<Room> {
        let permits = kib(length).min(self.permits);
        let budget = match wait {
            true => self.budget.clone().acquire_many_owned(permits).await.ok()?,
            false => self.budget.clone().try_acquire_many_owned(permits).ok()?,
        };
        Some(Room { _budget: budget, link: None })
    }

    /// Room for a chunk fetch of `length` bytes if there is some now: its turn at the gate
    /// and room in the byte bound.
    pub(super) fn room_now(&self, length: u64) -> Option<Room> {
        let link = self.gate.try_admit(length)?;
        let budget = self.budget.clone().try_acquire_many_owned(kib(length)).ok()?;
        Some(Room { _budget: budget, link: Some(link) })
    }

    /// Room for a read of `length` bytes alongside a first stat, if there is some in the
    /// byte bound now (a speculative read gives up rather than wait, so reads waiting for
    /// each other's room cannot deadlock); counted at the gate as a first batch's read.
    pub(super) fn read_room_now(&self, length: u64) -> Option<(OwnedSemaphorePermit, Reading)> {
        let budget = self.budget.clone().try_acquire_many_owned(kib(length)).ok()?;
        Some((budget, self.gate.opening(length)))
    }

    /// `wants` at whatever version the suppliers have (reads alongside a first stat), in
    /// as few calls as the suppliers allow, counted in `row`: each one's bytes and their
    /// version, or `None` on any failure.
    pub(super) async fn any_version(
        &self,
        wants: &[Want<'_>],
        row: &JobRow,
    ) -> Vec<Option<(Checked, String)>> {
        let span = fetch_span(wants.len(), wants.iter().map(|w| w.length).sum());
        let _call = self.call();
        async {
            let queued = Instant::now();
            let Ok(_request) = self.requests.acquire().await else { return vec![None; wants.len()] };
            span.record("queued_us", self.queued(queued).as_micros() as u64);
            let (started, mark) = (Instant::now(), self.gate.asking());
            let answers = self.supply.fetch_many(wants, &[]).await;
            if let Some(Ok(first)) = answers.first() {
                answered(&span, first, started);
            }
            wants
                .iter()
                .zip(answers)
                .map(|(want, answer)| {
                    let supplied = answer.ok()?;
                    self.received(want.dataset, &supplied, row, mark);
                    // Asked cut at the shard's end (`suppliers::hub_range`): never more
                    // than asked; whoever takes it up checks its length against the shard.
                    if supplied.data.data.len() as u64 > want.length {
                        return None;
                    }
                    self.count(want.dataset, &supplied, row, started.elapsed());
                    Some((supplied.data, supplied.version))
                })
                .collect()
        }
        .instrument(span.clone())
        .await
    }

    /// `[offset, offset + length)` of `entry` at its version, counted in `row`.
    pub(super) async fn supply(
        &self,
        entry: &Entry,
        offset: u64,
        length: u64,
        row: &JobRow,
        avoid: &[String],
    ) -> Result<Checked> {
        let span = fetch_span(1, length);
        let _call = self.call();
        async {
            let queued = Instant::now();
            // Held for the request only: storing the chunk needs no supplier.
            let _request = self
                .requests
                .acquire()
                .await
                .map_err(|_| Error::Internal("upstream requests closed".into()))?;
            span.record("queued_us", self.queued(queued).as_micros() as u64);
            let (started, mark) = (Instant::now(), self.gate.asking());
            let answer = self.supply.fetch(want(entry, offset, length), avoid).await;
            if let Ok(supplied) = &answer {
                answered(&span, supplied, started);
            }
            self.checked(entry, (offset, length), answer, row, (started.elapsed(), mark))
        }
        .instrument(span.clone())
        .await
    }

    /// `parts` (`(entry, offset, length)` each, at its entry's version) in as few calls as
    /// the suppliers allow (`Supply::fetch_many`), within one request's room, counted in
    /// `row`: each with its own answer, in order.
    pub(super) async fn supply_many(
        &self,
        parts: &[(&Entry, u64, u64)],
        row: &JobRow,
        avoid: &[String],
    ) -> Vec<Result<Checked>> {
        let span = fetch_span(parts.len(), parts.iter().map(|p| p.2).sum());
        let _call = self.call();
        let queued = Instant::now();
        let Ok(_request) = self.requests.acquire().instrument(span.clone()).await else {
            return parts.iter().map(|_| Err(Error::Internal("upstream requests closed".into()))).collect();
        };
        span.record("queued_us", self.queued(queued).as_micros() as u64);
        let (started, mark) = (Instant::now(), self.gate.asking());
        let wants: Vec<Want<'_>> =
            parts.iter().map(|&(entry, offset, length)| want(entry, offset, length)).collect();
        let answers = self.supply.fetch_many(&wants, avoid).instrument(span.clone()).await;
        if let Some(Ok(first)) = answers.first() {
            answered(&span, first, started);
        }
        let elapsed = started.elapsed();
        parts
            .iter()
            .zip(answers)
            .map(|(&(entry, offset, length), answer)| {
                self.checked(entry, (offset, length), answer, row, (elapsed, mark))
            })
            .collect()
    }

    /// A supplier's `answer` for `[offset, offset + length)` of `entry`, checked and
    /// counted in `row`: a newer version on the hub expires the entry.
    fn checked(
        &self,
        entry: &Entry,
        (offset, length): (u64, u64),
        answer: Result<Supplied>,
        row: &JobRow,
        (elapsed, mark): (Duration, Mark),
    ) -> Result<Checked> {
        match answer {
            Ok(supplied) => {
                self.received(&entry.dataset, &supplied, row, mark);
                check(entry, offset, length, &supplied)?;
                self.count(&entry.dataset, &supplied, row, elapsed);
                Ok(supplied.data)
            }
            Err(e) if e.code() == tonic::Code::Aborted => {
                // The hub has a newer version: check it at the next access.
                entry.expire();
                Err(Error::Read(ReadError::VersionChanged {
                    dataset: entry.dataset.clone(),
                    shard: entry.shard.clone(),
                    expected: entry.version.clone(),
                    found: "a newer version on the hub".into(),
                }))
            }
            Err(e) => Err(e),
        }
    }

    /// `[offset, offset + length)` of `entry` from the owner its reader's client asked
    /// first (`Chain::join_owner`); what it sent counted in `row`, after the same check
    /// as any supplier's answer.
    pub(super) async fn join_owner(
        &self,
        entry: &Entry,
        offset: u64,
        length: u64,
        row: &JobRow,
        avoid: &[String],
    ) -> Joined {
        let _call = self.call();
        let (started, mark) = (Instant::now(), self.gate.asking());
        match self.supply.join_owner(want(entry, offset, length), avoid).await {
            Joined::Bytes(supplied) => {
                self.received(&entry.dataset, &supplied, row, mark);
                match check(entry, offset, length, &supplied) {
                    Ok(()) => {
                        self.count(&entry.dataset, &supplied, row, started.elapsed());
                        Joined::Bytes(supplied)
                    }
                    Err(_) => Joined::NotThere,
                }
            }
            other => other,
        }
    }

    /// Counts what a hub's answer `supplied` took on the long link for `dataset`, as it
    /// arrives, whatever becomes of it (an answer refused for its length or version
    /// crossed the link too): with [`Upstream::count`], the one place where bytes are
    /// counted by supplier. A hub's answer to a request asked at `mark` is a sample of the
    /// link for the gate.
    fn received(&self, dataset: &str, supplied: &Supplied, row: &JobRow, mark: Mark) {
        if supplied.from == SuppliedBy::Hub {
            let (rate, bound) = self.gate.answered(mark, supplied.wire_len);
            self.metrics.link_rate.store(rate, Relaxed);
            self.metrics.link_bound.store(bound, Relaxed);
            self.metrics.dataset(dataset).upstream_wire_bytes.fetch_add(supplied.wire_len, Relaxed);
            row.link_bytes.fetch_add(supplied.wire_len, Relaxed);
        }
    }

    /// Counts what `supplied` brought for `dataset` once it passed its check (taking
    /// `elapsed`): the bytes fetched, by supplier (refused ones were fetched for no one).
    fn count(&self, dataset: &str, supplied: &Supplied, row: &JobRow, elapsed: Duration) {
        let length = supplied.data.data.len() as u64;
        self.metrics.fetch_latency.observe(elapsed);
        let counters = self.metrics.dataset(dataset);
        match supplied.from {
            SuppliedBy::Peer => {
                counters.peer_bytes.fetch_add(length, Relaxed);
                row.peer_bytes.fetch_add(length, Relaxed);
            }
            SuppliedBy::Hub => {
                self.metrics.upstream_requests.fetch_add(1, Relaxed);
                counters.upstream_bytes.fetch_add(length, Relaxed);
                row.hub_bytes.fetch_add(length, Relaxed);
            }
        }
    }
}

/// Whether `supplied` is what was asked of `entry`: its length and its version. A
/// supplier that answers otherwise broke its contract (the chain verifies each answer
/// against the request; this holds whatever supplies the owner).
fn check(entry: &Entry, offset: u64, length: u64, supplied: &Supplied) -> Result<()> {
    let got = supplied.data.data.len() as u64;
    if got != length || supplied.version != entry.version {
        return Err(Error::Internal(format!(
            "a supplier answered {got} bytes at version {:?} for {length} bytes at offset {offset} of {}/{} at version {:?}",
            supplied.version, entry.dataset, entry.shard, entry.version
        )));
    }
    Ok(())
}

/// The span of one call to the suppliers (when traces are exported): the parts and bytes
/// asked, the time queued for a request slot, who answered (`hub` or `group member`), the
/// call's time and the bytes it took on the link. The supplier's own span (a member's, the
/// hub's) is its child: the call carries this span's context.
fn fetch_span(parts: usize, bytes: u64) -> tracing::Span {
    shardcache_transport::telemetry::traced(|| {
        tracing::info_span!(
            "spoke.fetch",
            parts,
            bytes,
            queued_us = tracing::field::Empty,
            supplier = tracing::field::Empty,
            fetch_us = tracing::field::Empty,
            wire_bytes = tracing::field::Empty,
        )
    })
}

/// Records on `span` who answered a fetch started at `started`, and what it took.
fn answered(span: &tracing::Span, supplied: &Supplied, started: Instant) {
    let supplier = match supplied.from {
        SuppliedBy::Hub => "hub",
        SuppliedBy::Peer => "group member",
    };
    span.record("supplier", supplier);
    span.record("fetch_us", started.elapsed().as_micros() as u64);
    span.record("wire_bytes", supplied.wire_len);
}

/// A chunk fetch's room: its turn at the link gate until its answer has arrived
/// ([`Room::answered`]), and its room in the byte bound until it is dropped (the chunk
/// stored).
#[derive(Debug)]
pub(super) struct Room {
    _budget: OwnedSemaphorePermit,
    link: Option<Admitted>,
}

impl Room {
    /// The fetch's bytes have arrived: the link is free of them (storing them needs none).
    pub(super) fn answered(&mut self) {
        self.link = None;
    }
}

/// A read's room: in the reads' byte bound, and counted at the link gate.
#[derive(Debug)]
pub(super) struct ReadRoom<'a> {
    _reads: SemaphorePermit<'a>,
    _reading: Reading,
}

/// `[offset, offset + length)` of `entry`, at its version.
fn want(entry: &Entry, offset: u64, length: u64) -> Want<'_> {
    Want { dataset: &entry.dataset, shard: &entry.shard, offset, length, version: Some(&entry.version) }
}

/// `length` bytes in the budget's KiB permits.
fn kib(length: u64) -> u32 {
    u32::try_from(length.div_ceil(1024)).unwrap_or(u32::MAX)
}
