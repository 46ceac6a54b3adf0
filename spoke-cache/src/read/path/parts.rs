//! What the read path knows of each part of a read call: where its bytes come from
//! ([`Provenance`]), the part itself ([`Part`]), and what a trace says of them.

use std::sync::Arc;

use shardcache_proto::checksum::Checked;
use shardcache_transport::telemetry;

use crate::{
    Result,
    fetch::{ChunkFetch, SharedFetch},
    plans::Step,
    store::entry::{ChunkIndex, Entry},
    store::locate::PageSpan,
};

/// Where a part's bytes come from (its provenance: "source" is the read service's trait).
pub(super) enum Provenance {
    Stored,
    /// The chunk's fetch (it is stored once fetched).
    Chunk(ChunkFetch),
    /// Fetched as read, and the rest of its chunk fetched beside it, the whole stored (a
    /// miss the admission stores: `FetchOwner::fill`); the fill's part is sent it here.
    Fill(Option<tokio::sync::oneshot::Sender<Result<Checked>>>),
    /// Fetched as read, not stored (not admitted, a plan's straggler, an index read).
    Direct,
    /// A piece of a chunk being filled (`ChunkFetch::piece_for`), and where it starts.
    Piece(SharedFetch, u64),
    /// A part lent to a chunk fetch still waiting for room (`ChunkFetch::offer`:
    /// another reader's fetch as read, or a read alongside the shard's stat), and where it
    /// starts; fetched as read if that fetch fails.
    Lent(SharedFetch, u64),
    /// A whole range its job's plan fetched ahead (`samples/`).
    Staged,
    /// A whole range kept for a later epoch (`store/kept/`).
    KeptSample,
    /// Asked of the owner the reader's client asked first (a hedge, a failover), else as
    /// any miss (`ReadPath::hedged_part`).
    Hedged,
    /// An index read's bytes kept in memory.
    IndexHeld,
}

impl Part<'_> {
    /// Whether its bytes are at hand: read, or placed in the store's files.
    pub(super) fn answered(&self) -> bool {
        self.bytes.is_some() || self.placed.is_some()
    }
}

/// Records on `span` (the request's: a read adds no span of its own, so that a warm read
/// costs one exported span, observe-cost-bench) what was decided for each of `parts`
/// when traces are exported: how many were hits and misses, what the admission decided
/// for each miss (`admission`: stored as whole chunks, filled beside the read, fetched as
/// read and not stored, and so on) and the bytes; the caller adds the time spent reading
/// the store and fetching. The fetches a read starts are the request's children.
pub(super) fn record_parts(span: &tracing::Span, parts: &[Part<'_>]) {
    if !telemetry::exporting() || span.is_disabled() {
        return;
    }
    let mut kinds = std::collections::BTreeMap::<&str, u32>::new();
    for part in parts {
        *kinds.entry(part.provenance.decision()).or_default() += 1;
    }
    let admission = kinds.iter().map(|(kind, n)| format!("{kind} {n}")).collect::<Vec<_>>().join(", ");
    telemetry::attribute(span, "hits", parts.iter().filter(|p| !p.missed).count() as i64);
    telemetry::attribute(span, "misses", parts.iter().filter(|p| p.missed).count() as i64);
    telemetry::attribute(span, "admission", admission);
}

impl Provenance {
    /// What was decided for a part, as a trace says it.
    pub(super) fn decision(&self) -> &'static str {
        match self {
            Self::Stored => "hit",
            Self::IndexHeld => "hit (index kept in memory)",
            Self::Chunk(_) => "miss, chunk fetched and stored",
            Self::Fill(_) => "miss, read fetched and its chunk filled beside it",
            Self::Direct => "miss, fetched as read, not stored",
            Self::Piece(..) => "miss, joined a chunk being filled",
            Self::Lent(..) => "miss, joined another read of a chunk waiting for room",
            Self::Staged => "fetched ahead by the plan",
            Self::KeptSample => "kept for this epoch",
            Self::Hedged => "hedged: asked of the owner",
        }
    }
}

/// One chunk's share of one range of a `read_many` call.
pub(super) struct Part<'a> {
    /// Which range of the call, and what that range is to the plans.
    pub(super) want: usize,
    pub(super) step: Step,
    pub(super) entry: &'a Arc<Entry>,
    pub(super) index: ChunkIndex,
    /// Shard offsets `[from, to)` of the part.
    pub(super) from: u64,
    pub(super) to: u64,
    /// Where its bytes come from.
    pub(super) provenance: Provenance,
    /// It did not come from the store (a miss).
    pub(super) missed: bool,
    pub(super) bytes: Option<Checked>,
    /// Where it lies in the store's files, for the same-node door (`ReadPath::locate_many`):
    /// then it has no `bytes`.
    pub(super) placed: Option<Vec<PageSpan>>,
    /// Its fetch as read, once started.
    pub(super) pending: Option<SharedFetch>,
}
