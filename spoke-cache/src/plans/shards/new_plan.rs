//! A plan as `SetPlan` gives it ([`NewPlan`]: its shards once each, and per position the
//! one first read there and the end of its use), and as tests write one, position by
//! position ([`Planned`]).

use std::collections::HashMap;

use crate::store::entry::ShardKey;

/// One planned use of a shard: from the read that first touches it (`first`) to the
/// position of the last shard first read before its own last read (`until`), both plan
/// positions. A shard read whole before the next starts has `until == first`; under a
/// block shuffle the shards of a block are in use together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    pub first: usize,
    pub until: usize,
}

/// One position of a plan: the shard first read there, its use, its size and the
/// epoch of the read (a plan position by position, as tests write one).
#[derive(Debug, Clone)]
pub struct Planned {
    pub key: ShardKey,
    pub at: Use,
    pub size: u64,
    pub epoch: u64,
}

/// A plan as [`ShardPlans::set`] takes it: its distinct shards once each, and per position
/// the one first read there (its index in `shards`) and the end of its use.
#[derive(Debug, Clone, Default)]
pub struct NewPlan {
    /// Each shard the plan names, with its size.
    pub shards: Vec<(ShardKey, u64)>,
    /// Per position, the index in `shards` of the shard first read there.
    pub positions: Vec<u32>,
    /// Per position, the last position of its use (`Use::until`); empty: each its own.
    pub until: Vec<u32>,
    /// (first position, epoch) of each epoch, in order.
    pub epochs: Vec<(u32, u64)>,
}

impl NewPlan {
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }
}

impl From<Vec<Planned>> for NewPlan {
    fn from(order: Vec<Planned>) -> Self {
        let mut plan = NewPlan::default();
        let mut index: HashMap<ShardKey, u32> = HashMap::new();
        for (at, planned) in order.into_iter().enumerate() {
            let next = plan.shards.len() as u32;
            let local = *index.entry(planned.key.clone()).or_insert_with(|| {
                plan.shards.push((planned.key, planned.size));
                next
            });
            plan.positions.push(local);
            plan.until.push(planned.at.until as u32);
            if plan.epochs.last().is_none_or(|&(_, epoch)| epoch != planned.epoch) {
                plan.epochs.push((at as u32, planned.epoch));
            }
        }
        plan
    }
}
