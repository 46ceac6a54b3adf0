//! Hedged requests ("The Tail at Scale", Dean and Barroso): a call that a member has not
//! answered within its hedge delay is also sent to the next member; the first answer
//! wins and the other call is cancelled. A member whose races keep being won by the
//! hedge sent after it is demoted (`Health::lost_race`): the gray failure, a member that
//! says SERVING and hangs on reads, costs each call at most one hedge delay and is then
//! skipped for a backoff.

use std::{
    future::Future,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

use futures::{FutureExt, StreamExt, stream::FuturesUnordered};
use tokio::time::Instant;

use super::{Health, HedgePolicy, Judged, Verdict};

/// Calls in flight for one request at most: the first and one hedge.
const MAX_IN_FLIGHT: usize = 2;

/// What hedging did, for metrics and tests.
#[derive(Debug, Default)]
pub struct HedgeCounters {
    /// Hedges sent: calls sent to the next member because one had not answered in time.
    pub sent: AtomicU64,
    /// Hedges whose answer came first.
    pub won: AtomicU64,
    /// Members demoted for losing their races.
    pub demotions: AtomicU64,
}

/// One member a call may go to: its health and its name (for log lines).
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub health: &'a Health,
    pub name: &'a str,
    /// Hedge after this rather than the member's learned delay (a call whose answer is
    /// known to come within it, or not at all).
    pub delay: Option<std::time::Duration>,
}

impl<'a> Candidate<'a> {
    pub fn new(health: &'a Health, name: &'a str) -> Self {
        Self { health, name, delay: None }
    }
}

/// Asks `candidates` in order until one answers: the next one when a call fails (its
/// member unwell or without the answer) or has not answered within its hedge delay
/// (`policy`) while its member's hedge budget allows (`Health::may_hedge`); at most
/// [`MAX_IN_FLIGHT`] calls at once; the first answer wins and the rest are cancelled. `call(i)` asks candidate `i`. Answer times, failures and races go
/// into each candidate's health, hedges into `counters`. `Err(None)`: no candidates.
pub async fn hedged<T, E, F, Fut>(
    candidates: &[Candidate<'_>],
    policy: &HedgePolicy,
    counters: &HedgeCounters,
    call: F,
) -> Result<T, Option<E>>
where
    E: Judged,
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    hedged_relayed(candidates, policy, counters, call, |_| false).await
}

/// [`hedged`], where an answer for which `relayed` is true came from the member asked
/// first through the one that answered (`shardcache_proto::hedge::RELAYED_HEADER`): no
/// race was lost, the member asked first answered.
pub async fn hedged_relayed<T, E, F, Fut>(
    candidates: &[Candidate<'_>],
    policy: &HedgePolicy,
    counters: &HedgeCounters,
    mut call: F,
    relayed: impl Fn(&T) -> bool,
) -> Result<T, Option<E>>
where
    E: Judged,
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut running = FuturesUnordered::new();
    // (candidate, when its call started) of the calls in flight.
    let mut in_flight: Vec<(usize, Instant)> = Vec::new();
    let mut next = 0;
    let mut hedge_at: Option<Instant> = None;
    let mut last_error = None;
    // The hedge budget refused this call a hedge (see the timer below).
    let mut denied = false;
    let mut launch = |i: usize, running: &mut FuturesUnordered<_>, in_flight: &mut Vec<(usize, Instant)>| {
        let now = Instant::now();
        if i == 0 {
            candidates[i].health.asked();
        }
        in_flight.push((i, now));
        running.push(call(i).map(move |result| (i, result)));
        now + candidates[i].delay.unwrap_or_else(|| candidates[i].health.hedge_delay(policy))
    };
    loop {
        if in_flight.is_empty() {
            if next >= candidates.len() {
                return Err(last_error);
            }
            hedge_at = Some(launch(next, &mut running, &mut in_flight));
            next += 1;
        }
        let can_hedge = next < candidates.len() && in_flight.len() < MAX_IN_FLIGHT;
        let timer = async {
            match hedge_at.filter(|_| can_hedge) {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some((i, result)) = running.next() => {
                let started = in_flight.iter().find(|(c, _)| *c == i).map_or_else(Instant::now, |(_, s)| *s);
                in_flight.retain(|(c, _)| *c != i);
                let elapsed = started.elapsed();
                match result {
                    Ok(answer) => {
                        if !relayed(&answer) {
                            settle_race(candidates, i, started, &in_flight, counters);
                        }
                        candidates[i].health.answered(elapsed);
                        return Ok(answer);
                    }
                    Err(e) => match e.verdict() {
                        Verdict::Answer => {
                            candidates[i].health.answered(elapsed);
                            return Err(Some(e));
                        }
                        Verdict::Unwell => {
                            candidates[i].health.failed();
                            last_error = Some(e);
                        }
                        Verdict::NotHere => last_error = Some(e),
                    },
                }
                // A failed call frees its place at once: a failed hedge does not leave
                // the call waiting for another hedge delay.
                if next < candidates.len() && !in_flight.is_empty() && in_flight.len() < MAX_IN_FLIGHT {
                    hedge_at = Some(launch(next, &mut running, &mut in_flight));
                    next += 1;
                }
            }
            () = timer => {
                // The member last asked has not answered in time. Without budget for a
                // hedge, the call waits for it, looking again after each hedge delay:
                // once other calls' races find the member losing (`Health::is_losing`),
                // it is hedged after all. Giving up for good left a burst of calls to a
                // member that hung waiting for their deadline (`group-bench --gray`:
                // every batch in flight stalled for 20 s). Budget coming back is no
                // reason: a healthy owner's cold fetch needs no hedge.
                let slow = in_flight.last().map_or(next - 1, |&(c, _)| c);
                let health = candidates[slow].health;
                let hedge = if denied { health.is_losing() } else { health.may_hedge() };
                if !hedge {
                    denied = true;
                    let delay = candidates[slow].delay.unwrap_or_else(|| health.hedge_delay(policy));
                    hedge_at = Some(Instant::now() + delay);
                    continue;
                }
                counters.sent.fetch_add(1, Relaxed);
                tracing::debug!(member = candidates[next - 1].name, next = candidates[next].name, "no answer within the hedge delay: asking the next member too");
                hedge_at = Some(launch(next, &mut running, &mut in_flight));
                next += 1;
            }
        }
    }
}

/// Candidate `winner` (whose call started at `started`) answered while the calls of
/// `others` were still in flight: those started before it lost a race to a hedge (and
/// may be demoted); it won one if a hedge was sent after it.
fn settle_race(
    candidates: &[Candidate<'_>],
    winner: usize,
    started: Instant,
    others: &[(usize, Instant)],
    counters: &HedgeCounters,
) {
    let mut raced = false;
    for &(other, other_started) in others {
        if other_started <= started {
            counters.won.fetch_add(1, Relaxed);
            let member = candidates[other];
            if let Some(pause) = member.health.lost_race() {
                counters.demotions.fetch_add(1, Relaxed);
                tracing::warn!(member = member.name, pause = ?pause, "its hedges keep losing (it answers health checks but not reads in time): skipped for a while");
            }
        } else {
            raced = true;
        }
    }
    if raced {
        candidates[winner].health.won_race();
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::atomic::AtomicUsize, time::Duration};

    use super::*;

    #[derive(Debug, PartialEq)]
    struct Failure(Verdict);

    impl Judged for Failure {
        fn verdict(&self) -> Verdict {
            self.0
        }
    }

    const POLICY: HedgePolicy =
        HedgePolicy { floor: Duration::from_millis(20), initial: Duration::from_millis(20) };

    /// Three members; `behaviour(i)` is what member `i` does.
    async fn run(
        behaviour: impl Fn(usize) -> (Duration, Result<usize, Failure>),
        healths: &[Health; 3],
    ) -> (Result<usize, Option<Failure>>, HedgeCounters, usize) {
        let names = ["a", "b", "c"];
        let candidates: Vec<Candidate> =
            healths.iter().zip(names).map(|(health, name)| Candidate::new(health, name)).collect();
        let counters = HedgeCounters::default();
        let calls = AtomicUsize::new(0);
        let result = hedged(&candidates, &POLICY, &counters, |i| {
            calls.fetch_add(1, Relaxed);
            let (after, answer) = behaviour(i);
            async move {
                tokio::time::sleep(after).await;
                answer
            }
        })
        .await;
        (result, counters, calls.load(Relaxed))
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_answers_in_time_is_the_only_one_asked() {
        let healths: [Health; 3] = Default::default();
        let (result, counters, calls) = run(|i| (Duration::from_millis(5), Ok(i)), &healths).await;
        assert_eq!((result.unwrap(), calls, counters.sent.load(Relaxed)), (0, 1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_member_costs_one_hedge_delay_and_is_demoted_after_three() {
        let healths: [Health; 3] = Default::default();
        for round in 1..=3 {
            let started = Instant::now();
            let hung = |i| {
                if i == 0 { (Duration::from_secs(3600), Ok(0)) } else { (Duration::from_millis(5), Ok(i)) }
            };
            let (result, counters, _) = run(hung, &healths).await;
            assert_eq!(result.unwrap(), 1, "round {round}: the hedge answered");
            assert_eq!(started.elapsed(), POLICY.initial + Duration::from_millis(5), "one hedge delay");
            assert_eq!(counters.won.load(Relaxed), 1);
        }
        assert!(healths[0].is_demoted(), "three races lost in a row");
        assert!(healths[1].is_live() && healths[2].is_live());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_go_to_the_next_member_and_answers_end_the_call() {
        let healths: [Health; 3] = Default::default();
        let unwell = |i| match i {
            0 => (Duration::from_millis(1), Err(Failure(Verdict::Unwell))),
            1 => (Duration::from_millis(1), Err(Failure(Verdict::NotHere))),
            _ => (Duration::from_millis(1), Ok(i)),
        };
        let (result, counters, calls) = run(unwell, &healths).await;
        assert_eq!((result.unwrap(), calls, counters.sent.load(Relaxed)), (2, 3, 0));
        assert!(!healths[0].is_live(), "paused for failing as an unwell member");
        assert!(healths[1].is_live(), "not here is no failure");

        let healths: [Health; 3] = Default::default();
        let (result, _, calls) =
            run(|_| (Duration::from_millis(1), Err(Failure(Verdict::Answer))), &healths).await;
        assert_eq!((result.unwrap_err(), calls), (Some(Failure(Verdict::Answer)), 1), "the answer, once");

        let healths: [Health; 3] = Default::default();
        let (result, _, calls) =
            run(|_| (Duration::from_millis(1), Err(Failure(Verdict::Unwell))), &healths).await;
        assert_eq!((result.unwrap_err(), calls), (Some(Failure(Verdict::Unwell)), 3), "the last failure");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hedge_that_fails_hands_on_at_once() {
        let healths: [Health; 3] = Default::default();
        let started = Instant::now();
        // The first member hangs; the hedge to the second fails at once; the third is
        // asked then, not a hedge delay later.
        let behaviour = |i| match i {
            0 => (Duration::from_secs(3600), Ok(0)),
            1 => (Duration::ZERO, Err(Failure(Verdict::NotHere))),
            _ => (Duration::from_millis(5), Ok(i)),
        };
        let (result, counters, calls) = run(behaviour, &healths).await;
        assert_eq!((result.unwrap(), calls, counters.sent.load(Relaxed)), (2, 3, 1));
        assert_eq!(started.elapsed(), POLICY.initial + Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_over_the_hedge_budget_is_hedged_once_its_member_is_found_hung() {
        let healths: [Health; 3] = Default::default();
        // The first member's budget is spent by calls that were hedged and whose races
        // it did not lose yet (their hedges are slower than it is).
        while healths[0].may_hedge() {}
        let started = Instant::now();
        let names = ["a", "b", "c"];
        let candidates: Vec<Candidate> =
            healths.iter().zip(names).map(|(health, name)| Candidate::new(health, name)).collect();
        let counters = HedgeCounters::default();
        let call = hedged(&candidates, &POLICY, &counters, |i| async move {
            tokio::time::sleep(if i == 0 { Duration::from_secs(3600) } else { Duration::from_millis(5) })
                .await;
            Ok::<_, Failure>(i)
        });
        // Meanwhile another call finds the member hung: it loses a race.
        let other = async {
            tokio::time::sleep(POLICY.initial * 3 / 2).await;
            assert!(healths[0].lost_race().is_none());
        };
        let (result, ()) = tokio::join!(call, other);
        assert_eq!(result.unwrap(), 1, "hedged, not left waiting for the hung member");
        assert_eq!(
            started.elapsed(),
            POLICY.initial * 2 + Duration::from_millis(5),
            "at the next hedge delay"
        );
        assert_eq!(counters.sent.load(Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hedge_answered_with_the_first_members_bytes_is_no_race_it_lost() {
        let healths: [Health; 3] = Default::default();
        let candidates: Vec<Candidate> =
            healths.iter().zip(["a", "b", "c"]).map(|(health, name)| Candidate::new(health, name)).collect();
        for round in 0..super::super::DEMOTE_AFTER * 2 {
            let counters = HedgeCounters::default();
            // The first member is slow; the second answers first with what it relayed
            // from the first (a join of its fetch).
            let call = |i: usize| async move {
                tokio::time::sleep(Duration::from_millis(if i == 0 { 100 } else { 30 })).await;
                Ok::<_, Failure>(i)
            };
            let answer = hedged_relayed(&candidates, &POLICY, &counters, call, |&i| i == 1).await;
            assert_eq!(answer.unwrap(), 1, "round {round}");
            assert_eq!(counters.won.load(Relaxed), 0, "round {round}: not a race the first member lost");
        }
        assert!(
            healths[0].is_live() && !healths[0].is_losing(),
            "never demoted, nor hedged beyond its budget"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_member_that_still_answers_first_wins_its_race() {
        let healths: [Health; 3] = Default::default();
        // The first member answers after 30 ms, past its 20 ms delay, but before the
        // hedge (which takes 50 ms).
        let slow = |i| (Duration::from_millis(if i == 0 { 30 } else { 50 }), Ok(i));
        let (result, counters, calls) = run(slow, &healths).await;
        assert_eq!(
            (result.unwrap(), calls, counters.sent.load(Relaxed), counters.won.load(Relaxed)),
            (0, 2, 1, 0)
        );
        assert!(healths[0].is_live());
    }
}
