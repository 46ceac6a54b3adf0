//! What jobs say they will read, and the work that follows it. One place answers the two
//! questions every plan feature asks:
//! - *what is this read to the plans?* ([`Plans::to_read`], once per read call): a
//!   format's index read, a straggler behind its job's plan, a read of a job followed
//!   sample by sample (planned, with its sample's next read, or not), or a free read;
//! - *what comes next, given this much room?*: the [`follow::Follower`] asks each plan,
//!   whole shards ahead for the plans followed shard by shard (`shards/`), byte ranges
//!   for those followed sample by sample (`samples/`), and fetches them.
//!
//! Each plan is followed one way, chosen when it is set by the bytes each brings
//! (`shards::SHARD_BLOCK_SHARE`: whole shards while a block fits the room, samples
//! past it). Samples fetched ahead wait for their reads in [`staged`]; samples kept for a
//! later epoch live in the store (`store/kept/`), kept by `policy::keep`.
//!
//! Owns: the plans, the follower and what it fetches ahead. May import `fetch`, `store`,
//! `policy`, `observe`; never `read`, the facade or the services.

pub mod follow;
pub mod samples;
pub mod shards;

use std::sync::Arc;

pub use self::samples::staged;
use self::{
    samples::{Matched, SamplePlans, staged::Staged},
    shards::ShardPlans,
};
use crate::store::entry::{Entry, ShardKey};

/// Every plan the spoke holds: the plans followed whole shard by whole shard, the jobs
/// followed sample by sample, and the samples fetched ahead for them.
#[derive(Debug)]
pub struct Plans {
    pub shards: ShardPlans,
    pub samples: SamplePlans,
    /// Samples fetched ahead of their reads, held until read.
    pub staged: Staged,
}

/// What a read is to the plans ([`Plans::to_read`]): what the read path does with its
/// misses and what it starts after it follow from it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A format's index read (`shardcache-index-read`): no step of any plan; its misses
    /// are fetched as read and held in memory (`read/index_reads.rs`), they count in no
    /// filter and start nothing.
    Index,
    /// A read of a shard its own job's plan has moved past: fetched as read and not stored
    /// (the room is the plan's, for what is read next), nothing started after it.
    Straggler,
    /// A read of a job followed sample by sample: misses fetched as read (never a whole
    /// chunk: the room is its window's and its keeps'), nothing read ahead. `planned`: its
    /// plan named it (it leaves the window now), and `next_use` is its sample's next read,
    /// for which it is kept when it crossed the link.
    Sample { planned: bool, next_use: Option<u64> },
    /// Any other read (unplanned, or a step of a plan followed shard by shard): the
    /// admission decides whether a miss is stored, and read-ahead may follow it.
    Free,
}

impl Step {
    /// Whether the read counts as a reader's (runs, the admission's filter).
    pub fn counts(self) -> bool {
        self != Step::Index
    }

    /// Whether a miss may store its chunk and the read may start speculation after it.
    pub fn speculates(self) -> bool {
        self == Step::Free
    }
}

impl Plans {
    pub fn new(limits: shards::PlanLimits) -> Self {
        Self { shards: ShardPlans::new(limits), samples: SamplePlans::default(), staged: Staged::default() }
    }

    /// What each of `wants` (a read call's ranges) is to the plans, for `principal`'s job
    /// `job` (`index`: the call is a format's index read). Asked once per call: the
    /// shards' plans move their cursors (and say which shards the job straggles on), and
    /// a job followed sample by sample has its planned reads taken out of its window now,
    /// before they are fetched (the follower does not fetch them again beside them).
    pub fn to_read(
        &self,
        wants: &[(&Arc<Entry>, u64, u64)],
        (principal, job): (&str, Option<&str>),
        index: bool,
    ) -> Vec<Step> {
        // A format's index reads are no step of a plan (the SDK sends them untagged; an
        // older one may not).
        if index {
            return vec![Step::Index; wants.len()];
        }
        // A read moves the shards' cursors whoever reads; a job followed sample by sample
        // has no shard step to straggle behind.
        let mut stragglers = std::collections::HashSet::new();
        if self.shards.any() {
            let mut seen = std::collections::HashSet::new();
            for (entry, ..) in wants.iter().filter(|(entry, ..)| seen.insert(entry.id)) {
                if self.shards.read(&entry.dataset, &entry.shard, principal, job) {
                    stragglers.insert(entry.id);
                }
            }
        }
        if self.samples.follows(principal, job) {
            let shards: Vec<ShardKey> =
                wants.iter().map(|(e, ..)| (e.dataset.clone(), e.shard.clone())).collect();
            let reads =
                wants.iter().zip(&shards).map(|(&(_, offset, length), shard)| (shard, offset, length));
            return self
                .samples
                .reads(principal, job, reads)
                .into_iter()
                .map(|matched| match matched {
                    Matched::Planned { next_use } => Step::Sample { planned: true, next_use },
                    Matched::Unplanned => Step::Sample { planned: false, next_use: None },
                })
                .collect();
        }
        wants
            .iter()
            .map(|(entry, ..)| if stragglers.contains(&entry.id) { Step::Straggler } else { Step::Free })
            .collect()
    }

    /// Waits until a plan is set, a cursor moves, reads are planned or taken, or a fetch
    /// ahead ends: what comes next may have changed.
    pub async fn changed(&self) {
        tokio::select! {
            _ = self.shards.changed() => {}
            _ = self.samples.changed() => {}
        }
    }
}

/// The plans as eviction sees them (`store::evict`): a shard's next planned read is its
/// shard plans' (a plan followed sample by sample says what it reads again sample by
/// sample, through the kept samples).
impl crate::store::evict::NextUses for Plans {
    fn next_use(&self, key: &ShardKey) -> Option<usize> {
        self.shards.next_use(key)
    }

    fn expire(&self) {
        self.shards.expire()
    }
}
