//! Whether a member (a spoke of a group, a peer, a hub) is worth asking now, and how long
//! to wait for it before asking the next one.
//!
//! - [`Backoff`]: pauses that double while failures go on (1 s to 30 s), the one backoff
//!   of the project (members, peers, hubs, the spoke's revalidation).
//! - [`Health`]: a member's failures (a call failed as an unwell member's would: paused,
//!   and a health check that says SERVING ends the pause early), its demotion (its hedges
//!   keep losing: paused for a backoff even while its health check says SERVING, the
//!   gray failure; then on probation, asked by one call at a time until one answers
//!   first), and its recent answer times, from which its hedge delay is learned.

use std::{
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU32, AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

/// First pause after a failure, and the longest: a member that is down is asked about
/// once a second at first, then at most twice a minute.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Hedge races lost in a row that demote a member: one lost race is noise (a GC pause, a
/// busy disk), three in a row is a member that answers health checks but not reads.
pub const DEMOTE_AFTER: u32 = 3;

/// How long the one call a member on probation gets may take before another call may
/// try it: a call that was given the member and then dropped must not end its probes.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Hedges a member's slow calls may send, in thousandths of the calls it is asked first, and
/// at most this many saved up: gRPC's hedging is throttled the same way (a token bucket
/// per server, `retryThrottling`), so a healthy group whose cold reads often outlast
/// twice their p95 sends a few hedges, not one call in six (`group-bench`,
/// BENCHMARKS.md). A member that has lost a race since it last won one, or is on
/// probation, is hedged whenever its delay passes: that is a gray failure being found.
pub const HEDGE_SHARE_PER_MILLE: u32 = 50;
pub const HEDGE_BURST: u32 = 10;

/// Answer times kept per member for its hedge delay.
const LATENCY_SAMPLES: usize = 64;
/// Answers needed before the learned delay replaces the policy's initial one.
const MIN_SAMPLES: usize = 8;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Pauses that double while failures go on in a row.
#[derive(Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    /// Until when, and the last pause; `None` once reset.
    state: Mutex<Option<(Instant, Duration)>>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(FIRST_BACKOFF, MAX_BACKOFF)
    }
}

impl Backoff {
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, state: Mutex::new(None) }
    }

    /// Another failure: pauses for twice the last pause (the first one after a reset),
    /// at most the maximum; returns the pause.
    pub fn fail(&self) -> Duration {
        let mut state = lock(&self.state);
        let pause = state.map_or(self.first, |(_, last)| (last * 2).min(self.max));
        *state = Some((Instant::now() + pause, pause));
        pause
    }

    /// True while paused.
    pub fn paused(&self) -> bool {
        lock(&self.state).is_some_and(|(until, _)| Instant::now() < until)
    }

    /// Failed since the last reset (paused or not).
    pub fn is_set(&self) -> bool {
        lock(&self.state).is_some()
    }

    /// Ends the failures: the next one pauses for the first pause again. Returns whether
    /// there were any.
    pub fn reset(&self) -> bool {
        lock(&self.state).take().is_some()
    }

    /// When the pause ends, if paused.
    pub fn until(&self) -> Option<Instant> {
        lock(&self.state).map(|(until, _)| until).filter(|&until| Instant::now() < until)
    }
}

/// How long to wait for a member before asking the next one as well (a hedged request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgePolicy {
    /// Never hedge sooner than this, whatever the member's answer times.
    pub floor: Duration,
    /// The delay until the member has answered enough calls to learn from.
    pub initial: Duration,
}

impl HedgePolicy {
    /// A trainer's calls to the spokes of a group: another spoke costs the long link
    /// nothing (it reads the shard from its owner), so hedge early.
    pub const MEMBERS: Self = Self { floor: Duration::from_millis(50), initial: Duration::from_millis(500) };
    /// A spoke's calls to its peers and hubs: a hedge there may bring a chunk over the long
    /// link a second time, so only a member far slower than a cold fetch across a 60 ms
    /// link (a chunk queued behind 64 MiB at 2 Gbit/s is ~300 ms) is hedged.
    pub const UPSTREAM: Self = Self { floor: Duration::from_secs(1), initial: Duration::from_secs(2) };
}

/// A member's health as its calls have gone.
#[derive(Debug, Default)]
pub struct Health {
    /// Calls failed as an unwell member's (down, unreachable, shedding, garbled).
    failures: Backoff,
    /// Hedge races lost in a row ([`DEMOTE_AFTER`] demote it).
    lost: AtomicU32,
    /// Demoted for losing its hedge races: only time ends this pause. Set and no longer
    /// paused: on probation, until a call it answers first resets it.
    demotion: Backoff,
    /// When the call that may try a member on probation was given it.
    probe: Mutex<Option<Instant>>,
    latencies: Mutex<Latencies>,
    /// The learned hedge delay in microseconds (0: not learned yet).
    learned_micros: AtomicU64,
    /// Thousandths of the hedges its slow calls may send now
    /// ([`HEDGE_SHARE_PER_MILLE`]); `None` until first asked (a full [`HEDGE_BURST`]).
    hedge_tokens: Mutex<Option<u32>>,
}

#[derive(Debug, Default)]
struct Latencies {
    /// Microseconds, a ring of the last [`LATENCY_SAMPLES`] answers.
    ring: Vec<u32>,
    next: usize,
    seen: u64,
}

impl Health {
    /// Worth asking now: not paused after failures, not demoted, not on probation after
    /// a demotion (see [`Health::try_probe`]).
    pub fn is_live(&self) -> bool {
        !self.failures.paused() && !self.demotion.paused() && !self.on_probation()
    }

    /// Demoted once and its pause over, not yet proven well by an answer.
    fn on_probation(&self) -> bool {
        self.demotion.is_set() && !self.demotion.paused()
    }

    /// A member on probation is worth asking for one call at a time: the caller that
    /// gets `true` holds its probe, to be spent on a call that asks it first (a gray
    /// member that still hangs then costs one call a hedge delay, not every call made
    /// while it was thought well).
    pub fn try_probe(&self) -> bool {
        if self.failures.paused() || !self.on_probation() {
            return false;
        }
        let mut probe = lock(&self.probe);
        if probe.is_some_and(|given| given.elapsed() < PROBE_TIMEOUT) {
            return false;
        }
        *probe = Some(Instant::now());
        true
    }

    /// It failed and has not answered since (a health check may bring it back).
    pub fn has_failed(&self) -> bool {
        self.failures.is_set()
    }

    /// Demoted now for losing its hedge races.
    pub fn is_demoted(&self) -> bool {
        self.demotion.paused()
    }

    /// Failed, demoted or on probation, and not proven well since: a member a client
    /// skips, or tries with one call at a time.
    pub fn is_suspect(&self) -> bool {
        self.has_failed() || self.demotion.is_set()
    }

    /// A call failed as a down member's would: skip it for a while, longer each time.
    pub fn failed(&self) {
        self.failures.fail();
        lock(&self.probe).take();
    }

    /// A call was answered after `elapsed` (whatever the answer).
    /// Also ends a demotion's probation: it answered first.
    pub fn answered(&self, elapsed: Duration) {
        self.failures.reset();
        if self.on_probation() {
            self.won_race();
        }
        let mut latencies = lock(&self.latencies);
        let micros = elapsed.as_micros().min(u128::from(u32::MAX)) as u32;
        if latencies.ring.len() < LATENCY_SAMPLES {
            latencies.ring.push(micros);
        } else {
            let at = latencies.next;
            latencies.ring[at] = micros;
        }
        latencies.next = (latencies.next + 1) % LATENCY_SAMPLES;
        latencies.seen += 1;
        // The p95 is recomputed every few answers: a sort of 64 numbers per read would
        // be most of a warm read's cost.
        if latencies.ring.len() >= MIN_SAMPLES && latencies.seen.is_multiple_of(4) {
            let mut sorted = latencies.ring.clone();
            let at = (sorted.len() * 95).div_ceil(100) - 1;
            let (_, p95, _) = sorted.select_nth_unstable(at);
            self.learned_micros.store(u64::from(*p95) * 2, Relaxed);
        }
    }

    /// A health check said SERVING: the failures' pause ends (a demotion does not: such
    /// a member answers health checks and still hangs on reads), and so does the
    /// probation of a member that failed since its demotion (down, then back: a new
    /// process, not the gray one).
    pub fn serving_again(&self) -> bool {
        let failed = self.failures.reset();
        if failed && self.on_probation() {
            self.demotion.reset();
            self.lost.store(0, Relaxed);
        }
        failed
    }

    /// It answered before the hedge sent after it did.
    pub fn won_race(&self) {
        self.lost.store(0, Relaxed);
        self.demotion.reset();
        lock(&self.probe).take();
    }

    /// Demoted at once: it left a call unanswered for good (a join it never answered,
    /// `spoke-cache`'s `Chain::join_owner`), which no slow member does. Returns the pause.
    pub fn demote(&self) -> Duration {
        lock(&self.probe).take();
        self.lost.store(0, Relaxed);
        self.demotion.fail()
    }

    /// A hedge sent after it answered first. Returns the demotion's pause when this
    /// loss demotes it: the third in a row, or the first on probation. Races lost while
    /// it is demoted were started before (the calls in flight when it was): they are the
    /// same finding, and do not lengthen the pause (64 calls in flight to a member that
    /// hung took its pause from 1 s to 30 s in one second).
    pub fn lost_race(&self) -> Option<Duration> {
        if self.demotion.paused() {
            return None;
        }
        lock(&self.probe).take();
        let on_probation = self.on_probation();
        let lost = self.lost.fetch_add(1, Relaxed) + 1;
        if lost < DEMOTE_AFTER && !on_probation {
            return None;
        }
        self.lost.store(0, Relaxed);
        Some(self.demotion.fail())
    }

    /// How long to wait for this member before hedging: twice the p95 of its recent
    /// answer times, at least `policy.floor`; `policy.initial` until it has answered
    /// enough calls.
    pub fn hedge_delay(&self, policy: &HedgePolicy) -> Duration {
        self.learned_delay().unwrap_or(policy.initial).max(policy.floor)
    }

    /// Twice the p95 of its recent answer times, once it has answered enough calls.
    pub fn learned_delay(&self) -> Option<Duration> {
        match self.learned_micros.load(Relaxed) {
            0 => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    /// A call asked it first: it earns [`HEDGE_SHARE_PER_MILLE`] thousandths of a hedge.
    pub fn asked(&self) {
        let mut tokens = lock(&self.hedge_tokens);
        *tokens =
            Some((tokens.unwrap_or(HEDGE_BURST * 1000) + HEDGE_SHARE_PER_MILLE).min(HEDGE_BURST * 1000));
    }

    /// Lost a race since it last won one, or suspect ([`Health::is_suspect`]): a member
    /// whose slow calls are hedged whatever the budget.
    pub fn is_losing(&self) -> bool {
        self.lost.load(Relaxed) > 0 || self.is_suspect()
    }

    /// Whether a call it has not answered in time may be hedged now (spending one of its
    /// hedges): within its share of hedges, or always while it is losing
    /// ([`Health::is_losing`]; a call sent to it before it was demoted is hedged too:
    /// with the budget spent by the races that demoted it, such calls waited for their
    /// deadline, a spoke's calls to a gray peer 10 s).
    pub fn may_hedge(&self) -> bool {
        if self.is_losing() {
            return true;
        }
        let mut tokens = lock(&self.hedge_tokens);
        let left = tokens.unwrap_or(HEDGE_BURST * 1000);
        if left < 1000 {
            return false;
        }
        *tokens = Some(left - 1000);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_a_reset_ends_it() {
        let backoff = Backoff::default();
        assert!(!backoff.paused() && !backoff.is_set());
        assert_eq!(backoff.fail(), FIRST_BACKOFF);
        assert!(backoff.paused());
        let pauses: Vec<Duration> = (0..8).map(|_| backoff.fail()).collect();
        assert_eq!(pauses[0], FIRST_BACKOFF * 2);
        assert_eq!(*pauses.last().unwrap(), MAX_BACKOFF, "capped");
        assert!(backoff.reset());
        assert!(!backoff.paused());
        assert_eq!(backoff.fail(), FIRST_BACKOFF, "from the first pause again");
    }

    #[test]
    fn failures_pause_a_member_and_a_health_check_ends_the_pause() {
        let health = Health::default();
        assert!(health.is_live());
        health.failed();
        assert!(!health.is_live() && health.has_failed());
        assert!(health.serving_again());
        assert!(health.is_live() && !health.has_failed());
    }

    #[test]
    fn losing_hedges_demotes_a_member_that_health_checks_cannot_revive() {
        let first = Duration::from_millis(50);
        let health = Health { demotion: Backoff::new(first, MAX_BACKOFF), ..Health::default() };
        assert_eq!(health.lost_race(), None);
        health.won_race();
        assert_eq!(health.lost_race(), None, "a won race starts the count again");
        assert_eq!(health.lost_race(), None);
        assert_eq!(health.lost_race(), Some(first), "three lost in a row");
        assert!(!health.is_live() && health.is_demoted());
        health.serving_again();
        assert!(!health.is_live(), "SERVING does not end a demotion");
        assert!(health.is_suspect());
        for _ in 0..10 {
            assert_eq!(health.lost_race(), None, "calls sent before the demotion lose too: no longer pause");
        }
        std::thread::sleep(first + Duration::from_millis(10));
        assert_eq!(health.lost_race(), Some(first * 2), "on probation, demoted again and longer");
        health.won_race();
        assert!(health.is_live());
    }

    #[test]
    fn after_a_demotion_one_call_at_a_time_tries_the_member_until_one_answers_first() {
        let health =
            Health { demotion: Backoff::new(Duration::from_millis(300), MAX_BACKOFF), ..Health::default() };
        for _ in 0..DEMOTE_AFTER {
            health.lost_race();
        }
        assert!(!health.is_live(), "demoted");
        std::thread::sleep(Duration::from_millis(350));
        assert!(!health.is_live(), "on probation: not asked as a live member");
        assert!(health.try_probe(), "the first caller gets its one call");
        assert!(!health.try_probe() && !health.try_probe(), "the others do not while that call runs");
        assert_eq!(
            health.lost_race(),
            Some(Duration::from_millis(600)),
            "a probe that loses demotes at once"
        );
        assert!(!health.is_live() && !health.try_probe());
        std::thread::sleep(Duration::from_millis(650));
        assert!(health.try_probe(), "probation again");
        health.answered(Duration::from_millis(1));
        assert!(
            health.is_live() && !health.try_probe(),
            "an answer ends the probation: every call may ask it"
        );
        assert!(!health.is_demoted());
    }

    #[test]
    fn a_demoted_member_that_went_down_and_came_back_is_well_again_once_it_says_serving() {
        let health =
            Health { demotion: Backoff::new(Duration::from_millis(1), MAX_BACKOFF), ..Health::default() };
        for _ in 0..DEMOTE_AFTER {
            health.lost_race();
        }
        std::thread::sleep(Duration::from_millis(5));
        assert!(health.is_suspect() && !health.is_live(), "on probation");
        health.serving_again();
        assert!(health.is_suspect(), "a gray member says SERVING too: still on probation");
        health.failed();
        health.serving_again();
        assert!(health.is_live() && !health.is_suspect(), "down, then back: a new process");
    }

    #[test]
    fn hedges_are_a_share_of_the_calls_except_for_a_suspect_member() {
        let health = Health::default();
        let sent = (0..100).filter(|_| health.may_hedge()).count();
        assert_eq!(sent, HEDGE_BURST as usize, "a burst saved up, then nothing");
        for _ in 0..100 {
            health.asked();
        }
        let sent = (0..100).filter(|_| health.may_hedge()).count();
        assert_eq!(sent, (100 * HEDGE_SHARE_PER_MILLE / 1000) as usize, "a share of the calls asked");
        assert!(health.lost_race().is_none());
        assert!((0..10).all(|_| health.may_hedge()), "a member that lost a race is hedged whenever slow");
        health.won_race();
        assert!(!health.may_hedge(), "and within its share again once it wins one");
        health.demote();
        assert!((0..10).all(|_| health.may_hedge()), "a demoted member's calls still in flight are hedged");
        health.won_race();
        health.failed();
        assert!(health.may_hedge(), "and a failed one's");
    }

    #[test]
    fn the_hedge_delay_is_twice_the_recent_p95_above_the_floor() {
        let policy = HedgePolicy { floor: Duration::from_millis(5), initial: Duration::from_millis(300) };
        let health = Health::default();
        assert_eq!(health.hedge_delay(&policy), policy.initial, "nothing learned yet");
        // 100 answers: 95 of 1-19 ms... the slowest 5% at 100 ms.
        for i in 0..100u64 {
            let ms = if i % 20 == 19 { 100 } else { 1 + i % 19 };
            health.answered(Duration::from_millis(ms));
        }
        let delay = health.hedge_delay(&policy);
        assert!(delay >= Duration::from_millis(30) && delay <= Duration::from_millis(250), "{delay:?}");
        let fast = Health::default();
        for _ in 0..16 {
            fast.answered(Duration::from_micros(300));
        }
        assert_eq!(fast.hedge_delay(&policy), policy.floor, "never under the floor");
    }
}
