//! Where the hub's shard bytes come from: a [`Storage`] (a local directory, [`local`],
//! or an S3 prefix, [`s3`], ETag + If-Match) served through the shared read service
//! ([`shardcache_reader`]) by [`HubSource`].
//!
//! A storage lists datasets and shards and opens a shard at its current version; the
//! opened handle reads ranges *of that version only*, failing with `VersionChanged`
//! rather than returning bytes of a newer one. [`HubSource`] adds what the read service
//! asks of every source and storages need not each write: dataset totals, pages,
//! `StatShard`'s record size.

pub mod local;
pub mod s3;

use std::future::Future;

use shardcache_proto::{
    names::{DatasetName, ShardName},
    v1::DatasetInfo,
};
use shardcache_reader::{DatasetListing, ShardPage, ShardStat, Source};
pub use shardcache_reader::{ShardHandle, ShardMeta};

use crate::{Error, Result};

/// What a storage knows about one dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetMeta {
    pub name: String,
    /// Record (sample) size from the dataset's metadata file, 0 when unknown.
    pub record_size: u32,
}

/// A storage backend the hub serves from.
pub trait Storage: Send + Sync + 'static {
    type Shard: ShardHandle<Error = Error>;

    /// Chunk reads a `StreamShard` keeps in flight (see [`Source::READ_PARALLELISM`]).
    const READ_PARALLELISM: usize = 1;

    /// Every dataset, in name order.
    fn list_datasets(&self) -> impl Future<Output = Result<Vec<DatasetMeta>>> + Send;

    /// One dataset's metadata; `DatasetNotFound` if it does not exist.
    fn dataset(&self, dataset: &DatasetName) -> impl Future<Output = Result<DatasetMeta>> + Send;

    /// Every shard of `dataset`, in name order.
    fn list_shards(&self, dataset: &DatasetName) -> impl Future<Output = Result<Vec<ShardMeta>>> + Send;

    /// Opens `shard` at its current version.
    fn open(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
    ) -> impl Future<Output = Result<Self::Shard>> + Send;
}

/// A storage as the read service's [`Source`].
#[derive(Debug)]
pub struct HubSource<S>(pub S);

impl<S: Storage> Source for HubSource<S> {
    type Shard = S::Shard;
    type Error = Error;
    const READ_PARALLELISM: usize = S::READ_PARALLELISM;

    async fn list_datasets(&self, wanted: &(dyn Fn(&str) -> bool + Sync)) -> Result<DatasetListing> {
        let mut datasets = Vec::new();
        for meta in self.0.list_datasets().await?.into_iter().filter(|m| wanted(&m.name)) {
            let shards = self.0.list_shards(&DatasetName::new(&meta.name)?).await?;
            datasets.push(DatasetInfo {
                shard_count: shards.len() as u64,
                total_bytes: shards.iter().map(|s| s.size).sum(),
                name: meta.name,
                record_size: meta.record_size,
            });
        }
        Ok(DatasetListing { datasets, stale: false })
    }

    async fn list_shards(
        &self,
        dataset: &DatasetName,
        after: Option<&ShardName>,
        limit: usize,
    ) -> Result<ShardPage> {
        let record_size = self.0.dataset(dataset).await?.record_size;
        let shards = self.0.list_shards(dataset).await?;
        Ok(ShardPage::of(shards, after.map(ShardName::as_str), limit, record_size, false))
    }

    async fn open(&self, dataset: &DatasetName, shard: &ShardName) -> Result<S::Shard> {
        self.0.open(dataset, shard).await
    }

    async fn stat(&self, dataset: &DatasetName, shard: &ShardName) -> Result<ShardStat> {
        let handle = self.0.open(dataset, shard).await?;
        let record_size = self.0.dataset(dataset).await?.record_size;
        Ok(ShardStat { meta: handle.meta().clone(), record_size, stale: false })
    }
}

/// The most bytes of a dataset's metadata file the hub reads: a few bytes of JSON
/// (`{"record_size": 16384}`); a larger file is not metadata.
pub const MAX_META_BYTES: u64 = 64 << 10;

/// `record_size` from a dataset's metadata file's bytes; 0 when it is not JSON with a
/// `record_size` that fits in 32 bits (the listing then says "unknown").
pub fn parse_record_size(raw: &[u8]) -> u32 {
    #[derive(serde::Deserialize)]
    struct DatasetFile {
        #[serde(default)]
        record_size: u32,
    }
    serde_json::from_slice::<DatasetFile>(raw).map_or(0, |f| f.record_size)
}
