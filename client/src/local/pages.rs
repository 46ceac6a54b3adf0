//! A door's answer made into a range's bytes: the pages it placed in the store's files,
//! read here and each checked against its CRC32C, or the bytes it carried; assembled
//! into buffers kept for the next read ([`Pooled`]). The slot and the calls are `mod.rs`.

use std::{
    fs::File,
    io::IoSliceMut,
    sync::{Mutex, PoisonError},
};

use bytes::Bytes;
use shardcache_proto::{
    checksum::{ChecksumMismatch, checked_part, combine},
    v1::{LocalPiece, LocalRange},
};

use crate::{Error, Range, Result, verify::Verified};

/// `range` from its answer (`answered`: pieces read from `files`, or bytes carried), checked.
pub(super) fn read_range(
    door: &str,
    range: &Range,
    answered: LocalRange,
    files: &[File],
) -> Result<Verified> {
    let (data, crc32c) = assemble(door, range, &answered.pieces, files)?;
    if let Some(expected) = range.expected_version.as_deref() {
        let shard = format!("{}/{}", range.dataset, range.shard);
        crate::verify::same_version(&shard, expected, &answered.version)?;
    }
    Ok(Verified { offset: range.offset, data, version: answered.version, crc32c, wire_len: 0 })
}

/// The bytes of `range` from its `pieces` (pages read from `files`, or bytes carried),
/// each checked, with their CRC32C.
fn assemble(door: &str, range: &Range, pieces: &[LocalPiece], files: &[File]) -> Result<(Bytes, u32)> {
    let protocol = |detail: String| Error::Protocol { endpoint: door.to_owned(), detail };
    let len = usize::try_from(range.length).map_err(|_| protocol("a range over memory".into()))?;
    let mut out = Pooled::take(len);
    let (mut at, mut crc) = (0usize, 0u32);
    let mut scratch = Vec::new();
    for piece in pieces {
        let len = if piece.page {
            (piece.to as usize).saturating_sub(piece.from as usize)
        } else {
            piece.data.len()
        };
        let Some(into) = out.get_mut(at..at + len) else {
            return Err(protocol(format!("pieces longer than the {} bytes asked", range.length)));
        };
        let offset = range.offset + at as u64;
        let part = if piece.page {
            let file = files
                .get(piece.file as usize)
                .ok_or_else(|| protocol(format!("file {} was not passed", piece.file)))?;
            let checked = read_page(file, piece, into, &mut scratch)
                .map_err(|e| protocol(format!("reading a stored page: {e}")))?;
            checked.map_err(|(expected, actual)| Error::Checksum {
                endpoint: door.to_owned(),
                source: ChecksumMismatch { offset, len, expected, actual },
            })?
        } else {
            shardcache_proto::checksum::verify(offset, &piece.data, piece.crc32c)
                .map_err(|source| Error::Checksum { endpoint: door.to_owned(), source })?;
            into.copy_from_slice(&piece.data);
            piece.crc32c
        };
        crc = combine(crc, part, len);
        at += len;
    }
    if at != out.len() {
        return Err(protocol(format!("pieces of {at} bytes for the {} asked", range.length)));
    }
    Ok((out.into_bytes(), crc))
}

/// A buffer of a door read, given back to [`POOL`] when the last [`Bytes`] over it
/// drops: a stream's next piece reuses it, neither zeroed nor faulted in again (a fresh
/// 4 MiB buffer costs its reader a `memset` and a thousand page faults, about a fifth of
/// its CPU per byte in node-bench's profile). Every byte of it is written before it is
/// handed out (`assemble` fails a range its pieces do not fill).
struct Pooled(Vec<u8>);

/// Buffers of [`POOLED_LEAST`] to [`POOLED_LARGEST`] bytes kept for reuse, at most
/// [`POOLED_MOST`]: a process keeps at most 64 MiB for its door reads, enough for 8
/// streams' pieces in flight (two each, `stream.rs`).
static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
const POOLED_LEAST: usize = 256 << 10;
const POOLED_LARGEST: usize = 4 << 20;
const POOLED_MOST: usize = 16;

impl Pooled {
    fn take(len: usize) -> Self {
        let kept = match (POOLED_LEAST..=POOLED_LARGEST).contains(&len) {
            true => POOL.lock().unwrap_or_else(PoisonError::into_inner).pop(),
            false => None,
        };
        let mut buf = kept.unwrap_or_default();
        buf.resize(len, 0);
        Self(buf)
    }

    fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl std::ops::Deref for Pooled {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if (POOLED_LEAST..=POOLED_LARGEST).contains(&self.0.capacity()) {
            let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
            if pool.len() < POOLED_MOST {
                pool.push(std::mem::take(&mut self.0));
            }
        }
    }
}

/// Reads `piece`'s page from `file` and puts its part in `into`: the part's CRC32C, or
/// the page's stored and actual CRC32C when it fails its check. A whole page is read
/// straight into `into` (its header beside it); a part, with the page around it into
/// `scratch` (the check is over the whole page).
fn read_page(
    file: &File,
    piece: &LocalPiece,
    into: &mut [u8],
    scratch: &mut Vec<u8>,
) -> std::io::Result<std::result::Result<u32, (u32, u32)>> {
    let (from, to, page_len) = (piece.from as usize, piece.to as usize, piece.page_len as usize);
    if from >= to || to > page_len {
        let detail = format!("part {from}..{to} of a page of {page_len} bytes");
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, detail));
    }
    let whole = from == 0 && to == page_len;
    let page: &mut [u8] = if whole {
        &mut *into
    } else {
        scratch.resize(page_len, 0);
        scratch
    };
    let mut header = [0u8; 4];
    read_exact_at(file, &mut [IoSliceMut::new(&mut header), IoSliceMut::new(page)], piece.at)?;
    let stored = u32::from_le_bytes(header);
    let part = match checked_part(page, stored, from, to) {
        Ok(part) => part,
        Err(actual) => return Ok(Err((stored, actual))),
    };
    if !whole {
        into.copy_from_slice(&scratch[from..to]);
    }
    Ok(Ok(part))
}

/// `preadv` until `buffers` are full (a regular file reads whole in one call unless it
/// ends first): a file shorter than the place named in it is an error.
fn read_exact_at(file: &File, buffers: &mut [IoSliceMut<'_>], offset: u64) -> std::io::Result<()> {
    let wanted: usize = buffers.iter().map(|b| b.len()).sum();
    let got = rustix::io::preadv(file, buffers, offset)?;
    if got != wanted {
        let detail = format!("{got} bytes at {offset}, where the door placed {wanted}");
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, detail));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_buffer_hands_out_only_the_bytes_read_into_it() {
        let len = POOLED_LEAST + 5;
        let carried = |data: &[u8]| LocalPiece {
            data: data.to_vec().into(),
            crc32c: shardcache_proto::checksum::crc32c(data),
            ..LocalPiece::default()
        };
        let range = Range::new("d", "s", 0, len as u64);
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        for _ in 0..3 {
            // A buffer a read left behind, full of another read's bytes.
            POOL.lock().unwrap().push(vec![0xAA; 2 * len]);
            let (half, rest) = data.split_at(len / 2);
            let (read, crc) = assemble("door", &range, &[carried(half), carried(rest)], &[]).unwrap();
            assert_eq!(&read[..], &data[..], "exactly the bytes read, none of the last read's");
            assert_eq!(crc, shardcache_proto::checksum::crc32c(&data));
            drop(read);
            // Pieces that fill part of it: an error, never the rest of an old read.
            let short = assemble("door", &range, &[carried(half)], &[]);
            assert!(matches!(short, Err(Error::Protocol { .. })), "{short:?}");
        }
    }
}
