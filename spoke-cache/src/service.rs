//! The `shardcache.v1.ShardReader` service of the spoke: the hub's API, answered from
//! the cache. Requests are validated with the same rules and words as the hub's, so a
//! client cannot tell the two apart except by speed.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use shardcache_proto::{
    checksum::crc32c,
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

use crate::{Error, Result, cache::Cache, entry::Entry};

/// Chunks a stream reads ahead of the client, as on the hub.
pub const STREAM_READ_AHEAD: usize = 2;

/// Largest message of a StreamShard, on multiples of itself (and so of the hub's default
/// chunk size). A stream's memory is `STREAM_READ_AHEAD` messages plus what HTTP/2 holds,
/// so with 4 MiB cache chunks each open stream would hold 8 MiB: `spoke-bench`'s 16
/// streams took the spoke to 788 MiB peak RSS (BENCHMARKS.md).
pub const STREAM_MESSAGE_MAX: u64 = 1 << 20;

/// `ShardReader` over the cache.
#[derive(Debug)]
pub struct CachedReader {
    cache: Arc<Cache>,
    max_read: u64,
}

impl CachedReader {
    pub fn new(cache: Arc<Cache>, max_read: u64) -> Self {
        Self { cache, max_read }
    }

    async fn entry(&self, dataset: &str, shard: &str, expected_version: &str) -> Result<Arc<Entry>> {
        let entry = self.cache.entry(&DatasetName::new(dataset)?, &ShardName::new(shard)?).await?;
        expect_version(&entry, expected_version)?;
        Ok(entry)
    }

    async fn read(&self, entry: &Arc<Entry>, offset: u64, length: u64) -> Result<Chunk> {
        range::check_within(offset, length, entry.size)?;
        let data = self.cache.read(entry, offset, length).await?;
        Ok(chunk(entry, offset, data))
    }
}

/// A data message: `data` read from `entry` at `offset`, with its CRC32C and version.
fn chunk(entry: &Entry, offset: u64, data: bytes::Bytes) -> Chunk {
    Chunk { offset, crc32c: crc32c(&data), data, version: entry.version.clone() }
}

/// `VersionChanged` unless `entry` is at `expected` (or the client did not say).
fn expect_version(entry: &Entry, expected: &str) -> Result<()> {
    if expected.is_empty() || expected == entry.version {
        return Ok(());
    }
    Err(Error::VersionChanged {
        dataset: entry.dataset.clone(),
        shard: entry.shard.clone(),
        expected: expected.to_owned(),
        found: entry.version.clone(),
    })
}

#[tonic::async_trait]
impl ShardReader for CachedReader {
    async fn list_datasets(
        &self,
        request: Request<ListDatasetsRequest>,
    ) -> Result<Response<ListDatasetsResponse>, Status> {
        let grant = Grant::of(&request)?;
        let mut datasets = self.cache.upstream.list(|hub| async move { hub.list_datasets().await }).await?;
        // A token lists only the datasets it may read.
        datasets.retain(|d| grant.allows(&d.name));
        Ok(Response::new(ListDatasetsResponse { datasets }))
    }

    async fn list_shards(
        &self,
        request: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsResponse>, Status> {
        // Listing is metadata: passed through to the hub, page by page.
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        DatasetName::new(&req.dataset).map_err(Error::from)?;
        let req = &req;
        let page = self
            .cache
            .upstream
            .list(
                |hub| async move { hub.list_shards_page(&req.dataset, req.page_size, &req.page_token).await },
            )
            .await?;
        let shards = page
            .shards
            .into_iter()
            .map(|s| ShardInfo { chunk_size: self.cache.config.chunk_size as u32, ..s })
            .collect();
        Ok(Response::new(ListShardsResponse { shards, next_page_token: page.next_page_token }))
    }

    async fn stat_shard(&self, request: Request<StatShardRequest>) -> Result<Response<ShardInfo>, Status> {
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        Ok(Response::new(self.entry(&req.dataset, &req.shard, "").await?.info()))
    }

    async fn read_range(&self, request: Request<ReadRangeRequest>) -> Result<Response<Chunk>, Status> {
        let started = Instant::now();
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        range::check_total(req.length, self.max_read).map_err(Error::from)?;
        let entry = self.entry(&req.dataset, &req.shard, &req.expected_version).await?;
        let chunk = self.read(&entry, req.offset, req.length).await?;
        self.cache.metrics.read_latency.observe(started.elapsed());
        Ok(Response::new(chunk))
    }

    async fn read_ranges(
        &self,
        request: Request<ReadRangesRequest>,
    ) -> Result<Response<ReadRangesResponse>, Status> {
        let started = Instant::now();
        let grant = Grant::of(&request)?;
        let ranges = request.into_inner().ranges;
        range::check_count(ranges.len()).map_err(Error::from)?;
        for r in &ranges {
            grant.check(&r.dataset)?;
        }
        let total = ranges.iter().fold(0u64, |sum, r| sum.saturating_add(r.length));
        range::check_total(total, self.max_read).map_err(Error::from)?;
        // Each shard is resolved once for the whole batch, so every range of one shard is
        // read at the same version even if a revalidation replaces it meanwhile; the
        // shards at once, so a cold batch over several shards costs one round trip.
        let shards: HashSet<(&str, &str)> =
            ranges.iter().map(|r| (r.dataset.as_str(), r.shard.as_str())).collect();
        let resolved = futures::future::try_join_all(
            shards
                .into_iter()
                .map(|key| async move { Ok::<_, Error>((key, self.entry(key.0, key.1, "").await?)) }),
        )
        .await?;
        let entries: HashMap<(&str, &str), Arc<Entry>> = resolved.into_iter().collect();
        let wants = ranges
            .iter()
            .map(|r| {
                let entry = &entries[&(r.dataset.as_str(), r.shard.as_str())];
                expect_version(entry, &r.expected_version)?;
                range::check_within(r.offset, r.length, entry.size)?;
                Ok((entry, r.offset, r.length))
            })
            .collect::<Result<Vec<_>>>()?;
        let data = self.cache.read_many(&wants).await?;
        let chunks =
            wants.iter().zip(data).map(|(&(entry, offset, _), data)| chunk(entry, offset, data)).collect();
        self.cache.metrics.read_latency.observe(started.elapsed());
        Ok(Response::new(ReadRangesResponse { chunks }))
    }

    type StreamShardStream = ReceiverStream<Result<Chunk, Status>>;

    async fn stream_shard(
        &self,
        request: Request<StreamShardRequest>,
    ) -> Result<Response<Self::StreamShardStream>, Status> {
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        let entry = self.entry(&req.dataset, &req.shard, &req.expected_version).await?;
        let length = req.length.unwrap_or(entry.size.saturating_sub(req.offset));
        range::check_within(req.offset, length, entry.size).map_err(Error::from)?;
        let (end, piece) = (req.offset + length, entry.chunk_size.min(STREAM_MESSAGE_MAX));
        let (tx, rx) = mpsc::channel(STREAM_READ_AHEAD);
        let cache = self.cache.clone();
        tokio::spawn(async move {
            let mut pos = req.offset;
            while pos < end {
                let started = Instant::now();
                // Messages end on multiples of their size, as on the hub.
                let len = (piece - pos % piece).min(end - pos);
                let message = cache.read(&entry, pos, len).await.map(|data| chunk(&entry, pos, data));
                cache.metrics.read_latency.observe(started.elapsed());
                let failed = message.is_err();
                if tx.send(message.map_err(Status::from)).await.is_err() || failed {
                    break;
                }
                pos += len;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
