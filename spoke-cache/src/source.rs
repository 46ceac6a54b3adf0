//! The cache as the read service's [`Source`]: the spoke serves the hub's API through
//! the same [`ReadService`](shardcache_reader::ReadService) as the hub, so a client
//! cannot tell the two apart except by speed. Listings pass through to the hub; shards
//! open as cache entries (one `StatShard` on the first access and after the TTL); reads
//! go through [`Cache::read_many`] (stored parts in one hop, missing chunks fetched at
//! once).

use std::sync::Arc;

use bytes::Bytes;
use shardcache_proto::{
    names::{DatasetName, ShardName},
    v1::DatasetInfo,
};
use shardcache_reader::{Observer, ShardHandle, ShardMeta, ShardPage, ShardStat, Source};

use crate::{Error, Result, cache::Cache, entry::Entry, metrics::Metrics};

/// Largest message of a StreamShard, on multiples of itself (and so of the hub's default
/// chunk size): the spoke's `ReadLimits::chunk_size` when its cache chunks are larger. A
/// stream's memory is `STREAM_READ_AHEAD` messages plus what HTTP/2 holds, so with 4 MiB
/// cache chunks as messages each open stream would hold 8 MiB: `spoke-bench`'s 16
/// streams took the spoke to 788 MiB peak RSS (BENCHMARKS.md).
pub const STREAM_MESSAGE_MAX: u64 = 1 << 20;

/// The cache, read through to the hubs.
#[derive(Debug)]
pub struct CachedSource(pub Arc<Cache>);

/// A cached shard version, opened for one request.
#[derive(Debug, Clone)]
pub struct CachedShard {
    cache: Arc<Cache>,
    entry: Arc<Entry>,
    meta: ShardMeta,
}

impl CachedSource {
    async fn entry(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
    ) -> Result<CachedShard> {
        let entry = self.0.entry_for(dataset, shard, reads).await?;
        let meta = ShardMeta { name: entry.shard.clone(), size: entry.size, version: entry.version.clone() };
        Ok(CachedShard { cache: self.0.clone(), entry, meta })
    }
}

impl Source for CachedSource {
    type Shard = CachedShard;
    type Error = Error;
    // One stream message read at a time (the default): `spoke-bench`'s warm 16-client
    // stream moved 908-1176 MB/s with 1, 966-1103 with 2 and 1014-1103 with 4 reads in
    // flight, the extra buffers taking peak RSS to 478-501 MiB of the 512 MiB target
    // (same machine, one day; BENCHMARKS.md): the stream is CPU-bound, not latency-bound.

    async fn list_datasets(&self, wanted: &(dyn Fn(&str) -> bool + Sync)) -> Result<Vec<DatasetInfo>> {
        let mut datasets = self.0.upstream().list(|hub| async move { hub.list_datasets().await }).await?;
        datasets.retain(|d| wanted(&d.name));
        Ok(datasets)
    }

    async fn list_shards(
        &self,
        dataset: &DatasetName,
        after: Option<&ShardName>,
        limit: usize,
    ) -> Result<ShardPage> {
        // Metadata: passed through to the hub, page by page (its page token is the last
        // name of the previous page, as the read service's).
        let (dataset, after) = (dataset.as_str(), after.map_or("", |a| a.as_str()));
        let page = self
            .0
            .upstream()
            .list(|hub| async move { hub.list_shards_page(dataset, limit as u32, after).await })
            .await?;
        Ok(ShardPage {
            record_size: page.shards.first().map_or(0, |s| s.record_size),
            more: !page.next_page_token.is_empty(),
            shards: page
                .shards
                .into_iter()
                .map(|s| ShardMeta { name: s.shard, size: s.size, version: s.version })
                .collect(),
        })
    }

    async fn open(&self, dataset: &DatasetName, shard: &ShardName) -> Result<CachedShard> {
        self.entry(dataset, shard, &[]).await
    }

    async fn open_for(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
    ) -> Result<CachedShard> {
        self.entry(dataset, shard, reads).await
    }

    async fn stat(&self, dataset: &DatasetName, shard: &ShardName) -> Result<ShardStat> {
        let shard = self.entry(dataset, shard, &[]).await?;
        Ok(ShardStat { record_size: shard.entry.record_size, meta: shard.meta })
    }

    async fn read_many(&self, reads: &[(&CachedShard, u64, u64)]) -> Result<Vec<Bytes>> {
        let wants: Vec<_> =
            reads.iter().map(|&(shard, offset, length)| (&shard.entry, offset, length)).collect();
        self.0.read_many(&wants).await
    }
}

impl ShardHandle for CachedShard {
    type Error = Error;

    fn meta(&self) -> &ShardMeta {
        &self.meta
    }

    async fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        self.cache.read(&self.entry, offset, len as u64).await
    }
}

/// The read service times every read into the spoke's latency histogram.
impl Observer for Metrics {
    fn read_latency(&self, elapsed: std::time::Duration) {
        self.read_latency.observe(elapsed);
    }
}
