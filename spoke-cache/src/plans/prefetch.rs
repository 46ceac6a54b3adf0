//! Prefetch that follows the access plans: whenever a plan is set, a job's cursor moves
//! or a planned fetch finishes, the shards the jobs are reading and those they read next
//! (by default the rest of the block being read and the next block, as the plans' `until`s
//! delimit blocks: `--plan-window auto`; or a number of bytes ahead) are fetched whole,
//! nearest first, [`PLANNED_FETCHES`] at a time. The window so follows the plan: a
//! dataset read in blocks of four 16 MiB shards looks 64 MiB ahead, one read shard after
//! shard one shard ahead, and the room under the low watermark bounds either.
//!
//! What is listed is also held under the low watermark: the shards listed up to a
//! candidate (those being read and those read before it) will all be in the cache when
//! it is read, so a candidate is fetched only if they and it fit below the level
//! eviction stops at. Eviction takes the shard read again furthest away first, so
//! fetching it never evicts a shard read sooner (the rule of Cao, Felten, Karlin and
//! Li's integrated prefetching and caching: do not prefetch a block if that evicts one
//! needed before it).

use std::sync::Arc;

use shardcache_proto::names::{DatasetName, ShardName};

use crate::{
    fetch::FetchOwner,
    fetch::lookup::Lookups,
    fetch::suppliers::Chain,
    observe::job_counters::JobRow,
    observe::metrics::Metrics,
    plans::shards::{PlanWindow, Plans, Upcoming},
    store::capacity::Capacity,
    store::catalog::Catalog,
    store::entry::ShardKey,
};

/// Shards fetched whole at once by the plans (each with `--shard-fetch-parallelism`
/// chunks in flight): two keep the link busy while one is admitted.
pub const PLANNED_FETCHES: usize = 2;

/// What planned prefetch uses.
#[derive(Debug, Clone)]
pub struct PlanFetcher {
    pub plans: Arc<Plans>,
    pub capacity: Arc<Capacity>,
    pub catalog: Arc<Catalog>,
    pub lookups: Arc<Lookups>,
    pub fetch: FetchOwner,
    /// Which shards this spoke fetches itself (in a group, those it owns).
    pub chain: Arc<Chain>,
    pub metrics: Arc<Metrics>,
    /// `--plan-window`: how far ahead of the reads (the next block, or bytes of shards).
    pub window: PlanWindow,
    /// Chunk fetches in flight per shard (`--shard-fetch-parallelism`).
    pub parallelism: usize,
}

impl PlanFetcher {
    /// Follows the plans until `shutdown`.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = self.plans.changed() => {}
            }
            self.follow();
        }
    }

    /// Starts the fetches the plans call for now.
    fn follow(&self) {
        if self.window == PlanWindow::Bytes(0) {
            return;
        }
        let room = self.capacity.low_watermark();
        let upcoming = self.plans.upcoming(self.window);
        // With the window the plans delimit (`auto`), what is read next takes at most half
        // the room the blocks being read leave under the low watermark: the rest keeps the
        // shards read again later (the next epoch's hits). In a cache a few blocks large a
        // whole next block would leave them none (plan-bench, BENCHMARKS.md).
        let in_use: u64 = upcoming.iter().filter(|u| !u.ahead).map(|u| u.size).sum();
        let window_room = match self.window {
            PlanWindow::Blocks => room.saturating_sub(in_use) / 2,
            PlanWindow::Bytes(_) => room,
        };
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
            match self.plans.start_fetch(&key, PLANNED_FETCHES) {
                None => return,          // as many running as allowed
                Some(false) => continue, // running already
                Some(true) => {}
            }
            let (this, row) = (self.clone(), self.metrics.jobs.planned(&principal, &job, epoch));
            tokio::spawn(async move {
                if let Err(e) = this.fetch_whole(&key, row, &principal).await {
                    tracing::debug!(dataset = %key.0, shard = %key.1, job, error = %e, "planned fetch failed");
                }
                this.plans.fetched(&key);
            });
        }
    }

    /// Fetches `key` whole for `principal`'s plan, held against eviction while it runs;
    /// counted in `row`.
    async fn fetch_whole(&self, key: &ShardKey, row: JobRow, principal: &str) -> crate::Result<u64> {
        if self.plans.next_use(key).is_none() {
            return Ok(0); // read and done since it was listed
        }
        let entry = self.lookups.entry(&DatasetName::new(&key.0)?, &ShardName::new(&key.1)?).await?;
        entry.hold_for_prefetch(true);
        let fetch = crate::fetch::FetchFor::read(&row, principal, &[]);
        let fetched = self.fetch.fetch_shard(&entry, self.parallelism, fetch).await;
        entry.hold_for_prefetch(false);
        fetched
    }
}
