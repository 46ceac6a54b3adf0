//! A group of spokes: which member owns a shard, and which members are answering.
//!
//! Ownership is rendezvous (highest-random-weight) hashing, as AIStore places objects:
//! every (member, dataset, shard) gets a score from a hash, and the shard's members in
//! score order are its owner, then the next to try. Anyone with the same member list
//! computes the same order, with nothing shared; a member leaving moves only the shards
//! it owned (each to its next member), a member joining takes about 1/N of them.
//! Weighted by capacity: score = weight / -ln(u), u the hash mapped into (0, 1)
//! (Schindelhauer and Schomaker's weighted rendezvous), so a member with twice the
//! weight owns twice the shards.
//!
//! Health: a member that failed a call (it is down, unreachable, or shedding) is skipped
//! until it answers a gRPC health check (asked every 500 ms: `members::probe_failed`) or
//! its pause ends (1 s, doubling to 30 s while it keeps failing); when every member is
//! skipped, they are tried anyway, in order.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// First pause of a member that failed.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// FNV-1a over the pieces, with a separator byte between them, then the splitmix64
/// finaliser: stable across builds and platforms (std's hasher is not promised to be),
/// and well mixed in every bit.
fn hash(pieces: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, piece) in pieces.iter().enumerate() {
        for &b in piece.as_bytes().iter().chain(std::iter::once(&(i as u8 ^ 0xff))) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Member `name`'s score for `dataset/shard` with `weight`.
fn score(name: &str, weight: f64, dataset: &str, shard: &str) -> f64 {
    // The top 53 bits as a float in (0, 1): never 0, never 1.
    let u = ((hash(&[name, dataset, shard]) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    weight / -u.ln()
}

/// The members (`(name, weight)`) in the order they own `dataset/shard`: the owner
/// first. Ties (equal scores) go to the earlier member.
pub fn rendezvous(members: &[(&str, f64)], dataset: &str, shard: &str) -> Vec<usize> {
    let mut scored: Vec<(f64, usize)> = members
        .iter()
        .enumerate()
        .map(|(i, &(name, weight))| (score(name, weight, dataset, shard), i))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().map(|(_, i)| i).collect()
}

/// Whether a member is answering, from how its calls went.
#[derive(Debug, Default)]
pub struct Health {
    state: Mutex<Option<(Instant, Duration)>>,
}

impl Health {
    /// Not skipped now: it answered last time, or its pause is over.
    pub fn is_live(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.is_none_or(|(until, _)| Instant::now() >= until)
    }

    /// A call failed as a down member's would: skip it for a while, longer each time.
    pub fn failed(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let pause = state.map_or(FIRST_BACKOFF, |(_, last)| (last * 2).min(MAX_BACKOFF));
        *state = Some((Instant::now() + pause, pause));
    }

    /// It failed and has not answered since.
    pub fn has_failed(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// A call (or a health check) succeeded.
    pub fn answered(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *state = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("http://spoke-{i}.spokes:7071")).collect()
    }

    fn owners(names: &[String], weights: &[f64], shards: usize) -> Vec<usize> {
        let members: Vec<(&str, f64)> =
            names.iter().map(String::as_str).zip(weights.iter().copied()).collect();
        (0..shards).map(|s| rendezvous(&members, "c4", &format!("shard-{s:05}.bin"))[0]).collect()
    }

    #[test]
    fn placement_is_stable_and_balanced_within_ten_percent() {
        let shards = 20_000;
        for n in 3..=5 {
            let names = members(n);
            let placed = owners(&names, &vec![1.0; n], shards);
            assert_eq!(placed, owners(&names, &vec![1.0; n], shards), "the same list, the same owners");
            let fair = shards as f64 / n as f64;
            for member in 0..n {
                let owned = placed.iter().filter(|&&o| o == member).count() as f64;
                assert!((owned - fair).abs() / fair < 0.10, "{n} members: member {member} owns {owned}");
            }
        }
    }

    #[test]
    fn a_change_moves_about_one_nth_and_only_to_or_from_the_changed_member() {
        let shards = 20_000;
        let four = members(4);
        let before = owners(&four, &[1.0; 4], shards);
        // Member 2 leaves: only its shards move.
        let three: Vec<String> =
            four.iter().enumerate().filter(|&(i, _)| i != 2).map(|(_, m)| m.clone()).collect();
        let after = owners(&three, &[1.0; 3], shards);
        let index_in_four = |i: usize| if i >= 2 { i + 1 } else { i };
        let moved = before.iter().zip(&after).filter(|&(&b, &a)| b != index_in_four(a)).count();
        assert!(
            before.iter().zip(&after).all(|(&b, &a)| b == 2 || b == index_in_four(a)),
            "only member 2's moved"
        );
        assert!((moved as f64 / shards as f64 - 0.25).abs() < 0.03, "{moved} moved of {shards}");
        // A fifth joins: it takes about 1/5, from everyone.
        let five = members(5);
        let joined = owners(&five, &[1.0; 5], shards);
        let taken = before.iter().zip(&joined).filter(|&(&b, &j)| b != j).count();
        assert!(
            before.iter().zip(&joined).all(|(&b, &j)| b == j || j == 4),
            "shards move only to the new member"
        );
        assert!((taken as f64 / shards as f64 - 0.20).abs() < 0.03, "{taken} moved to the new member");
    }

    #[test]
    fn weights_give_shares_in_proportion() {
        let names = members(3);
        let placed = owners(&names, &[2.0, 1.0, 1.0], 20_000);
        let share = placed.iter().filter(|&&o| o == 0).count() as f64 / 20_000.0;
        assert!((share - 0.5).abs() < 0.03, "twice the weight, half the shards of 3: {share}");
    }

    #[test]
    fn failed_members_are_skipped_then_tried_again() {
        let health = Health::default();
        assert!(health.is_live());
        health.failed();
        assert!(!health.is_live(), "paused after a failure");
        health.answered();
        assert!(health.is_live());
    }
}
