//! The `shardcache.v1.ShardReader` service over any [`Source`]: validates every request,
//! enforces the read limits, and stamps each chunk with its CRC32C and version.

use std::{collections::HashMap, sync::Arc};

use bytes::Bytes;
use futures::{StreamExt, future::try_join_all};
use shardcache_proto::{
    checksum::crc32c,
    names::{DatasetName, ShardName},
    range,
    v1::{
        Chunk, DatasetInfo, ListDatasetsRequest, ListDatasetsResponse, ListShardsRequest, ListShardsResponse,
        ReadRangeRequest, ReadRangesRequest, ReadRangesResponse, ShardInfo, StatShardRequest,
        StreamShardRequest, shard_reader_server::ShardReader,
    },
};
use shardcache_serving::auth::Grant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::{
    Error, Result,
    source::{ShardHandle, ShardMeta, Source},
    stats::HubStats,
};

/// Shards per `ListShards` page when the request does not say.
pub const DEFAULT_PAGE_SIZE: usize = 1000;
/// Largest page a client may ask for; bounds one response to ~1 MB of names.
pub const MAX_PAGE_SIZE: usize = 10_000;
/// Chunks a stream reads ahead of what the client has taken. Two keeps the disk busy
/// while the previous chunk is on the wire; at 1 MiB chunks it is 2 MiB per stream.
pub const STREAM_READ_AHEAD: usize = 2;

/// How reads are cut and bounded.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    /// Size of the chunks `StreamShard` sends (and the alignment of their offsets).
    pub chunk_size: u32,
    /// Most bytes one `ReadRange` or `ReadRanges` call returns.
    pub max_read: u64,
}

/// `ShardReader` over a source.
#[derive(Debug)]
pub struct ReadService<S> {
    source: S,
    limits: ReadLimits,
    stats: Arc<HubStats>,
}

impl<S: Source> ReadService<S> {
    pub fn new(source: S, limits: ReadLimits, stats: Arc<HubStats>) -> Self {
        Self { source, limits, stats }
    }

    /// Opens a shard, holding it to `expected_version` when the client gave one.
    async fn open(&self, dataset: &str, shard: &str, expected_version: &str) -> Result<S::Shard> {
        let (dataset, shard) = (DatasetName::new(dataset)?, ShardName::new(shard)?);
        let handle = self.source.open(&dataset, &shard).await?;
        expect_version(handle.meta(), dataset.as_str(), expected_version)?;
        Ok(handle)
    }

    fn shard_info(&self, dataset: &str, meta: &ShardMeta, record_size: u32) -> ShardInfo {
        ShardInfo {
            dataset: dataset.to_owned(),
            shard: meta.name.clone(),
            size: meta.size,
            version: meta.version.clone(),
            chunk_size: self.limits.chunk_size,
            record_size,
        }
    }
}

/// `VersionChanged` unless the shard is at `expected` (or the client did not say).
fn expect_version(meta: &ShardMeta, dataset: &str, expected: &str) -> Result<()> {
    if expected.is_empty() || expected == meta.version {
        return Ok(());
    }
    Err(Error::VersionChanged {
        dataset: dataset.to_owned(),
        shard: meta.name.clone(),
        expected: expected.to_owned(),
        found: meta.version.clone(),
    })
}

fn chunk(offset: u64, data: Bytes, version: &str) -> Chunk {
    Chunk { offset, crc32c: crc32c(&data), data, version: version.to_owned() }
}

async fn read_checked<H: ShardHandle>(handle: &H, offset: u64, length: u64) -> Result<Chunk> {
    let meta = handle.meta();
    range::check_within(offset, length, meta.size)?;
    // `length` fits in usize: it is under `max_read`, checked by the caller.
    let data = handle.read_at(offset, length as usize).await?;
    Ok(chunk(offset, data, &meta.version))
}

#[tonic::async_trait]
impl<S: Source> ShardReader for ReadService<S> {
    async fn list_datasets(
        &self,
        request: Request<ListDatasetsRequest>,
    ) -> Result<Response<ListDatasetsResponse>, Status> {
        self.stats.stat_request();
        let grant = Grant::of(&request)?;
        let mut datasets = Vec::new();
        // A token lists only the datasets it may read.
        for meta in self.source.list_datasets().await?.into_iter().filter(|m| grant.allows(&m.name)) {
            let shards = self.source.list_shards(&DatasetName::new(&meta.name)?).await?;
            datasets.push(DatasetInfo {
                shard_count: shards.len() as u64,
                total_bytes: shards.iter().map(|s| s.size).sum(),
                name: meta.name,
                record_size: meta.record_size,
            });
        }
        Ok(Response::new(ListDatasetsResponse { datasets }))
    }

    async fn list_shards(
        &self,
        request: Request<ListShardsRequest>,
    ) -> Result<Response<ListShardsResponse>, Status> {
        self.stats.stat_request();
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        let dataset = DatasetName::new(&req.dataset)?;
        let meta = self.source.dataset(&dataset).await?;
        let shards = self.source.list_shards(&dataset).await?;
        // The token is the last name of the previous page: stable while shards come and go.
        let start = if req.page_token.is_empty() {
            0
        } else {
            let after = ShardName::new(&req.page_token)
                .map_err(|_| Error::BadPageToken { token: req.page_token.clone() })?;
            shards.partition_point(|s| s.name.as_str() <= after.as_str())
        };
        let page_size = match req.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let page = &shards[start..(start + page_size).min(shards.len())];
        let next_page_token = match page.last() {
            Some(last) if start + page.len() < shards.len() => last.name.clone(),
            _ => String::new(),
        };
        let shards = page.iter().map(|s| self.shard_info(&req.dataset, s, meta.record_size)).collect();
        Ok(Response::new(ListShardsResponse { shards, next_page_token }))
    }

    async fn stat_shard(&self, request: Request<StatShardRequest>) -> Result<Response<ShardInfo>, Status> {
        self.stats.stat_request();
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        let handle = self.open(&req.dataset, &req.shard, "").await?;
        let dataset = self.source.dataset(&DatasetName::new(&req.dataset)?).await?;
        Ok(Response::new(self.shard_info(&req.dataset, handle.meta(), dataset.record_size)))
    }

    async fn read_range(&self, request: Request<ReadRangeRequest>) -> Result<Response<Chunk>, Status> {
        self.stats.read_request();
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        range::check_total(req.length, self.limits.max_read)?;
        let handle = self.open(&req.dataset, &req.shard, &req.expected_version).await?;
        let chunk = read_checked(&handle, req.offset, req.length).await?;
        self.stats.served(chunk.data.len());
        Ok(Response::new(chunk))
    }

    async fn read_ranges(
        &self,
        request: Request<ReadRangesRequest>,
    ) -> Result<Response<ReadRangesResponse>, Status> {
        self.stats.read_request();
        let grant = Grant::of(&request)?;
        let ranges = request.into_inner().ranges;
        range::check_count(ranges.len())?;
        for r in &ranges {
            grant.check(&r.dataset)?;
        }
        let total = ranges.iter().fold(0u64, |sum, r| sum.saturating_add(r.length));
        range::check_total(total, self.limits.max_read)?;
        // A batch usually hits few shards many times: open each once.
        let mut handles: HashMap<(&str, &str), S::Shard> = HashMap::new();
        for r in &ranges {
            if let std::collections::hash_map::Entry::Vacant(slot) = handles.entry((&r.dataset, &r.shard)) {
                slot.insert(self.open(&r.dataset, &r.shard, "").await?);
            }
        }
        let reads = ranges.iter().map(|r| {
            let handle = &handles[&(r.dataset.as_str(), r.shard.as_str())];
            async move {
                expect_version(handle.meta(), &r.dataset, &r.expected_version)?;
                read_checked(handle, r.offset, r.length).await
            }
        });
        let chunks = try_join_all(reads).await?;
        self.stats.served(chunks.iter().map(|c| c.data.len()).sum());
        Ok(Response::new(ReadRangesResponse { chunks }))
    }

    type StreamShardStream = ReceiverStream<Result<Chunk, Status>>;

    async fn stream_shard(
        &self,
        request: Request<StreamShardRequest>,
    ) -> Result<Response<Self::StreamShardStream>, Status> {
        self.stats.read_request();
        let grant = Grant::of(&request)?;
        let req = request.into_inner();
        grant.check(&req.dataset)?;
        let handle = self.open(&req.dataset, &req.shard, &req.expected_version).await?;
        let size = handle.meta().size;
        let length = req.length.unwrap_or(size.saturating_sub(req.offset));
        range::check_within(req.offset, length, size).map_err(Error::from)?;
        let (end, chunk_size) = (req.offset + length, u64::from(self.limits.chunk_size));
        let (tx, rx) = mpsc::channel(STREAM_READ_AHEAD);
        let stats = self.stats.clone();
        // Chunks end on multiples of the chunk size, so every reader of a shard sees the
        // same chunk boundaries (the spoke caches by them).
        let spans = std::iter::successors((req.offset < end).then_some(req.offset), move |&pos| {
            let next = pos + (chunk_size - pos % chunk_size);
            (next < end).then_some(next)
        })
        .map(move |pos| (pos, (chunk_size - pos % chunk_size).min(end - pos)));
        tokio::spawn(async move {
            // In order, with the source's number of reads in flight; memory per stream is
            // (READ_PARALLELISM + STREAM_READ_AHEAD) chunks.
            let mut reads = futures::stream::iter(spans)
                .map(|(pos, len)| {
                    let handle = handle.clone();
                    async move {
                        handle
                            .read_at(pos, len as usize)
                            .await
                            .map(|data| chunk(pos, data, &handle.meta().version))
                    }
                })
                .buffered(S::READ_PARALLELISM);
            while let Some(message) = reads.next().await {
                if let Ok(chunk) = &message {
                    stats.served(chunk.data.len());
                }
                let failed = message.is_err();
                // A send fails when the client went away: stop reading for it.
                if tx.send(message.map_err(Status::from)).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
