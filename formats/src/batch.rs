//! Reading samples' ranges in as few calls as the servers' bounds allow, each pinned to
//! the version the index was read at.

use bytes::Bytes;
use shardcache_proto::{range::MAX_RANGES_PER_CALL, v1::ShardInfo};

use shardcache_client::{Client, Range, Result};

/// Bytes one `ReadRanges` call of a sample batch asks for at most: under the servers'
/// smallest default `--max-read` (16 MiB) with room to spare; a sample larger than it
/// is streamed on its own.
pub const BATCH_BYTES: u64 = 8 << 20;

/// Each range's bytes, in order: consecutive ranges batched up to [`BATCH_BYTES`] and
/// [`MAX_RANGES_PER_CALL`] ranges a call; a range over [`BATCH_BYTES`] streamed.
pub async fn read_batched(client: &Client, ranges: Vec<Range>) -> Result<Vec<Bytes>> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut batch: Vec<Range> = Vec::new();
    let mut bytes = 0;
    for range in ranges {
        if range.length > BATCH_BYTES {
            flush(client, &mut batch, &mut out).await?;
            bytes = 0;
            out.push(stream(client, &range).await?);
            continue;
        }
        if bytes + range.length > BATCH_BYTES || batch.len() == MAX_RANGES_PER_CALL {
            flush(client, &mut batch, &mut out).await?;
            bytes = 0;
        }
        bytes += range.length;
        batch.push(range);
    }
    flush(client, &mut batch, &mut out).await?;
    Ok(out)
}

/// `range` at `version` (none when the listing gave none).
pub(crate) fn pinned(mut range: Range, version: &str) -> Range {
    if !version.is_empty() {
        range.expected_version = Some(version.to_owned());
    }
    range
}

/// `[offset, offset + length)` of a listed shard, at its listed version.
pub(crate) fn listed_range(dataset: &str, shard: &ShardInfo, offset: u64, length: u64) -> Range {
    pinned(Range::new(dataset, &shard.shard, offset, length), &shard.version)
}

/// `range` read as a stream (any size), at its expected version when it names one.
async fn stream(client: &Client, range: &Range) -> Result<Bytes> {
    Ok(client.stream_range(range).await?.read_to_end().await?.into())
}

/// Reads `batch` in one call, appending the bytes to `out`.
async fn flush(client: &Client, batch: &mut Vec<Range>, out: &mut Vec<Bytes>) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    out.extend(client.read_ranges(batch).await?.into_iter().map(|v| v.data));
    batch.clear();
    Ok(())
}
