//! The follower of the plans: whenever a plan is set, a cursor moves, reads are planned
//! or taken, or a fetch ahead ends, it asks each plan what comes next, given the room
//! it has, and fetches it. Two strategies, one per way a plan is followed:
//!
//! - **Whole shards** (plans followed shard by shard, `shards/`): the shards the jobs are
//!   reading and those they read next (by default the rest of the block being read and the
//!   next block, as the plans' `until`s delimit blocks: `--plan-window auto`; or a number
//!   of bytes ahead) are fetched whole, nearest first, [`PLANNED_FETCHES`] at a time, and
//!   stored. What is listed is also held under the low watermark: the shards listed up
//!   to a candidate will all be in the cache when it is read, so a candidate is fetched
//!   only if they and it fit below the level eviction stops at. Eviction takes the shard
//!   read again furthest away first, so fetching it never evicts a shard read sooner
//!   (Cao, Felten, Karlin and Li's integrated prefetching and caching: do not prefetch a
//!   block if that evicts one needed before it).
//! - **Samples** (jobs followed sample by sample, `samples/`): the nearest planned reads
//!   not yet held, up to the samples' window (`policy::window`, less what is held), in
//!   batches of ranges (one `ReadRanges` a batch of up to `suppliers::BATCH_BYTES`, all
//!   started at once: several batches in flight fill the link's bandwidth-delay
//!   product), each held for its read (`staged.rs`). A planned read whose bytes are
//!   stored (its chunk, or a kept sample) is not fetched.
//!
//! In a group each member fetches what it owns; the others read it from it.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{StreamExt, stream};
use shardcache_proto::names::{DatasetName, ShardName};

use super::{Plans, samples::Due, shards::Upcoming};
use crate::{
    fetch::lookup::Lookups,
    fetch::suppliers::{BATCH_BYTES, Chain},
    fetch::{FetchFor, FetchOwner},
    observe::job_counters::JobRow,
    observe::metrics::Metrics,
    policy::window::{self, Ahead, PlanWindow},
    store::capacity::Capacity,
    store::catalog::Catalog,
    store::entry::{Entry, ShardKey},
    store::kept::Keeper,
};

/// Shards fetched whole at once by the plans (each with `--shard-fetch-parallelism`
/// chunks in flight): two keep the link busy while one is admitted.
pub const PLANNED_FETCHES: usize = 2;

/// How often samples held for reads no read took are looked for, and the windows of
/// finished jobs.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Shard lookups (StatShard) a pass over the samples waits for at once: a window over a
/// dataset the spoke has not seen names many shards.
const LOOKUPS_AT_ONCE: usize = 16;

/// The follower, with what it uses.
#[derive(Debug, Clone)]
pub struct Follower {
    pub plans: Arc<Plans>,
    pub capacity: Arc<Capacity>,
    pub catalog: Arc<Catalog>,
    pub lookups: Arc<Lookups>,
    pub fetch: FetchOwner,
    /// Which shards this spoke fetches itself (in a group, those it owns).
    pub chain: Arc<Chain>,
    /// What is kept already (`store/kept/`).
    pub keeper: Arc<Keeper>,
    pub metrics: Arc<Metrics>,
    /// `--plan-window`: how far ahead of the reads shards are fetched (the next block, or
    /// bytes of shards).
    pub window: PlanWindow,
    /// Chunk fetches in flight per shard fetched whole (`--shard-fetch-parallelism`).
    pub parallelism: usize,
}

impl Follower {
    /// Follows the plans until `shutdown`.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = self.plans.changed() => {}
                _ = sweep.tick() => {
                    let dropped = self.plans.staged.expire();
                    if dropped > 0 {
                        tracing::debug!(bytes = dropped, "dropped samples fetched ahead that no read took");
                    }
                    self.plans.samples.expire();
                }
            }
            self.follow().await;
        }
    }

    /// Starts the fetches the plans call for now: their next shards, then their next
    /// samples.
    pub async fn follow(&self) {
        self.follow_shards();
        self.follow_samples().await;
    }

    /// Whole shards: what the plans followed shard by shard read next, within the room
    /// under the low watermark and the window.
    fn follow_shards(&self) {
        if !self.window.follows_shards() {
            return;
        }
        let room = self.capacity.low_watermark();
        let upcoming = self.plans.shards.upcoming(self.window);
        // What is read next takes what the window leaves beside the blocks being read
        // (`policy::window`: with `auto`, half the room they leave, the rest kept for the
        // shards read again later).
        let in_use: u64 = upcoming.iter().filter(|u| !u.ahead).map(|u| u.size).sum();
        let window_room =
            window::ahead(self.window, self.capacity.capacity(), Ahead::Shards { in_use, room });
        let (mut listed, mut ahead) = (0, 0);
        for Upcoming { key, size, principal, job, epoch, ahead: in_window } in upcoming {
            listed += size;
            ahead += if in_window { size } else { 0 };
            if listed > room || ahead > window_room {
                return;
            }
            // In a group, each member fetches the shards it owns (the others read them
            // from it when they need them).
            let mine = self.chain.owns(&key.0, &key.1);
            if !mine || self.catalog.get(&key).is_some_and(|e| e.is_complete()) {
                continue;
            }
            match self.plans.shards.start_fetch(&key, PLANNED_FETCHES) {
                None => return,          // as many running as allowed
                Some(false) => continue, // running already
                Some(true) => {}
            }
            let (this, row) = (self.clone(), self.metrics.jobs.planned(&principal, &job, epoch));
            tokio::spawn(async move {
                if let Err(e) = this.fetch_shard(&key, row, &principal).await {
                    tracing::debug!(dataset = %key.0, shard = %key.1, job, error = %e, "planned fetch failed");
                }
                this.plans.shards.fetched(&key);
            });
        }
    }

    /// Fetches `key` whole for `principal`'s plan, held against eviction while it runs;
    /// counted in `row`.
    async fn fetch_shard(&self, key: &ShardKey, row: JobRow, principal: &str) -> crate::Result<u64> {
        if self.plans.shards.next_use(key).is_none() {
            return Ok(0); // read and done since it was listed
        }
        let entry = self.lookups.entry(&DatasetName::new(&key.0)?, &ShardName::new(&key.1)?).await?;
        entry.hold_for_prefetch(true);
        let fetch = FetchFor::read(&row, principal, &[]);
        let fetched = self.fetch.fetch_shard(&entry, self.parallelism, fetch).await;
        entry.hold_for_prefetch(false);
        fetched
    }

    /// Samples: the nearest planned reads of the jobs followed sample by sample, up to
    /// what the samples' window has room for now.
    async fn follow_samples(&self) {
        let staged = self.plans.staged.bytes();
        let room = window::ahead(self.window, self.capacity.capacity(), Ahead::Samples { staged });
        if room == 0 {
            return;
        }
        let chain = self.chain.clone();
        let due = self.plans.samples.due(room, |shard| chain.owns(&shard.0, &shard.1));
        if due.is_empty() {
            return;
        }
        let entries = self.entries(&due).await;
        let mut batch: Vec<(Due, Arc<Entry>)> = Vec::new();
        let mut bytes = 0;
        for read in due {
            let Some(entry) = entries.get(&read.shard).cloned() else {
                self.plans.samples.not_fetched(&read);
                continue;
            };
            // A read that came while the entries were looked up fetched it itself.
            let past_end = read.offset.checked_add(read.length).is_none_or(|end| end > entry.size);
            if past_end || self.held(&entry, &read) || !self.plans.samples.still_planned(&read) {
                continue;
            }
            if bytes + read.length > BATCH_BYTES && !batch.is_empty() {
                self.start_samples(std::mem::take(&mut batch));
                bytes = 0;
            }
            bytes += read.length;
            batch.push((read, entry));
        }
        if !batch.is_empty() {
            self.start_samples(batch);
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
        self.plans.staged.has(&(entry.id, read.offset, read.length))
            || self.keeper.samples().holds(entry, read.offset, read.length)
            || (read.length > 0
                && entry.chunks_of(read.offset, read.offset + read.length).all(|i| entry.has_chunk(i)))
    }

    /// Starts one batch of samples: its ranges fetched as read in one call, each held for
    /// its read; the follower is woken when it ends (room in the window again).
    fn start_samples(&self, batch: Vec<(Due, Arc<Entry>)>) {
        let Some((first, _)) = batch.first() else { return };
        let (principal, job) = first.job.clone();
        let row = self.metrics.jobs.planned(&principal, &job, first.epoch);
        let wants: Vec<(&Arc<Entry>, u64, u64)> =
            batch.iter().map(|(d, e)| (e, d.offset, d.length)).collect();
        let fetches = self.fetch.start_direct(&wants, FetchFor::read(&row, &principal, &[]));
        for ((read, entry), fetch) in batch.iter().zip(&fetches) {
            let reserved = self.capacity.reserve(read.length);
            self.plans.staged.hold((entry.id, read.offset, read.length), fetch.clone(), reserved);
        }
        self.metrics.sample_batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let plans = self.plans.clone();
        tokio::spawn(async move {
            futures::future::join_all(fetches).await;
            plans.samples.wake();
        });
    }
}
