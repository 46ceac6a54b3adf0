//! Where a [`SampleIndex`](super::SampleIndex) reads a dataset's bytes: a server, through
//! [`Client`], or files held in memory ([`Files`]: the fuzz harness runs every format's
//! whole path, index and samples, over millions of damaged files without a server).

use std::{collections::BTreeMap, future::Future};

use bytes::Bytes;
use shardcache_proto::v1::ShardInfo;

use super::read_batched;
use shardcache_client::{Client, Error, Range, Result};

/// Reads of a dataset's bytes, as the formats' readers need them.
pub trait Fetch: Sync {
    /// Each range's bytes, in order.
    fn fetch(&self, ranges: Vec<Range>) -> impl Future<Output = Result<Vec<Bytes>>> + Send;

    /// The bytes of `range` handed to `each` as they arrive (the offset in the shard of
    /// each piece, and its bytes) until it returns `Ok(false)`; `Ok(true)` when `each`
    /// asked for more than the range holds.
    fn scan<F>(&self, range: &Range, each: F) -> impl Future<Output = Result<bool>> + Send
    where
        F: FnMut(u64, &[u8]) -> Result<bool> + Send;
}

impl Fetch for Client {
    fn fetch(&self, ranges: Vec<Range>) -> impl Future<Output = Result<Vec<Bytes>>> + Send {
        read_batched(self, ranges)
    }

    async fn scan<F>(&self, range: &Range, mut each: F) -> Result<bool>
    where
        F: FnMut(u64, &[u8]) -> Result<bool> + Send,
    {
        let mut stream = self.stream_range(range).await?;
        while let Some(chunk) = stream.next_chunk().await? {
            if !each(chunk.offset, &chunk.data)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// A dataset's files held in memory, by name: what [`Fetch`] reads in the fuzz harness
/// and in tests of the formats without a server.
#[derive(Debug, Clone, Default)]
pub struct Files {
    files: BTreeMap<String, Bytes>,
}

/// Bytes [`Files::scan`] hands out at a time: as a server's stream messages do, a tar's
/// headers cross pieces' ends.
const SCAN_PIECE: usize = 64 << 10;

impl Files {
    pub fn new(files: impl IntoIterator<Item = (String, Bytes)>) -> Self {
        Self { files: files.into_iter().collect() }
    }

    /// The files as a listing gives them (no versions).
    pub fn listing(&self) -> Vec<ShardInfo> {
        let info = |(name, data): (&String, &Bytes)| ShardInfo {
            shard: name.clone(),
            size: data.len() as u64,
            ..Default::default()
        };
        self.files.iter().map(info).collect()
    }

    /// `[offset, offset + length)` of `range`'s file; an error past its end, as a server's
    /// OUT_OF_RANGE.
    fn bytes(&self, range: &Range) -> Result<Bytes> {
        let data = self
            .files
            .get(&range.shard)
            .ok_or_else(|| Error::Config(format!("{}/{}: no such file", range.dataset, range.shard)))?;
        let end = range.offset.checked_add(range.length).filter(|&end| end <= data.len() as u64);
        let end = end.ok_or_else(|| Error::Status {
            endpoint: "files in memory".into(),
            status: tonic::Status::out_of_range(format!(
                "{}/{}: a read of {} bytes at {} past its {} bytes",
                range.dataset,
                range.shard,
                range.length,
                range.offset,
                data.len()
            )),
        })?;
        Ok(data.slice(range.offset as usize..end as usize))
    }
}

impl Fetch for Files {
    async fn fetch(&self, ranges: Vec<Range>) -> Result<Vec<Bytes>> {
        ranges.iter().map(|r| self.bytes(r)).collect()
    }

    async fn scan<F>(&self, range: &Range, mut each: F) -> Result<bool>
    where
        F: FnMut(u64, &[u8]) -> Result<bool> + Send,
    {
        let data = self.bytes(range)?;
        for (i, piece) in data.chunks(SCAN_PIECE).enumerate() {
            if !each(range.offset + (i * SCAN_PIECE) as u64, piece)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
