//! The fetch owner against a fake supplier (`crate::testing`): one fetch per missing
//! chunk however many read it, nothing kept of a failed or wrong answer, a new version
//! upstream noticed, the byte bound kept.

use std::{sync::atomic::Ordering::SeqCst, time::Duration};

use super::*;
use crate::testing::{Wrong, parts, pattern};

const CHUNK: u64 = 64 << 10;

fn for_read(row: &JobRow) -> FetchFor<'_> {
    FetchFor::read(row, "trainer", &[])
}

#[tokio::test]
async fn concurrent_readers_of_a_missing_chunk_share_one_fetch_and_it_is_stored() {
    let parts = parts(CHUNK, 1 << 30, 1 << 30);
    let data = pattern(3 * CHUNK as usize, 1);
    parts.supply.put("ds", "s", "v1", data.clone());
    parts.supply.set_latency(Duration::from_millis(20));
    let entry = parts.entry("ds", "s").await.unwrap();
    let row = JobRow::default();
    let fetches: Vec<ChunkFetch> =
        (0..8).map(|_| parts.fetch.chunk(&entry, ChunkIndex(1), for_read(&row)).unwrap()).collect();
    for fetch in fetches {
        assert_eq!(fetch.fetched.await.unwrap().data[..], data[CHUNK as usize..2 * CHUNK as usize]);
        assert_eq!(fetch.stored.await.unwrap(), CHUNK, "each reader is told the chunk is on disk");
    }
    assert_eq!(parts.supply.fetches.load(SeqCst), 1, "eight readers, one fetch");
    assert!(entry.has_chunk(ChunkIndex(1)) && !entry.has_chunk(ChunkIndex(0)));
    assert_eq!(parts.stored(&entry, CHUNK, CHUNK).unwrap(), data[CHUNK as usize..2 * CHUNK as usize]);
    assert!(
        parts.fetch.chunk(&entry, ChunkIndex(1), for_read(&row)).is_none(),
        "stored: read from the store"
    );
    assert_eq!(row.hub_bytes.load(Relaxed), CHUNK, "counted once, in the reader's row");
    assert_eq!(parts.capacity.used(), CHUNK);
}

#[tokio::test]
async fn a_failed_fetch_keeps_nothing_and_the_next_read_fetches_again() {
    let parts = parts(CHUNK, 1 << 30, 1 << 30);
    let data = pattern(CHUNK as usize, 2);
    parts.supply.put("ds", "s", "v1", data.clone());
    let entry = parts.entry("ds", "s").await.unwrap();
    let row = JobRow::default();
    parts.supply.fail_next(1);
    let failed = parts.fetch.chunk(&entry, ChunkIndex(0), for_read(&row)).unwrap();
    let error = failed.fetched.await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::Unavailable, "{error}");
    assert!(failed.stored.await.is_err());
    assert!(!entry.has_chunk(ChunkIndex(0)) && parts.stored(&entry, 0, CHUNK).is_none(), "nothing stored");
    assert_eq!(parts.fetch.in_flight(), 0, "the failed fetch is not kept for the next reader");
    let again = parts.fetch.chunk(&entry, ChunkIndex(0), for_read(&row)).unwrap();
    assert_eq!(again.fetched.await.unwrap().data[..], data[..]);
    again.stored.await.unwrap();
    assert_eq!(parts.supply.fetches.load(SeqCst), 2);
    assert_eq!(parts.stored(&entry, 0, CHUNK).unwrap(), data);
}

#[tokio::test]
async fn wrong_bytes_from_a_supplier_are_neither_served_nor_stored() {
    for wrong in [Wrong::Short, Wrong::OtherVersion] {
        let parts = parts(CHUNK, 1 << 30, 1 << 30);
        parts.supply.put("ds", "s", "v1", pattern(2 * CHUNK as usize, 3));
        let entry = parts.entry("ds", "s").await.unwrap();
        let row = JobRow::default();
        parts.supply.answer(Some(wrong));
        let fetch = parts.fetch.chunk(&entry, ChunkIndex(0), for_read(&row)).unwrap();
        let error = fetch.fetched.await.unwrap_err();
        assert!(error.to_string().contains("a supplier answered"), "{wrong:?}: {error}");
        assert!(fetch.stored.await.is_err());
        let direct = parts.fetch.direct(&entry, 100, 1000, for_read(&row)).await;
        assert!(direct.is_err(), "{wrong:?}: a read as read is refused too");
        assert!(
            !entry.has_chunk(ChunkIndex(0)) && parts.stored(&entry, 0, CHUNK).is_none(),
            "{wrong:?}: nothing stored"
        );
        assert_eq!(parts.capacity.used(), 0);
        assert_eq!(row.hub_bytes.load(Relaxed), 0, "{wrong:?}: refused bytes are not counted as fetched");
        assert!(row.link_bytes.load(Relaxed) > 0, "{wrong:?}: but what crossed the link for them is counted");
    }
}

#[tokio::test]
async fn a_new_version_upstream_fails_the_read_and_sends_the_entry_to_be_checked() {
    let parts = parts(CHUNK, 1 << 30, 1 << 30);
    parts.supply.put("ds", "s", "v1", pattern(CHUNK as usize, 4));
    let entry = parts.entry("ds", "s").await.unwrap();
    assert!(parts.catalog.is_fresh(&entry));
    let v2 = pattern(CHUNK as usize, 5);
    parts.supply.put("ds", "s", "v2", v2.clone());
    let fetch = parts.fetch.chunk(&entry, ChunkIndex(0), for_read(&JobRow::default())).unwrap();
    let error = fetch.fetched.await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::Aborted, "{error}");
    assert!(!entry.has_chunk(ChunkIndex(0)), "no byte of v2 under v1's entry");
    assert!(!parts.catalog.is_fresh(&entry), "the entry is checked at its next access");
    let next = parts.entry("ds", "s").await.unwrap();
    assert_eq!((next.version.as_str(), next.id != entry.id), ("v2", true));
    let fetch = parts.fetch.chunk(&next, ChunkIndex(0), for_read(&JobRow::default())).unwrap();
    assert_eq!(fetch.fetched.await.unwrap().data[..], v2[..]);
}

#[tokio::test]
async fn bytes_in_flight_stay_within_the_bound() {
    // Room for two chunks in flight: eight chunks of a shard go two at a time.
    let parts = parts(CHUNK, 1 << 30, 2 * CHUNK);
    let data = pattern(8 * CHUNK as usize, 6);
    parts.supply.put("ds", "s", "v1", data.clone());
    parts.supply.set_latency(Duration::from_millis(5));
    let entry = parts.entry("ds", "s").await.unwrap();
    let fetched = parts.fetch.fetch_shard(&entry, 8, for_read(&JobRow::default())).await.unwrap();
    assert_eq!(fetched, 8 * CHUNK);
    assert!(entry.is_complete());
    assert_eq!(parts.stored(&entry, 0, 8 * CHUNK).unwrap(), data);
    let most = parts.supply.most_fetching.load(SeqCst);
    assert!(most <= 2 * CHUNK, "{most} bytes were fetched at once, past the bound of {}", 2 * CHUNK);
    assert_eq!(parts.supply.fetches.load(SeqCst), 8);
    // The six chunks beyond the first two waited for room, each behind a fetch of 5 ms
    // or more: the queue an operator sees (the "link saturated" alert reads it).
    let queued = parts.metrics.upstream_queue_micros.load(Relaxed);
    assert!(queued >= 5_000, "fetches queued for room {queued} us in all");
    let page = parts.metrics.render(&Default::default());
    let line =
        page.lines().find(|l| l.starts_with("shardcache_spoke_upstream_queue_seconds_total ")).unwrap();
    assert!(line.split(' ').nth(1).unwrap().parse::<f64>().unwrap() >= 0.005, "{line}");
}

#[tokio::test]
async fn a_range_fetched_as_read_is_shared_and_never_stored() {
    let parts = parts(CHUNK, 1 << 30, 1 << 30);
    let data = pattern(2 * CHUNK as usize, 7);
    parts.supply.put("ds", "s", "v1", data.clone());
    parts.supply.set_latency(Duration::from_millis(20));
    let entry = parts.entry("ds", "s").await.unwrap();
    let row = JobRow::default();
    let reads = (0..4).map(|_| parts.fetch.direct(&entry, 1000, 5000, for_read(&row)));
    for read in futures::future::join_all(reads).await {
        assert_eq!(read.unwrap().data[..], data[1000..6000]);
    }
    assert_eq!(parts.supply.fetches.load(SeqCst), 1, "four readers of one range, one fetch");
    assert_eq!(row.hub_bytes.load(Relaxed), 5000, "what crossed is the range, not its chunk");
    assert!(!entry.has_chunk(ChunkIndex(0)) && parts.capacity.used() == 0, "a read as read is not stored");
}

#[tokio::test]
async fn a_batch_of_ranges_fetched_as_read_is_one_call_upstream_and_joins_what_runs() {
    let parts = parts(CHUNK, 1 << 30, 1 << 30);
    let (a, b) = (pattern(2 * CHUNK as usize, 8), pattern(CHUNK as usize, 9));
    parts.supply.put("ds", "a", "v1", a.clone());
    parts.supply.put("ds", "b", "v1", b.clone());
    parts.supply.set_latency(Duration::from_millis(20));
    let (ea, eb) = (parts.entry("ds", "a").await.unwrap(), parts.entry("ds", "b").await.unwrap());
    let row = JobRow::default();
    // One range is already being fetched by another reader: joined, not asked again.
    let running = parts.fetch.direct(&ea, 0, 100, for_read(&row));
    let wants = [(&ea, 0, 100), (&ea, 70_000, 300), (&eb, 10, 20), (&ea, 70_000, 300)];
    let (_, batch) = futures::future::join(running, parts.fetch.direct_many(&wants, for_read(&row))).await;
    let batch = batch.unwrap();
    assert_eq!(batch[0].data[..], a[..100]);
    assert_eq!(batch[1].data[..], a[70_000..70_300]);
    assert_eq!(batch[2].data[..], b[10..30]);
    assert_eq!(batch[3].data[..], a[70_000..70_300], "a range asked twice in a call is fetched once");
    assert_eq!(parts.supply.batches.load(SeqCst), 1, "the misses of one call cross in one call");
    assert_eq!(parts.supply.fetches.load(SeqCst), 3, "the running range and two new ones");
    assert_eq!(row.hub_bytes.load(Relaxed), 420);
    assert!(parts.capacity.used() == 0, "ranges fetched as read are not stored");
}

#[tokio::test]
async fn a_fill_stores_the_chunk_from_the_readers_part_and_the_rest_crossing_once() {
    let parts = parts(CHUNK, 1 << 30, 1 << 30);
    let data = pattern(3 * CHUNK as usize, 10);
    parts.supply.put("ds", "s", "v1", data.clone());
    let entry = parts.entry("ds", "s").await.unwrap();
    let row = JobRow::default();
    // A reader's 5000 bytes inside chunk 1, fetched as read; the chunk filled beside.
    let (from, to) = (CHUNK + 1000, CHUNK + 6000);
    let part = parts.fetch.start_direct(&[(&entry, from, to - from)], for_read(&row)).remove(0);
    let fill =
        parts.fetch.fill(&entry, ChunkIndex(1), KnownPart { from, to, bytes: part.clone() }, for_read(&row));
    assert_eq!(part.await.unwrap().data[..], data[from as usize..to as usize]);
    assert_eq!(fill.taken().expect("the fill runs").stored.await.unwrap(), CHUNK);
    assert_eq!(parts.stored(&entry, CHUNK, CHUNK).unwrap(), data[CHUNK as usize..2 * CHUNK as usize]);
    assert_eq!(row.hub_bytes.load(Relaxed), CHUNK, "the part once, the rest once: the chunk's bytes");
    // At the chunk's edges the fill asks for one range, not two.
    let part = parts.fetch.start_direct(&[(&entry, 0, 10)], for_read(&row)).remove(0);
    let fill =
        parts.fetch.fill(&entry, ChunkIndex(0), KnownPart { from: 0, to: 10, bytes: part }, for_read(&row));
    fill.taken().unwrap().stored.await.unwrap();
    assert_eq!(parts.stored(&entry, 0, CHUNK).unwrap(), data[..CHUNK as usize]);
    assert_eq!(row.hub_bytes.load(Relaxed), 2 * CHUNK);
}

#[tokio::test]
async fn a_fill_whose_readers_fetch_failed_fetches_the_part_itself() {
    let parts = parts(CHUNK, 1 << 30, 1 << 30);
    let data = pattern(CHUNK as usize, 11);
    parts.supply.put("ds", "s", "v1", data.clone());
    let entry = parts.entry("ds", "s").await.unwrap();
    let row = JobRow::default();
    parts.supply.fail_next(1);
    let part = parts.fetch.start_direct(&[(&entry, 100, 200)], for_read(&row)).remove(0);
    assert!(part.clone().await.is_err(), "the reader's own fetch failed");
    let fill = parts.fetch.fill(
        &entry,
        ChunkIndex(0),
        KnownPart { from: 100, to: 300, bytes: part },
        for_read(&row),
    );
    assert_eq!(
        fill.taken().expect("the fill runs").stored.await.unwrap(),
        CHUNK,
        "readers who joined it are answered"
    );
    assert_eq!(parts.stored(&entry, 0, CHUNK).unwrap(), data);
    assert_eq!(row.hub_bytes.load(Relaxed), CHUNK, "the chunk crossed once: the failed part brought nothing");
}

/// Parts with room for one chunk in flight (a second chunk's fetch waits behind the
/// first), over a shard of `chunks` chunks of `pattern(.., seed)` whose every fetch takes
/// 50 ms: the parts, the shard's bytes, its entry and a reader's row.
async fn one_chunk_in_flight(
    chunks: usize,
    seed: u8,
) -> (crate::testing::Parts, Vec<u8>, Arc<Entry>, JobRow) {
    let parts = parts(CHUNK, 1 << 30, CHUNK);
    let data = pattern(chunks * CHUNK as usize, seed);
    parts.supply.put("ds", "s", "v1", data.clone());
    parts.supply.set_latency(Duration::from_millis(50));
    let entry = parts.entry("ds", "s").await.unwrap();
    (parts, data, entry, JobRow::default())
}

/// Waits until `first` (chunk 0) and `queued` (chunk 1) are stored, and checks chunk 1 on
/// disk against `data`.
async fn both_stored(
    parts: &crate::testing::Parts,
    (first, queued): (ChunkFetch, ChunkFetch),
    entry: &Entry,
    data: &[u8],
) {
    assert_eq!(queued.stored.await.unwrap(), CHUNK);
    first.stored.await.unwrap();
    assert_eq!(
        parts.stored(entry, CHUNK, CHUNK).unwrap(),
        data[CHUNK as usize..],
        "the chunk, whole and right"
    );
}

#[tokio::test]
async fn a_chunk_fetch_waiting_for_room_takes_a_readers_part_lent_meanwhile() {
    let (parts, data, entry, row) = one_chunk_in_flight(2, 12).await;
    let first = parts.fetch.chunk(&entry, ChunkIndex(0), for_read(&row)).unwrap();
    let queued = parts.fetch.chunk(&entry, ChunkIndex(1), for_read(&row)).unwrap();
    assert!(first.is_started() && !queued.is_started(), "the second waits for room");
    // A reader of 100 bytes of chunk 1 fetches them as read and lends them to the fetch.
    let (from, to) = (CHUNK + 500, CHUNK + 600);
    let part = parts.fetch.start_direct(&[(&entry, from, to - from)], for_read(&row)).remove(0);
    assert!(queued.lend(KnownPart { from, to, bytes: part.clone() }));
    assert!(
        !queued.lend(KnownPart { from: from + 50, to: to + 50, bytes: part.clone() }),
        "no part over one lent"
    );
    assert_eq!(part.await.unwrap().data[..], data[from as usize..to as usize], "answered before the chunk");
    both_stored(&parts, (first, queued), &entry, &data).await;
    assert_eq!(row.hub_bytes.load(Relaxed), 2 * CHUNK, "each chunk crossed once, the lent part with it");
}

#[tokio::test]
async fn a_chunk_fetch_waiting_for_room_takes_every_part_lent_and_asks_only_for_the_gaps() {
    let (parts, data, entry, row) = one_chunk_in_flight(2, 15).await;
    let first = parts.fetch.chunk(&entry, ChunkIndex(0), for_read(&row)).unwrap();
    let queued = parts.fetch.chunk(&entry, ChunkIndex(1), for_read(&row)).unwrap();
    assert!(!queued.is_started(), "the second waits for room");
    // Three readers (a job's first batch) each lend the part of chunk 1 they fetch as read.
    let lent = [(CHUNK + 100, CHUNK + 300), (CHUNK + 5000, CHUNK + 6000), (2 * CHUNK - 10, 2 * CHUNK)];
    let batches = parts.supply.batches.load(SeqCst);
    let mut reads = Vec::new();
    for (from, to) in lent {
        let part = parts.fetch.start_direct(&[(&entry, from, to - from)], for_read(&row)).remove(0);
        assert!(queued.lend(KnownPart { from, to, bytes: part.clone() }), "{from}..{to} is lent");
        reads.push((from, to, part));
    }
    for (from, to, part) in reads {
        assert_eq!(
            part.await.unwrap().data[..],
            data[from as usize..to as usize],
            "each answered by its own"
        );
    }
    both_stored(&parts, (first, queued), &entry, &data).await;
    let calls = parts.supply.batches.load(SeqCst) - batches;
    assert_eq!(calls, lent.len() + 1, "a call per reader, and the gaps around their parts in one");
    assert_eq!(row.hub_bytes.load(Relaxed), 2 * CHUNK, "each chunk crossed once, the lent parts with it");
}

#[tokio::test]
async fn a_fill_whose_many_lent_parts_failed_fetches_them_in_one_call() {
    let (parts, data, entry, row) = one_chunk_in_flight(2, 16).await;
    let (batches, ranges) = (parts.supply.batches.load(SeqCst), parts.supply.fetches.load(SeqCst));
    let first = parts.fetch.chunk(&entry, ChunkIndex(0), for_read(&row)).unwrap();
    let queued = parts.fetch.chunk(&entry, ChunkIndex(1), for_read(&row)).unwrap();
    assert!(!queued.is_started(), "the second waits for room");
    // 30 readers' parts of chunk 1 lent to it, whose fetches all came back empty (as the
    // reads alongside a first stat do when they find no room).
    let failed = || futures::future::ready(Err(Error::Internal("not fetched".into()))).boxed().shared();
    for i in 0..30 {
        let from = CHUNK + 1000 * i;
        assert!(queued.lend(KnownPart { from, to: from + 100, bytes: failed() }), "part {i} is lent");
    }
    both_stored(&parts, (first, queued), &entry, &data).await;
    // Chunk 0 in one call; for chunk 1 the 30 gaps around the parts in one call and the 30
    // parts in another: two round trips, not 31.
    assert_eq!(parts.supply.batches.load(SeqCst) - batches, 2, "the failed parts asked together");
    assert_eq!(parts.supply.fetches.load(SeqCst) - ranges, 1 + 30 + 30, "each range asked once");
    assert_eq!(
        row.hub_bytes.load(Relaxed),
        2 * CHUNK,
        "each chunk crossed once: the empty parts brought nothing"
    );
}

#[tokio::test]
async fn a_fill_offered_after_a_fetch_of_its_chunk_ended_or_began_never_brings_the_part_twice() {
    let (parts, data, entry, row) = one_chunk_in_flight(3, 14).await;
    // A reader's part of chunk `index` offered to its fill, after the reader saw the chunk
    // absent and no fetch of it. (Its bytes never come: where a fill takes the part, it
    // fetches it itself, so the link's count shows every part asked twice.)
    let offer = |index: u64| {
        let (from, to) = (index * CHUNK + 100, index * CHUNK + 200);
        let bytes = futures::future::ready(Err(Error::Internal("not fetched".into()))).boxed().shared();
        parts.fetch.fill(&entry, ChunkIndex(index), KnownPart { from, to, bytes }, for_read(&row))
    };
    let first = parts.fetch.chunk(&entry, ChunkIndex(0), for_read(&row)).unwrap();
    let queued = parts.fetch.chunk(&entry, ChunkIndex(1), for_read(&row)).unwrap();
    // A fetch that began meanwhile and waits for room takes the part (it asks for the rest).
    assert!(matches!(offer(1), Filled::Taken(_)), "a fetch waiting for room is lent the part");
    // One that began and has asked upstream brings the part itself: the reader joins it.
    assert!(matches!(offer(0), Filled::Running(_)), "a started fetch is joined, not lent a part");
    first.stored.await.unwrap();
    queued.stored.await.unwrap();
    // One that ended meanwhile left the chunk stored: the reader reads it from the store.
    assert!(matches!(offer(0), Filled::Stored), "a stored chunk is read from the store");
    assert_eq!(row.hub_bytes.load(Relaxed), 2 * CHUNK, "each chunk crossed once");
    assert_eq!(parts.stored(&entry, 0, 2 * CHUNK).unwrap(), data[..2 * CHUNK as usize]);
}

#[tokio::test]
async fn a_reader_of_another_part_of_a_chunk_being_filled_waits_for_its_piece_only() {
    let parts = parts(CHUNK, 1 << 30, 1 << 30);
    let data = pattern(CHUNK as usize, 13);
    parts.supply.put("ds", "s", "v1", data.clone());
    let entry = parts.entry("ds", "s").await.unwrap();
    parts.supply.set_latency(Duration::from_millis(50));
    let row = JobRow::default();
    let (from, to) = (30_000, 31_000);
    let part = parts.fetch.start_direct(&[(&entry, from, to - from)], for_read(&row)).remove(0);
    let fill = parts
        .fetch
        .fill(&entry, ChunkIndex(0), KnownPart { from, to, bytes: part }, for_read(&row))
        .taken()
        .unwrap();
    // Once started, the fill says which piece holds a range (before and after the part).
    for _ in 0..1000 {
        if fill.piece_for(100, 200).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // A range within the reader's part waits for that part, and so does a member hedged to
    // that joins this fetch (`running_range`, asked while the fill runs: every fetch takes
    // 50 ms here): no longer than the first reader.
    let joined = parts.fetch.running_range(&entry, 30_100, 100).expect("the fill is running");
    let (start, within) = fill.piece_for(30_100, 30_200).expect("the reader's part");
    assert_eq!((start, within.await.unwrap().data.len() as u64), (from, to - from));
    assert_eq!(joined.await.unwrap().data[..], data[30_100..30_200]);
    let (start, before) = fill.piece_for(100, 200).expect("the piece before the part");
    assert_eq!(start, 0);
    assert_eq!(before.await.unwrap().data[..], data[..from as usize]);
    let (start, after) = fill.piece_for(40_000, 40_010).expect("the piece after it");
    assert_eq!(start, to);
    assert_eq!(after.await.unwrap().data[..], data[to as usize..]);
    assert!(fill.piece_for(29_000, 32_000).is_none(), "a range across pieces waits for the chunk");
    assert_eq!(fill.stored.await.unwrap(), CHUNK);
    assert_eq!(parts.stored(&entry, 0, CHUNK).unwrap(), data);
}

#[tokio::test]
async fn a_chunk_fetch_takes_up_the_reads_alongside_the_stat_within_its_chunk() {
    // A job's first samples read alongside the shard's stat; a prefetch (or a plan's
    // window) reaches their chunk while they run: it brings only the rest.
    let parts = parts(CHUNK, 1 << 30, 1 << 30);
    let data = pattern(CHUNK as usize, 16);
    parts.supply.put("ds", "s", "v1", data.clone());
    parts.supply.set_latency(Duration::from_millis(30));
    let entry = parts.entry("ds", "s").await.unwrap();
    let row = JobRow::default();
    let samples = [(1000, 2000), (40_000, 1000)];
    parts.fetch.speculate(("ds", "s"), &samples, &row);
    let _kept = parts.fetch.alongside("ds", "s", samples.to_vec());
    let fetch = parts.fetch.chunk(&entry, ChunkIndex(0), for_read(&row)).unwrap();
    assert_eq!(fetch.stored.await.unwrap(), CHUNK);
    assert_eq!(parts.stored(&entry, 0, CHUNK).unwrap(), data, "the chunk, whole and right");
    assert_eq!(row.hub_bytes.load(Relaxed), CHUNK, "the samples crossed once, with the rest around them");
}
