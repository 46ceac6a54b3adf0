//! Filling a chunk beside a read: a miss the admission stores is answered by its own
//! bytes (fetched as read, `as_read.rs`), and the rest of its chunk is fetched around that
//! part (before it and after it) and stored with it (`FetchOwner::fill`); a chunk fetch
//! still waiting for room takes a reader's part lent to it instead of asking for it
//! (`ChunkFetch::lend`). The link carries the chunk once; no reader waits for more than
//! the piece that holds its bytes.

use futures::FutureExt;
use shardcache_proto::checksum::Checked;

use super::{ChunkFetch, Inner, KnownPart, Owned, Pieces, SharedFetch};
use crate::{Error, Result, store::entry::Entry};

impl ChunkFetch {
    /// The piece of a fill (or its reader's part) that holds `[from, to)` of the shard,
    /// with where it starts: what a reader of that range, or a member joining the fetch,
    /// waits for, rather than the whole chunk.
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
    /// it as read) and the rest fetched around it, both at once, each published in
    /// `pieces` as it is asked for (a reader of another part waits for its piece only):
    /// each verified on arrival, their checksums combined into
    /// the chunk's, which the store checks its pages against.
    pub(super) async fn fill(
        &self,
        entry: &Entry,
        (offset, length): (u64, u64),
        (part, pieces): (KnownPart, &Pieces),
        fetch: &Owned,
    ) -> Result<Checked> {
        // The rest before the part and after it, one request each. (Pieces of 1 MiB made a
        // reader of another part wait for less, but four times the requests per chunk
        // within the same `UPSTREAM_REQUESTS_IN_FLIGHT`: a group's owner then finished its
        // chunks so much later that members hedged to judged it hung and fetched them
        // again, 1.35-2.10x the dataset in `group-bench --gray` where main brought 1.00.)
        let end = offset + length;
        let cut: Vec<(u64, u64)> =
            [(offset, part.from), (part.to, end)].into_iter().filter(|(from, to)| from < to).collect();
        // The reader's part is published too (sent once it is in, from the reader's fetch
        // or from this fill's own when that one failed): a reader of a range within it,
        // or a member hedged to that joins this fetch (`running_range`), waits for it
        // alone, as long as the first reader did; waiting for the whole chunk instead
        // outlasts a hedged member's wait for the owner, and the member then fetches the
        // chunk itself.
        let (mut senders, published): (Vec<_>, Vec<_>) = cut
            .iter()
            .chain(std::iter::once(&(part.from, part.to)))
            .map(|&(from, to)| {
                let (tx, rx) = tokio::sync::oneshot::channel::<Result<Checked>>();
                let bytes = async move {
                    rx.await.unwrap_or_else(|_| Err(Error::Internal("a fill ended before its piece".into())))
                };
                (tx, (from, to, bytes.boxed().shared()))
            })
            .unzip();
        let _ = pieces.set(published);
        let part_sender = senders.pop();
        let asked = cut.iter().zip(senders).map(|(&(from, to), tx)| async move {
            let bytes = self.upstream.supply(entry, from, to - from, &fetch.row, &fetch.avoid).await;
            let _ = tx.send(bytes.clone());
            bytes
        });
        let (rest, part_bytes) = futures::future::join(futures::future::join_all(asked), part.bytes).await;
        // The reader's fetch failed, or its call ended before it started (readers who joined
        // this fill wait for it too): the part is fetched here.
        let part_bytes = match part_bytes {
            Ok(bytes) => Ok(bytes),
            Err(_) => {
                self.upstream.supply(entry, part.from, part.to - part.from, &fetch.row, &fetch.avoid).await
            }
        };
        if let Some(tx) = part_sender {
            let _ = tx.send(part_bytes.clone());
        }
        let part_bytes = part_bytes?;
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
