//! Whether a chunk fetch asks its hub for zstd (`--hub-compression`). Compression pays
//! where the link bounds delivery: a chunk that crosses in half the bytes arrives sooner
//! when bytes are what it waits for. Where the CPU bounds delivery (a fast link, a hub
//! and spoke on busy cores) it only adds the time to compress and decode: `make demo`'s
//! cold spoke on an uncapped 60 ms link lost 15 points of GPU utilisation to it
//! (BENCHMARKS.md).
//!
//! `auto` (the default) measures it per hub, as it goes: fetches of a chunk or more
//! alternate between the two until each has been timed, then ask for zstd while its
//! fetches cost clearly less time per byte lately (below [`ZSTD_WINS_BELOW`] of plain's,
//! each the mean of its last [`SAMPLES`]), the other one fetch in [`EXPLORE_EVERY`] so
//! that a change (the link filling, the hub freeing its cores) is seen within a few
//! dozen fetches. `zstd` always asks (where the link is billed by the byte,
//! bytes matter more than time); `off` never does.

use std::{sync::Mutex, time::Duration};

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

/// Compressed fetches are taken only while they cost less than this share of a plain
/// fetch's time per byte. A fetch's time leaves out what compression costs the cores (the
/// hub's encoding, the spoke's decoding): on a link bound by its round trip, not its
/// bytes, the two measure within noise of each other, and taking zstd for a few percent
/// would spend those cores for nothing (`make demo`'s cold spoke shares its two with the
/// trainer and the hub). A link that bounds delivery by its bytes halves the time of a
/// chunk that compresses to half.
pub const ZSTD_WINS_BELOW: f64 = 0.8;

/// One fetch in this many takes the mode measured slower, to keep measuring it.
pub const EXPLORE_EVERY: u64 = 8;

/// Fetches smaller than this are not timed: their round trip, not their bytes, is
/// what they wait for.
pub const TIMED_BYTES: u64 = 256 << 10;

/// Fetches each mode's cost is the mean of: few, so that the mode explored one fetch in
/// eight is known again after a few of them.
pub const SAMPLES: usize = 4;

/// Which a hub's next fetch asks for, from how the two have gone.
#[derive(Debug, Default)]
pub struct Chooser {
    mode: HubCompression,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Seconds per byte of the last [`SAMPLES`] fetches: [plain, compressed].
    costs: [std::collections::VecDeque<f64>; 2],
    fetches: u64,
}

impl State {
    /// [plain, compressed] mean costs, once both are known.
    fn costs(&self) -> Option<(f64, f64)> {
        let mean = |c: &std::collections::VecDeque<f64>| {
            (!c.is_empty()).then(|| c.iter().sum::<f64>() / c.len() as f64)
        };
        Some((mean(&self.costs[0])?, mean(&self.costs[1])?))
    }
}

impl Chooser {
    pub fn new(mode: HubCompression) -> Self {
        Self { mode, state: Mutex::default() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the next fetch asks for zstd.
    pub fn compress(&self) -> bool {
        match self.mode {
            HubCompression::Always => true,
            HubCompression::Off => false,
            HubCompression::Auto => {
                let mut state = self.state();
                state.fetches += 1;
                let turn = state.fetches;
                match state.costs() {
                    Some(costs) => zstd_wins(costs) != turn.is_multiple_of(EXPLORE_EVERY),
                    None => turn.is_multiple_of(2),
                }
            }
        }
    }

    /// A fetch of `bytes` (decoded) took `elapsed`, compressed or not. Returns the
    /// `(plain, zstd)` seconds per byte when this changed which one `auto` takes, for the
    /// log.
    pub fn fetched(&self, compressed: bool, elapsed: Duration, bytes: u64) -> Option<(f64, f64)> {
        if self.mode != HubCompression::Auto || bytes < TIMED_BYTES {
            return None;
        }
        let cost = elapsed.as_secs_f64() / bytes as f64;
        let mut state = self.state();
        let before = state.costs().map(zstd_wins);
        let samples = &mut state.costs[usize::from(compressed)];
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back(cost);
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
}

/// Whether compressed fetches win, from `(plain, zstd)` seconds per byte.
fn zstd_wins((plain, zstd): (f64, f64)) -> bool {
    zstd < plain * ZSTD_WINS_BELOW
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Of `n` fetches, how many of the last half ask for zstd when a compressed 4 MiB
    /// fetch takes `zstd_ms` and a plain one `plain_ms`.
    fn asked(chooser: &Chooser, n: usize, plain_ms: u64, zstd_ms: u64) -> usize {
        (0..n)
            .filter(|&i| {
                let compressed = chooser.compress();
                let ms = if compressed { zstd_ms } else { plain_ms };
                chooser.fetched(compressed, Duration::from_millis(ms), 4 * MIB);
                compressed && i >= n / 2
            })
            .count()
    }

    #[test]
    fn auto_takes_the_faster_and_keeps_measuring_the_other() {
        let chooser = Chooser::new(HubCompression::Auto);
        // A capped link: half the bytes cross in half the time.
        let compressed = asked(&chooser, 80, 300, 170);
        assert_eq!(compressed, 35, "compressed but for one in {EXPLORE_EVERY}: {compressed} of the last 40");
        assert_eq!(chooser.compressing(), Some(true));
        // The link frees up (or the hub's cores fill): compressing costs time, saves none.
        let compressed = asked(&chooser, 80, 64, 73);
        assert_eq!(compressed, 5, "back to plain within the first 40: {compressed} of the last 40");
        assert_eq!(chooser.compressing(), Some(false));
        // A few percent faster does not pay for the cores compression takes.
        let compressed = asked(&chooser, 80, 100, 90);
        assert_eq!(compressed, 5, "plain but for one in {EXPLORE_EVERY}: {compressed} of the last 40");
        // Small fetches say nothing about it.
        chooser.fetched(true, Duration::from_millis(1), MIB / 8);
        assert_eq!(chooser.compressing(), Some(false));
    }

    #[test]
    fn the_fixed_modes_do_as_they_say() {
        let (always, off) = (Chooser::new(HubCompression::Always), Chooser::new(HubCompression::Off));
        assert_eq!((asked(&always, 80, 1, 100), asked(&off, 80, 100, 1)), (40, 0));
        assert_eq!(HubCompression::parse("zstd"), Ok(HubCompression::Always));
        assert!(HubCompression::parse("gzip").unwrap_err().contains("auto, zstd, off"));
    }
}
