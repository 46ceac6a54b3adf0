//! The plans against the best possible eviction, cursors, blocks and stragglers.
use super::*;
use crate::policy::keep::{self, Claim, NextUse};

fn key(i: u32) -> ShardKey {
    ("ds".into(), format!("s{i}"))
}

fn planned(i: u32, first: usize, until: usize) -> Planned {
    Planned { key: key(i), at: Use { first, until }, size: 1, epoch: 0 }
}

/// A plan reading `shards` one after another, each 1 byte.
fn in_order(shards: &[u32]) -> Vec<Planned> {
    shards.iter().enumerate().map(|(at, &i)| planned(i, at, at)).collect()
}

/// Misses of `sequence` with a cache of `capacity` shards that evicts by the plan:
/// the plan is the sequence itself, the cursor moved by each read.
fn misses_by_plan(sequence: &[u32], capacity: usize) -> usize {
    let plans = ShardPlans::default();
    plans.set("", "job", in_order(sequence), u64::MAX).expect("within the bounds");
    let (mut cached, mut misses) = (Vec::<u32>::new(), 0);
    for &item in sequence {
        plans.read("ds", &format!("s{item}"), "", None);
        if cached.contains(&item) {
            continue;
        }
        misses += 1;
        if cached.len() == capacity {
            let victim = cached
                .iter()
                .copied()
                .min_by(|&a, &b| {
                    let claim = |i: u32| Claim {
                        next_use: NextUse::of_shard(plans.next_use(&key(i))),
                        last_access: u64::from(i),
                    };
                    keep::before(&claim(a), &claim(b))
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
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
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
    let plans = ShardPlans::default();
    assert_eq!(plans.next_use(&key(1)), None, "no plan: no next use");
    plans.set("", "a", in_order(&[0, 1, 2, 3, 1]), u64::MAX).expect("within the bounds");
    plans.set("", "b", in_order(&[3, 2]), u64::MAX).expect("within the bounds");
    assert_eq!(plans.next_use(&key(1)), Some(1));
    assert_eq!(plans.next_use(&key(3)), Some(0), "job b reads it first");
    plans.read("ds", "s2", "", None); // job a reaches position 2, job b position 1
    assert_eq!(plans.next_use(&key(1)), Some(2), "its second read in a's plan");
    assert_eq!(plans.next_use(&key(0)), None, "a read it already, b never will");
    plans.set("", "a", Vec::new(), u64::MAX).expect("within the bounds");
    assert_eq!(plans.next_use(&key(1)), None, "withdrawn");
}

#[test]
fn shards_read_together_stay_in_use_until_their_last_read() {
    // A block of three shards read together (each in use until position 2), then
    // shard 3 alone; the next epoch reads 0 first.
    let plans = ShardPlans::default();
    plans
        .set(
            "",
            "job",
            vec![planned(0, 0, 2), planned(1, 1, 2), planned(2, 2, 2), planned(3, 3, 3), planned(0, 4, 4)],
            u64::MAX,
        )
        .expect("within the bounds");
    plans.read("ds", "s0", "", None);
    plans.read("ds", "s2", "", None); // the cursor reaches the block's last shard
    for i in 0..3 {
        assert_eq!(plans.next_use(&key(i)), Some(0), "shard {i} is still being read");
    }
    plans.read("ds", "s0", "", None); // a read inside its use does not move the cursor
    assert_eq!(plans.next_use(&key(3)), Some(1));
    let names = |listed: Vec<Upcoming>| listed.into_iter().map(|u| u.key.1).collect::<Vec<_>>();
    plans.answered([("ds", "s0")]);
    assert_eq!(names(plans.upcoming(PlanWindow::Bytes(10))), ["s0", "s1", "s2", "s3"], "in use, then ahead");
    assert_eq!(names(plans.upcoming(PlanWindow::Bytes(0))), ["s0", "s1", "s2"], "what is being read, always");
    assert_eq!(
        names(plans.upcoming(PlanWindow::Blocks)),
        ["s0", "s1", "s2", "s3"],
        "shard 3 is the next block"
    );
    plans.read("ds", "s3", "", None);
    assert_eq!(plans.next_use(&key(0)), Some(1), "the block is done: shard 0's next use is next epoch");
    assert_eq!(plans.next_use(&key(1)), None);
}

#[test]
fn the_window_is_the_block_being_read_and_the_next_one() {
    // Blocks of three shards (each in use until the block's last position), then
    // blocks of two.
    let plans = ShardPlans::default();
    let blocks = [(0, 2), (1, 2), (2, 2), (3, 4), (4, 4), (5, 6), (6, 6)];
    plans
        .set(
            "",
            "job",
            blocks.iter().map(|&(i, until)| planned(i, i as usize, until)).collect::<Vec<_>>(),
            u64::MAX,
        )
        .expect("within the bounds");
    let names = |listed: Vec<Upcoming>| listed.into_iter().map(|u| u.key.1).collect::<Vec<_>>();
    // Closed until a read of the job is answered: its first reads have the link alone.
    assert!(plans.upcoming(PlanWindow::Blocks).is_empty(), "no window before an answered read");
    plans.answered([("other", "s0")]);
    assert!(
        plans.upcoming(PlanWindow::Blocks).is_empty(),
        "a read of a shard it does not name opens nothing"
    );
    plans.answered([("ds", "s0")]);
    assert_eq!(names(plans.upcoming(PlanWindow::Blocks)), ["s0", "s1", "s2", "s3", "s4"]);
    plans.read("ds", "s1", "", None);
    assert_eq!(names(plans.upcoming(PlanWindow::Blocks)), ["s0", "s1", "s2", "s3", "s4"], "still in block 1");
    plans.read("ds", "s3", "", None);
    assert_eq!(
        names(plans.upcoming(PlanWindow::Blocks)),
        ["s3", "s4", "s5", "s6"],
        "block 1 is done: the window moved on by a block"
    );
    // Without `until`s each shard is its own block: the one being read and the next. (The
    // job's next plan is open already: its window does not wait for another read.)
    plans.set("", "job", in_order(&[7, 8, 9]), u64::MAX).expect("within the bounds");
    plans.read("ds", "s7", "", None);
    assert_eq!(names(plans.upcoming(PlanWindow::Blocks)), ["s7", "s8"]);
}

#[test]
fn a_plan_changed_mid_epoch_is_followed() {
    let plans = ShardPlans::default();
    plans.set("", "job", in_order(&[0, 1, 2, 3]), u64::MAX).expect("within the bounds");
    plans.read("ds", "s0", "", None);
    plans.read("ds", "s1", "", None);
    assert_eq!(plans.next_use(&key(3)), Some(2));
    // The job resumes with another order for the rest of its epoch (say, after a
    // restart with a new world size): the new plan replaces the old, cursor and all.
    plans.set("", "job", in_order(&[3, 2]), u64::MAX).expect("within the bounds");
    assert_eq!(plans.next_use(&key(3)), Some(0));
    assert_eq!(plans.next_use(&key(2)), Some(1));
    assert_eq!(plans.next_use(&key(1)), None, "not in the new plan");
    plans.read("ds", "s2", "", None);
    assert_eq!(plans.next_use(&key(3)), None, "read before the cursor's position, done");
}

#[test]
fn stragglers_are_told_apart_and_do_not_move_the_cursor() {
    // Two epochs of 8 shards, the second in the same order (from position 8); each
    // shard read whole, its own block.
    let plans = ShardPlans::default();
    let mut order = in_order(&[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7]);
    for planned in &mut order[8..] {
        planned.epoch = 1;
    }
    plans.set("", "job/rank0/worker1", order, u64::MAX).expect("within the bounds");
    assert!(!plans.read("ds", "s4", "", Some("job")), "the reads move the cursor");
    assert_eq!(plans.next_use(&key(3)), Some(7), "shard 3 is done");
    // A slower reader still reads shard 3 (the block before the cursor's): a
    // straggler's read, to its own job; the cursor stays.
    assert!(plans.read("ds", "s3", "", Some("job")), "a straggler's");
    assert!(!plans.read("ds", "s3", "", Some("other")), "another job's plan says nothing of it");
    assert!(!plans.read("ds", "s3", "", None), "nor of an untagged read");
    assert_eq!(plans.next_use(&key(5)), Some(1), "the cursor stayed");
    assert_eq!(plans.next_use(&key(3)), Some(7), "and the shard stays done: its room is for what comes next");
    assert_eq!(plans.progress()[0].lag, 1, "how far behind stragglers read is reported");
    // Further behind: out of order, not a straggler's; and not the next epoch's start
    // while this epoch has blocks to go.
    assert!(!plans.read("ds", "s1", "", Some("job")));
    assert_eq!(plans.next_use(&key(5)), Some(1), "the cursor stayed");
    // From the epoch's last block, a read of the next epoch's first shard moves on.
    plans.read("ds", "s7", "", Some("job"));
    assert!(!plans.read("ds", "s0", "", Some("job")));
    assert_eq!(plans.next_use(&key(1)), Some(1), "the cursor is at the next epoch's start");
}

#[test]
fn plans_are_their_principals_own_and_bounded_per_principal_and_in_all() {
    let limits = PlanLimits {
        plans_per_principal: 2,
        positions_per_principal: 6,
        plans: 3,
        positions: 10,
        ..PlanLimits::default()
    };
    let plans = ShardPlans::new(limits);
    plans.set("alice", "train", in_order(&[0, 1, 2]), u64::MAX).expect("within the bounds");
    // Bob's "train" is his own: it neither replaces nor withdraws Alice's.
    plans.set("bob", "train", in_order(&[5]), u64::MAX).expect("within the bounds");
    plans.set("bob", "train", Vec::new(), u64::MAX).expect("withdrawing is always allowed");
    assert_eq!(plans.next_use(&key(1)), Some(1), "alice's plan is still there");
    let owners: Vec<_> = plans.progress().into_iter().map(|p| (p.principal, p.job)).collect();
    assert_eq!(owners, [("alice".to_owned(), "train".to_owned())]);
    // A straggler's read is one only to the reader's own plan.
    plans.read("ds", "s1", "alice", Some("train"));
    assert!(plans.read("ds", "s0", "alice", Some("train")), "alice's straggler");
    assert!(!plans.read("ds", "s0", "bob", Some("train")), "bob has no plan named train");

    // Replacing a plan does not count the plan it replaces.
    plans
        .set("alice", "train", in_order(&[0, 1, 2, 3, 4, 5]), u64::MAX)
        .expect("6 positions, the principal's bound");
    let refused = plans.set("alice", "eval", in_order(&[7]), u64::MAX).unwrap_err();
    assert_eq!(refused.flag, "--max-plan-positions-per-principal", "{refused}");
    assert_eq!((refused.would, refused.limit), (7, 6));
    plans.set("alice", "train", in_order(&[0, 1]), u64::MAX).expect("smaller");
    plans.set("alice", "eval", in_order(&[7]), u64::MAX).expect("room now");
    let refused = plans.set("alice", "third", in_order(&[8]), u64::MAX).unwrap_err();
    assert_eq!(refused.flag, "--max-plans-per-principal", "{refused}");
    assert!(refused.to_string().contains("principal \"alice\""), "{refused}");
    plans.set("bob", "a", in_order(&[9]), u64::MAX).expect("bob has his own room");
    let refused = plans.set("carol", "a", in_order(&[9]), u64::MAX).unwrap_err();
    assert_eq!(refused.flag, "--max-plans", "the spoke's bound: {refused}");
    // A withdrawn plan leaves the index: no shard keeps a next use through it.
    plans.set("alice", "eval", Vec::new(), u64::MAX).expect("withdrawn");
    assert_eq!(plans.next_use(&key(7)), None);
}

#[test]
fn plans_no_read_meets_expire() {
    let idle =
        ShardPlans::new(PlanLimits { idle_expiry: std::time::Duration::ZERO, ..PlanLimits::default() });
    idle.set("alice", "done", in_order(&[0, 1]), u64::MAX).expect("within the bounds");
    assert!(idle.progress().is_empty(), "a plan idle for the expiry is dropped");
    assert_eq!(idle.next_use(&key(1)), None);
    // A read meets a plan and keeps it: expired 1.2 s after it was set, 0.6 s after the
    // read (the margins are the sleeps' overshoot on a loaded machine).
    let second = std::time::Duration::from_millis(1000);
    let kept = ShardPlans::new(PlanLimits { idle_expiry: second, ..PlanLimits::default() });
    kept.set("alice", "running", in_order(&[0, 1]), u64::MAX).expect("within the bounds");
    std::thread::sleep(second * 6 / 10);
    kept.read("ds", "s0", "alice", None);
    std::thread::sleep(second * 6 / 10);
    kept.expire();
    assert_eq!(kept.progress().len(), 1, "the read met the plan less than the expiry ago");
}

#[test]
fn a_plan_whose_block_does_not_fit_two_thirds_of_the_room_is_followed_sample_by_sample() {
    // Blocks of three 1-byte shards: 3 bytes each.
    let blocks =
        || [(0, 2), (1, 2), (2, 2), (3, 5), (4, 5), (5, 5)].map(|(i, until)| planned(i, i as usize, until));
    let plans = ShardPlans::default();
    assert_eq!(
        plans.set("", "fits", blocks().to_vec(), 5).unwrap(),
        (6, false),
        "3 of 5 bytes: shard by shard"
    );
    assert_eq!(
        plans.set("", "big", blocks().to_vec(), 4).unwrap(),
        (6, true),
        "3 of 4 bytes: sample by sample"
    );
    assert_eq!(
        plans.progress().iter().map(|p| (p.job.as_str(), p.samples)).collect::<Vec<_>>(),
        [("big", true), ("fits", false)]
    );
    // Only the plan followed shard by shard prefetches and orders eviction.
    plans.set("", "fits", Vec::new(), 5).unwrap();
    assert_eq!(plans.next_use(&key(0)), None, "no shard's room is held for a plan of samples");
    assert!(plans.upcoming(PlanWindow::Blocks).is_empty(), "and nothing is prefetched whole for it");
}
