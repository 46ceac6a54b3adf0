//! Ranges fetched as read, never stored: a miss the admission does not store, a plan's
//! straggler, an index read, and the part a read of a chunk being filled is answered by
//! (`fill.rs`). The misses of one call go upstream together, in as few calls as the
//! suppliers allow (`Supply::fetch_many`): a batch of a reader's misses costs the long
//! link one round trip, as it does to a hub with no cache; concurrent readers of one
//! range share one fetch.

use std::{collections::HashMap, sync::Arc};

use futures::FutureExt;
use shardcache_proto::checksum::Checked;

use super::{FetchFor, FetchOwner, Inner, Owned, SharedFetch, speculation::SpeculativeRead};
use crate::{Error, Result, fetch::shared::spawn_shared, store::entry::Entry};

impl FetchOwner {
    /// `[offset, offset + length)` of `entry` fetched as it is asked for and not stored
    /// (a miss the cache does not admit, a plan's straggler, an index read): counted in
    /// `fetch.row`, within the byte and request bounds, one fetch for concurrent readers of
    /// the same range; a read of it started alongside the shard's stat is taken up.
    pub async fn direct(
        &self,
        entry: &Arc<Entry>,
        offset: u64,
        length: u64,
        fetch: FetchFor<'_>,
    ) -> Result<Checked> {
        let key = (entry.id, offset, length);
        let shared = {
            let mut direct = self.inner.direct();
            match direct.get(&key) {
                Some(running) => running.clone(),
                None => {
                    let shared = self.spawn_direct(entry, offset, length, fetch);
                    direct.insert(key, shared.clone());
                    shared
                }
            }
        };
        shared.await
    }

    /// Every `(entry, offset, length)` of `wants` fetched as read and not stored, as
    /// [`FetchOwner::direct`]; see [`FetchOwner::start_direct`].
    pub async fn direct_many(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        fetch: FetchFor<'_>,
    ) -> Result<Vec<Checked>> {
        futures::future::try_join_all(self.start_direct(wants, fetch)).await
    }

    /// The fetches as read of `wants`, one shared fetch each, in order: a running one of
    /// the same range joined, one taking up a read alongside the shard's stat on its own,
    /// and all the others started together in as few calls upstream as the suppliers
    /// allow (`Supply::fetch_many`): a batch of a reader's misses costs one round trip
    /// over the long link, as it does to a hub with no cache, not one per range.
    pub fn start_direct(&self, wants: &[(&Arc<Entry>, u64, u64)], fetch: FetchFor<'_>) -> Vec<SharedFetch> {
        let mut out: Vec<Option<SharedFetch>> = vec![None; wants.len()];
        // (slot, entry, offset, length) of the ranges the batch fetches, each once.
        let mut batch: Vec<(usize, Arc<Entry>, u64, u64)> = Vec::new();
        let mut in_batch: HashMap<(u64, u64, u64), usize> = HashMap::new();
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        let mut direct = self.inner.direct();
        for (slot, &(entry, offset, length)) in wants.iter().enumerate() {
            let key = (entry.id, offset, length);
            if let Some(running) = direct.get(&key) {
                out[slot] = Some(running.clone());
            } else if let Some(&j) = in_batch.get(&key) {
                repeats.push((slot, j));
            } else if !self
                .inner
                .speculations
                .overlapping(&entry.dataset, &entry.shard, offset, length)
                .is_empty()
            {
                // Read alongside the stat, or part of it is (another reader's range over it):
                // on its own, taking up what that read brought.
                let shared = self.spawn_direct(entry, offset, length, fetch);
                direct.insert(key, shared.clone());
                out[slot] = Some(shared);
            } else {
                in_batch.insert(key, batch.len());
                batch.push((slot, entry.clone(), offset, length));
            }
        }
        if !batch.is_empty() {
            let keys: Vec<(u64, u64, u64)> = batch.iter().map(|(_, e, o, l)| (e.id, *o, *l)).collect();
            let parts: Vec<(Arc<Entry>, u64, u64)> =
                batch.iter().map(|(_, e, o, l)| (e.clone(), *o, *l)).collect();
            let (inner, owned) = (self.inner.clone(), Owned::of(fetch));
            let job = async move { Ok(inner.fetch_batch_as_read(&parts, &owned).await) };
            let (done, done_keys) = (self.inner.clone(), keys.clone());
            // One task fetches the batch; each range's readers share its part of the answer.
            let all = spawn_shared("range batch fetch", job, move || {
                let mut direct = done.direct();
                for key in &done_keys {
                    direct.remove(key);
                }
            });
            for (j, (slot, ..)) in batch.iter().enumerate() {
                let one = all.clone().map(move |answers| answers.and_then(|a| a[j].clone())).boxed().shared();
                direct.insert(keys[j], one.clone());
                out[*slot] = Some(one);
            }
        }
        drop(direct);
        for (slot, j) in repeats {
            out[slot] = out[batch[j].0].clone();
        }
        out.into_iter()
            .map(|shared| {
                shared.unwrap_or_else(|| {
                    futures::future::ready(Err(Error::Internal("a range went unfetched".into())))
                        .boxed()
                        .shared()
                })
            })
            .collect()
    }

    /// The shared fetch as read of one range, on its own (it takes up a read alongside
    /// the shard's stat).
    fn spawn_direct(&self, entry: &Arc<Entry>, offset: u64, length: u64, fetch: FetchFor<'_>) -> SharedFetch {
        let key = (entry.id, offset, length);
        // Taken now: a read alongside the stat is forgotten when its own request ends,
        // which may be before this task runs (its bytes would then cross twice).
        let alongside = self.inner.speculations.overlapping(&entry.dataset, &entry.shard, offset, length);
        let (inner, entry, owned) = (self.inner.clone(), entry.clone(), Owned::of(fetch));
        let job = async move { inner.fetch_as_read(&entry, (offset, length), alongside, &owned).await };
        let done = self.inner.clone();
        spawn_shared("range fetch", job, move || {
            done.direct().remove(&key);
        })
    }
}

impl Inner {
    /// The body of [`FetchOwner::direct`]'s shared fetch: what reads alongside the shard's
    /// stat brought of the range (at the entry's version), and the rest from upstream. (The
    /// reads alongside a stat never overlap each other: one reader's range over another's
    /// is not read twice, it takes the other's bytes here.)
    async fn fetch_as_read(
        &self,
        entry: &Entry,
        (offset, length): (u64, u64),
        alongside: Vec<(u64, u64, SpeculativeRead)>,
        fetch: &Owned,
    ) -> Result<Checked> {
        let end = offset + length;
        let mut have: Vec<(u64, Checked)> = Vec::new();
        for (o, l, read) in alongside {
            // All it asked for, or (cut at the end) all the shard has from its offset.
            if let Some((data, version)) = read.await
                && version == entry.version
                && let got = data.data.len() as u64
                && (got == l || (got < l && o + got == entry.size))
                && o + got > offset
            {
                let (from, to) = (o.max(offset), (o + got).min(end));
                have.push((from, data.part((from - o) as usize, (to - o) as usize)));
            }
        }
        if have.len() == 1 && have[0].1.data.len() as u64 == length {
            return Ok(have.remove(0).1);
        }
        have.sort_by_key(|(from, _)| *from);
        let gaps = super::fill::gaps(
            (offset, end),
            have.iter().map(|(from, b)| (*from, from + b.data.len() as u64)),
        );
        if !gaps.is_empty() {
            let asked: u64 = gaps.iter().map(|(from, to)| to - from).sum();
            let _room = self.upstream.read_room(asked).await?;
            let wants: Vec<(&Entry, u64, u64)> =
                gaps.iter().map(|&(from, to)| (entry, from, to - from)).collect();
            // One range (no read alongside the stat, the common case) asked on its own.
            let fetched = match wants.as_slice() {
                &[(entry, from, length)] => {
                    vec![self.upstream.supply(entry, from, length, &fetch.row, &fetch.avoid).await]
                }
                _ => self.upstream.supply_many(&wants, &fetch.row, &fetch.avoid).await,
            };
            for (&(from, _), bytes) in gaps.iter().zip(fetched) {
                have.push((from, bytes?));
            }
        }
        have.sort_by_key(|(from, _)| *from);
        let read = Checked::concat(have.into_iter().map(|(_, bytes)| bytes).collect());
        if read.data.len() as u64 != length {
            return Err(Error::Internal(format!(
                "a read as read of {}/{} at {offset} assembled {} bytes of {length}",
                entry.dataset,
                entry.shard,
                read.data.len()
            )));
        }
        Ok(read)
    }

    /// The body of [`FetchOwner::start_direct`]'s batch: the ranges of `parts` within the
    /// room of all of them, in as few calls as the suppliers allow, each its own answer.
    async fn fetch_batch_as_read(
        &self,
        parts: &[(Arc<Entry>, u64, u64)],
        fetch: &Owned,
    ) -> Vec<Result<Checked>> {
        let total = parts.iter().map(|(_, _, length)| length).sum();
        let _room = match self.upstream.read_room(total).await {
            Ok(room) => room,
            Err(e) => return parts.iter().map(|_| Err(e.clone())).collect(),
        };
        let parts: Vec<(&Entry, u64, u64)> = parts.iter().map(|(e, o, l)| (&**e, *o, *l)).collect();
        self.upstream.supply_many(&parts, &fetch.row, &fetch.avoid).await
    }
}
