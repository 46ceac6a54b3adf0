//! One job's plan, held compactly: a plan of a million positions is a few arrays of
//! 32-bit numbers, not a million pairs of strings. Per position: the shard first read
//! there (its id in the plans' shard table, `table.rs`), the end of its use when it is
//! not the position itself, and its place in the positions sorted by shard (how a
//! shard's uses are found); per block, where it starts. 8 bytes a position for a plan
//! read shard after shard, 12 and a few for a block shuffle's (`plan-memory-bench`).

/// How far ahead of a job's cursor a read may be and still move it: reads arrive out of
/// order by what a trainer has in flight (ranks x batches x shards per batch), far less
/// than an epoch.
pub const CURSOR_REACH: usize = 256;

#[derive(Debug)]
pub(super) struct JobPlan {
    /// The shard first read at each position (shard table ids).
    shard: Vec<u32>,
    /// The last position of each position's use; empty when each is its own (every shard
    /// read whole before the next).
    until: Vec<u32>,
    /// Every position, sorted by (shard, position): the uses of a shard, in order, are a
    /// run of it, found by binary search.
    by_shard: Vec<u32>,
    /// Where each block starts, ascending; empty when each position is its own block. A
    /// block runs until every shard first read in it has been read for the last time
    /// (the `until` of each position it spans, transitively); under a block shuffle, a
    /// block's shards are read together.
    block_starts: Vec<u32>,
    /// (first position, epoch) of each epoch of the plan.
    epochs: Vec<(u32, u64)>,
    pub(super) cursor: usize,
    /// The furthest behind the cursor a straggler's read was seen, in positions (kept
    /// when the job sends its next plan): reported, so an operator sees how far apart
    /// the job's readers are.
    pub(super) lag: usize,
    /// When the plan was set or a read last met it: a plan idle for
    /// `PlanLimits::idle_expiry` is a finished job's, and is dropped.
    pub(super) touched: std::time::Instant,
    /// Followed sample by sample (a block does not fit the cache: `Plans::set`): it
    /// neither prefetches nor keeps whole shards.
    pub(super) samples: bool,
    /// A read of a shard it names has been answered: its window is fetched from then on
    /// (`ShardPlans::answered`). Until then the job's first reads have the link to
    /// themselves: a window opened when the plan was set filled the link with whole
    /// chunks ahead of them (a first batch 10x later than with no cache, issue 58). Kept
    /// when the job sends its next plan.
    pub(super) opened: bool,
}

/// What a read was to a job's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// It moved the cursor.
    Moved,
    /// A straggler's read of a shard whose use has just ended.
    Straggler,
    Other,
}

impl JobPlan {
    /// The plan of `positions` (each the index in `ids` of the shard first read there,
    /// `ids` the shards' table ids), `until` (`NewPlan::until`) and `epochs`.
    pub(super) fn new(
        (positions, until, epochs): (Vec<u32>, Vec<u32>, Vec<(u32, u64)>),
        ids: &[u32],
        lag: usize,
    ) -> Self {
        let shard: Vec<u32> = positions.iter().map(|&local| ids[local as usize]).collect();
        drop(positions);
        let mut by_shard: Vec<u32> = (0..shard.len() as u32).collect();
        by_shard.sort_unstable_by_key(|&p| (shard[p as usize], p));
        let mut until =
            if until.iter().enumerate().all(|(p, &u)| u as usize == p) { Vec::new() } else { until };
        until.shrink_to_fit();
        let mut plan = Self {
            shard,
            until,
            by_shard,
            block_starts: Vec::new(),
            epochs,
            cursor: 0,
            lag,
            touched: std::time::Instant::now(),
            samples: false,
            opened: false,
        };
        plan.block_starts = plan.blocks();
        plan
    }

    /// Where each block starts (empty when every position is its own).
    fn blocks(&self) -> Vec<u32> {
        if self.until.is_empty() {
            return Vec::new();
        }
        let mut starts = Vec::new();
        let mut end = None;
        for p in 0..self.len() {
            match end {
                Some(e) if p <= e => end = Some(e.max(self.until_of(p))),
                _ => {
                    starts.push(p as u32);
                    end = Some(self.until_of(p));
                }
            }
        }
        starts.shrink_to_fit();
        starts
    }

    pub(super) fn len(&self) -> usize {
        self.shard.len()
    }

    /// Bytes of the largest block (`size` of a shard): what must be in the cache at once
    /// to read it whole shard by whole shard.
    pub(super) fn largest_block(&self, size: impl Fn(u32) -> u64) -> u64 {
        let mut largest = 0;
        let mut start = 0;
        while start < self.len() {
            let end = self.block_end(start);
            let mut shards: Vec<u32> = self.shard[start..=end].to_vec();
            shards.sort_unstable();
            shards.dedup();
            largest = largest.max(shards.into_iter().map(&size).sum());
            start = end + 1;
        }
        largest
    }

    /// The shard first read at position `at`.
    pub(super) fn shard_at(&self, at: usize) -> u32 {
        self.shard[at]
    }

    /// The epoch of position `at`.
    pub(super) fn epoch_at(&self, at: usize) -> u64 {
        let i = self.epochs.partition_point(|&(start, _)| start as usize <= at);
        self.epochs.get(i.saturating_sub(1)).map_or(0, |&(_, epoch)| epoch)
    }

    /// The last position of the use that begins at `at`.
    fn until_of(&self, at: usize) -> usize {
        self.until.get(at).map_or(at, |&u| u as usize)
    }

    /// The block of position `at`.
    fn block_of(&self, at: usize) -> usize {
        if self.block_starts.is_empty() {
            return at;
        }
        self.block_starts.partition_point(|&s| s as usize <= at).saturating_sub(1)
    }

    /// The last position of the block that holds position `at`.
    pub(super) fn block_end(&self, at: usize) -> usize {
        if at >= self.len() {
            return at;
        }
        if self.block_starts.is_empty() {
            return at;
        }
        let block = self.block_of(at);
        self.block_starts.get(block + 1).map_or(self.len() - 1, |&next| next as usize - 1)
    }

    /// The positions `shard` is first read at, ascending.
    fn uses(&self, shard: u32) -> &[u32] {
        let from = self.by_shard.partition_point(|&p| self.shard[p as usize] < shard);
        let to = self.by_shard.partition_point(|&p| self.shard[p as usize] <= shard);
        &self.by_shard[from..to]
    }

    /// The shards the plan names (each once).
    pub(super) fn distinct(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self.by_shard.iter().map(|&p| self.shard[p as usize]).collect();
        out.dedup();
        out
    }

    /// Whether the cursor is in the last block of its epoch (the epoch's reads are
    /// ending, and a read of the next epoch's shards is the next epoch's start).
    fn in_last_block_of_epoch(&self) -> bool {
        let next = self.block_end(self.cursor) + 1;
        next >= self.len() || self.epoch_at(next) != self.epoch_at(self.cursor)
    }

    /// The positions to have in the cache now: the shards in use (begun and not ended),
    /// the rest of the block being read, and the next block, each with its distance from
    /// the cursor and whether it is in the next block (ahead).
    pub(super) fn window(&self) -> Vec<(usize, bool, usize)> {
        let mut near = Vec::new();
        let behind = self.cursor.saturating_sub(CURSOR_REACH);
        let mut current_end = self.cursor;
        for at in behind..self.cursor.min(self.len()) {
            if self.next_use(self.shard[at]) == Some(0) {
                current_end = current_end.max(self.until_of(at));
                near.push((0, false, at));
            }
        }
        if self.cursor >= self.len() {
            return near;
        }
        let current_end = self.block_end(self.cursor).max(current_end);
        let next_end = self.block_end(current_end + 1).min(self.len() - 1);
        for at in self.cursor..=next_end {
            near.push((at - self.cursor, at > current_end, at));
        }
        near
    }

    /// The shards in use, then those from the cursor on until `ahead` bytes beyond the
    /// one at the cursor are listed (the one that crosses it included), each with its
    /// distance and whether it is ahead of the one being read; `size` of a shard.
    pub(super) fn ahead(&self, ahead: u64, size: impl Fn(u32) -> u64) -> Vec<(usize, bool, usize)> {
        let mut near = Vec::new();
        let behind = self.cursor.saturating_sub(CURSOR_REACH);
        for at in behind..self.cursor.min(self.len()) {
            if self.next_use(self.shard[at]) == Some(0) {
                near.push((0, false, at));
            }
        }
        let mut walked = 0;
        for at in self.cursor..self.len() {
            if walked > ahead {
                break;
            }
            // The shard at the cursor is being read: not ahead.
            let distance = at - self.cursor;
            walked += if distance == 0 { 0 } else { size(self.shard[at]) };
            near.push((distance, distance > 0, at));
        }
        near
    }

    /// The use of `shard` the cursor is in, else its next one: (first, until).
    fn current_or_next(&self, shard: u32) -> Option<(usize, usize)> {
        let uses = self.uses(shard);
        let at = uses.partition_point(|&p| self.until_of(p as usize) < self.cursor);
        uses.get(at).map(|&p| (p as usize, self.until_of(p as usize)))
    }

    /// Distance from the cursor to `shard`'s next use; 0 while in use.
    pub(super) fn next_use(&self, shard: u32) -> Option<usize> {
        self.current_or_next(shard).map(|(first, _)| first.saturating_sub(self.cursor))
    }

    /// A client read `shard`: moves the cursor to its next use if that is a little ahead
    /// (not while it is in use; into the next epoch only from the last block of this
    /// one). A read of a shard whose use ended in the block the cursor is in or the one
    /// before is a straggler's: readers are not in lockstep (ranks, workers and their
    /// read-ahead reach the next block at different times), so the cursor stays, and the
    /// read is reported as a straggler's (its misses are fetched as read and not stored:
    /// the plan needs that room for what is read next).
    pub(super) fn read(&mut self, shard: u32) -> Seen {
        let uses = self.uses(shard);
        if uses.is_empty() {
            return Seen::Other;
        }
        let at = uses.partition_point(|&p| self.until_of(p as usize) < self.cursor);
        let next = uses.get(at).map(|&p| p as usize);
        if next.is_some_and(|first| first <= self.cursor) {
            return Seen::Other; // in use
        }
        if let Some(before) = at.checked_sub(1).map(|b| self.until_of(uses[b] as usize))
            && self.block_of(before) + 1 >= self.block_of(self.cursor)
        {
            self.lag = self.lag.max(self.cursor - before);
            return Seen::Straggler;
        }
        let Some(next) = next else { return Seen::Other };
        let same_epoch = self.epoch_at(next) == self.epoch_at(self.cursor);
        if next - self.cursor > CURSOR_REACH || !(same_epoch || self.in_last_block_of_epoch()) {
            return Seen::Other;
        }
        self.cursor = next;
        Seen::Moved
    }

    /// Bytes of memory the plan holds (its arrays), for `plan-memory-bench` and tests.
    pub(super) fn memory(&self) -> usize {
        4 * (self.shard.capacity()
            + self.until.capacity()
            + self.by_shard.capacity()
            + self.block_starts.capacity())
            + 16 * self.epochs.capacity()
    }
}
