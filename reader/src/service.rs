//! The `shardcache.v1.ShardReader` service over any [`Source`]: validates every request,
//! checks grants, enforces the read limits, pages listings, shapes `ReadRanges` and
//! `StreamShard`, and stamps each data message with its CRC32C and version.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};
use tracing::Instrument as _;

use futures::{StreamExt, TryStreamExt};
use shardcache_proto::{
    checksum::Checked,
    encoding,
    names::{DatasetName, ShardName},
    range,
    v1::{
        Chunk, ListDatasetsRequest, ListDatasetsResponse, ListShardsRequest, ListShardsResponse,
        ReadRangeRequest, ReadRangesRequest, ReadRangesResponse, ShardInfo, StatShardRequest,
        StreamShardRequest, shard_reader_server::ShardReader,
    },
};
use shardcache_serving::auth::Grant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::{
    ReadContext, ReadError,
    source::{STALE_METADATA, ShardHandle, ShardMeta, Source},
};

/// Shards per `ListShards` page when the request does not say.
pub const DEFAULT_PAGE_SIZE: usize = 1000;
/// Largest page a client may ask for; bounds one response to ~1 MB of names.
pub const MAX_PAGE_SIZE: usize = 10_000;
/// Messages a stream reads ahead of what the client has taken. Two keeps the source busy
/// while the previous message is on the wire; at 1 MiB messages it is 2 MiB per stream.
pub const STREAM_READ_AHEAD: usize = 2;

/// Shards one `ReadRanges` call opens at once (each may cost the source a stat upstream):
/// a trainer's batch names a few; this bounds what one request can fan out to.
pub const OPENS_PER_CALL: usize = 64;

/// How reads are cut and bounded.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    /// Size of the messages `StreamShard` sends (and the alignment of their offsets),
    /// reported as `ShardInfo.message_size`.
    pub message_size: u32,
    /// Most bytes one `ReadRange` or `ReadRanges` call returns.
    pub max_read: u64,
    /// zstd level of the messages sent to readers that take zstd, where a message
    /// compresses (`shardcache_proto::encoding`); `None`: every message as it is.
    pub compression: Option<i32>,
}

/// What a server counts of the requests it serves (the hub's stats, the spoke's
/// metrics). Every method has a default that counts nothing.
pub trait Observer: Send + Sync + std::fmt::Debug + 'static {
    /// A `ListDatasets`, `ListShards` or `StatShard` call.
    fn stat_request(&self) {}
    /// A `ReadRange`, `ReadRanges` or `StreamShard` call.
    fn read_request(&self) {}
    /// Shard bytes about to be sent in data messages.
    fn served(&self, _bytes: usize) {}
    /// Bytes of data messages as sent: `served`'s, less what compression saved.
    fn sent(&self, _bytes: usize) {}
    /// A read finished: a `ReadRange` or `ReadRanges` call, or one message of a stream.
    fn read_latency(&self, _elapsed: Duration, _context: &ReadContext) {}
}

/// Counts nothing.
impl Observer for () {}

/// `ShardReader` over a source.
#[derive(Debug)]
pub struct ReadService<S> {
    source: S,
    limits: ReadLimits,
    observer: Arc<dyn Observer>,
}

type Result<T, E> = std::result::Result<T, E>;

impl<S: Source> ReadService<S> {
    /// The zstd level for a request's messages: this server's, when the reader takes zstd.
    fn level(&self, context: &ReadContext) -> Option<i32> {
        self.limits.compression.filter(|_| context.accepts_zstd)
    }

    /// `chunks` as sent to the reader of `context` (compressed where that pays), counted.
    async fn encoded(&self, chunks: Vec<Chunk>, context: &ReadContext) -> Vec<Chunk> {
        let sent = encode_all(chunks, self.level(context)).await;
        self.observer.sent(sent.iter().map(|c| c.data.len()).sum());
        sent
    }

    pub fn new(source: S, limits: ReadLimits, observer: Arc<dyn Observer>) -> Self {
        Self { source, limits, observer }
    }

    /// Opens a shard for `reads` for `context` (see [`Source::open_for`]), holding it to
    /// `expected_version` when the client gave one.
    async fn open(
        &self,
        dataset: &str,
        shard: &str,
        expected_version: &str,
        reads: &[(u64, u64)],
        context: &ReadContext,
    ) -> Result<S::Shard, S::Error> {
        let (dataset_name, shard_name) = names(dataset, shard)?;
        let handle = self.source.open_for(&dataset_name, &shard_name, reads, context).await?;
        expect_version(handle.meta(), dataset, expected_version)?;
        Ok(handle)
    }

    fn shard_info(&self, dataset: &str, meta: &ShardMeta, record_size: u32) -> ShardInfo {
        ShardInfo {
            dataset: dataset.to_owned(),
            shard: meta.name.clone(),
            size: meta.size,
            version: meta.version.clone(),
            message_size: self.limits.message_size,
            record_size,
            modified_ms: meta.modified_ms,
        }
    }
}

fn names(dataset: &str, shard: &str) -> Result<(DatasetName, ShardName), ReadError> {
    Ok((DatasetName::new(dataset)?, ShardName::new(shard)?))
}

/// The length `req` reads of a shard of `size` bytes: its own, which must lie inside the
/// shard, or with `cut_at_end` what of it does (a spoke's reads alongside its first
/// stat of a shard, whose size it does not know yet).
fn within(req: &ReadRangeRequest, size: u64) -> Result<u64, ReadError> {
    if req.cut_at_end {
        return Ok(range::cut_at_end(req.offset, req.length, size));
    }
    range::check_within(req.offset, req.length, size)?;
    Ok(req.length)
}

/// `length` bytes of `handle` at `offset`; nothing read for none (a read cut at the end
/// may start past it).
async fn read_at<H: ShardHandle>(handle: &H, offset: u64, length: u64) -> Result<Checked, H::Error> {
    if length == 0 {
        return Ok(Checked::default());
    }
    handle.read_at(offset, length as usize).await
}

/// `VersionChanged` unless the shard is at `expected` (or the client did not say).
fn expect_version(meta: &ShardMeta, dataset: &str, expected: &str) -> Result<(), ReadError> {
    if expected.is_empty() || expected == meta.version {
        return Ok(());
    }
    Err(ReadError::VersionChanged {
        dataset: dataset.to_owned(),
        shard: meta.name.clone(),
        expected: expected.to_owned(),
        found: meta.version.clone(),
    })
}

/// `response`, with [`STALE_METADATA`] when the source could not confirm it.
fn marked<T>(mut response: Response<T>, stale: bool) -> Response<T> {
    if stale {
        response.metadata_mut().insert(
            STALE_METADATA,
            tonic::metadata::MetadataValue::from_static(
                "the source could not be reached; answered from what was seen",
            ),
        );
    }
    response
}

/// `chunks` compressed at `level` where that pays; off the runtime's threads when there
/// is more than a little to compress (a 4 MiB message takes milliseconds), at most
/// [`COMPRESSING`] at once, the others waiting their turn (CPU-bound work: more threads
/// than cores only take the blocking pool's threads from the source's reads). Sent as
/// they are if the compression's task fails.
async fn encode_all(chunks: Vec<Chunk>, level: Option<i32>) -> Vec<Chunk> {
    let Some(level) = level else { return chunks };
    let bytes: usize = chunks.iter().map(|c| c.data.len()).sum();
    if bytes < 64 << 10 {
        return chunks.into_iter().map(|c| encoding::encode(c, level)).collect();
    }
    let Ok(_turn) = compressing().acquire().await else { return chunks };
    // Cheap: the data are shared `Bytes`.
    let plain = chunks.clone();
    let work = move || chunks.into_iter().map(|c| encoding::encode(c, level)).collect();
    tokio::task::spawn_blocking(work).await.unwrap_or(plain)
}

/// Compressions running at once: two per core (one waits on its source read or its
/// send while the other compresses).
static COMPRESSING: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();

fn compressing() -> &'static tokio::sync::Semaphore {
    COMPRESSING.get_or_init(|| {
        tokio::sync::Semaphore::new(
            2 * std::thread::available_parallelism().map_or(2, std::num::NonZero::get),
        )
    })
}

/// A data message: `read` at `offset` of a shard at `version` (its checksum as the
/// source computed it).
fn chunk(offset: u64, read: Checked, version: &str) -> Chunk {
    Chunk { offset, crc32c: read.crc32c, data: read.data, version: version.to_owned(), ..Default::default() }
}

/// `[offset, end)` cut into messages of `size` that end on multiples of it, so every
/// reader of a shard sees the same boundaries.
fn messages(offset: u64, end: u64, size: u64) -> impl Iterator<Item = (u64, u64)> {
    std::iter::successors((offset < end).then_some(offset), move |&pos| {
        let next = pos + (size - pos % size);
        (next < end).then_some(next)
    })
    .map(move |pos| (pos, (size - pos % size).min(end - pos)))
}

#[tonic::async_trait]
impl<S: Source> ShardReader for ReadService<S> {
    async fn list_datasets(
        &self,
        request: Request<ListDatasetsRequest>,
    ) -> Result<Response<ListDatasetsResponse>, Status> {
        self.observer.stat_request();
        let grant = Grant::of(&request)?;
        // A token lists only the datasets it may read.
        let listing = self.source.list_datasets(&|name| grant.allows(name)).await.map_err(Into::into)?;
        Ok(marked(Response::new(ListDatasetsResponse { datasets: listing.datasets }), listing.stale))
    }

    async fn list_shards(
        &self,
        request: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsResponse>, Status> {
        self.observer.stat_request();
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        let dataset = DatasetName::new(&req.dataset).map_err(ReadError::from)?;
        // The token is the last name of the previous page: stable while shards come and go.
        let after = match req.page_token.as_str() {
            "" => None,
            token => {
                Some(ShardName::new(token).map_err(|_| ReadError::BadPageToken { token: token.to_owned() })?)
            }
        };
        let page_size = match req.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let page = self.source.list_shards(&dataset, after.as_ref(), page_size).await.map_err(Into::into)?;
        let next_page_token = match page.shards.last() {
            Some(last) if page.more => last.name.clone(),
            _ => String::new(),
        };
        let shards = page.shards.iter().map(|s| self.shard_info(&req.dataset, s, page.record_size)).collect();
        Ok(marked(Response::new(ListShardsResponse { shards, next_page_token }), page.stale))
    }

    async fn stat_shard(&self, request: Request<StatShardRequest>) -> Result<Response<ShardInfo>, Status> {
        self.observer.stat_request();
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        let (dataset, shard) = names(&req.dataset, &req.shard)?;
        let stat = self.source.stat(&dataset, &shard).await.map_err(Into::into)?;
        Ok(marked(Response::new(self.shard_info(&req.dataset, &stat.meta, stat.record_size)), stat.stale))
    }

    async fn read_range(&self, request: Request<ReadRangeRequest>) -> Result<Response<Chunk>, Status> {
        let started = Instant::now();
        self.observer.read_request();
        let grant = Grant::of(&request)?;
        let context = ReadContext::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        range::check_total(req.length, self.limits.max_read).map_err(ReadError::from)?;
        let handle = self
            .open(&req.dataset, &req.shard, &req.expected_version, &[(req.offset, req.length)], &context)
            .await
            .map_err(Into::into)?;
        let meta = handle.meta();
        let length = within(&req, meta.size)?;
        // `length` fits in usize: it is under `max_read`, checked above.
        traced_read(1, length);
        let data = read_at(&handle, req.offset, length).await.map_err(Into::into)?;
        self.observer.served(data.data.len());
        let mut sent = self.encoded(vec![chunk(req.offset, data, &meta.version)], &context).await;
        self.observer.read_latency(started.elapsed(), &context);
        Ok(context.relayed.mark(Response::new(sent.pop().unwrap_or_default())))
    }

    async fn read_ranges(
        &self,
        request: Request<ReadRangesRequest>,
    ) -> Result<Response<ReadRangesResponse>, Status> {
        let started = Instant::now();
        self.observer.read_request();
        let grant = Grant::of(&request)?;
        let context = ReadContext::of(&request)?;
        let ranges = request.into_inner().ranges;
        range::check_count(ranges.len()).map_err(ReadError::from)?;
        for r in &ranges {
            grant.check(&r.dataset)?;
        }
        let total = ranges.iter().fold(0u64, |sum, r| sum.saturating_add(r.length));
        range::check_total(total, self.limits.max_read).map_err(ReadError::from)?;
        // Each shard is opened once for the whole batch, so every range of one shard is
        // read at the same version even if the shard changes meanwhile; and the shards at
        // once, so a batch over shards the spoke has not seen costs one round trip.
        let mut shards: HashMap<(&str, &str), Vec<(u64, u64)>> = HashMap::new();
        for r in &ranges {
            shards.entry((r.dataset.as_str(), r.shard.as_str())).or_default().push((r.offset, r.length));
        }
        let context = &context;
        // At most OPENS_PER_CALL at once: a batch over thousands of shards the source has
        // not seen asks its upstream a few dozen at a time.
        let opens: Vec<_> = shards
            .into_iter()
            .map(|(key, reads)| async move {
                Ok::<_, S::Error>((key, self.open(key.0, key.1, "", &reads, context).await?))
            })
            .collect();
        let opened: Vec<_> = futures::stream::iter(opens)
            .buffer_unordered(OPENS_PER_CALL)
            .try_collect()
            .await
            .map_err(Into::into)?;
        let handles: HashMap<(&str, &str), S::Shard> = opened.into_iter().collect();
        let reads = ranges
            .iter()
            .map(|r| {
                let handle = &handles[&(r.dataset.as_str(), r.shard.as_str())];
                expect_version(handle.meta(), &r.dataset, &r.expected_version)?;
                Ok((handle, r.offset, within(r, handle.meta().size)?))
            })
            .collect::<Result<Vec<_>, ReadError>>()?;
        traced_read(reads.len(), total);
        // Empty reads (a read cut at the end may start past it) are not the source's.
        let asked: Vec<_> = reads.iter().filter(|&&(_, _, length)| length > 0).copied().collect();
        let mut answers = self.source.read_many(&asked).await.map_err(Into::into)?.into_iter();
        let data: Vec<Checked> = reads
            .iter()
            .map(|&(_, _, length)| match length {
                0 => Ok(Checked::default()),
                _ => answers
                    .next()
                    .ok_or_else(|| Status::internal("the source answered fewer reads than asked")),
            })
            .collect::<Result<_, Status>>()?;
        self.observer.served(data.iter().map(|d| d.data.len()).sum());
        let chunks = reads
            .iter()
            .zip(data)
            .map(|(&(handle, offset, _), data)| chunk(offset, data, &handle.meta().version))
            .collect();
        let chunks = self.encoded(chunks, context).await;
        self.observer.read_latency(started.elapsed(), context);
        Ok(context.relayed.mark(Response::new(ReadRangesResponse { chunks })))
    }

    type StreamShardStream = ReceiverStream<Result<Chunk, Status>>;

    async fn stream_shard(
        &self,
        request: Request<StreamShardRequest>,
    ) -> Result<Response<Self::StreamShardStream>, Status> {
        self.observer.read_request();
        let grant = Grant::of(&request)?;
        let context = ReadContext::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        // A stream names its head, up to what one unary read may ask (`--max-read`; to
        // the end, whose offset nobody knows yet, for a stream of no length): a spoke that
        // has never seen the shard reads it alongside the shard's stat, as for a
        // `ReadRange`, so a cold stream costs one round trip to the hub before its bytes,
        // not two (wan-bench's cold `shardcache cat` row; the S3 door's whole-object GETs).
        let head = [(req.offset, req.length.unwrap_or(u64::MAX).min(self.limits.max_read))];
        let handle = self
            .open(&req.dataset, &req.shard, &req.expected_version, &head, &context)
            .await
            .map_err(Into::into)?;
        let size = handle.meta().size;
        let length = req.length.unwrap_or(size.saturating_sub(req.offset));
        range::check_within(req.offset, length, size).map_err(ReadError::from)?;
        let spans = messages(req.offset, req.offset + length, u64::from(self.limits.message_size));
        let (tx, rx) = mpsc::channel(STREAM_READ_AHEAD);
        let observer = self.observer.clone();
        let level = self.level(&context);
        let context = Arc::new(context);
        tokio::spawn(
            async move {
                // In order, with the source's number of reads in flight; memory per stream is
                // (READ_PARALLELISM + STREAM_READ_AHEAD) messages.
                let mut reads = futures::stream::iter(spans)
                    .map(|(pos, len)| {
                        let (handle, observer, context) = (handle.clone(), observer.clone(), context.clone());
                        async move {
                            let started = Instant::now();
                            let data = handle.read_at(pos, len as usize).await?;
                            observer.served(data.data.len());
                            let sent =
                                encode_all(vec![chunk(pos, data, &handle.meta().version)], level).await;
                            observer.sent(sent.iter().map(|c| c.data.len()).sum());
                            observer.read_latency(started.elapsed(), &context);
                            Ok(sent.into_iter().next().unwrap_or_default())
                        }
                    })
                    .buffered(S::READ_PARALLELISM);
                while let Some(message) = reads.next().await {
                    let message: Result<Chunk, S::Error> = message;
                    let failed = message.is_err();
                    // A send fails when the client went away: stop reading for it.
                    if tx.send(message.map_err(Into::into)).await.is_err() || failed {
                        break;
                    }
                }
            }
            // In the request's span: the stream's reads are its children in a trace.
            .instrument(tracing::Span::current()),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// What a read request asks, on the request's span (no span of its own: one less per
/// read to export) when traces are exported.
fn traced_read(ranges: usize, bytes: u64) {
    let span = tracing::Span::current();
    shardcache_transport::telemetry::attribute(&span, "ranges", ranges as i64);
    shardcache_transport::telemetry::attribute(&span, "bytes", bytes as i64);
}

#[cfg(test)]
mod tests {
    use super::messages;

    #[test]
    fn stream_messages_end_on_multiples_of_their_size() {
        let cut: Vec<_> = messages(5, 25, 10).collect();
        assert_eq!(cut, [(5, 5), (10, 10), (20, 5)]);
        assert_eq!(messages(7, 7, 10).count(), 0);
        assert_eq!(messages(0, 30, 10).collect::<Vec<_>>(), [(0, 10), (10, 10), (20, 10)]);
    }
}
