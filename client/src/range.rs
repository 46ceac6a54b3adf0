//! What a read asks for: a [`Range`] of a shard (what it hands out is `verify`'s
//! `Verified`).

use shardcache_proto::v1::ReadRangeRequest;

/// One range of a shard: what `Client::read_range` reads, one of a `read_ranges` batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub dataset: String,
    pub shard: String,
    pub offset: u64,
    pub length: u64,
    /// When set, the read fails with ABORTED unless the shard is still at this version.
    pub expected_version: Option<String>,
}

impl Range {
    pub fn new(dataset: impl Into<String>, shard: impl Into<String>, offset: u64, length: u64) -> Self {
        Self { dataset: dataset.into(), shard: shard.into(), offset, length, expected_version: None }
    }

    pub(crate) fn to_request(&self) -> ReadRangeRequest {
        ReadRangeRequest {
            dataset: self.dataset.clone(),
            shard: self.shard.clone(),
            offset: self.offset,
            length: self.length,
            expected_version: self.expected_version.clone().unwrap_or_default(),
        }
    }
}
