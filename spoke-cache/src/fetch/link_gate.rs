//! The link gate: how many bytes the chunk fetches (what is stored: a plan's window, a
//! whole-shard fetch, the rest of a chunk filled beside a read) may have in flight over
//! the long link, beside the reads. Reads are never held here, only counted: chunk
//! fetches and reads together stay within the bound, and beside a job's first batch (reads
//! alongside a first stat) within what the link carries without a queue (one
//! bandwidth-delay product), so a job's first reads cross the link ahead of the windows
//! they open (issue 58: a cold spoke's first batch came 10x later than with no cache,
//! behind 64 MiB of whole chunks).
//!
//! The bound adapts to the link, as BBR sizes a flow's inflight (Cardwell et al., "BBR:
//! Congestion-Based Congestion Control", 2016): twice the bandwidth-delay product of the
//! highest delivery rate seen over [`RATE_WINDOW`] and the shortest answer time over
//! [`RTT_WINDOW`] (stats' answers included: `Lookups`), plus two chunks (one being
//! answered, one asked), never more than
//! `--upstream-bytes-in-flight`. Until the first answer it is two chunks. A slower link
//! (the emulator's `--faults throttle=...`) lowers the measured rate within
//! [`RATE_WINDOW`], and the bound with it.
//!
//! Chunk fetches are admitted in the order they asked (a large one is not starved by
//! smaller ones behind it); one that gives up while waiting leaves the queue.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

/// How long the highest delivery rate is remembered: long enough to span a few
/// round trips of answers, short enough that a link throttled mid-run lowers the bound
/// within a couple of seconds.
pub const RATE_WINDOW: Duration = Duration::from_secs(2);

/// How long the shortest answer time is remembered (BBR's min-RTT window).
pub const RTT_WINDOW: Duration = Duration::from_secs(10);

/// How long a chunk fetch waits behind reads alone: past it, it is let in whenever no
/// other chunk fetch is in flight, so that readers who joined it (and a plan's window)
/// make progress however busy the reads keep the link.
pub const LONGEST_WAIT_BEHIND_READS: Duration = Duration::from_secs(1);

/// What the gate has measured of the link: delivery-rate and answer-time samples, one
/// per answer (each request's bytes delivered by everyone while it was in flight, over
/// its time).
#[derive(Debug, Default)]
pub struct LinkEstimate {
    /// Bytes answered over the link so far.
    delivered: u64,
    /// (when, bytes per second), within [`RATE_WINDOW`].
    rates: VecDeque<(Instant, f64)>,
    /// (when, answer time), within [`RTT_WINDOW`].
    rtts: VecDeque<(Instant, Duration)>,
}

/// When a request was asked, and what the link had delivered then.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    at: Instant,
    delivered: u64,
}

impl LinkEstimate {
    /// A request asked now.
    pub fn asking(&self, now: Instant) -> Mark {
        Mark { at: now, delivered: self.delivered }
    }

    /// A request asked at `mark` answered with `bytes` (on the wire) at `now`.
    pub fn answered(&mut self, mark: Mark, bytes: u64, now: Instant) {
        self.delivered += bytes;
        let took = now.saturating_duration_since(mark.at).max(Duration::from_micros(100));
        let rate = (self.delivered - mark.delivered) as f64 / took.as_secs_f64();
        // Max filter: a sample below one still in the window never becomes the maximum.
        while self.rates.back().is_some_and(|&(_, r)| r <= rate) {
            self.rates.pop_back();
        }
        self.rates.push_back((now, rate));
        self.round_trip(mark, now);
    }

    /// A request asked at `mark` answered at `now`, whatever it brought: a sample of the
    /// round trip.
    pub fn round_trip(&mut self, mark: Mark, now: Instant) {
        let took = now.saturating_duration_since(mark.at).max(Duration::from_micros(100));
        // Min filter, as the rates' max filter.
        while self.rtts.back().is_some_and(|&(_, t)| t >= took) {
            self.rtts.pop_back();
        }
        self.rtts.push_back((now, took));
        self.expire(now);
    }

    fn expire(&mut self, now: Instant) {
        while self.rates.front().is_some_and(|&(at, _)| now.saturating_duration_since(at) > RATE_WINDOW) {
            self.rates.pop_front();
        }
        while self.rtts.front().is_some_and(|&(at, _)| now.saturating_duration_since(at) > RTT_WINDOW) {
            self.rtts.pop_front();
        }
    }

    /// The highest delivery rate in the window (bytes per second; 0 before any answer).
    pub fn rate(&self) -> f64 {
        self.rates.front().map_or(0.0, |&(_, rate)| rate)
    }

    /// The bandwidth-delay product measured at `now` (bytes), if anything was answered
    /// within the windows.
    pub fn bdp(&mut self, now: Instant) -> Option<u64> {
        self.expire(now);
        let (&(_, rate), &(_, rtt)) = (self.rates.front()?, self.rtts.front()?);
        Some((rate * rtt.as_secs_f64()) as u64)
    }
}

/// The gate, shared by every fetch upstream (`upstream.rs`).
#[derive(Debug)]
pub struct LinkGate {
    state: Mutex<State>,
    /// `--upstream-bytes-in-flight`: the bound never exceeds it.
    ceiling: u64,
    /// The chunk size: two of them before any answer, and above the BDP after.
    chunk: u64,
}

#[derive(Debug, Default)]
struct State {
    estimate: LinkEstimate,
    /// Bytes of chunk fetches admitted and not yet answered.
    fetches: u64,
    /// Bytes of reads asked and not yet answered.
    reads: u64,
    /// Of those, reads alongside a first stat (a job's first batch): `opening`.
    opening: u64,
    /// Chunk fetches waiting, in the order they asked.
    queue: VecDeque<Waiter>,
    next_id: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    length: u64,
    since: Instant,
    admit: oneshot::Sender<()>,
}

impl LinkGate {
    pub fn new(ceiling: u64, chunk: u64) -> Self {
        Self { state: Mutex::default(), ceiling: ceiling.max(chunk), chunk }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bytes chunk fetches and reads may have in flight together now.
    #[cfg(test)]
    pub fn bound(&self) -> u64 {
        let now = Instant::now();
        self.bound_of(&mut self.state(), now)
    }

    fn bound_of(&self, state: &mut State, now: Instant) -> u64 {
        let measured = state.estimate.bdp(now).map_or(0, |bdp| 2 * bdp);
        (measured + 2 * self.chunk).min(self.ceiling)
    }

    /// Whether a chunk fetch of `length` that has waited since `since` fits now: chunk
    /// fetches and reads together within the bound. Beside the reads of a first batch
    /// (`opening`), only within one measured bandwidth-delay product: what is in flight
    /// then never queues on the link, so no first read's bytes wait behind a chunk's (at
    /// 200 Mbit/s not even one 4 MiB chunk goes beside a job's first batch). (Held to that
    /// beside every read, the cold epoch's link use fell from 0.98 to 0.93 of the rate at
    /// 200 Mbit/s and from 0.82 to 0.72 at 1 Gbit/s, `cold-start-bench`: fills' reads are
    /// in flight most of a cold epoch.) One always fits on an idle link, or with no other
    /// chunk fetch once it has waited [`LONGEST_WAIT_BEHIND_READS`].
    fn fits(&self, state: &mut State, length: u64, since: Instant) -> bool {
        let now = Instant::now();
        let alone = state.reads == 0 || now.saturating_duration_since(since) >= LONGEST_WAIT_BEHIND_READS;
        if state.fetches == 0 && alone {
            return true;
        }
        let bound = self.bound_of(state, now);
        let bound = match state.opening {
            0 => bound,
            _ => state.estimate.bdp(now).unwrap_or(0).min(bound),
        };
        state.fetches + state.reads + length <= bound
    }

    /// Admits the waiting chunk fetches that fit now, in order.
    fn pump(&self, state: &mut State) {
        while let Some(front) = state.queue.front() {
            let (length, since) = (front.length, front.since);
            if !self.fits(state, length, since) {
                return;
            }
            let waiter = state.queue.pop_front().expect("a front");
            // Counted before it is told: one that gave up meanwhile gives it back
            // (`Waiting::drop`).
            state.fetches += length;
            let _ = waiter.admit.send(());
        }
    }

    /// Room for a chunk fetch of `length` bytes if it fits now and none waits before it.
    pub fn try_admit(self: &Arc<Self>, length: u64) -> Option<Admitted> {
        let mut state = self.state();
        if !state.queue.is_empty() || !self.fits(&mut state, length, Instant::now()) {
            return None;
        }
        state.fetches += length;
        Some(Admitted { gate: self.clone(), length })
    }

    /// Room for a chunk fetch of `length` bytes, waited for in turn.
    pub async fn admit(self: &Arc<Self>, length: u64) -> Admitted {
        let admitted = {
            let mut state = self.state();
            if state.queue.is_empty() && self.fits(&mut state, length, Instant::now()) {
                state.fetches += length;
                return Admitted { gate: self.clone(), length };
            }
            let (admit, admitted) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            state.queue.push_back(Waiter { id, length, since: Instant::now(), admit });
            (id, admitted)
        };
        let (id, mut admitted) = admitted;
        let mut waiting = Waiting { gate: self.clone(), id, length, admitted: false };
        // The time rule is looked at when anything is answered or released, and once more
        // when this fetch's wait reaches it: reads that hold the link without an answer
        // for that long (a large one on a slow link) would otherwise keep it waiting.
        let due = tokio::time::Instant::now() + LONGEST_WAIT_BEHIND_READS;
        if tokio::time::timeout_at(due, &mut admitted).await.is_err() {
            self.pump(&mut self.state());
            // The sender is dropped unsent only with the gate, which this holds.
            let _ = admitted.await;
        }
        waiting.admitted = true;
        Admitted { gate: self.clone(), length }
    }

    /// A read of `length` bytes asked now, counted until the guard is dropped.
    pub fn reading(self: &Arc<Self>, length: u64) -> Reading {
        self.state().reads += length;
        Reading { gate: self.clone(), length, opening: 0 }
    }

    /// A read of `length` bytes alongside a first stat asked now (a job's first batch:
    /// chunk fetches keep the link unqueued beside it), counted until the guard is dropped.
    pub fn opening(self: &Arc<Self>, length: u64) -> Reading {
        let mut state = self.state();
        state.reads += length;
        state.opening += length;
        Reading { gate: self.clone(), length, opening: length }
    }

    /// A request asked now (to be passed to [`LinkGate::answered`]).
    pub fn asking(&self) -> Mark {
        self.state().estimate.asking(Instant::now())
    }

    /// A request without bytes of data (a stat) asked at `mark` answered now: a sample of
    /// the round trip alone.
    pub fn round_trip(&self, mark: Mark) {
        let mut state = self.state();
        let now = Instant::now();
        state.estimate.round_trip(mark, now);
        self.pump(&mut state);
    }

    /// The request asked at `mark` answered with `bytes` on the wire: a sample of the link.
    /// Returns the measured delivery rate (bytes per second) and the bound, as they are now.
    pub fn answered(&self, mark: Mark, bytes: u64) -> (u64, u64) {
        let mut state = self.state();
        let now = Instant::now();
        state.estimate.answered(mark, bytes, now);
        self.pump(&mut state);
        (state.estimate.rate() as u64, self.bound_of(&mut state, now))
    }

    /// (bytes of chunk fetches, bytes of reads) in flight, and chunk fetches waiting.
    #[cfg(test)]
    pub fn in_flight(&self) -> (u64, u64, usize) {
        let state = self.state();
        (state.fetches, state.reads, state.queue.len())
    }

    fn release(&self, fetches: u64, (reads, opening): (u64, u64)) {
        let mut state = self.state();
        state.fetches -= fetches;
        state.reads -= reads;
        state.opening -= opening;
        self.pump(&mut state);
    }
}

/// A chunk fetch's room at the gate, until its answer has arrived (dropped).
#[derive(Debug)]
pub struct Admitted {
    gate: Arc<LinkGate>,
    length: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.gate.release(self.length, (0, 0));
    }
}

/// A read counted at the gate, until its answer has arrived (dropped).
#[derive(Debug)]
pub struct Reading {
    gate: Arc<LinkGate>,
    length: u64,
    /// Of `length`, what is a first batch's (`LinkGate::opening`).
    opening: u64,
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.gate.release(0, (self.length, self.opening));
    }
}

/// A chunk fetch in the queue: dropped before it was admitted, it leaves the queue (or,
/// admitted as it gave up, gives its room back).
struct Waiting {
    gate: Arc<LinkGate>,
    id: u64,
    length: u64,
    admitted: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.admitted {
            return;
        }
        let mut state = self.gate.state();
        match state.queue.iter().position(|w| w.id == self.id) {
            Some(at) => {
                state.queue.remove(at);
                // A large fetch at the front that left may let smaller ones in.
                self.gate.pump(&mut state);
            }
            None => {
                state.fetches -= self.length;
                self.gate.pump(&mut state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_bound_is_twice_the_measured_bdp_plus_two_chunks_within_the_ceiling() {
        let gate = LinkGate::new(64 * MIB, 4 * MIB);
        assert_eq!(gate.bound(), 8 * MIB, "two chunks before any answer");
        // 10 MB answered 100 ms after it was asked: 100 MB/s over 100 ms, a BDP of 10 MB.
        let mark = gate.asking();
        let mut state = gate.state();
        state.estimate.answered(mark, 10_000_000, mark.at + Duration::from_millis(100));
        let bdp = state.estimate.bdp(mark.at + Duration::from_millis(100)).unwrap();
        assert!((9_900_000..=10_100_000).contains(&bdp), "{bdp}");
        let bound = gate.bound_of(&mut state, mark.at + Duration::from_millis(100));
        assert_eq!(bound, 2 * bdp + 8 * MIB);
        // A faster link is held to the ceiling.
        let fast = state.estimate.asking(mark.at + Duration::from_millis(100));
        state.estimate.answered(fast, 100_000_000, mark.at + Duration::from_millis(200));
        assert_eq!(gate.bound_of(&mut state, mark.at + Duration::from_millis(200)), 64 * MIB);
    }

    #[test]
    fn a_stats_answer_time_stands_for_the_round_trip() {
        // A job's first answers are large and queued behind each other: 10 MB in 200 ms.
        let mut estimate = LinkEstimate::default();
        let start = Instant::now();
        let first = estimate.asking(start);
        estimate.answered(first, 10_000_000, start + Duration::from_millis(200));
        let queued = estimate.bdp(start + Duration::from_millis(200)).unwrap();
        assert!((9_990_000..=10_010_000).contains(&queued), "{queued}");
        // A stat asked then comes back in 60 ms: the link's round trip.
        let stat = estimate.asking(start + Duration::from_millis(200));
        estimate.round_trip(stat, start + Duration::from_millis(260));
        let bdp = estimate.bdp(start + Duration::from_millis(260)).unwrap();
        assert!((2_990_000..=3_010_000).contains(&bdp), "50 MB/s x 60 ms, not x 200 ms: {bdp}");
    }

    #[test]
    fn a_slower_link_lowers_the_bound_once_its_fast_samples_leave_the_window() {
        let mut estimate = LinkEstimate::default();
        let start = Instant::now();
        let fast = estimate.asking(start);
        estimate.answered(fast, 12_500_000, start + Duration::from_millis(100)); // 125 MB/s
        let fast_bdp = estimate.bdp(start + Duration::from_millis(100)).unwrap();
        // Throttled to a tenth: samples every 100 ms for three seconds.
        for i in 1..30 {
            let at = start + Duration::from_millis(100 * i);
            let slow = estimate.asking(at);
            estimate.answered(slow, 1_250_000, at + Duration::from_millis(100));
        }
        let now = start + Duration::from_millis(3000);
        let slow_bdp = estimate.bdp(now).unwrap();
        assert!(slow_bdp * 5 < fast_bdp, "{slow_bdp} after the throttle, {fast_bdp} before");
    }

    #[test]
    fn beside_a_first_batch_chunk_fetches_keep_the_link_unqueued() {
        let gate = Arc::new(LinkGate::new(64 * MIB, 4 * MIB));
        // 25 MB/s over 60 ms (200 Mbit/s): a BDP of 1.5 MB, a bound of 3 MB + two chunks.
        let mark = gate.asking();
        gate.state().estimate.answered(mark, 1_500_000, mark.at + Duration::from_millis(60));
        assert_eq!(gate.bound(), 3_000_000 + 8 * MIB);
        let idle = gate.try_admit(4 * MIB).expect("an idle link");
        let (fetches, ..) = gate.in_flight();
        drop(idle);
        assert_eq!(fetches, 4 * MIB);
        // Beside reads, a chunk fetch goes within the bound (the link stays full).
        let reads = gate.reading(MIB);
        let beside = gate.try_admit(4 * MIB);
        assert!(beside.is_some(), "a chunk beside reads, within the bound");
        drop((beside, reads));
        // Beside a first batch's reads, not: a 4 MiB chunk would queue them on the link.
        let first = gate.opening(MIB);
        assert!(gate.try_admit(4 * MIB).is_none(), "no chunk beside a first batch");
        drop(first);
        assert_eq!(gate.in_flight(), (0, 0, 0));
        assert!(gate.try_admit(4 * MIB).is_some(), "and the link is the chunks' again");
    }

    #[tokio::test]
    async fn chunk_fetches_wait_while_reads_hold_the_bound_and_go_in_turn() {
        let gate = Arc::new(LinkGate::new(64 * MIB, 4 * MIB));
        // Two chunks' worth of reads: no chunk fetch fits beside them.
        let reads = gate.reading(8 * MIB);
        assert!(gate.try_admit(4 * MIB).is_none(), "reads before chunk fetches");
        let first = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(4 * MIB).await }
        });
        let second = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(4 * MIB).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(gate.in_flight(), (0, 8 * MIB, 2), "both wait behind the reads");
        assert!(gate.try_admit(MIB).is_none(), "none passes those waiting");
        drop(reads);
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        assert_eq!(gate.in_flight(), (8 * MIB, 0, 0), "both admitted once the reads were answered");
        drop((first, second));
        assert_eq!(gate.in_flight(), (0, 0, 0));
    }

    #[tokio::test]
    async fn a_fetch_that_gives_up_while_waiting_leaves_the_queue_and_holds_nothing() {
        let gate = Arc::new(LinkGate::new(64 * MIB, 4 * MIB));
        let held = gate.try_admit(8 * MIB).expect("an idle link admits");
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(4 * MIB).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(gate.in_flight().2, 1);
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(gate.in_flight(), (8 * MIB, 0, 0), "it left the queue");
        drop(held);
        assert_eq!(gate.in_flight(), (0, 0, 0));
        assert!(gate.try_admit(8 * MIB).is_some(), "and nothing waits before the next");
    }

    #[tokio::test]
    async fn a_chunk_fetch_behind_reads_that_never_stop_goes_alone_after_a_while() {
        let gate = Arc::new(LinkGate::new(64 * MIB, 4 * MIB));
        let mut reads = gate.reading(8 * MIB);
        let started = Instant::now();
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(4 * MIB).await }
        });
        // Reads answered and asked again every 50 ms, always holding the bound.
        while !waiting.is_finished() {
            assert!(started.elapsed() < Duration::from_secs(10), "the chunk fetch starved");
            tokio::time::sleep(Duration::from_millis(50)).await;
            let next = gate.reading(8 * MIB);
            drop(std::mem::replace(&mut reads, next));
        }
        assert!(started.elapsed() >= LONGEST_WAIT_BEHIND_READS, "not before it had waited");
        let admitted = waiting.await.unwrap();
        assert_eq!(gate.in_flight(), (4 * MIB, 8 * MIB, 0), "alone among the reads");
        drop(admitted);
    }

    #[tokio::test]
    async fn a_chunk_fetch_behind_one_long_read_goes_alone_when_its_wait_is_up() {
        let gate = Arc::new(LinkGate::new(64 * MIB, 4 * MIB));
        // One read that holds the bound and is not answered for the whole test: nothing is
        // answered or released, so only the fetch's own wait can let it in.
        let read = gate.reading(8 * MIB);
        let started = Instant::now();
        let admitted = tokio::time::timeout(10 * LONGEST_WAIT_BEHIND_READS, gate.admit(4 * MIB))
            .await
            .expect("the chunk fetch waited for an answer that never came");
        assert!(started.elapsed() >= LONGEST_WAIT_BEHIND_READS, "not before it had waited");
        assert_eq!(gate.in_flight(), (4 * MIB, 8 * MIB, 0), "alone beside the read");
        drop((admitted, read));
    }
}
