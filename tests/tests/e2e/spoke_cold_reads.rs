//! A cold read costs one round trip to the hub: when the spoke has never seen a shard,
//! the chunks a read (or a stream's head) covers cross the link alongside the shard's
//! StatShard, and are kept
//! only when the hub read them at the version the stat returned.
//!
//! The hub here is the real read service over a real directory, wrapped: its StatShard
//! waits (bounded) until it has seen a read of the shard, so a spoke that asks for the
//! chunks only after the stat fails the test; and it can answer unpinned reads as if the
//! shard had just changed (other bytes, another version), which the spoke must not keep.

#![allow(clippy::unwrap_used)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
    },
    time::Duration,
};

use hub_server::source::{HubSource, local::LocalSource};
use shardcache_client::{Client, Range};
use shardcache_proto::{
    checksum::crc32c,
    v1::{
        Chunk, ListDatasetsRequest, ListDatasetsResponse, ListShardsRequest, ListShardsResponse,
        ReadRangeRequest, ReadRangesRequest, ReadRangesResponse, ShardInfo, StatShardRequest,
        StreamShardRequest, shard_reader_client::ShardReaderClient, shard_reader_server::ShardReader,
    },
};
use shardcache_reader::ReadService;
use shardcache_tests::{TestSpoke, spoke_options, test_options, write_pattern};
use spoke_cache::store::entry::ChunkIndex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

/// How long a StatShard waits for a read of its shard before answering anyway (then the
/// test fails on the order it saw, not on time).
const STAT_WAITS_AT_MOST: Duration = Duration::from_secs(5);

struct Hub {
    inner: ReadService<HubSource<Arc<LocalSource>>>,
    read_seen: Notify,
    reads_seen: AtomicU64,
    /// Stats answered before any read of the shard had arrived.
    stats_before_reads: AtomicU64,
    /// Unpinned reads are answered as if the shard had changed since.
    unpinned_see_a_new_version: AtomicBool,
    unpinned_reads: AtomicU64,
    /// Reads pinned to a version (chunk fills, not reads alongside a stat) of this shard
    /// wait until `release` turns true: they hold the spoke's link gate meanwhile.
    held_shard: std::sync::Mutex<Option<String>>,
    held: AtomicU64,
    release: tokio::sync::watch::Sender<bool>,
}

#[tonic::async_trait]
impl ShardReader for Hub {
    async fn list_datasets(
        &self,
        r: Request<ListDatasetsRequest>,
    ) -> Result<Response<ListDatasetsResponse>, Status> {
        self.inner.list_datasets(r).await
    }
    async fn list_shards(
        &self,
        r: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsResponse>, Status> {
        self.inner.list_shards(r).await
    }
    async fn stat_shard(&self, r: Request<StatShardRequest>) -> Result<Response<ShardInfo>, Status> {
        let seen = self.read_seen.notified();
        if self.reads_seen.load(SeqCst) == 0 && tokio::time::timeout(STAT_WAITS_AT_MOST, seen).await.is_err()
        {
            self.stats_before_reads.fetch_add(1, SeqCst);
        }
        self.inner.stat_shard(r).await
    }
    async fn read_range(&self, r: Request<ReadRangeRequest>) -> Result<Response<Chunk>, Status> {
        let unpinned = r.get_ref().expected_version.is_empty();
        self.saw_reads(1);
        self.held_if(std::slice::from_ref(r.get_ref())).await;
        let mut chunk = self.inner.read_range(r).await?.into_inner();
        if unpinned {
            self.unpinned(&mut chunk);
        }
        Ok(Response::new(chunk))
    }
    // The reads alongside a stat come in one ReadRanges when there are several.
    async fn read_ranges(
        &self,
        r: Request<ReadRangesRequest>,
    ) -> Result<Response<ReadRangesResponse>, Status> {
        let unpinned: Vec<bool> =
            r.get_ref().ranges.iter().map(|range| range.expected_version.is_empty()).collect();
        self.saw_reads(unpinned.len() as u64);
        self.held_if(&r.get_ref().ranges).await;
        let mut answer = self.inner.read_ranges(r).await?.into_inner();
        for (chunk, unpinned) in answer.chunks.iter_mut().zip(unpinned) {
            if unpinned {
                self.unpinned(chunk);
            }
        }
        Ok(Response::new(answer))
    }
    type StreamShardStream = <ReadService<HubSource<Arc<LocalSource>>> as ShardReader>::StreamShardStream;
    async fn stream_shard(
        &self,
        r: Request<StreamShardRequest>,
    ) -> Result<Response<Self::StreamShardStream>, Status> {
        self.inner.stream_shard(r).await
    }
}

impl Hub {
    /// Waits for `release` if any of `ranges` is a pinned read of the held shard.
    async fn held_if(&self, ranges: &[ReadRangeRequest]) {
        let held = self.held_shard.lock().unwrap().clone();
        if !ranges.iter().any(|r| !r.expected_version.is_empty() && Some(&r.shard) == held.as_ref()) {
            return;
        }
        self.held.fetch_add(1, SeqCst);
        let _ = self.release.subscribe().wait_for(|released| *released).await;
    }

    /// `ranges` reads of a shard arrived.
    fn saw_reads(&self, ranges: u64) {
        self.reads_seen.fetch_add(ranges, SeqCst);
        self.read_seen.notify_waiters();
    }

    /// The answer to an unpinned read, counted: as the hub read it, or as if the shard had
    /// just changed.
    fn unpinned(&self, chunk: &mut Chunk) {
        self.unpinned_reads.fetch_add(1, SeqCst);
        if self.unpinned_see_a_new_version.load(SeqCst) {
            // A consistent answer for a newer version: other bytes, their own CRC.
            chunk.data = chunk.data.iter().map(|b| b ^ 0xff).collect::<Vec<u8>>().into();
            chunk.crc32c = crc32c(&chunk.data);
            chunk.version.push_str("-newer");
        }
    }
}

/// The wrapped hub over `root`, and its address.
async fn start_hub(root: &std::path::Path, newer_when_unpinned: bool) -> (Arc<Hub>, String) {
    let mut limits = test_options().limits;
    limits.max_read = 4 << 20;
    let hub = Arc::new(Hub {
        inner: ReadService::new(HubSource(Arc::new(LocalSource::new(root).unwrap())), limits, Arc::new(())),
        read_seen: Notify::new(),
        reads_seen: AtomicU64::new(0),
        stats_before_reads: AtomicU64::new(0),
        unpinned_see_a_new_version: AtomicBool::new(newer_when_unpinned),
        unpinned_reads: AtomicU64::new(0),
        held_shard: std::sync::Mutex::new(None),
        held: AtomicU64::new(0),
        release: tokio::sync::watch::Sender::new(false),
    });
    let endpoint = shardcache_tests::serve_reader(hub.clone()).await;
    (hub, endpoint)
}

/// A spoke with 256 KiB chunks, no background fetches, in front of `hub`.
async fn start_spoke(hub: &str, cache: &std::path::Path) -> (TestSpoke, Client) {
    let mut options = spoke_options(hub);
    options.cache.fetch_whole_shard = false;
    options.cache.read_ahead_chunks = 0;
    let spoke = TestSpoke::start(cache, options).await;
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    (spoke, client)
}

/// The hub answered the stat before any read had arrived, saw `chunks` reads alongside
/// it, and nothing fetched again after it: a cold read cost one round trip.
fn assert_one_round_trip(hub: &Hub, chunks: u64) {
    assert_eq!(hub.stats_before_reads.load(SeqCst), 0, "the stat was answered before any read had arrived");
    assert_eq!(hub.unpinned_reads.load(SeqCst), chunks, "the chunks were read alongside the stat");
    assert_eq!(hub.reads_seen.load(SeqCst), chunks, "and nothing was fetched again after it");
}

#[tokio::test]
async fn a_cold_read_asks_for_its_chunks_alongside_the_stat_and_keeps_them() {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = write_pattern(&root.path().join("ds/s.bin"), 3 << 20, 7);
    let (hub, endpoint) = start_hub(root.path(), false).await;
    let (spoke, client) = start_spoke(&endpoint, cache.path()).await;

    // 1 MiB from 512 KiB: chunks 2..=5 of 256 KiB, all whole inside the read.
    let read = client.read_range(&Range::new("ds", "s.bin", 512 << 10, 1 << 20)).await.unwrap();
    assert!(read.data == data[512 << 10..(512 << 10) + (1 << 20)], "the bytes of the file");
    assert_one_round_trip(&hub, 4);

    // Kept: the same range again is a hit, and nothing more crosses the link.
    let again = client.read_range(&Range::new("ds", "s.bin", 512 << 10, 1 << 20)).await.unwrap();
    assert!(again.data == read.data);
    assert_eq!(hub.reads_seen.load(SeqCst), 4);
    // Readers get the bytes before they are stored: wait (bounded) for the admissions.
    for _ in 0..500 {
        if spoke.cache.fetches_in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let entry = spoke.cache.cached_entry("ds", "s.bin").unwrap();
    assert!(
        (2..=5).all(|i| entry.has_chunk(ChunkIndex(i)))
            && !entry.has_chunk(ChunkIndex(1))
            && !entry.has_chunk(ChunkIndex(6))
    );
}

#[tokio::test]
async fn a_cold_batch_of_small_reads_asks_for_them_alongside_the_stat() {
    // A job's first batch: samples smaller than a chunk, in several chunks of a shard the
    // spoke has never seen. They cross the link alongside the stat, in one call, as they
    // would with no cache (a round trip later through a cold spoke before issue 58).
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = write_pattern(&root.path().join("ds/s.bin"), 3 << 20, 8);
    let (hub, endpoint) = start_hub(root.path(), false).await;
    let (_spoke, client) = start_spoke(&endpoint, cache.path()).await;
    let samples = [(1000, 16 << 10), (700 << 10, 16 << 10), (2 << 20, 4000)];
    let ranges: Vec<Range> = samples.iter().map(|&(at, len)| Range::new("ds", "s.bin", at, len)).collect();
    let read = client.read_ranges(&ranges).await.unwrap();
    for (got, &(at, len)) in read.iter().zip(&samples) {
        assert!(got.data == data[at as usize..(at + len) as usize], "the bytes of the file at {at}");
    }
    assert_eq!(hub.stats_before_reads.load(SeqCst), 0, "the stat was answered before any read had arrived");
    assert_eq!(hub.unpinned_reads.load(SeqCst), 3, "the samples were read alongside the stat");
}

#[tokio::test]
async fn a_cold_stream_of_a_known_length_asks_for_its_head_alongside_the_stat() {
    // As `shardcache cat --length` streams: the spoke reads the stream's head (up to its
    // --max-read, 1 MiB here) alongside the stat, one round trip to the hub, not two.
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = write_pattern(&root.path().join("ds/s.bin"), 3 << 20, 9);
    let (hub, endpoint) = start_hub(root.path(), false).await;
    let (_spoke, client) = start_spoke(&endpoint, cache.path()).await;

    let stream = client.stream_range(&Range::new("ds", "s.bin", 512 << 10, 1 << 20)).await.unwrap();
    let got = stream.read_to_end().await.unwrap();
    assert!(got == data[512 << 10..(512 << 10) + (1 << 20)], "the bytes of the file");
    assert_one_round_trip(&hub, 4);
}

#[tokio::test]
async fn a_cold_stream_to_the_end_asks_for_its_head_alongside_the_stat() {
    // A StreamShard of no length (the S3 door's whole-object GET): nobody knows where the
    // shard ends, so the head (--max-read, 1 MiB here) is asked cut at the end: chunks
    // 0..=3 of 256 KiB of a 600 KiB shard, of which the hub sends 256, 256, 88 and 0 KiB.
    // One round trip; the short last chunk is kept too.
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = write_pattern(&root.path().join("ds/s.bin"), 600 << 10, 10);
    let (hub, endpoint) = start_hub(root.path(), false).await;
    let (spoke, _client) = start_spoke(&endpoint, cache.path()).await;

    let mut raw = ShardReaderClient::connect(spoke.endpoint.clone()).await.unwrap();
    let whole = StreamShardRequest { dataset: "ds".into(), shard: "s.bin".into(), ..Default::default() };
    let mut stream = raw.stream_shard(whole).await.unwrap().into_inner();
    let mut got = Vec::new();
    while let Some(message) = stream.message().await.unwrap() {
        assert_eq!(message.offset, got.len() as u64);
        got.extend_from_slice(&message.data);
    }
    assert!(got == data, "the bytes of the file, to its end");
    assert_one_round_trip(&hub, 4);
    spoke.settled().await;
    let entry = spoke.cache.cached_entry("ds", "s.bin").unwrap();
    assert!((0..=2).all(|i| entry.has_chunk(ChunkIndex(i))), "every chunk kept, the short last one too");
}

#[tokio::test]
async fn a_cold_whole_object_get_through_the_s3_door_asks_for_its_head_alongside_the_stat() {
    // What MosaicML Streaming and `aws s3 cp` do first with every shard: GET it whole.
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = write_pattern(&root.path().join("ds/s.bin"), 600 << 10, 13);
    let (hub, endpoint) = start_hub(root.path(), false).await;
    let mut options = spoke_options(&endpoint);
    options.cache.fetch_whole_shard = false;
    options.cache.read_ahead_chunks = 0;
    let spoke = TestSpoke::start_with_s3(cache.path(), options).await;

    let addr = spoke.s3_addr.unwrap();
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET /ds/s.bin HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).await.unwrap();
    let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&answer[..head_end]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains(&format!("content-length: {}", data.len())), "{head}");
    assert!(answer[head_end..] == data[..], "the object's bytes");
    assert_one_round_trip(&hub, 4);
}

#[tokio::test]
async fn a_stream_of_a_shard_stated_but_not_held_fetches_its_chunks_whole() {
    // As MosaicML Streaming reads through the S3 door: a HeadObject (the spoke's stat),
    // then the GetObject's stream. With cache chunks larger than a stream's messages (4
    // MiB and 1 MiB by default; 2 MiB and 1 MiB here) each chunk the stream covers crosses
    // the link in one read (one round trip), not as its first message and then the rest.
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = write_pattern(&root.path().join("ds/s.bin"), (3 << 20) - 1000, 14);
    let (hub, endpoint) = start_hub(root.path(), false).await;
    let mut options = spoke_options(&endpoint);
    options.cache.chunk_size = 2 << 20;
    options.cache.fetch_whole_shard = false;
    options.cache.read_ahead_chunks = 0;
    options.max_read = 4 << 20;
    let spoke = TestSpoke::start(cache.path(), options).await;
    let client = Client::connect(&spoke.endpoint).await.unwrap();
    // (The wrapped hub holds this stat until it gives up waiting for a read: none comes.)
    assert_eq!(client.stat("ds", "s.bin").await.unwrap().size, data.len() as u64);
    assert_eq!(hub.reads_seen.load(SeqCst), 0);

    let stream = client.stream_shard("ds", "s.bin", 0, None).await.unwrap();
    assert!(stream.read_to_end().await.unwrap() == data, "the bytes of the file");
    assert_eq!(hub.reads_seen.load(SeqCst), 2, "one read for each chunk, the short last one too");
    spoke.settled().await;
    let entry = spoke.cache.cached_entry("ds", "s.bin").unwrap();
    assert!((0..2).all(|i| entry.has_chunk(ChunkIndex(i))), "every chunk kept");
}

#[tokio::test]
async fn chunks_read_at_another_version_than_the_stat_are_not_kept() {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = write_pattern(&root.path().join("ds/s.bin"), 3 << 20, 9);
    let (hub, endpoint) = start_hub(root.path(), true).await;
    let (spoke, client) = start_spoke(&endpoint, cache.path()).await;

    let read = client.read_range(&Range::new("ds", "s.bin", 0, 1 << 20)).await.unwrap();
    assert!(read.data == data[..1 << 20], "the bytes of the stat's version, not the newer ones");
    assert_eq!(hub.unpinned_reads.load(SeqCst), 4, "the speculative reads happened");
    assert_eq!(hub.reads_seen.load(SeqCst), 8, "and were fetched again, pinned to the stat's version");
    let entry = spoke.cache.cached_entry("ds", "s.bin").unwrap();
    assert!(!entry.version.ends_with("-newer"));
    // What the cache kept is the stat's version too: a hit returns the same bytes.
    let again = client.read_range(&Range::new("ds", "s.bin", 0, 1 << 20)).await.unwrap();
    assert!(again.data == data[..1 << 20]);
    assert_eq!(hub.reads_seen.load(SeqCst), 8);
}

#[tokio::test]
async fn a_read_past_the_end_of_an_unseen_shard_is_refused_as_on_the_hub() {
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_pattern(&root.path().join("ds/s.bin"), 600 << 10, 3);
    let (_hub, endpoint) = start_hub(root.path(), false).await;
    let (_spoke, client) = start_spoke(&endpoint, cache.path()).await;
    // Speculates chunks 0..=3 (1 MiB), of which only two exist: the read still gets the
    // hub's answer for a range past the end, and the spoke keeps serving.
    let err = client.read_range(&Range::new("ds", "s.bin", 0, 1 << 20)).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("past the end of the shard"), "{err}");
    let ok = client.read_range(&Range::new("ds", "s.bin", 0, 512 << 10)).await.unwrap();
    assert_eq!(ok.data.len(), 512 << 10);
}

#[tokio::test]
async fn a_read_of_a_part_a_waiting_fill_holds_is_answered_by_it_not_after_the_gate() {
    // Two ranks of a job read the same sample of a cold shard, one after the other, while
    // the link gate is busy (issue 58: 1 in 8-40 readers' first batch waited 1.3-2.6 s at
    // 200 Mbit/s). The first is answered by its own read; the chunk's fill, which holds
    // that read's bytes, waits for its turn behind fills of another shard. The second is
    // answered by the same bytes at once, not after the fill's turn and the whole chunk,
    // and nothing crosses the link twice.
    let (root, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_pattern(&root.path().join("ds/t.bin"), 4 << 20, 11);
    let data = write_pattern(&root.path().join("ds/s.bin"), 1 << 20, 12);
    let (hub, endpoint) = start_hub(root.path(), false).await;
    let (spoke, client) = start_spoke(&endpoint, cache.path()).await;

    // A sample in each of t.bin's 16 chunks: 16 fills, more than the gate lets in beside
    // each other (about two chunks on loopback); those it lets in are held at the hub.
    *hub.held_shard.lock().unwrap() = Some("t.bin".into());
    let samples: Vec<Range> =
        (0..16).map(|c| Range::new("ds", "t.bin", c * (256 << 10) + 1000, 100)).collect();
    client.read_ranges(&samples).await.unwrap();
    shardcache_tests::until("t.bin's fills asking the hub", || hub.held.load(SeqCst) > 0).await;

    let sample = Range::new("ds", "s.bin", 5000, 300);
    let first = client.read_range(&sample).await.unwrap();
    assert!(first.data == data[5000..5300], "the first rank's bytes");
    let reads = hub.reads_seen.load(SeqCst);
    let second = tokio::time::timeout(Duration::from_secs(10), client.read_range(&sample))
        .await
        .expect("the second rank waited for the fill's turn at the link gate")
        .unwrap();
    assert!(second.data == data[5000..5300], "the second rank's bytes");
    assert_eq!(hub.reads_seen.load(SeqCst), reads, "the second read brought nothing over the link");
    assert!(
        !spoke.cache.cached_entry("ds", "s.bin").unwrap().has_chunk(ChunkIndex(0)),
        "the fill still waits"
    );

    // Let the fills go: s.bin's chunk is stored whole and right, its sample not asked again.
    hub.release.send_replace(true);
    spoke.settled().await;
    let entry = spoke.cache.cached_entry("ds", "s.bin").unwrap();
    assert!(entry.has_chunk(ChunkIndex(0)), "the chunk was filled");
    let hit = client.read_range(&Range::new("ds", "s.bin", 0, 256 << 10)).await.unwrap();
    assert!(hit.data == data[..256 << 10], "the stored chunk");
}
