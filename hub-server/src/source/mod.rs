//! Where shard bytes come from. The service speaks gRPC; a [`Source`] knows storage.
//!
//! A source lists datasets and shards and opens a shard at its current version; the
//! opened [`ShardHandle`] reads ranges *of that version only*, failing with
//! [`Error::VersionChanged`](crate::Error::VersionChanged) rather than returning bytes
//! of a newer one. That contract is what lets the service promise "never mixed bytes"
//! for any source: a local directory ([`local`]) or an S3 prefix ([`s3`], ETag + If-Match).

pub mod local;
pub mod s3;

use std::future::Future;

use bytes::Bytes;
use shardcache_proto::names::{DatasetName, ShardName};

use crate::Result;

/// What a source knows about one shard at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMeta {
    /// Relative name inside the dataset.
    pub name: String,
    pub size: u64,
    /// Opaque version; equal versions mean equal bytes.
    pub version: String,
}

/// What a source knows about one dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetMeta {
    pub name: String,
    /// Record (sample) size from the dataset's metadata file, 0 when unknown.
    pub record_size: u32,
}

/// A storage backend the hub serves from.
pub trait Source: Send + Sync + 'static {
    type Shard: ShardHandle;

    /// Chunk reads a `StreamShard` keeps in flight. A local disk reads ahead on its own;
    /// an object store answers each GET after a round trip, so several run at once.
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

/// A shard opened at one version.
pub trait ShardHandle: Clone + Send + Sync + 'static {
    fn meta(&self) -> &ShardMeta;

    /// Reads `[offset, offset + len)`, which the caller has checked lies inside the shard.
    /// Fails with `VersionChanged` if the shard is no longer at [`ShardHandle::meta`]'s version.
    fn read_at(&self, offset: u64, len: usize) -> impl Future<Output = Result<Bytes>> + Send;
}
