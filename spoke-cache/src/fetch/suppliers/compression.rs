//! Whether a chunk fetch asks its hub for zstd (`--hub-compression`). Compression pays
//! where the link bounds delivery: a chunk that crosses in half the bytes arrives sooner
//! when bytes are what it waits for. Where the CPU bounds delivery (a fast link, a hub
//! and spoke on busy cores) it only adds the time to compress and decode: `make demo`'s
//! cold spoke on an uncapped 60 ms link lost 15 points of GPU utilisation to it
//! (BENCHMARKS.md).
//!
//! `auto` (the default) measures it per hub, as it goes. A fetch's cost is its time
//! beyond the hub's round trip (the shortest of the hub's last [`FLOOR_FETCHES`] fetches
//! of any size), per byte: the part of its time its bytes decide. Each mode's cost is
//! the least of its last [`SAMPLES`] fetches of a chunk or more: the time the link and
//! the cores need at best, where a mean (or the least of a few) is mostly the queueing
//! of a busy machine. The
//! rule before this one failed on exactly that (issue 48): it took zstd while the mean
//! time per byte of four whole fetches was under 0.8 of plain's. Timed whole, a 4 MiB
//! chunk over a 60 ms link at 1 Gbit/s is 60 ms of round trip and 34 of bytes, so half
//! the bytes looked like a fifth less time and `auto` sent 0.58-0.81x of the dataset
//! where zstd sends 0.38x; and on the demo's busy cores (hundreds of ms of queueing) it
//! swapped modes 42 times in a cold epoch.
//!
//! The link's bytes are what the product saves, so zstd is asked for unless it clearly
//! costs time: above [`PLAIN_WINS_ABOVE`] times plain's cost (the cores bound delivery:
//! a fast link, a hub and spoke on busy cores). Until both have been timed, one fetch in
//! four asks for zstd. Each keeps being measured: plain one fetch in [`EXPLORE_PLAIN_EVERY`]
//! while zstd is taken (each costs the link a chunk's saved bytes), zstd one in
//! [`EXPLORE_ZSTD_EVERY`] while plain is (each costs the cores a chunk's compression,
//! not the link). `zstd` always asks; `off` never does. The fetches asked each way are
//! counted (`Status`'s `hub_fetches_plain` and `hub_fetches_zstd`, the metrics), so
//! operators see the trade.
//!
//! Time alone cannot see bytes that do not shrink: on random bytes (images, compressed
//! archives) the hub sends them as they are after judging a sample, so zstd costs about
//! plain's time and `auto` kept asking (issue 58: 5,179 of 7,667 fetches of a GPU node's
//! cold epoch), spending the hub's cores on the judging. So `auto` also learns, per
//! dataset, what the answers to its zstd asks took on the link: a dataset's first
//! [`PROBE_FETCHES`] fetches ask for zstd (the probe), and once its last that many zstd
//! answers saved less than 1 - [`SHRINK_BELOW`] of their bytes its fetches go plain,
//! asking again one in [`REPROBE_EVERY`] (a dataset whose new shards do compress is seen
//! within that many fetches); where they shrink, the time rule above decides.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

/// `--hub-compression`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HubCompression {
    /// Whichever of the two fetches faster, measured.
    #[default]
    Auto,
    Always,
    Off,
}

impl HubCompression {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            "zstd" => Ok(Self::Always),
            "off" => Ok(Self::Off),
            other => Err(format!("{other:?}: one of auto, zstd, off")),
        }
    }
}

/// Plain fetches are taken only while a compressed one costs more than this times a
/// plain one's time per byte beyond the round trip. Below it the two deliver within the
/// noise of a busy machine and the fewer bytes win: on this project's 2-core machine a
/// 60 ms link at 1 Gbit/s delivered token data at 114-115 MB/s plain and 131-136 MB/s
/// with every chunk compressed (`compress-bench --auto`, BENCHMARKS.md), the hub's
/// compression about as slow as the link; with the link uncapped, compressing every
/// chunk took 1.5-1.7x the time, and the cold demo lost GPU utilisation to it.
pub const PLAIN_WINS_ABOVE: f64 = 1.25;

/// While zstd is taken, one fetch in this many is sent plain to keep measuring it: the
/// link's bytes it costs are at most 1/32 of a dataset beyond zstd's (issue 48 asks
/// auto to stay within 0.05 of zstd's bytes on a link that bounds delivery).
pub const EXPLORE_PLAIN_EVERY: u64 = 32;

/// While plain is taken, one fetch in this many asks for zstd: it costs cores, not link
/// bytes, so it can be measured more often and a link that fills is seen sooner.
pub const EXPLORE_ZSTD_EVERY: u64 = 16;

/// Fetches smaller than this are timed only for the round trip: their bytes are too
/// few to tell the two apart.
pub const TIMED_BYTES: u64 = 256 << 10;

/// Fetches each mode's cost is the least of: enough that one of them met no queue (the
/// demo's cold spoke shares two cores with its trainer and hub: with the least of 8, a
/// queue on the cores looked like the link and `auto` swapped modes 28 times in an
/// epoch); a faster one counts at once (a link that frees up is seen at the first plain
/// fetch), a slower one once the faster ones are this many fetches old.
pub const SAMPLES: usize = 32;

/// Fetches whose shortest time is taken for the hub's round trip.
pub const FLOOR_FETCHES: usize = 256;

/// A dataset's zstd answers that decide whether its bytes shrink: its first fetches ask
/// for zstd, this many, and its answers of [`PROBED_BYTES`] or more tell.
pub const PROBE_FETCHES: usize = 4;

/// Answers smaller than this say too little of how the bytes compress (the hub judges a
/// message on a sample of it).
pub const PROBED_BYTES: u64 = 4 << 10;

/// The bytes shrink where zstd answers take less than this share of their decoded bytes
/// on the link: under 5% saved is not worth the hub's and the spoke's cores.
pub const SHRINK_BELOW: f64 = 0.95;

/// A dataset whose bytes do not shrink asks for zstd again one fetch in this many.
pub const REPROBE_EVERY: u64 = 4096;

/// A probe whose answers have not told within this long (failed, or all under
/// [`PROBED_BYTES`]) is sent again.
pub const PROBE_WAIT: Duration = Duration::from_secs(2);

/// Which a hub's next fetch asks for, from how the two have gone.
#[derive(Debug)]
pub struct Chooser {
    mode: HubCompression,
    /// [`PROBE_WAIT`] (shorter in the unit tests).
    probe_wait: Duration,
    state: Mutex<State>,
    /// Fetches asked for as they are, and for zstd.
    asked: [AtomicU64; 2],
}

#[derive(Debug, Default)]
struct State {
    /// (seconds, bytes) of the last [`SAMPLES`] fetches of [`TIMED_BYTES`] or more:
    /// [plain, compressed].
    samples: [VecDeque<(f64, u64)>; 2],
    /// Seconds of the last [`FLOOR_FETCHES`] fetches of any size, either mode.
    recent: VecDeque<f64>,
    fetches: u64,
    /// Per dataset, what its zstd answers took on the link.
    shrink: HashMap<String, Shrink>,
}

/// What a dataset's answers to zstd asks took on the link.
#[derive(Debug, Default)]
struct Shrink {
    /// (bytes on the link, decoded bytes) of its last [`PROBE_FETCHES`] zstd answers.
    answers: VecDeque<(u64, u64)>,
    /// Fetches of the dataset asked since its bytes were found not to shrink.
    plain: u64,
    /// Fetches asked for zstd to probe them, before the answers tell.
    probes: usize,
    /// When its probe was last sent.
    probed_at: Option<std::time::Instant>,
}

impl Shrink {
    /// Whether its bytes shrink, once probed.
    fn shrinks(&self) -> Option<bool> {
        if self.answers.len() < PROBE_FETCHES {
            return None;
        }
        let (wire, decoded) = self.answers.iter().fold((0, 0), |(w, d), &(a, b)| (w + a, d + b));
        Some((wire as f64) < decoded as f64 * SHRINK_BELOW)
    }
}

impl State {
    /// What `dataset`'s zstd answers have said (its name copied once, not per fetch).
    fn shrink_of(&mut self, dataset: &str) -> &mut Shrink {
        if !self.shrink.contains_key(dataset) {
            self.shrink.insert(dataset.to_owned(), Shrink::default());
        }
        self.shrink.get_mut(dataset).expect("inserted above")
    }

    /// [plain, compressed] seconds per byte beyond the round trip (the least of each
    /// mode's samples), once both are known.
    fn costs(&self) -> Option<(f64, f64)> {
        let floor = self.recent.iter().copied().fold(f64::INFINITY, f64::min);
        let cost = |samples: &VecDeque<(f64, u64)>| {
            samples.iter().map(|&(s, bytes)| (s - floor).max(0.0) / bytes as f64).reduce(f64::min)
        };
        Some((cost(&self.samples[0])?, cost(&self.samples[1])?))
    }
}

impl Chooser {
    pub fn new(mode: HubCompression) -> Self {
        Self { mode, probe_wait: PROBE_WAIT, state: Mutex::default(), asked: Default::default() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the next fetch, of `dataset`'s bytes, asks for zstd (counted).
    pub fn compress(&self, dataset: &str) -> bool {
        let compress = match self.mode {
            HubCompression::Always => true,
            HubCompression::Off => false,
            HubCompression::Auto => {
                let mut state = self.state();
                let shrink = state.shrink_of(dataset);
                let probe = match shrink.shrinks() {
                    // Its bytes do not shrink: plain, but for a reprobe now and then.
                    Some(false) => {
                        shrink.plain += 1;
                        Some(shrink.plain.is_multiple_of(REPROBE_EVERY))
                    }
                    // Its first fetches ask for zstd until they can tell.
                    None if shrink.probes < PROBE_FETCHES => {
                        shrink.probes += 1;
                        shrink.probed_at = Some(std::time::Instant::now());
                        Some(true)
                    }
                    // Its probe is out: plain until the answers tell. A cold start asks
                    // dozens before the first is back, and asking one in four of those for
                    // zstd (the time rule's start, below) was 11 zstd asks per cold spoke
                    // of random bytes in cold-start-bench, where the probe is 4. A probe
                    // that did not tell in time is sent again.
                    None if shrink.probed_at.is_some_and(|at| at.elapsed() < self.probe_wait) => Some(false),
                    None => {
                        shrink.probes = 1;
                        shrink.probed_at = Some(std::time::Instant::now());
                        Some(true)
                    }
                    Some(true) => None,
                };
                if let Some(compress) = probe {
                    self.asked[usize::from(compress)].fetch_add(1, Relaxed);
                    return compress;
                }
                state.fetches += 1;
                let turn = state.fetches;
                match state.costs().map(zstd_wins) {
                    Some(true) => !turn.is_multiple_of(EXPLORE_PLAIN_EVERY),
                    Some(false) => turn.is_multiple_of(EXPLORE_ZSTD_EVERY),
                    // A cold start sends dozens before the first is back: most go plain,
                    // as fast as no compression wherever the cores bound delivery (with
                    // three in four compressed the demo's cold row stayed at 78-80% in
                    // batches 0-100, 82-83% with one in four; BENCHMARKS.md).
                    None => turn % 4 == 2,
                }
            }
        };
        self.asked[usize::from(compress)].fetch_add(1, Relaxed);
        compress
    }

    /// An answer of `dataset`'s that asked for zstd: `decoded` bytes that took `wire` on
    /// the link. Each range of a batch is its own dataset's answer.
    pub fn answered(&self, dataset: &str, decoded: u64, wire: u64) {
        if self.mode != HubCompression::Auto || decoded < PROBED_BYTES {
            return;
        }
        let mut state = self.state();
        let shrink = state.shrink_of(dataset);
        if shrink.answers.len() == PROBE_FETCHES {
            shrink.answers.pop_front();
        }
        shrink.answers.push_back((wire, decoded));
    }

    /// A fetch of `bytes` (decoded) took `elapsed`, compressed or not. Returns the
    /// `(plain, zstd)` seconds per byte beyond the round trip when this changed which one
    /// `auto` takes, for the log.
    pub fn fetched(&self, compressed: bool, elapsed: Duration, bytes: u64) -> Option<(f64, f64)> {
        if self.mode != HubCompression::Auto {
            return None;
        }
        let seconds = elapsed.as_secs_f64();
        let mut state = self.state();
        let before = state.costs().map(zstd_wins);
        if state.recent.len() == FLOOR_FETCHES {
            state.recent.pop_front();
        }
        state.recent.push_back(seconds);
        if bytes >= TIMED_BYTES {
            let samples = &mut state.samples[usize::from(compressed)];
            if samples.len() == SAMPLES {
                samples.pop_front();
            }
            samples.push_back((seconds, bytes));
        }
        let now = state.costs()?;
        (before != Some(zstd_wins(now))).then_some(now)
    }

    /// Whether fetches ask for zstd now: the mode, or in `auto` the one measured faster
    /// (`None` until both are).
    pub fn compressing(&self) -> Option<bool> {
        match self.mode {
            HubCompression::Always => Some(true),
            HubCompression::Off => Some(false),
            HubCompression::Auto => self.state().costs().map(zstd_wins),
        }
    }

    /// Fetches asked for (as they are, zstd) since the spoke started.
    pub fn asked(&self) -> (u64, u64) {
        (self.asked[0].load(Relaxed), self.asked[1].load(Relaxed))
    }
}

/// Whether compressed fetches are taken, from `(plain, zstd)` seconds per byte.
pub fn zstd_wins((plain, zstd): (f64, f64)) -> bool {
    zstd <= plain * PLAIN_WINS_ABOVE
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Of `n` chunk fetches of 4 MiB of a dataset whose bytes zstd halves, how many of
    /// the last half ask for zstd when a compressed one takes `zstd_ms` and a plain one
    /// `plain_ms`, each fetch after a small one that takes `rtt_ms` (a reader's own range;
    /// `None`: chunks only).
    fn asked(chooser: &Chooser, n: usize, rtt_ms: Option<u64>, plain_ms: u64, zstd_ms: u64) -> usize {
        asked_of(chooser, "text", 0.5, n, rtt_ms, (plain_ms, zstd_ms))
    }

    /// [`asked`] of `dataset`, whose zstd answers take `ratio` of their bytes on the link.
    fn asked_of(
        chooser: &Chooser,
        dataset: &str,
        ratio: f64,
        n: usize,
        rtt_ms: Option<u64>,
        (plain_ms, zstd_ms): (u64, u64),
    ) -> usize {
        (0..n)
            .filter(|&i| {
                if let Some(rtt) = rtt_ms {
                    chooser.fetched(false, Duration::from_millis(rtt), 16 << 10);
                }
                let compressed = chooser.compress(dataset);
                let ms = if compressed { zstd_ms } else { plain_ms };
                chooser.fetched(compressed, Duration::from_millis(ms), 4 * MIB);
                if compressed {
                    chooser.answered(dataset, 4 * MIB, (4.0 * MIB as f64 * ratio) as u64);
                }
                compressed && i >= n / 2
            })
            .count()
    }

    #[test]
    fn auto_compresses_unless_it_clearly_costs_time_beyond_the_round_trip() {
        let chooser = Chooser::new(HubCompression::Auto);
        // 60 ms link at 1 Gbit/s: a plain chunk is 34 ms of bytes, a compressed one 20
        // (half the bytes, and the hub's compression).
        let compressed = asked(&chooser, 80, Some(60), 94, 80);
        assert_eq!(compressed, 39, "all but one in {EXPLORE_PLAIN_EVERY}: {compressed} of the last 40");
        assert_eq!(chooser.compressing(), Some(true));
        // The link frees up: compressing costs the hub's time (12 ms against 2), saves
        // none. Plain is measured one fetch in 32; the first of them shows it.
        let compressed = asked(&chooser, 320, Some(60), 62, 72);
        assert_eq!(compressed, 10, "plain but for one in {EXPLORE_ZSTD_EVERY} in the last 160: {compressed}");
        assert_eq!(chooser.compressing(), Some(false));
        // Compressed a little slower (35 ms against 30), within the noise: the bytes win.
        let compressed = asked(&chooser, 80, Some(60), 90, 95);
        assert!(compressed >= 37, "zstd but for one in {EXPLORE_PLAIN_EVERY}: {compressed} of the last 40");
        assert_eq!(chooser.compressing(), Some(true));
        // Small fetches say nothing about the bytes.
        chooser.fetched(false, Duration::from_millis(1), MIB / 8);
        assert_eq!(chooser.compressing(), Some(true));
        let (plain, zstd) = chooser.asked();
        assert_eq!(plain + zstd, 480, "every chunk fetch counted once");
        assert!(zstd > 120 && plain > 200, "{plain} plain, {zstd} zstd");
    }

    #[test]
    fn without_small_fetches_the_fastest_chunk_stands_for_the_round_trip() {
        // A prefetch: chunks only. Link-bound, zstd wins; on a fast link, plain does.
        let capped = Chooser::new(HubCompression::Auto);
        assert_eq!(asked(&capped, 80, None, 94, 80), 39);
        let fast = Chooser::new(HubCompression::Auto);
        // One in 16 of the last 40 (the probe's four asks came first).
        let explored = asked(&fast, 80, None, 62, 72);
        assert!((2..=3).contains(&explored), "zstd one in {EXPLORE_ZSTD_EVERY}: {explored}");
    }

    #[test]
    fn bytes_that_do_not_shrink_are_asked_plain_after_a_short_probe() {
        // A link-bound hub (zstd as fast as plain): time says zstd, the bytes say no.
        let chooser = Chooser::new(HubCompression::Auto);
        let random = asked_of(&chooser, "images", 1.0, 400, Some(60), (94, 94));
        assert_eq!(random, 0, "none of the last 200 after the probe");
        let (plain, zstd) = chooser.asked();
        assert_eq!((plain + zstd, zstd as usize), (400, PROBE_FETCHES), "the probe's asks only");
        // Another dataset of the same hub that shrinks still asks for zstd.
        assert_eq!(asked_of(&chooser, "text", 0.5, 80, Some(60), (94, 80)), 39);
        // Asked again one fetch in REPROBE_EVERY: new shards that shrink are seen.
        let later = REPROBE_EVERY as usize * PROBE_FETCHES;
        let asked = asked_of(&chooser, "images", 0.3, later, Some(60), (94, 80));
        assert!(asked > later / 4, "compressed again once its reprobes shrink: {asked} of {}", later / 2);
        // Nearly as large compressed (2% saved) is not shrinking.
        let barely = Chooser::new(HubCompression::Auto);
        assert_eq!(asked_of(&barely, "jpeg", 0.98, 200, Some(60), (94, 94)), 0);
    }

    #[test]
    fn fetches_asked_while_the_probe_is_out_go_plain() {
        // A cold start: dozens of fetches asked before the first answer is back.
        let chooser = Chooser::new(HubCompression::Auto);
        let first: Vec<bool> = (0..40).map(|_| chooser.compress("images")).collect();
        assert_eq!(first.iter().filter(|&&z| z).count(), PROBE_FETCHES, "the probe's asks only: {first:?}");
        for _ in 0..PROBE_FETCHES {
            chooser.answered("images", 4 * MIB, 4 * MIB);
        }
        assert!((0..40).all(|_| !chooser.compress("images")), "random bytes, probed: plain");
        // A probe whose answers never tell (each under PROBED_BYTES) is sent again once
        // it has had its time, and a dataset that shrinks is then compressed.
        let small = Chooser { probe_wait: Duration::from_millis(20), ..Chooser::new(HubCompression::Auto) };
        let probe = |c: &Chooser| (0..10).filter(|_| c.compress("text")).count();
        assert_eq!(probe(&small), PROBE_FETCHES);
        for _ in 0..PROBE_FETCHES {
            small.answered("text", PROBED_BYTES / 2, PROBED_BYTES / 4);
        }
        assert_eq!(probe(&small), 0, "its answers are out, or too small to tell: plain meanwhile");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(probe(&small), PROBE_FETCHES, "probed again after its wait");
        for _ in 0..PROBE_FETCHES {
            small.answered("text", 4 * MIB, MIB);
        }
        assert_eq!(small.state().shrink_of("text").shrinks(), Some(true));
    }

    #[test]
    fn the_fixed_modes_do_as_they_say() {
        let (always, off) = (Chooser::new(HubCompression::Always), Chooser::new(HubCompression::Off));
        assert_eq!((asked(&always, 80, None, 1, 100), asked(&off, 80, None, 100, 1)), (40, 0));
        assert_eq!((always.asked(), off.asked()), ((0, 80), (80, 0)));
        assert_eq!(HubCompression::parse("zstd"), Ok(HubCompression::Always));
        assert!(HubCompression::parse("gzip").unwrap_err().contains("auto, zstd, off"));
    }
}
