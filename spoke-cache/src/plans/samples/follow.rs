//! The follower of the sample plans: whenever reads are planned or taken, or a fetch
//! ahead ends, it fetches the nearest planned reads not yet held, up to the window
//! (`policy::keep::window_bound`, less what is held), in batches of ranges (one
//! `ReadRanges` a batch of up to `suppliers::BATCH_BYTES`, all started at once: several
//! batches in flight fill the link's bandwidth-delay product), and holds each for its
//! read (`staged.rs`). A planned read whose bytes are stored (its chunk, or a kept sample)
//! is not fetched. In a group each member fetches the samples of the shards it owns; the
//! reads of the others go to their owners.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{StreamExt, stream};
use shardcache_proto::names::{DatasetName, ShardName};

use super::{Due, SamplePlans, staged::Staged};
use crate::{
    fetch::lookup::Lookups,
    fetch::suppliers::{BATCH_BYTES, Chain},
    fetch::{FetchFor, FetchOwner},
    observe::metrics::Metrics,
    policy::keep,
    store::capacity::Capacity,
    store::entry::{Entry, ShardKey},
    store::kept::Keeper,
};

/// How often held samples no read took are looked for, and windows of finished jobs.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Shard lookups (StatShard) a pass waits for at once: a window over a dataset the spoke
/// has not seen names many shards.
const LOOKUPS_AT_ONCE: usize = 16;

/// What the follower uses.
#[derive(Debug, Clone)]
pub struct SampleFollower {
    pub plans: Arc<SamplePlans>,
    pub staged: Arc<Staged>,
    pub capacity: Arc<Capacity>,
    pub lookups: Arc<Lookups>,
    pub fetch: FetchOwner,
    /// Which shards this spoke fetches itself (in a group, those it owns).
    pub chain: Arc<Chain>,
    /// What is kept already (`store/kept/`).
    pub keeper: Arc<Keeper>,
    pub metrics: Arc<Metrics>,
}

impl SampleFollower {
    /// Follows the sample plans until `shutdown`.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = self.plans.changed() => {}
                _ = sweep.tick() => {
                    let dropped = self.staged.expire();
                    if dropped > 0 {
                        tracing::debug!(bytes = dropped, "dropped samples fetched ahead that no read took");
                    }
                    self.plans.expire();
                }
            }
            self.follow().await;
        }
    }

    /// Fetches what the window has room for now.
    pub async fn follow(&self) {
        let window = keep::window_bound(self.capacity.capacity());
        let room = window.saturating_sub(self.staged.bytes());
        if room == 0 {
            return;
        }
        let chain = self.chain.clone();
        let due = self.plans.due(room, |shard| chain.owns(&shard.0, &shard.1));
        if due.is_empty() {
            return;
        }
        let entries = self.entries(&due).await;
        let mut batch: Vec<(Due, Arc<Entry>)> = Vec::new();
        let mut bytes = 0;
        for read in due {
            let Some(entry) = entries.get(&read.shard).cloned() else {
                self.plans.not_fetched(&read);
                continue;
            };
            // A read that came while the entries were looked up fetched it itself.
            let past_end = read.offset.checked_add(read.length).is_none_or(|end| end > entry.size);
            if past_end || self.held(&entry, &read) || !self.plans.still_planned(&read) {
                continue;
            }
            if bytes + read.length > BATCH_BYTES && !batch.is_empty() {
                self.start(std::mem::take(&mut batch));
                bytes = 0;
            }
            bytes += read.length;
            batch.push((read, entry));
        }
        if !batch.is_empty() {
            self.start(batch);
        }
    }

    /// The entries of the shards `due` names, looked up at most [`LOOKUPS_AT_ONCE`] at a
    /// time (a shard that cannot be looked up is left out: its reads fetch it).
    async fn entries(&self, due: &[Due]) -> HashMap<ShardKey, Arc<Entry>> {
        let mut shards: Vec<ShardKey> = due.iter().map(|d| d.shard.clone()).collect();
        shards.sort();
        shards.dedup();
        let lookups = self.lookups.clone();
        stream::iter(shards)
            .map(move |key| {
                let lookups = lookups.clone();
                async move {
                    let (dataset, shard) = (DatasetName::new(&key.0).ok()?, ShardName::new(&key.1).ok()?);
                    let entry = lookups.entry(&dataset, &shard).await.ok()?;
                    Some((key, entry))
                }
            })
            .buffer_unordered(LOOKUPS_AT_ONCE)
            .filter_map(futures::future::ready)
            .collect()
            .await
    }

    /// Whether `read` of `entry` is held already: staged, kept, or all its chunks stored.
    fn held(&self, entry: &Entry, read: &Due) -> bool {
        let end = read.offset + read.length;
        self.staged.has(&(entry.id, read.offset, read.length))
            || self.keeper.samples().holds(entry, read.offset, read.length)
            || (read.length > 0
                && (read.offset / entry.chunk_size..=(end - 1) / entry.chunk_size)
                    .all(|i| entry.has_chunk(i)))
    }

    /// Starts one batch: its ranges fetched as read in one call, each held for its read;
    /// the follower is woken when it ends (room in the window again).
    fn start(&self, batch: Vec<(Due, Arc<Entry>)>) {
        let Some((first, _)) = batch.first() else { return };
        let (principal, job) = first.job.clone();
        let row = self.metrics.jobs.planned(&principal, &job, first.epoch);
        let wants: Vec<(&Arc<Entry>, u64, u64)> =
            batch.iter().map(|(d, e)| (e, d.offset, d.length)).collect();
        let fetches = self.fetch.start_direct(&wants, FetchFor::read(&row, &principal, &[]));
        for ((read, entry), fetch) in batch.iter().zip(&fetches) {
            let reserved = self.capacity.reserve(read.length);
            self.staged.hold((entry.id, read.offset, read.length), fetch.clone(), reserved);
        }
        self.metrics.sample_batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let plans = self.plans.clone();
        tokio::spawn(async move {
            futures::future::join_all(fetches).await;
            plans.wake();
        });
    }
}
