//! The cache as the read service's [`Source`]: the spoke serves the hub's API through
//! the same [`ReadService`](shardcache_reader::ReadService) as the hub, so a client
//! cannot tell the two apart except by speed. Listings pass through to the hub; shards
//! open as cache entries (one `StatShard` on the first access and after the TTL); reads
//! go through [`Cache::read_many`] (stored parts in one hop, missing chunks fetched at
//! once).
//!
//! When the hub cannot answer, listings and stats are answered from the cache's catalog
//! (the shards read through this spoke), marked stale (`shardcache-stale`): a warm spoke
//! can start a job while its hub is away.

use std::{collections::BTreeMap, sync::Arc};

use shardcache_proto::{
    checksum::Checked,
    names::{DatasetName, ShardName},
    v1::DatasetInfo,
};
use shardcache_reader::{
    DatasetListing, Observer, ReadContext, ShardHandle, ShardMeta, ShardPage, ShardStat, Source,
};

use crate::{
    Error, Result, cache::Cache, observe::metrics::Metrics, read::path::ReadFor, store::entry::Entry,
};

/// Largest message of a StreamShard, on multiples of itself (and so of the hub's default
/// message size): the spoke's `ReadLimits::message_size` when its cache chunks are
/// larger. A stream's memory is `STREAM_READ_AHEAD` messages plus what HTTP/2 holds, so
/// with 4 MiB cache chunks as messages each open stream would hold 8 MiB (`spoke-bench`'s
/// peak RSS with 16 streams, BENCHMARKS.md).
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
    /// Who the request reads for: where its reads (and what they fetch) are counted, and
    /// the members its client already asked.
    reader: ReadFor,
}

impl CachedSource {
    async fn entry(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
        context: &ReadContext,
    ) -> Result<CachedShard> {
        let mut reader = reader_for(&self.0, context);
        let (entry, alongside) = self.0.entry_for(dataset, shard, reads, &reader).await?;
        reader.alongside = alongside;
        let meta = ShardMeta {
            name: entry.shard.clone(),
            size: entry.size,
            version: entry.version.clone(),
            modified_ms: entry.modified_ms,
        };
        Ok(CachedShard { cache: self.0.clone(), entry, meta, reader })
    }
}

/// Who a request of `context` reads for, in the cache's terms: its job's row, its
/// principal, the members its client asked already.
pub fn reader_for(cache: &Cache, context: &ReadContext) -> ReadFor {
    let row = cache.metrics().jobs.row(&context.principal, context.job.as_ref());
    let job = context.job.as_ref().map(|tag| tag.job.clone());
    let principal = context.principal.as_str().into();
    let (avoid, index_read) = (context.avoid.clone().into(), context.index_read);
    let relayed = context.relayed.clone();
    ReadFor { job, principal, row, avoid, index_read, alongside: None, relayed }
}

impl Source for CachedSource {
    type Shard = CachedShard;
    type Error = Error;
    // One stream message read at a time (the default): more reads in flight did not move
    // `spoke-bench`'s warm 16-client stream and cost memory (BENCHMARKS.md): the stream
    // is CPU-bound, not latency-bound.

    async fn list_datasets(&self, wanted: &(dyn Fn(&str) -> bool + Sync)) -> Result<DatasetListing> {
        let (mut datasets, stale) =
            match self.0.hubs().list(|hub| async move { hub.list_datasets().await }).await {
                Ok(datasets) => (datasets, false),
                Err(e) if e.hub_cannot_answer() => (self.cached_datasets(), true),
                Err(e) => return Err(e),
            };
        datasets.retain(|d| wanted(&d.name));
        Ok(DatasetListing { datasets, stale })
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
        let page = match self
            .0
            .hubs()
            .list(|hub| async move { hub.list_shards_page(dataset, limit as u32, after).await })
            .await
        {
            Ok(page) => page,
            Err(e) if e.hub_cannot_answer() => return self.cached_shards(dataset, after, limit).ok_or(e),
            Err(e) => return Err(e),
        };
        Ok(ShardPage {
            stale: false,
            record_size: page.shards.first().map_or(0, |s| s.record_size),
            more: !page.next_page_token.is_empty(),
            shards: page
                .shards
                .into_iter()
                .map(|s| ShardMeta {
                    name: s.shard,
                    size: s.size,
                    version: s.version,
                    modified_ms: s.modified_ms,
                })
                .collect(),
        })
    }

    async fn open(&self, dataset: &DatasetName, shard: &ShardName) -> Result<CachedShard> {
        self.entry(dataset, shard, &[], &ReadContext::default()).await
    }

    async fn open_for(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
        context: &ReadContext,
    ) -> Result<CachedShard> {
        self.entry(dataset, shard, reads, context).await
    }

    async fn stat(&self, dataset: &DatasetName, shard: &ShardName) -> Result<ShardStat> {
        let shard = self.entry(dataset, shard, &[], &ReadContext::default()).await?;
        // Not confirmed within --revalidate-after: the hub could not be asked.
        let stale = !self.0.is_fresh(&shard.entry);
        Ok(ShardStat { record_size: shard.entry.record_size, meta: shard.meta, stale })
    }

    async fn read_many(&self, reads: &[(&CachedShard, u64, u64)]) -> Result<Vec<Checked>> {
        let Some((first, ..)) = reads.first() else { return Ok(Vec::new()) };
        let wants: Vec<_> =
            reads.iter().map(|&(shard, offset, length)| (&shard.entry, offset, length)).collect();
        // One call, one request: every shard was opened for the same job.
        self.0.read_many(&wants, &first.reader).await
    }
}

impl CachedSource {
    /// The datasets of the shards the cache knows, with their counts and bytes.
    fn cached_datasets(&self) -> Vec<DatasetInfo> {
        let mut datasets: BTreeMap<String, DatasetInfo> = BTreeMap::new();
        for entry in self.0.entries() {
            let info = datasets.entry(entry.dataset.clone()).or_insert_with(|| DatasetInfo {
                name: entry.dataset.clone(),
                record_size: entry.record_size,
                ..Default::default()
            });
            info.shard_count += 1;
            info.total_bytes += entry.size;
        }
        datasets.into_values().collect()
    }

    /// A page of the shards of `dataset` the cache knows; `None` when it knows none.
    fn cached_shards(&self, dataset: &str, after: &str, limit: usize) -> Option<ShardPage> {
        let entries: Vec<_> = self.0.entries().into_iter().filter(|e| e.dataset == dataset).collect();
        let record_size = entries.first()?.record_size;
        let mut shards: Vec<ShardMeta> = entries
            .into_iter()
            .map(|e| ShardMeta {
                name: e.shard.clone(),
                size: e.size,
                version: e.version.clone(),
                modified_ms: e.modified_ms,
            })
            .collect();
        shards.sort_by(|a, b| a.name.cmp(&b.name));
        Some(ShardPage::of(shards, Some(after), limit, record_size, true))
    }
}

impl ShardHandle for CachedShard {
    type Error = Error;

    fn meta(&self) -> &ShardMeta {
        &self.meta
    }

    async fn read_at(&self, offset: u64, len: usize) -> Result<Checked> {
        self.cache.read(&self.entry, offset, len as u64, &self.reader).await
    }
}

/// The read service times every read into the spoke's latency histogram.
impl Observer for Metrics {
    fn read_latency(&self, elapsed: std::time::Duration, context: &ReadContext) {
        self.read_latency.observe(elapsed);
        if let Some(tag) = &context.job
            && self.job_tables.read(&context.principal, &tag.job, elapsed)
        {
            // The request's span (`shardcache_serving::server`): a collector keeps the
            // traces so marked whole (deploy/otel/collector.yaml).
            shardcache_transport::telemetry::attribute(&tracing::Span::current(), "shardcache.slow", true);
        }
    }
}
