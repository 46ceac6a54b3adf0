//! Filling a chunk beside a read: a miss the admission stores is answered by its own
//! bytes (fetched as read, `as_read.rs`), and the rest of its chunk is fetched around that
//! part, in pieces, and stored with it (`FetchOwner::fill`); a chunk fetch still waiting
//! for room takes a reader's part lent to it instead of asking for it (`ChunkFetch::lend`).
//! The link carries the chunk once; no reader waits for more than the piece that holds
//! its bytes.

use futures::FutureExt;
use shardcache_proto::checksum::Checked;

use super::{ChunkFetch, FILL_PIECE, Inner, KnownPart, Owned, Pieces, SharedFetch};
use crate::{Error, Result, entry::Entry};

impl ChunkFetch {
    /// The piece of a fill that holds `[from, to)` of the shard, with where it starts: what
    /// a reader of that range waits for, rather than the whole chunk.
    pub fn piece_for(&self, from: u64, to: u64) -> Option<(u64, SharedFetch)> {
        let pieces = self.pieces.get()?;
        let (start, _, bytes) = pieces.iter().find(|&&(start, end, _)| start <= from && to <= end)?;
        Some((*start, bytes.clone()))
    }

    /// Lends it `part`, which a reader fetches as read, while it waits for room: when it
    /// starts it asks only for the rest of the chunk (the reader is answered by its own
    /// fetch, the link carries the chunk once). Whether it took the part (not once started,
    /// nor when another reader's part is there already).
    pub fn lend(&self, part: KnownPart) -> bool {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_started() || known.is_some() {
            return false;
        }
        *known = Some(part);
        true
    }
}

impl Inner {
    /// The chunk `[offset, offset + length)` of `entry` from `part` (a reader's fetch of
    /// it as read) and the rest fetched around it in pieces of at most [`FILL_PIECE`], all
    /// at once, each published in `pieces` as it is asked for (a reader of another part
    /// waits for its piece only): each verified on arrival, their checksums combined into
    /// the chunk's, which the store checks its pages against.
    pub(super) async fn fill(
        &self,
        entry: &Entry,
        (offset, length): (u64, u64),
        (part, pieces): (KnownPart, &Pieces),
        fetch: &Owned,
    ) -> Result<Checked> {
        let end = offset + length;
        let mut cut = Vec::new();
        for (from, to) in [(offset, part.from), (part.to, end)] {
            let mut at = from;
            while at < to {
                cut.push((at, (at + FILL_PIECE).min(to)));
                at = (at + FILL_PIECE).min(to);
            }
        }
        let (senders, published): (Vec<_>, Vec<_>) = cut
            .iter()
            .map(|&(from, to)| {
                let (tx, rx) = tokio::sync::oneshot::channel::<Result<Checked>>();
                let bytes = async move {
                    rx.await.unwrap_or_else(|_| Err(Error::Internal("a fill ended before its piece".into())))
                };
                (tx, (from, to, bytes.boxed().shared()))
            })
            .unzip();
        let _ = pieces.set(published);
        let asked = cut.iter().zip(senders).map(|(&(from, to), tx)| async move {
            let bytes = self.upstream.supply(entry, from, to - from, &fetch.row, &fetch.avoid).await;
            let _ = tx.send(bytes.clone());
            bytes
        });
        let (rest, part_bytes) = futures::future::join(futures::future::join_all(asked), part.bytes).await;
        // The reader's fetch failed, or its call ended before it started (readers who joined
        // this fill wait for it too): the part is fetched here.
        let part_bytes = match part_bytes {
            Ok(bytes) => bytes,
            Err(_) => {
                self.upstream.supply(entry, part.from, part.to - part.from, &fetch.row, &fetch.avoid).await?
            }
        };
        let mut pieces: Vec<(u64, Checked)> = Vec::with_capacity(rest.len() + 1);
        for (&(from, _), bytes) in cut.iter().zip(rest) {
            pieces.push((from, bytes?));
        }
        pieces.push((part.from, part_bytes));
        pieces.sort_by_key(|(from, _)| *from);
        let chunk = Checked::concat(pieces.into_iter().map(|(_, bytes)| bytes).collect());
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
