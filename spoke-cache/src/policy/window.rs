//! The plans' window: how many bytes the spoke fetches ahead of a job's reads, for
//! either way a plan is followed (`plans/follow.rs`). One function, [`ahead`], answers
//! for both; what differs is what the bytes ahead compete with:
//!
//! - **Whole shards** (plans followed shard by shard): fetched shards are stored, so what
//!   is ahead shares the room under the low watermark with the shards being read and
//!   those kept for a later epoch. With `--plan-window auto` ([`PlanWindow::Blocks`]) the
//!   shards ahead take at most half the room the blocks being read leave: the rest keeps
//!   the shards read again later (in a cache a few blocks large a whole next block would
//!   leave them none: plan-bench, BENCHMARKS.md). With a number of bytes the plans list
//!   that many bytes ahead, all the room under the low watermark theirs.
//! - **Samples** (jobs followed sample by sample): fetched samples are held in memory
//!   until read, so the window is bytes of the capacity set aside for them
//!   ([`samples_bound`]), less what is held already. It must hold what the link carries
//!   in one fetch's time (the bandwidth-delay product: ~15 MB at 2 Gbit/s and 60 ms).
//!
//! The keep limit of samples ([`keep_limit`], `keep.rs`) is the capacity less this window.

/// How far ahead of the jobs' reads shards are fetched whole (`--plan-window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanWindow {
    /// The rest of the block being read and the next block, by each plan's `until`s.
    Blocks,
    /// This many bytes of shards beyond those in use; 0 turns planned prefetch off.
    Bytes(u64),
}

impl PlanWindow {
    /// Whether shards are fetched ahead at all (`--plan-window 0` turns it off; the
    /// samples' window is not this setting's: their fetches are the reads' own, early).
    pub fn follows_shards(self) -> bool {
        self != PlanWindow::Bytes(0)
    }
}

/// What is being fetched ahead, with what it holds already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ahead {
    /// Whole shards, with `in_use` bytes of the shards the plans are reading (the blocks
    /// being read) and `room` the bytes under the low watermark.
    Shards { in_use: u64, room: u64 },
    /// Samples, with `staged` bytes fetched and not yet read.
    Samples { staged: u64 },
}

/// Bytes more that may be fetched ahead now, for a spoke of `capacity` bytes with the
/// plans' window `setting` (see the module's documentation).
pub fn ahead(setting: PlanWindow, capacity: u64, now: Ahead) -> u64 {
    match now {
        Ahead::Shards { .. } if !setting.follows_shards() => 0,
        Ahead::Shards { in_use, room } => match setting {
            PlanWindow::Blocks => room.saturating_sub(in_use) / 2,
            PlanWindow::Bytes(_) => room,
        },
        Ahead::Samples { staged } => samples_bound(capacity).saturating_sub(staged),
    }
}

/// The samples' window's least share of the capacity: what the watermarks leave above
/// the low one, so that a cache full of kept samples and a full window is at its
/// capacity.
pub const SAMPLES_SHARE: f64 = 1.0 - crate::policy::evict::LOW_WATERMARK;

/// The samples' window a small cache gives at least: what fills the link for one round
/// trip (16 MiB in flight carry ~250 MB/s over 60 ms: `link-bench`), but never more than
/// [`SAMPLES_MAX_SHARE`] of the capacity. A cache a tenth of the data's size keeps a
/// tenth at best: its reads are worth more than its keeps.
pub const SAMPLES_FILL: u64 = 16 << 20;
pub const SAMPLES_MAX_SHARE: f64 = 0.6;

/// Bytes of samples a spoke of `capacity` holds fetched ahead of their reads.
pub fn samples_bound(capacity: u64) -> u64 {
    let least = (capacity as f64 * SAMPLES_SHARE) as u64;
    let most = (capacity as f64 * SAMPLES_MAX_SHARE) as u64;
    least.max(SAMPLES_FILL.min(most))
}

/// Bytes a spoke of `capacity` holds at most, kept samples and chunks, while it follows
/// samples: the capacity less the samples' window.
pub fn keep_limit(capacity: u64) -> u64 {
    capacity.saturating_sub(samples_bound(capacity))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_samples_window_fills_the_link_where_the_cache_can_spare_it() {
        // Half of 256 MiB: the watermarks' 15% (19.2 MiB) is more than a fill.
        assert_eq!(samples_bound(128 * MIB), (128.0 * MIB as f64 * 0.15) as u64);
        // An eighth of it: a fill of the link, not 15% (4.8 MiB would starve the reads).
        assert_eq!(samples_bound(32 * MIB), 16 * MIB);
        // Tiny: at most 60%.
        assert_eq!(samples_bound(10 * MIB), 6 * MIB);
        assert_eq!(keep_limit(128 * MIB), 128 * MIB - samples_bound(128 * MIB));
        let samples = |staged| ahead(PlanWindow::Blocks, 32 * MIB, Ahead::Samples { staged });
        assert_eq!((samples(0), samples(10 * MIB), samples(20 * MIB)), (16 * MIB, 6 * MIB, 0));
    }

    #[test]
    fn shards_ahead_take_half_the_room_the_blocks_read_leave_or_all_of_it_for_a_byte_window() {
        let shards = |setting, in_use| ahead(setting, 100, Ahead::Shards { in_use, room: 85 });
        assert_eq!(shards(PlanWindow::Blocks, 25), 30);
        assert_eq!(shards(PlanWindow::Blocks, 90), 0, "the blocks being read fill the room");
        assert_eq!(shards(PlanWindow::Bytes(10), 25), 85, "the plans list 10 bytes; the room is theirs");
        assert_eq!(shards(PlanWindow::Bytes(0), 0), 0);
        assert!(!PlanWindow::Bytes(0).follows_shards() && PlanWindow::Blocks.follows_shards());
    }
}
