//! What makes bytes [`Verified`], in one place below both the client's calls
//! (`client.rs`) and its streams (`stream.rs`): a message decoded where it came
//! compressed (never past what was asked), its offset and length against what was asked,
//! its CRC32C against its bytes, and one version across everything a read returns
//! ([`same_version`]). A read that cannot be verified is an [`Error`], never data.

use bytes::Bytes;
use shardcache_proto::{checksum, encoding, v1::Chunk};

use crate::{Error, Range, Result};

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

/// `endpoint` broke the protocol: what it sent is not what was asked.
pub(crate) fn protocol(endpoint: &str, detail: String) -> Error {
    Error::Protocol { endpoint: endpoint.to_owned(), detail }
}

/// The one version check: bytes of `shard` (`dataset/shard`) at `found` where `expected`
/// was read or asked for fail with VersionChanged, never mix into one read.
pub(crate) fn same_version(shard: &str, expected: &str, found: &str) -> Result<()> {
    if expected == found {
        return Ok(());
    }
    Err(Error::VersionChanged {
        shard: shard.to_owned(),
        expected: expected.to_owned(),
        found: found.to_owned(),
    })
}

/// `chunk` (the answer to `range` from `endpoint`) verified: decoded, exactly the range
/// asked for (or, cut at the shard's end, no more of it), at the version the range names
/// if it names one, its CRC32C right.
pub(crate) fn range(endpoint: &str, range: &Range, chunk: Chunk) -> Result<Verified> {
    let (chunk, wire_len) = decoded(endpoint, chunk, range.length)?;
    let length = chunk.data.len() as u64;
    let whole = length == range.length || (range.cut_at_end && length < range.length);
    if chunk.offset != range.offset || !whole {
        return Err(protocol(
            endpoint,
            format!(
                "asked for {} bytes at offset {} of {}/{}, got {} bytes at offset {}",
                range.length,
                range.offset,
                range.dataset,
                range.shard,
                chunk.data.len(),
                chunk.offset
            ),
        ));
    }
    if let Some(expected) = range.expected_version.as_deref() {
        same_version(&format!("{}/{}", range.dataset, range.shard), expected, &chunk.version)?;
    }
    checked(endpoint, chunk, wire_len)
}

/// `chunk` decoded where it came compressed (to at most `expected` bytes: a message
/// that says more is refused before anything is allocated), and the bytes it took on
/// the link.
pub(crate) fn decoded(endpoint: &str, chunk: Chunk, expected: u64) -> Result<(Chunk, u64)> {
    let wire_len = chunk.data.len() as u64;
    let (offset, decoded_length) = (chunk.offset, chunk.decoded_length);
    let span = match decoded_length {
        0 => tracing::Span::none(),
        _ => shardcache_transport::telemetry::traced(|| {
            tracing::info_span!("decompress", bytes = decoded_length, wire_bytes = wire_len)
        }),
    };
    let chunk = span.in_scope(|| encoding::decode(chunk, expected)).map_err(|e| {
        protocol(
            endpoint,
            format!("sent a data message at offset {offset} ({decoded_length} bytes decoded) that {e}"),
        )
    })?;
    Ok((chunk, wire_len))
}

/// `chunk` (decoded) as verified bytes, or the CRC32C mismatch `endpoint` sent.
pub(crate) fn checked(endpoint: &str, chunk: Chunk, wire_len: u64) -> Result<Verified> {
    let span =
        shardcache_transport::telemetry::traced(|| tracing::info_span!("verify", bytes = chunk.data.len()));
    span.in_scope(|| checksum::verify(chunk.offset, &chunk.data, chunk.crc32c))
        .map_err(|source| Error::Checksum { endpoint: endpoint.to_owned(), source })?;
    Ok(Verified {
        offset: chunk.offset,
        data: chunk.data,
        version: chunk.version,
        crc32c: chunk.crc32c,
        wire_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(offset: u64, data: &'static [u8], version: &str) -> Chunk {
        Chunk {
            offset,
            data: Bytes::from_static(data),
            crc32c: checksum::crc32c(data),
            version: version.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_bytes_asked_for_at_the_version_asked_for_are_verified() {
        let mut asked = Range::new("ds", "s", 4, 3);
        let read = range("http://a:1", &asked, chunk(4, b"abc", "v1")).unwrap();
        assert_eq!(
            (read.offset, &read.data[..], read.version.as_str(), read.wire_len),
            (4, &b"abc"[..], "v1", 3)
        );
        let moved = range("http://a:1", &asked, chunk(5, b"abc", "v1")).unwrap_err();
        assert!(matches!(moved, Error::Protocol { .. }), "{moved}");
        let short = range("http://a:1", &asked, chunk(4, b"ab", "v1")).unwrap_err();
        assert!(short.to_string().contains("asked for 3 bytes at offset 4 of ds/s, got 2"), "{short}");
        asked.expected_version = Some("v0".into());
        let changed = range("http://a:1", &asked, chunk(4, b"abc", "v1")).unwrap_err();
        assert!(matches!(changed, Error::VersionChanged { ref found, .. } if found == "v1"), "{changed}");
        let mut corrupt = chunk(4, b"abc", "v0");
        corrupt.crc32c ^= 1;
        assert!(matches!(range("http://a:1", &asked, corrupt), Err(Error::Checksum { .. })));
    }
}
