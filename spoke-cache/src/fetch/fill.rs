//! Filling a chunk beside reads: a miss the admission stores is answered by its own
//! bytes (fetched as read, `as_read.rs`), and the rest of its chunk is fetched around that
//! part, once it has arrived, and stored with it (`FetchOwner::fill`); a chunk fetch
//! still waiting for room takes the parts other readers lend it instead of asking for
//! them (`ChunkFetch::lend`), so every reader of a job's first batch is answered by its
//! own bytes. The link carries the chunk once; no reader waits for more than the piece
//! that holds its bytes.

use futures::FutureExt;
use shardcache_proto::checksum::Checked;

use super::{ChunkFetch, Inner, KnownPart, Offer, Owned, Pieces, SharedFetch};
use crate::{Error, Result, store::entry::Entry};

/// Readers' parts one chunk fetch takes at most while it waits (the 8 ranks of a job's
/// first batch, each with a few samples in the chunk, fit): the gaps between them are
/// asked for in one request however many there are, and a chunk read by more readers
/// than this is mostly theirs already; a reader past them waits for the chunk.
pub const PARTS_PER_CHUNK: usize = 64;

impl ChunkFetch {
    /// The piece of a fill (or its reader's part) that holds `[from, to)` of the shard,
    /// with where it starts: what a reader of that range, or a member joining the fetch,
    /// waits for, rather than the whole chunk.
    pub fn piece_for(&self, from: u64, to: u64) -> Option<(u64, SharedFetch)> {
        let pieces = self.pieces.get()?;
        let (start, _, bytes) = pieces.iter().find(|&&(start, end, _)| start <= from && to <= end)?;
        Some((*start, bytes.clone()))
    }

    /// Offers it `part`, which a reader fetches as read, while it waits for room, in one
    /// look under the parts' lock (the fetch takes them, and starts, under it):
    /// - a part lent to it already (another reader's, or one read alongside the shard's
    ///   stat) that holds all of `part`'s range answers it ([`Offer::Held`]): its reader
    ///   waits for those bytes, not for the fetch's turn at the link gate and then the
    ///   whole chunk;
    /// - else it takes `part` ([`Offer::Taken`]) and, when it starts, asks only for the
    ///   rest of the chunk (the reader is answered by its own fetch, the link carries the
    ///   chunk once);
    /// - not once started, nor a part over one lent already (that reader's bytes answer
    ///   this one when they arrive: it joins), nor past [`PARTS_PER_CHUNK`]
    ///   ([`Offer::Refused`]).
    pub fn offer(&self, part: KnownPart) -> Offer {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_started() {
            return Offer::Refused;
        }
        if let Some(held) = known.iter().find(|k| k.from <= part.from && part.to <= k.to) {
            return Offer::Held(held.from, held.bytes.clone());
        }
        let overlaps = known.iter().any(|k| k.from < part.to && part.from < k.to);
        if overlaps || known.len() >= PARTS_PER_CHUNK {
            return Offer::Refused;
        }
        known.push(part);
        Offer::Taken
    }

    /// [`ChunkFetch::offer`], whether it took `part`.
    pub fn lend(&self, part: KnownPart) -> bool {
        matches!(self.offer(part), Offer::Taken)
    }
}

impl Inner {
    /// The chunk `[offset, offset + length)` of `entry` from `parts` (readers' fetches
    /// of it as read, none overlapping) and the gaps around them, asked for in one
    /// request; each piece published in `pieces` as it is asked for (a reader of a range
    /// within one waits for that piece only), each verified on arrival, their checksums
    /// combined into the chunk's, which the store checks its pages against.
    pub(super) async fn fill(
        &self,
        entry: &Entry,
        (offset, length): (u64, u64),
        (mut parts, pieces): (Vec<KnownPart>, &Pieces),
        fetch: &Owned,
    ) -> Result<Checked> {
        parts.sort_by_key(|part| part.from);
        let end = offset + length;
        // The gaps before, between and after the parts: one request for all of them. (Pieces
        // of 1 MiB, one request each, made a reader of another part wait for less, but four
        // times the requests per chunk within the same `UPSTREAM_REQUESTS_IN_FLIGHT`: a
        // group's owner then finished its chunks so much later that members hedged to
        // judged it hung and fetched them again, 1.35-2.10x the dataset in `group-bench
        // --gray` where main brought 1.00.)
        let gaps = gaps((offset, end), parts.iter().map(|p| (p.from, p.to)));
        // The readers' parts are published too (sent once in, from the reader's fetch or
        // from this fill's own when that one failed): a reader of a range within one, or a
        // member hedged to that joins this fetch (`running_range`), waits for it alone, as
        // long as the first reader did; waiting for the whole chunk instead outlasts a
        // hedged member's wait for the owner, and the member then fetches the chunk itself.
        let ranges: Vec<(u64, u64)> =
            gaps.iter().copied().chain(parts.iter().map(|p| (p.from, p.to))).collect();
        let (senders, published): (Vec<_>, Vec<_>) = ranges
            .iter()
            .map(|&(from, to)| {
                let (tx, rx) = tokio::sync::oneshot::channel::<Result<Checked>>();
                let bytes = async move {
                    rx.await.unwrap_or_else(|_| Err(Error::Internal("a fill ended before its piece".into())))
                };
                (tx, (from, to, bytes.boxed().shared()))
            })
            .collect();
        let _ = pieces.set(published);
        let mut senders = senders.into_iter();
        let asked = async {
            if gaps.is_empty() {
                return Vec::new();
            }
            let wants: Vec<(&Entry, u64, u64)> =
                gaps.iter().map(|&(from, to)| (entry, from, to - from)).collect();
            self.upstream.supply_many(&wants, &fetch.row, &fetch.avoid).await
        };
        let lent = futures::future::join_all(parts.iter().map(|part| part.bytes.clone()));
        let (gap_bytes, part_bytes) = futures::future::join(asked, lent).await;
        let mut assembled: Vec<(u64, Checked)> = Vec::with_capacity(ranges.len());
        let mut failed = None;
        for (&(from, _), bytes) in gaps.iter().zip(gap_bytes) {
            if let Some(tx) = senders.next() {
                let _ = tx.send(bytes.clone());
            }
            match bytes {
                Ok(bytes) => assembled.push((from, bytes)),
                Err(e) => failed = Some(e),
            }
        }
        // The parts whose reader's fetch failed, or whose call ended before it started
        // (readers who joined this fill wait for them too), are fetched here, all in one
        // call. (A job with 256 batches in flight read 240 parts of one chunk alongside its
        // stat, and those reads came back empty; fetched one by one, they took 240 round
        // trips while the fill held its room at the link gate: `seed-demo --read-ahead 16`
        // stalled 37-57 s, issue 58.)
        let refetch: Vec<(&Entry, u64, u64)> = parts
            .iter()
            .zip(&part_bytes)
            .filter(|(_, bytes)| bytes.is_err())
            .map(|(part, _)| (entry, part.from, part.to - part.from))
            .collect();
        let mut refetched = match refetch.is_empty() {
            true => Vec::new(),
            false => self.upstream.supply_many(&refetch, &fetch.row, &fetch.avoid).await,
        }
        .into_iter();
        for (part, bytes) in parts.iter().zip(part_bytes) {
            let bytes = match bytes {
                Ok(bytes) => Ok(bytes),
                Err(_) => refetched
                    .next()
                    .unwrap_or_else(|| Err(Error::Internal("a refetched part went unanswered".into()))),
            };
            if let Some(tx) = senders.next() {
                let _ = tx.send(bytes.clone());
            }
            match bytes {
                Ok(bytes) => assembled.push((part.from, bytes)),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        assembled.sort_by_key(|(from, _)| *from);
        let chunk = Checked::concat(assembled.into_iter().map(|(_, bytes)| bytes).collect());
        if chunk.data.len() as u64 != length {
            return Err(Error::Internal(format!(
                "a fill of {}/{} at {offset} assembled {} bytes of {length}",
                entry.dataset,
                entry.shard,
                chunk.data.len()
            )));
        }
        Ok(chunk)
    }
}

/// The ranges of `[offset, end)` that none of `held` (`(from, to)` each, sorted by where
/// they start) covers: what a fill, or a read as read beside the reads alongside a stat,
/// still asks for.
pub(super) fn gaps((offset, end): (u64, u64), held: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut gaps = Vec::new();
    let mut at = offset;
    for (from, to) in held {
        if at < from {
            gaps.push((at, from));
        }
        at = at.max(to);
    }
    if at < end {
        gaps.push((at, end));
    }
    gaps
}
