//! CRC32C (Castagnoli), the checksum every data message carries.
//!
//! CRC32C because x86-64 (SSE 4.2) and aarch64 compute it in hardware at many GB/s,
//! so checking every chunk at every hop costs little next to moving the bytes.

use bytes::{Bytes, BytesMut};

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// CRC32C of `a` followed by `b`, from `crc_a`, `crc_b` and `b`'s length: a message's
/// checksum from the checksums of its parts, without reading the bytes again.
pub fn combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    crc32c::crc32c_combine(crc_a, crc_b, len_b)
}

/// Bytes with the CRC32C of exactly them: what a source reads, a message carries, and a
/// verified read hands on, so that the checksum is computed once where the bytes are
/// checked and combined, not recomputed, where they are put together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    pub data: Bytes,
    pub crc32c: u32,
}

impl Checked {
    /// `data` with its CRC32C computed.
    pub fn new(data: Bytes) -> Self {
        Self { crc32c: crc32c(&data), data }
    }

    /// The parts one after another: the one part as it is, several copied into one
    /// buffer with their checksums combined.
    pub fn concat(mut parts: Vec<Checked>) -> Self {
        if parts.len() == 1 {
            return parts.pop().unwrap_or_default();
        }
        let mut data = BytesMut::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        let mut crc = 0;
        for part in parts {
            crc = combine(crc, part.crc32c, part.data.len());
            data.extend_from_slice(&part.data);
        }
        Self { data: data.freeze(), crc32c: crc }
    }

    /// `[from, to)` of these bytes, copied (a slice would keep the whole buffer alive as
    /// long as the part), with its checksum computed.
    pub fn part(&self, from: usize, to: usize) -> Self {
        if from == 0 && to == self.data.len() {
            return self.clone();
        }
        Self::new(Bytes::copy_from_slice(&self.data[from..to]))
    }
}

/// A chunk whose bytes do not match the checksum that came with them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "checksum mismatch at offset {offset}: expected CRC32C {expected:#010x}, computed {actual:#010x} over {len} bytes"
)]
pub struct ChecksumMismatch {
    pub offset: u64,
    pub len: usize,
    pub expected: u32,
    pub actual: u32,
}

/// Checks that `data`, read at `offset`, has the CRC32C `expected`.
pub fn verify(offset: u64, data: &[u8], expected: u32) -> Result<(), ChecksumMismatch> {
    let actual = crc32c(data);
    if actual == expected {
        Ok(())
    } else {
        Err(ChecksumMismatch { offset, len: data.len(), expected, actual })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // RFC 3720 (iSCSI) B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    }

    #[test]
    fn checksums_combine_to_the_checksum_of_the_whole() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        for cut in [0, 1, 4096, 65_536, 199_999, 200_000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(combine(crc32c(a), crc32c(b), b.len()), crc32c(&data), "cut at {cut}");
        }
        let parts: Vec<Checked> =
            data.chunks(70_000).map(|c| Checked::new(Bytes::copy_from_slice(c))).collect();
        let whole = Checked::concat(parts);
        assert_eq!(whole, Checked::new(Bytes::from(data.clone())));
        assert_eq!(whole.part(10, 90_000), Checked::new(Bytes::copy_from_slice(&data[10..90_000])));
    }

    #[test]
    fn flipped_bit_is_detected() {
        let data = b"sixteen kibibytes of tokens".to_vec();
        let crc = crc32c(&data);
        assert!(verify(7, &data, crc).is_ok());
        let mut bad = data.clone();
        bad[3] ^= 0x01;
        let err = verify(7, &bad, crc).unwrap_err();
        assert_eq!(err.offset, 7);
        assert!(err.to_string().contains("checksum mismatch at offset 7"));
    }
}
