//! Where a read service's bytes come from. The service speaks gRPC; a [`Source`] knows
//! where the shards are: storage on the hub, the cache (reading through to a hub) on the
//! spoke.
//!
//! A source lists datasets and shards and opens a shard at its current version; the
//! opened [`ShardHandle`] reads ranges *of that version only*, failing with
//! [`ReadError::VersionChanged`] rather than returning bytes of a newer one. That
//! contract is what lets the service promise "never mixed bytes" for any source.

use std::future::Future;

use shardcache_proto::{
    checksum::Checked,
    names::{DatasetName, ShardName},
    v1::DatasetInfo,
};
use tonic::Status;

use crate::{ReadContext, ReadError};

/// What a source knows about one shard at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMeta {
    /// Relative name inside the dataset.
    pub name: String,
    pub size: u64,
    /// Opaque version; equal versions mean equal bytes.
    pub version: String,
    /// When the bytes last changed (ms since the Unix epoch), 0 when the storage does not
    /// say. A new version may keep it (an S3 object rewritten within the same
    /// millisecond): the version, not this, says whether bytes changed.
    pub modified_ms: u64,
}

/// A shard's metadata with its dataset's record size (what `StatShard` answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStat {
    pub meta: ShardMeta,
    /// Record (sample) size of the shard's dataset, 0 when unknown.
    pub record_size: u32,
    /// Possibly out of date: the source could not confirm it (see [`STALE_METADATA`]).
    pub stale: bool,
}

/// One page of a dataset's shards, in name order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardPage {
    pub shards: Vec<ShardMeta>,
    /// Record size of the dataset, 0 when unknown.
    pub record_size: u32,
    /// More shards follow the last one of this page.
    pub more: bool,
    /// Possibly out of date or incomplete (see [`STALE_METADATA`]).
    pub stale: bool,
}

impl ShardPage {
    /// The page of `shards` (the whole listing, in name order) that follows `after`: at
    /// most `limit` shards, and whether more follow. The one paging of a listing, for
    /// every source that holds its listing whole (the hub's storages, the spoke's
    /// catalog when its hubs cannot answer).
    pub fn of(
        mut shards: Vec<ShardMeta>,
        after: Option<&str>,
        limit: usize,
        record_size: u32,
        stale: bool,
    ) -> Self {
        let start = after.map_or(0, |after| shards.partition_point(|s| s.name.as_str() <= after));
        let end = start.saturating_add(limit).min(shards.len());
        let more = end < shards.len();
        shards.truncate(end);
        shards.drain(..start);
        Self { shards, record_size, more, stale }
    }
}

/// Datasets with their shard counts and bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DatasetListing {
    pub datasets: Vec<DatasetInfo>,
    /// Possibly out of date or incomplete (see [`STALE_METADATA`]).
    pub stale: bool,
}

/// Response metadata on a listing or stat answered from what the server had seen
/// (defined with the protocol, where clients read it too).
pub use shardcache_proto::STALE_METADATA;

/// Where a [`ReadService`](crate::ReadService) reads from.
pub trait Source: Send + Sync + 'static {
    type Shard: ShardHandle<Error = Self::Error>;
    /// The source's errors: the service's own ([`ReadError`]) among them, each with the
    /// status a client gets.
    type Error: From<ReadError> + Into<Status> + Send + 'static;

    /// Reads a `StreamShard` keeps in flight. A local disk reads ahead on its own; an
    /// object store answers each GET after a round trip, so several run at once.
    const READ_PARALLELISM: usize = 1;

    /// Every dataset `wanted` accepts (by name), in name order, with its shard count and
    /// bytes.
    fn list_datasets(
        &self,
        wanted: &(dyn Fn(&str) -> bool + Sync),
    ) -> impl Future<Output = Result<DatasetListing, Self::Error>> + Send;

    /// At most `limit` shards of `dataset` whose names sort after `after`, in name order.
    fn list_shards(
        &self,
        dataset: &DatasetName,
        after: Option<&ShardName>,
        limit: usize,
    ) -> impl Future<Output = Result<ShardPage, Self::Error>> + Send;

    /// Opens `shard` at its current version.
    fn open(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
    ) -> impl Future<Output = Result<Self::Shard, Self::Error>> + Send;

    /// Opens `shard` for a call that will read `reads` (`(offset, length)` pairs, not
    /// yet checked against the shard's size) of it, for `context` (the job its reads are
    /// counted under, the group members its client already asked). The default opens
    /// it; a source that can start those reads while it opens (the spoke, on a shard it
    /// has not seen: its `StatShard` and the reads cross the link together) does so.
    fn open_for(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
        reads: &[(u64, u64)],
        context: &ReadContext,
    ) -> impl Future<Output = Result<Self::Shard, Self::Error>> + Send {
        let _ = (reads, context);
        self.open(dataset, shard)
    }

    /// `shard`'s metadata and its dataset's record size.
    fn stat(
        &self,
        dataset: &DatasetName,
        shard: &ShardName,
    ) -> impl Future<Output = Result<ShardStat, Self::Error>> + Send;

    /// Reads every `(shard, offset, length)` (each inside its shard: checked by the
    /// service) for one `ReadRanges` call, in order. The default reads them all at once;
    /// a source that can plan a batch as a whole (the spoke's cache: one hop to its
    /// store, every missing chunk fetched at once) does so.
    fn read_many(
        &self,
        reads: &[(&Self::Shard, u64, u64)],
    ) -> impl Future<Output = Result<Vec<Checked>, Self::Error>> + Send {
        // Lengths fit in usize: the service bounds a call by its `max_read`.
        futures::future::try_join_all(
            reads.iter().map(|&(shard, offset, len)| shard.read_at(offset, len as usize)),
        )
    }
}

/// A shard opened at one version; cheap to clone.
pub trait ShardHandle: Clone + Send + Sync + 'static {
    type Error;

    fn meta(&self) -> &ShardMeta;

    /// Reads `[offset, offset + len)`, which the caller has checked lies inside the shard,
    /// with the CRC32C of the bytes (a source that checked them as it read, the spoke's
    /// store, hands on what it computed). Fails with `VersionChanged` if the shard is no
    /// longer at [`ShardHandle::meta`]'s version.
    fn read_at(&self, offset: u64, len: usize) -> impl Future<Output = Result<Checked, Self::Error>> + Send;
}
