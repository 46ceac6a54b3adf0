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
    /// When set, what of the range lies inside the shard is read (nothing from its end
    /// on) rather than the read being refused: a read made before the shard's size is
    /// known ([`Range::cut_at_end`]).
    pub cut_at_end: bool,
}

impl Range {
    pub fn new(dataset: impl Into<String>, shard: impl Into<String>, offset: u64, length: u64) -> Self {
        Self {
            dataset: dataset.into(),
            shard: shard.into(),
            offset,
            length,
            expected_version: None,
            cut_at_end: false,
        }
    }

    /// This range, read to the shard's end at most, and as nothing when it starts at or
    /// past the end (a server older than `cut_at_end` refuses such a read as past the
    /// end). What a spoke reads alongside its first stat of a shard.
    #[must_use]
    pub fn cut_at_end(mut self) -> Self {
        self.cut_at_end = true;
        self
    }

    pub(crate) fn to_request(&self) -> ReadRangeRequest {
        ReadRangeRequest {
            dataset: self.dataset.clone(),
            shard: self.shard.clone(),
            offset: self.offset,
            length: self.length,
            expected_version: self.expected_version.clone().unwrap_or_default(),
            cut_at_end: self.cut_at_end,
        }
    }
}
