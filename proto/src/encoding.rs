//! Compression on the link: a reader says in a request's `shardcache-accept-encoding`
//! header which encodings it decodes (`zstd`); a server that compresses chooses per
//! message whether it pays, and says in the message how its bytes are encoded
//! (`Chunk.encoding`). The CRC32C is always the decoded bytes', so the reader checks what
//! it decodes, end to end. A reader that sends no header gets the bytes as they are,
//! from every server; a server that does not know the header sends them as they are too.
//!
//! Whether a message pays is judged on a sample ([`SAMPLE`] bytes from three places)
//! compressed at level 1: below [`MIN_RATIO`] the message goes as it is, so
//! incompressible data (JPEG, random bytes) costs one small compression per message.

use bytes::Bytes;

use crate::v1::{Chunk, Encoding};

/// Request metadata: the encodings the reader decodes, comma-separated.
pub const ACCEPT_ENCODING_HEADER: &str = "shardcache-accept-encoding";

/// The name of zstd in [`ACCEPT_ENCODING_HEADER`].
pub const ZSTD: &str = "zstd";

/// Bytes of a message sampled to judge whether it compresses: 3 x 16 KiB.
pub const SAMPLE: usize = 16 << 10;

/// Below this ratio (bytes / compressed bytes) on the sample, a message is sent as it is.
pub const MIN_RATIO: f64 = 1.05;

/// The largest StreamShard message a server sends (a hub's `--message-size` is at most
/// 8 MiB): what a stream's message may decode to at most.
pub const MAX_MESSAGE: u64 = 8 << 20;

/// Messages shorter than this are sent as they are (a frame's overhead and a call's
/// CPU for a few bytes saved).
pub const MIN_LENGTH: usize = 4 << 10;

/// Whether an [`ACCEPT_ENCODING_HEADER`] value names zstd.
pub fn accepts_zstd(header: &str) -> bool {
    header.split(',').any(|e| e.trim().eq_ignore_ascii_case(ZSTD))
}

/// `data` as one zstd frame at `level`, or `None` when it does not pay (too short, or
/// its sample shrinks by less than [`MIN_RATIO`]).
pub fn compress(data: &[u8], level: i32) -> Option<Bytes> {
    if data.len() < MIN_LENGTH {
        return None;
    }
    if data.len() > 3 * SAMPLE {
        let (middle, end) = (data.len() / 2, data.len() - SAMPLE);
        let mut sample = Vec::with_capacity(3 * SAMPLE);
        for at in [0, middle, end] {
            sample.extend_from_slice(&data[at..at + SAMPLE]);
        }
        if !pays(&sample, zstd::bulk::compress(&sample, 1).ok()?.len()) {
            return None;
        }
    }
    let compressed = zstd::bulk::compress(data, level).ok()?;
    pays(data, compressed.len()).then(|| Bytes::from(compressed))
}

fn pays(data: &[u8], compressed: usize) -> bool {
    compressed > 0 && data.len() as f64 / compressed as f64 >= MIN_RATIO
}

/// `chunk` with its data compressed at `level` where that pays (its CRC32C unchanged:
/// the decoded bytes').
pub fn encode(mut chunk: Chunk, level: i32) -> Chunk {
    if chunk.encoding == Encoding::Identity as i32
        && let Some(compressed) = compress(&chunk.data, level)
    {
        chunk.decoded_length = chunk.data.len() as u64;
        chunk.data = compressed;
        chunk.encoding = Encoding::Zstd as i32;
    }
    chunk
}

/// Why an encoded message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(
        "is in encoding {0}, which this SDK does not know (upgrade it, or read with Client::plain, \
         or run the server with --link-compression-level 0)"
    )]
    Unknown(i32),
    #[error("says it decodes to {said} bytes where at most {expected} could be")]
    Length { said: u64, expected: u64 },
    #[error("holds a zstd frame that does not decode to the {0} bytes it says: {1}")]
    Zstd(u64, String),
}

/// `chunk` with its data decoded: at most `expected` bytes (the range asked for; a
/// message that says more is refused before anything is allocated).
pub fn decode(mut chunk: Chunk, expected: u64) -> Result<Chunk, DecodeError> {
    match Encoding::try_from(chunk.encoding) {
        Ok(Encoding::Identity) => return Ok(chunk),
        Ok(Encoding::Zstd) => {}
        Err(_) => return Err(DecodeError::Unknown(chunk.encoding)),
    }
    let length = chunk.decoded_length;
    if length > expected {
        return Err(DecodeError::Length { said: length, expected });
    }
    let decoded = zstd::bulk::decompress(&chunk.data, length as usize)
        .map_err(|e| DecodeError::Zstd(length, e.to_string()))?;
    if decoded.len() as u64 != length {
        return Err(DecodeError::Zstd(length, format!("it decoded to {} bytes", decoded.len())));
    }
    chunk.data = Bytes::from(decoded);
    chunk.encoding = Encoding::Identity as i32;
    chunk.decoded_length = 0;
    Ok(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(data: Vec<u8>) -> Chunk {
        Chunk { crc32c: crate::checksum::crc32c(&data), data: data.into(), ..Default::default() }
    }

    #[test]
    fn compressible_messages_are_encoded_and_decode_to_the_same_bytes_and_crc() {
        let data: Vec<u8> = (0..1u32 << 18).flat_map(|i| (i % 1000).to_le_bytes()).collect();
        let sent = encode(chunk(data.clone()), 3);
        assert_eq!(sent.encoding, Encoding::Zstd as i32);
        assert!(sent.data.len() * 4 < data.len(), "{} of {}", sent.data.len(), data.len());
        let got = decode(sent, data.len() as u64).unwrap();
        assert_eq!(got.data.as_ref(), data.as_slice());
        assert_eq!(got.crc32c, crate::checksum::crc32c(&data));
    }

    #[test]
    fn incompressible_and_short_messages_go_as_they_are() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let random: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert_eq!(encode(chunk(random), 3).encoding, Encoding::Identity as i32);
        assert_eq!(encode(chunk(vec![0; 100]), 3).encoding, Encoding::Identity as i32);
    }

    #[test]
    fn a_message_that_says_it_is_longer_than_asked_is_refused() {
        let sent = encode(chunk(vec![7; 1 << 16]), 3);
        assert_eq!(decode(sent.clone(), 1000), Err(DecodeError::Length { said: 1 << 16, expected: 1000 }));
        let mut lying = sent;
        lying.decoded_length -= 1;
        assert!(matches!(decode(lying, 1 << 16), Err(DecodeError::Zstd(..))));
        assert!(accepts_zstd("gzip, ZSTD") && !accepts_zstd("gzip"));
    }
}
