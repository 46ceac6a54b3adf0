//! The read path's stored parts: read from the store in one trip to the blocking pool,
//! checked; a stored chunk that fails its check is forgotten and refetched.

use std::sync::{Arc, atomic::Ordering::Relaxed};

use shardcache_proto::checksum::Checked;

use super::{FAULT_RETRIES, Part, Provenance, ReadFor, ReadPath};
use crate::{
    Error, Result,
    store::entry::{ChunkIndex, Entry},
    store::locate::{Opened, PageSpan},
    store::{PageFault, blocking},
};

/// A stored part as the blocking pool answers it: placed in the store's files, or read.
enum Stored {
    Placed(Vec<PageSpan>),
    Read(Result<Result<Checked, PageFault>>),
}

impl ReadPath {
    /// Reads the parts that are stored (or places them in the store's files, when
    /// `place`: `store::locate`), in one trip to the blocking pool; a part whose stored
    /// copy fails its check is read again (refetched).
    pub(super) async fn read_stored_parts(
        &self,
        parts: &mut [Part<'_>],
        reader: &ReadFor,
        place: bool,
    ) -> Result<()> {
        let is_stored = |p: &&mut Part<'_>| matches!(p.provenance, Provenance::Stored);
        let stored: Vec<(u64, u64, u64)> =
            parts.iter_mut().filter(is_stored).map(|p| (p.entry.id, p.from, p.to - p.from)).collect();
        if stored.is_empty() {
            return Ok(());
        }
        let store = self.store.clone();
        let read: Vec<Stored> = blocking(move || {
            let mut opened = Opened::new(shardcache_transport::local_socket::MAX_FILES);
            let mut placed =
                |(id, from, len)| place.then(|| store.locate(id, from, len, &mut opened)).flatten();
            Ok(stored
                .into_iter()
                .map(|part| match placed(part) {
                    Some(spans) => Stored::Placed(spans),
                    None => Stored::Read(store.read(part.0, part.1, part.2)),
                })
                .collect())
        })
        .await?;
        for (part, result) in parts.iter_mut().filter(is_stored).zip(read) {
            let result = match result {
                Stored::Placed(spans) => {
                    part.placed = Some(spans);
                    continue;
                }
                Stored::Read(result) => result?,
            };
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
    pub(super) async fn reread(
        &self,
        entry: &Arc<Entry>,
        index: ChunkIndex,
        from: u64,
        to: u64,
        reader: &ReadFor,
    ) -> Result<Checked> {
        for _ in 0..FAULT_RETRIES {
            match self.fetch.chunk(entry, index, reader.fetch()) {
                Some(fetch) => {
                    let start = (from - index.start(entry.chunk_size)) as usize;
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

    /// `[offset, offset + length)` of `entry` (inside the shard) from the store only:
    /// `None` when any chunk of it is not stored (or fails its check), never a fetch.
    pub async fn read_cached(&self, entry: &Arc<Entry>, offset: u64, length: u64) -> Result<Option<Checked>> {
        if length == 0 {
            return Ok(Some(Checked::default()));
        }
        let end = offset + length;
        let mut parts = Vec::new();
        for index in entry.chunks_of(offset, end) {
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
    pub(super) async fn read_stored(
        &self,
        entry: &Arc<Entry>,
        index: ChunkIndex,
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
    pub(super) async fn stored_fault(&self, entry: &Arc<Entry>, index: ChunkIndex, fault: PageFault) {
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
