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
///
/// Multiplies `crc_a` by x^(8 len_b) modulo the polynomial, that power built from a
/// table of x^(2^k) (zlib 1.2.12's `crc32_combine`): about log2(len_b) products of
/// 32-bit polynomials. The `crc32c` crate's combine is zlib's older one, which squares a
/// 32x32 bit matrix per bit of the length (tens of microseconds on a 64 KiB page, more
/// than reading the page again); the read path combines on every partial page.
pub fn combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    mult_mod_p(x_pow_8n(len_b), crc_a) ^ crc_b
}

/// The CRC32C of `page[from..to]` when the whole page matches its stored checksum
/// `stored`, else `Err` with the page's own CRC32C. One pass: a part's checksum is
/// computed with those of the bytes around it, and the three combined are checked against
/// the page's (the spoke's store reads, and the SDK's reads of the store's files through
/// a spoke's same-node door).
pub fn checked_part(page: &[u8], stored: u32, from: usize, to: usize) -> Result<u32, u32> {
    let (part, whole) = if from == 0 && to == page.len() {
        let whole = crc32c(page);
        (whole, whole)
    } else {
        let (before, part, after) = (crc32c(&page[..from]), crc32c(&page[from..to]), crc32c(&page[to..]));
        (part, combine(combine(before, part, to - from), after, page.len() - to))
    };
    if whole == stored { Ok(part) } else { Err(whole) }
}

/// CRC32C's polynomial, bit-reflected (x^0 in the top bit).
const POLY: u32 = 0x82F6_3B78;

/// `a * b` modulo the polynomial, both reflected.
const fn mult_mod_p(a: u32, mut b: u32) -> u32 {
    let (mut m, mut p) = (1u32 << 31, 0u32);
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
}

/// x^(2^k) modulo the polynomial, for every k a length in bytes can need (`8 n` has
/// at most 3 + 64 bits). zlib keeps 32 and wraps, which holds for its polynomial, not
/// for this one (a combine over 2^29 bytes came out wrong).
const X_POW_2K: [u32; 67] = {
    let mut table = [0u32; 67];
    let mut p = 1u32 << 30; // x^1
    let mut k = 0;
    while k < 67 {
        table[k] = p;
        p = mult_mod_p(p, p);
        k += 1;
    }
    table
};

/// x^(8 n) modulo the polynomial: n zero bytes appended.
fn x_pow_8n(mut n: usize) -> u32 {
    let (mut p, mut k) = (1u32 << 31, 3); // x^0; 8 n = n << 3
    while n != 0 {
        if n & 1 != 0 {
            p = mult_mod_p(X_POW_2K[k], p);
        }
        n >>= 1;
        k += 1;
    }
    p
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
        // The same as the crc32c crate's (zlib's older) combine, for lengths of every size.
        let mut len = 1usize;
        while len < 1 << 40 {
            for (a, b) in [(0, 0), (0x1234_5678, 0x9abc_def0), (u32::MAX, 7)] {
                assert_eq!(combine(a, b, len), crc32c::crc32c_combine(a, b, len), "length {len}");
                assert_eq!(combine(a, b, len + 3), crc32c::crc32c_combine(a, b, len + 3), "length {len} + 3");
            }
            len *= 3;
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
