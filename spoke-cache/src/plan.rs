//! Access plans: the order in which jobs will read shards (`SetPlan`), and how far away
//! each cached shard's next planned read is, for eviction.
//!
//! A job's plan is the shard order of the rest of its current epoch followed by the
//! next one (the SDK knows both: a seed and a shuffle). Each job has a cursor, the plan
//! position it has reached: a client read of a shard moves it to that shard's next
//! position in the plan, if that is within [`CURSOR_REACH`] (reads arrive a little out
//! of order: several ranks, batches in flight). A shard's next use is its first
//! position at or after the cursor, as a distance; over several jobs, the nearest.
//!
//! Evicting the shard whose next use is furthest away is Belady's rule: with the future
//! known it misses least. Under a reshuffle every epoch, least-recently-used evicts
//! shards just before they are read again; this keeps a stable set and lets the rest
//! stream through.

use std::{
    collections::HashMap,
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
};

use crate::index::ShardKey;

/// How far ahead of a job's cursor a read may be and still move it: reads arrive out of
/// order by what a trainer has in flight (ranks x batches x shards per batch), far less
/// than an epoch.
pub const CURSOR_REACH: usize = 256;

/// Most positions one plan may have (two epochs of a large dataset: the seed's C4 at 64
/// MiB shards is ~12k shards an epoch).
pub const MAX_PLAN_POSITIONS: usize = 1 << 20;

#[derive(Debug)]
struct JobPlan {
    /// Positions of each shard in the plan, ascending.
    positions: HashMap<ShardKey, Vec<usize>>,
    cursor: usize,
}

impl JobPlan {
    fn new(order: Vec<ShardKey>) -> Self {
        let mut positions: HashMap<ShardKey, Vec<usize>> = HashMap::new();
        for (i, key) in order.into_iter().enumerate() {
            positions.entry(key).or_default().push(i);
        }
        Self { positions, cursor: 0 }
    }

    /// The first position of `key` at or after the cursor.
    fn next_position(&self, key: &ShardKey) -> Option<usize> {
        let positions = self.positions.get(key)?;
        let at = positions.partition_point(|&p| p < self.cursor);
        positions.get(at).copied()
    }
}

/// The plans of the jobs reading through this cache.
#[derive(Debug, Default)]
pub struct Plans {
    jobs: Mutex<HashMap<String, JobPlan>>,
    /// Any plan at all: reads skip the lock while there is none.
    any: AtomicBool,
}

impl Plans {
    fn jobs(&self) -> MutexGuard<'_, HashMap<String, JobPlan>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `job`'s plan (`order`: shards in planned read order); an empty order
    /// withdraws it. Returns the distinct shards it names.
    pub fn set(&self, job: &str, order: Vec<ShardKey>) -> usize {
        let mut jobs = self.jobs();
        let distinct = if order.is_empty() {
            jobs.remove(job);
            0
        } else {
            let plan = JobPlan::new(order);
            let distinct = plan.positions.len();
            jobs.insert(job.to_owned(), plan);
            distinct
        };
        self.any.store(!jobs.is_empty(), Relaxed);
        distinct
    }

    /// A client read `dataset/shard`: jobs that planned it a little ahead move their
    /// cursors there.
    pub fn read(&self, dataset: &str, shard: &str) {
        if !self.any.load(Relaxed) {
            return;
        }
        let key = (dataset.to_owned(), shard.to_owned());
        for plan in self.jobs().values_mut() {
            if let Some(at) = plan.next_position(&key).filter(|&p| p - plan.cursor <= CURSOR_REACH) {
                plan.cursor = at;
            }
        }
    }

    /// How many plan positions away `key`'s next planned read is, over all jobs; `None`
    /// when no plan reads it again.
    pub fn next_use(&self, key: &ShardKey) -> Option<usize> {
        if !self.any.load(Relaxed) {
            return None;
        }
        self.jobs().values().filter_map(|plan| plan.next_position(key).map(|p| p - plan.cursor)).min()
    }

    /// Whether any job has a plan.
    pub fn any(&self) -> bool {
        self.any.load(Relaxed)
    }
}

/// Eviction order: which of two cached shards to evict first. Shards no plan reads
/// again go first, least recently used first (`last_access`); then planned ones,
/// furthest next use first.
pub fn evict_before(a: (Option<usize>, u64), b: (Option<usize>, u64)) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a.0, b.0) {
        (None, None) => a.1.cmp(&b.1),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => y.cmp(&x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> ShardKey {
        ("ds".into(), format!("s{i}"))
    }

    /// Misses of `sequence` with a cache of `capacity` shards that evicts by the plan:
    /// the plan is the sequence itself, the cursor moved by each read.
    fn misses_by_plan(sequence: &[u32], capacity: usize) -> usize {
        let plans = Plans::default();
        plans.set("job", sequence.iter().map(|&i| key(i)).collect());
        let (mut cached, mut misses) = (Vec::<u32>::new(), 0);
        for &item in sequence {
            plans.read("ds", &format!("s{item}"));
            if cached.contains(&item) {
                continue;
            }
            misses += 1;
            if cached.len() == capacity {
                let victim = cached
                    .iter()
                    .copied()
                    .min_by(|&a, &b| {
                        evict_before((plans.next_use(&key(a)), a as u64), (plans.next_use(&key(b)), b as u64))
                    })
                    .unwrap_or_default();
                cached.retain(|&c| c != victim);
            }
            cached.push(item);
        }
        misses
    }

    /// The fewest misses any eviction choice can have (exhaustive search).
    fn misses_optimal(sequence: &[u32], capacity: usize, cached: Vec<u32>) -> usize {
        let Some((&item, rest)) = sequence.split_first() else { return 0 };
        if cached.contains(&item) {
            return misses_optimal(rest, capacity, cached);
        }
        if cached.len() < capacity {
            let mut next = cached;
            next.push(item);
            return 1 + misses_optimal(rest, capacity, next);
        }
        (0..cached.len())
            .map(|evict| {
                let mut next = cached.clone();
                next[evict] = item;
                1 + misses_optimal(rest, capacity, next)
            })
            .min()
            .unwrap_or(0)
    }

    #[test]
    fn evicting_by_the_plan_misses_as_little_as_the_best_choice_can() {
        let mut seed = 17u64;
        for case in 0..60 {
            let (items, len, capacity) = (3 + case % 4, 8 + case % 7, 2 + case % 3);
            let sequence: Vec<u32> = (0..len)
                .map(|_| {
                    seed =
                        seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    ((seed >> 33) % items as u64) as u32
                })
                .collect();
            let optimal = misses_optimal(&sequence, capacity, Vec::new());
            assert_eq!(misses_by_plan(&sequence, capacity), optimal, "{sequence:?} with room for {capacity}");
        }
    }

    #[test]
    fn reshuffled_epochs_keep_a_stable_set_where_lru_keeps_nothing() {
        // Two epochs over 8 shards with room for 4, the second in the same order (the
        // worst case for LRU, which misses all 16): the plan keeps shards 0-2 and 7
        // through the first epoch, so the second misses only 3-6.
        let epoch: Vec<u32> = (0..8).collect();
        let sequence: Vec<u32> = epoch.iter().chain(&epoch).copied().collect();
        assert_eq!(misses_by_plan(&sequence, 4), 8 + 4);
        assert_eq!(misses_optimal(&sequence, 4, Vec::new()), 8 + 4);
    }

    #[test]
    fn cursors_follow_reads_a_little_ahead_and_plans_are_per_job() {
        let plans = Plans::default();
        assert_eq!(plans.next_use(&key(1)), None, "no plan: no next use");
        plans.set("a", [0, 1, 2, 3, 1].iter().map(|&i| key(i)).collect());
        plans.set("b", [3, 2].iter().map(|&i| key(i)).collect());
        assert_eq!(plans.next_use(&key(1)), Some(1));
        assert_eq!(plans.next_use(&key(3)), Some(0), "job b reads it first");
        plans.read("ds", "s2"); // job a reaches position 2, job b position 1
        assert_eq!(plans.next_use(&key(1)), Some(2), "its second read in a's plan");
        assert_eq!(plans.next_use(&key(0)), None, "a read it already, b never will");
        plans.set("a", Vec::new());
        assert_eq!(plans.next_use(&key(1)), None, "withdrawn");
    }
}
