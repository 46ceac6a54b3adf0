//! The mount's own read-ahead, per open file, for files the kernel does not cache
//! (`FOPEN_DIRECT_IO`, see `mod.rs`): the shape of mountpoint-s3's prefetcher. A read
//! that continues the last one (a sequential reader) keeps a window ahead of it in
//! flight, doubling from one [`PART`] to [`MAX_WINDOW`] as the reader keeps going,
//! topped up as one `StreamShard` of at least half the window at a time; a read
//! anywhere else (a random reader, a seek) drops the window and is read as asked, one
//! `ReadRange` of exactly its bytes. A reader's request is answered from parts already
//! fetched or on their way, sliced without a copy where it lies in one part, and at
//! once on the FUSE thread where they are all there.
//!
//! Why not the kernel's read-ahead: that fills the page cache, so every byte is copied
//! once more (the reply into the cache, the cache into the reader), the kernel keeps at
//! most its read-ahead in flight, and raising it from FUSE's 128 KiB needs root (sysfs).
//! Here read-ahead is the same for every user, and a reply goes into the reader's buffer.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use bytes::{Bytes, BytesMut};
use shardcache_client::{Client, Error, Range};
use tokio::sync::watch;

/// Size of one read-ahead part: 1 MiB, the kernel's largest FUSE request (a `dd bs=1M`
/// reader's requests are then one part each, sliced without a copy).
pub const PART: u64 = 1 << 20;
/// Most bytes fetched ahead of one sequential reader (its memory in the mount): 32
/// parts. `mount-bench` (BENCHMARKS.md) measured 32 MiB a little ahead of 16 MiB
/// (0.79-0.85 of the SDK's stream against 0.77-0.88, three runs each).
pub const MAX_WINDOW: u64 = 32 * PART;

/// One part's bytes (or the errno its reader gets) once fetched: `None` until then. A
/// reader waits on it or, where it is there already, takes it at once.
type Fetch = watch::Receiver<Option<Result<Bytes, i32>>>;
/// Where a part's fetcher puts it. Closed: no reader wants the part any more.
type Slot = watch::Sender<Option<Result<Bytes, i32>>>;

/// Where one file's bytes come from: the file's identity on the server.
#[derive(Debug, Clone)]
pub struct Source {
    pub client: Client,
    pub dataset: String,
    pub shard: String,
    /// The version the file was opened at: every range is read at it, or fails.
    pub version: String,
    pub size: u64,
    /// Deadline of each range (past it: EIO).
    pub deadline: Duration,
    /// Where ranges are read (the FUSE thread is not one of its threads).
    pub runtime: tokio::runtime::Handle,
}

/// One open file's read-ahead state.
#[derive(Debug)]
pub struct ReadAhead {
    source: Arc<Source>,
    /// Whether reads continuing the last one fetch ahead (files the kernel caches get
    /// its read-ahead instead, and read exactly what it asks).
    enabled: bool,
    /// Offset just past the last read.
    next: u64,
    /// Reads in a row that continued the one before.
    streak: u32,
    /// Parts fetched or in flight, contiguous, in order: (offset, length, bytes).
    ahead: VecDeque<(u64, u64, Fetch)>,
}

/// The ranges one read is answered from, in order: (offset, length, bytes).
pub type Pieces = Vec<(u64, u64, Fetch)>;

impl ReadAhead {
    pub fn new(source: Source, enabled: bool) -> Self {
        Self { source: Arc::new(source), enabled, next: 0, streak: 0, ahead: VecDeque::new() }
    }

    /// The file's size (at its version).
    pub fn size(&self) -> u64 {
        self.source.size
    }

    /// The pieces that answer a read of `[offset, end)` (`end` within the file), and
    /// the parts ahead of it set in flight. Never waits: the caller awaits the pieces.
    pub fn plan(&mut self, offset: u64, end: u64) -> Pieces {
        let continues = offset == self.next;
        self.streak = if continues { self.streak.saturating_add(1) } else { 0 };
        self.next = end;
        // Drop what lies before the read; a read outside what is ahead starts over.
        while self.ahead.front().is_some_and(|&(at, len, _)| at + len <= offset) {
            self.ahead.pop_front();
        }
        if self.ahead.front().is_some_and(|&(at, ..)| at > offset) {
            self.ahead.clear();
        }
        let window = if self.enabled && self.streak > 0 {
            (PART << (self.streak - 1).min(MAX_WINDOW.ilog2() - PART.ilog2())).min(MAX_WINDOW)
        } else {
            0
        };
        if window == 0 && self.ahead.is_empty() {
            // A random read: exactly its bytes, nothing kept.
            return vec![(offset, end - offset, self.fetch(offset, end - offset))];
        }
        let fetched = self.ahead.back().map_or(offset, |&(at, len, _)| at + len);
        // Topped up to a full window once less than half of it is left ahead of the
        // read: each top-up is one stream of at least half the window, not a request
        // per part (one stream costs the spoke less than the same bytes as ranges:
        // mount-bench's two SDK columns).
        if fetched < end || fetched - end < window / 2 {
            self.stream(fetched, (end + window).min(self.source.size));
        }
        let pieces =
            self.ahead.iter().filter(|&&(at, len, _)| at < end && at + len > offset).cloned().collect();
        // Parts the read consumes to their end are not needed again.
        while self.ahead.front().is_some_and(|&(at, len, _)| at + len <= end) {
            self.ahead.pop_front();
        }
        pieces
    }

    /// Reads `[offset, offset + len)` now (on the runtime), at the file's version, as
    /// one range.
    fn fetch(&self, offset: u64, len: u64) -> Fetch {
        let source = self.source.clone();
        let (slot, fetch) = watch::channel(None);
        self.source.runtime.spawn(async move {
            let mut range = Range::new(&source.dataset, &source.shard, offset, len);
            range.expected_version = Some(source.version.clone());
            let read = match tokio::time::timeout(source.deadline, source.client.read_range(&range)).await {
                Ok(Ok(read)) => Ok(read.data),
                Ok(Err(e)) => Err(failed(&source, &e)),
                Err(_) => Err(timed_out(&source)),
            };
            slot.send_replace(Some(read));
        });
        fetch
    }

    /// Reads `[from, until)` as one stream (on the runtime), at the file's version, into
    /// parts of [`PART`] bytes put at the back of what is ahead.
    fn stream(&mut self, from: u64, until: u64) {
        if from >= until {
            return;
        }
        let mut slots = VecDeque::new();
        for at in (from..until).step_by(PART as usize) {
            let len = PART.min(until - at);
            let (slot, fetch) = watch::channel(None);
            self.ahead.push_back((at, len, fetch));
            slots.push_back((len, slot));
        }
        let source = self.source.clone();
        self.source.runtime.spawn(async move {
            let mut range = Range::new(&source.dataset, &source.shard, from, until - from);
            range.expected_version = Some(source.version.clone());
            let errno = match tokio::time::timeout(source.deadline, fill(&source, &range, &mut slots)).await {
                Ok(Ok(())) => libc::EIO, // the stream ended early (the SDK says why, as an error)
                Ok(Err(e)) => failed(&source, &e),
                Err(_) => timed_out(&source),
            };
            for (_, slot) in slots {
                slot.send_replace(Some(Err(errno)));
            }
        });
    }
}

/// Fills `slots` in order from a stream of `range`, each with its length's bytes (a
/// slice of one message where it lies in one); stops early, cancelling the stream,
/// once no reader wants any slot left (a reader that moved elsewhere).
async fn fill(source: &Source, range: &Range, slots: &mut VecDeque<(u64, Slot)>) -> Result<(), Error> {
    let mut stream = source.client.stream_range(range).await?;
    let mut partial = BytesMut::new();
    while let Some(chunk) = stream.next_chunk().await? {
        let mut data = chunk.data;
        while let Some(&(len, _)) = slots.front() {
            if data.is_empty() {
                break;
            }
            let take = (len as usize - partial.len()).min(data.len());
            let piece = data.split_to(take);
            let part = if partial.is_empty() && take == len as usize {
                piece
            } else {
                partial.extend_from_slice(&piece);
                if partial.len() < len as usize {
                    continue;
                }
                partial.split().freeze()
            };
            if let Some((_, slot)) = slots.pop_front() {
                slot.send_replace(Some(Ok(part)));
            }
        }
        if slots.iter().all(|(_, slot)| slot.is_closed()) {
            slots.clear();
            return Ok(());
        }
    }
    Ok(())
}

/// Logs a range past its deadline; the errno its reader gets.
fn timed_out(source: &Source) -> i32 {
    tracing::warn!(
        dataset = source.dataset,
        shard = source.shard,
        "mount: a read timed out after {:?}",
        source.deadline
    );
    libc::EIO
}

/// Logs why a range failed; the errno its reader gets.
fn failed(source: &Source, e: &Error) -> i32 {
    // The server refuses the old version (ABORTED), or its bytes say another.
    if matches!(e, Error::VersionChanged { .. }) || e.code() == Some(tonic::Code::Aborted) {
        tracing::error!(
            dataset = source.dataset,
            shard = source.shard,
            error = %e,
            "mount: the shard changed while open; the read fails (reopen it for the new version)"
        );
    } else {
        tracing::warn!(dataset = source.dataset, shard = source.shard, error = %e, "mount: a read failed");
    }
    super::errno(e)
}

/// The bytes of `[offset, end)` from `pieces` (what [`ReadAhead::plan`] gave): a slice
/// of one piece where the read lies in one, else the pieces' bytes joined.
pub async fn answer(mut pieces: Pieces, offset: u64, end: u64) -> Result<Bytes, i32> {
    for (_, _, fetch) in &mut pieces {
        // A fetcher that ended without a word (a panic) left its part empty: EIO.
        fetch.wait_for(Option::is_some).await.map_err(|_| libc::EIO)?;
    }
    answer_now(&pieces, offset, end).unwrap_or(Err(libc::EIO))
}

/// [`answer`] without waiting, where every piece is fetched already (a sequential
/// reader's usual case): the FUSE thread replies at once, with no hand-over to the
/// runtime and back.
pub fn answer_now(pieces: &[(u64, u64, Fetch)], offset: u64, end: u64) -> Option<Result<Bytes, i32>> {
    let mut fetched = Vec::with_capacity(pieces.len());
    for (at, _, fetch) in pieces {
        match fetch.borrow().clone()? {
            Ok(data) => fetched.push((*at, data)),
            Err(e) => return Some(Err(e)),
        }
    }
    Some(cut(&fetched, offset, end))
}

/// `[offset, end)` out of contiguous fetched ranges `(offset, bytes)`.
fn cut(fetched: &[(u64, Bytes)], offset: u64, end: u64) -> Result<Bytes, i32> {
    let slice = |&(at, ref data): &(u64, Bytes)| {
        let from = offset.saturating_sub(at) as usize;
        let to = ((end - at) as usize).min(data.len());
        if from > to { Err(libc::EIO) } else { Ok(data.slice(from..to)) }
    };
    if let [one] = fetched {
        return slice(one);
    }
    let mut joined = Vec::with_capacity((end - offset) as usize);
    for piece in fetched {
        joined.extend_from_slice(&slice(piece)?);
    }
    Ok(joined.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `size` bytes whose server is never reached: what `plan` decides is
    /// known before any fetch answers (they fail, unread, in the background).
    fn file(size: u64) -> ReadAhead {
        let endpoint = "http://127.0.0.1:1";
        let channel = tonic::transport::Endpoint::from_static(endpoint).connect_lazy();
        let source = Source {
            client: Client::from_channel(channel, endpoint),
            dataset: "d".into(),
            shard: "s".into(),
            version: "v".into(),
            size,
            deadline: Duration::from_secs(1),
            runtime: tokio::runtime::Handle::current(),
        };
        ReadAhead::new(source, true)
    }

    /// Where the pieces of a read lie.
    fn spans(pieces: &Pieces) -> Vec<(u64, u64)> {
        pieces.iter().map(|&(at, len, _)| (at, len)).collect()
    }

    /// How far past `end` the parts in flight reach.
    fn ahead_of(file: &ReadAhead, end: u64) -> u64 {
        file.ahead.back().map_or(0, |&(at, len, _)| (at + len).saturating_sub(end))
    }

    const READ: u64 = 128 << 10;

    #[tokio::test]
    async fn a_sequential_readers_window_starts_at_a_part_and_doubles_to_the_largest() {
        let mut f = file(64 * PART);
        // A read from the start continues where a new file stands: a part ahead of it at
        // once, streamed in parts, the read answered from the first.
        assert_eq!(spans(&f.plan(0, READ)), [(0, PART)]);
        assert_eq!(ahead_of(&f, READ), PART);
        // Then twice as much with each read in a row, topped up once less than half the
        // window is left, never past the largest.
        let mut furthest = Vec::new();
        for i in 1..200 {
            f.plan(i * READ, (i + 1) * READ);
            furthest.push(ahead_of(&f, (i + 1) * READ));
        }
        assert_eq!(furthest[..5], [2 * PART, 4 * PART, 8 * PART, 16 * PART, 32 * PART]);
        assert!(furthest[4..].iter().all(|&w| (MAX_WINDOW / 2..=MAX_WINDOW).contains(&w)), "{furthest:?}");
        // What the reads consumed is dropped: what is left begins where they ended.
        assert!(f.ahead.front().is_some_and(|&(at, len, _)| at <= 200 * READ && at + len > 200 * READ));
    }

    #[tokio::test]
    async fn a_read_elsewhere_drops_the_window_and_is_read_as_asked() {
        let mut f = file(64 * PART);
        for i in 0..10 {
            f.plan(i * READ, (i + 1) * READ);
        }
        assert!(ahead_of(&f, 10 * READ) > 0);
        // A seek: exactly the read's bytes, nothing kept ahead.
        let at = 40 * PART + 5;
        assert_eq!(spans(&f.plan(at, at + 4096)), [(at, 4096)]);
        assert!(f.ahead.is_empty());
        // Reading on from there starts over at one part ahead.
        f.plan(at + 4096, at + 8192);
        assert_eq!(ahead_of(&f, at + 8192), PART);
        // A read behind the window drops it too.
        assert_eq!(spans(&f.plan(0, 4096)), [(0, 4096)]);
        assert!(f.ahead.is_empty());
        // Without read-ahead (files the kernel caches), every read is read as asked.
        let mut cached = file(64 * PART);
        cached.enabled = false;
        for i in 0..10 {
            assert_eq!(spans(&cached.plan(i * READ, (i + 1) * READ)), [(i * READ, READ)]);
            assert!(cached.ahead.is_empty());
        }
    }

    /// A piece already fetched.
    fn fetched(at: u64, data: &Bytes) -> (u64, u64, Fetch) {
        (at, data.len() as u64, watch::channel(Some(Ok(data.clone()))).1)
    }

    #[test]
    fn a_read_within_one_part_is_a_slice_of_it_not_a_copy() {
        let part: Bytes = (0..PART).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
        let next: Bytes = (0..PART).map(|i| (i % 241) as u8).collect::<Vec<u8>>().into();
        let pieces = vec![fetched(PART, &part), fetched(2 * PART, &next)];
        let inside = answer_now(&pieces[..1], PART + 4096, PART + 8192).unwrap().unwrap();
        assert_eq!(inside, part.slice(4096..8192));
        assert_eq!(inside.as_ptr(), part[4096..].as_ptr(), "the part's own memory");
        // Across two parts: the read's bytes joined.
        let across = answer_now(&pieces, 2 * PART - 10, 2 * PART + 10).unwrap().unwrap();
        assert_eq!(across[..10], part[part.len() - 10..]);
        assert_eq!(across[10..], next[..10]);
        // A piece not fetched yet: no answer now; a failed one: its errno.
        let (_slot, waiting) = watch::channel(None);
        assert!(answer_now(&[(0, PART, waiting)], 0, 10).is_none());
        let failed = [(0, PART, watch::channel(Some(Err(libc::EIO))).1)];
        assert_eq!(answer_now(&failed, 0, 10), Some(Err(libc::EIO)));
    }
}
