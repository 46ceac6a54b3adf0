//! Reads started alongside a first `StatShard`: when the cache has never seen a shard,
//! the whole chunks a read covers and the rest of its ranges (for a format's index
//! reads, the ranges themselves) are read at whatever version the suppliers have while
//! the stat crosses the link, in one batch, so a cold read costs one round trip, not two. The chunk's fetch (or the
//! index reads' memory), once the entry (and so the version) is known, takes these
//! bytes when they are at the entry's version and of the length it wants.
//!
//! Concurrent first reads of a shard share one read of each range (a cold batch from 16
//! ranks had chunks cross the link twice). A speculative read never waits for room in
//! the byte bound (it gives up instead), so reads waiting for each other's room cannot
//! deadlock; and it never asks the members ranked before this spoke (only the owner
//! speculates: a shard another member owns is read from it, at a known version).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};
use tracing::Instrument as _;

use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};

use shardcache_proto::checksum::Checked;

use super::upstream::Upstream;
use crate::{fetch::suppliers::Want, observe::job_counters::JobRow};

/// A speculative read's bytes and their version, or `None`.
pub(crate) type SpeculativeRead = Shared<BoxFuture<'static, Option<(Checked, String)>>>;

/// (dataset, shard, offset, length) of a speculative read.
type Key = (String, String, u64, u64);

/// Speculative reads, by what they read, until their first reader has taken them up.
#[derive(Debug, Default)]
pub(super) struct Speculations {
    reads: Mutex<HashMap<Key, SpeculativeRead>>,
}

impl Speculations {
    fn reads(&self) -> MutexGuard<'_, HashMap<Key, SpeculativeRead>> {
        self.reads.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts reading `parts` (`(offset, length)` each) of `dataset/shard` from `upstream`
    /// (counted in `row`), those no read is running for, in one batch (one call upstream
    /// per hub batch: a cold batch of a reader's samples costs one round trip).
    pub(super) fn start(
        &self,
        upstream: &Arc<Upstream>,
        (dataset, shard): (&str, &str),
        parts: &[(u64, u64)],
        row: &JobRow,
    ) {
        let key = |(offset, length): (u64, u64)| (dataset.to_owned(), shard.to_owned(), offset, length);
        let mut reads = self.reads();
        // A part over one being read already is not read again (concurrent first reads of
        // one chunk, each ending where it ends, would each bring their own range): its
        // read waits for the stat and joins what runs then (a fill lent the other part).
        let mut running: Vec<(u64, u64)> = reads
            .keys()
            .filter(|(d, s, ..)| d == dataset && s == shard)
            .map(|&(.., offset, length)| (offset, length))
            .collect();
        let mut new: Vec<(u64, u64)> = Vec::new();
        for &(offset, length) in parts {
            let overlaps =
                |&(o, l): &(u64, u64)| o < offset.saturating_add(length) && offset < o.saturating_add(l);
            if length > 0 && !running.iter().any(overlaps) {
                running.push((offset, length));
                new.push((offset, length));
            }
        }
        if new.is_empty() {
            return;
        }
        let (upstream, row, asked) = (upstream.clone(), row.clone(), new.clone());
        let (ds, sh) = (dataset.to_owned(), shard.to_owned());
        // In the span of the request that opened the shard: a trace shows it there.
        let batch = tokio::spawn(
            async move {
                let total = asked.iter().map(|&(_, length)| length).sum();
                let Some(_room) = upstream.read_room_now(total) else { return vec![None; asked.len()] };
                let wants: Vec<Want<'_>> = asked
                    .iter()
                    .map(|&(offset, length)| Want { dataset: &ds, shard: &sh, offset, length, version: None })
                    .collect();
                upstream.any_version(&wants, &row).await
            }
            .instrument(tracing::Span::current()),
        );
        let all = async move { batch.await.unwrap_or_default() }.boxed().shared();
        for (j, part) in new.into_iter().enumerate() {
            let one = all.clone().map(move |answers| answers.get(j).cloned().flatten());
            reads.insert(key(part), one.boxed().shared());
        }
    }

    /// The speculative read of `[offset, offset + length)` of `dataset/shard`, if one
    /// was started and not yet forgotten; or one at `offset` asked longer: the last chunk
    /// of a shard, read whole alongside the stat before anyone knew the shard ends inside
    /// it (asked cut at the end; whoever takes it up checks its length).
    pub(super) fn get(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
    ) -> Option<SpeculativeRead> {
        let reads = self.reads();
        reads.get(&(dataset.to_owned(), shard.to_owned(), offset, length)).cloned().or_else(|| {
            reads
                .iter()
                .find(|((d, s, o, l), _)| d == dataset && s == shard && *o == offset && *l > length)
                .map(|(_, read)| read.clone())
        })
    }

    /// The speculative reads of `dataset/shard` that overlap `[offset, offset + length)`
    /// (`(offset, length, read)` each; they never overlap each other: `start`).
    pub(super) fn overlapping(
        &self,
        dataset: &str,
        shard: &str,
        offset: u64,
        length: u64,
    ) -> Vec<(u64, u64, SpeculativeRead)> {
        let end = offset.saturating_add(length);
        self.reads()
            .iter()
            .filter(|((d, s, o, l), _)| {
                d == dataset && s == shard && *o < end && offset < o.saturating_add(*l)
            })
            .map(|((.., o, l), read)| (*o, *l, read.clone()))
            .collect()
    }

    pub(super) fn forget(&self, dataset: &str, shard: &str, offset: u64, length: u64) {
        self.reads().remove(&(dataset.to_owned(), shard.to_owned(), offset, length));
    }
}

/// The reads a request started alongside a first stat, forgotten when the request ends
/// (dropped): until then, a part of them the read path fetches as read takes them up
/// rather than crossing the link again; after, their bytes must not stay in memory.
#[derive(Debug)]
pub struct Alongside {
    speculations: Arc<Speculations>,
    dataset: String,
    shard: String,
    /// (offset, length) of each read.
    parts: Vec<(u64, u64)>,
}

impl Alongside {
    pub(super) fn new(
        speculations: Arc<Speculations>,
        dataset: &str,
        shard: &str,
        parts: Vec<(u64, u64)>,
    ) -> Self {
        Self { speculations, dataset: dataset.to_owned(), shard: shard.to_owned(), parts }
    }
}

impl Drop for Alongside {
    fn drop(&mut self) {
        for &(offset, length) in &self.parts {
            self.speculations.forget(&self.dataset, &self.shard, offset, length);
        }
    }
}
