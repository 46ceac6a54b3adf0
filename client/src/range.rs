//! What a read asks for ([`Range`]) and what it hands out ([`Verified`]): bytes of a
//! shard, checked.

use bytes::Bytes;
use shardcache_proto::v1::ReadRangeRequest;

/// Bytes read from a shard, verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Offset of `data` in the shard.
    pub offset: u64,
    pub data: Bytes,
    /// Version of the shard the bytes belong to.
    pub version: String,
    /// CRC32C of `data`, checked (a spoke stores and serves it on without reading the
    /// bytes again).
    pub crc32c: u32,
    /// Bytes the message took on the link: `data`'s length, or less where it came
    /// compressed (`shardcache_proto::encoding`).
    pub wire_len: u64,
}

/// One range of a [`Client::read_ranges`] batch.
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
