//! Parquet page headers, read and checked before the `parquet` crate decodes a row group.
//!
//! The crate believes a page header's sizes and counts: it allocates the
//! `uncompressed_page_size` a header claims before decompressing, zero-fills a Snappy
//! page's output to that size (a page that decompresses to fewer bytes is padded with
//! zeros, where pyarrow refuses the file), and sizes a dictionary by its `num_values`.
//! So every page header of a row group is read here first (Thrift's compact protocol,
//! the few fields that matter) and the row group is refused when a page does not fit:
//! its compressed bytes past its column chunk, its uncompressed bytes past what the
//! reader's budget holds for the row group, a Snappy block whose stated length is not the
//! page's, or more values than the row group's rows and bytes could hold.

use parquet::basic::Compression;

/// A page header's fields that bound what decoding it allocates.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct PageHeader {
    /// 0 data page, 1 index page, 2 dictionary page, 3 data page v2.
    kind: i32,
    uncompressed: i32,
    compressed: i32,
    /// Values (data pages: levels, nulls included; dictionary pages: entries).
    values: Option<i32>,
    /// Rows (data pages v2).
    rows: Option<i32>,
    /// Bytes of levels before the compressed values (data pages v2).
    levels: i32,
    /// Whether the values are compressed (data pages v2; true when not said).
    compressed_values: bool,
    /// The values' encoding (data pages).
    encoding: Option<i32>,
}

/// PLAIN_DICTIONARY and RLE_DICTIONARY: values that are indices into the chunk's dictionary.
const DICTIONARY_ENCODINGS: [i32; 2] = [2, 8];

/// How deep Thrift structs may nest in a page header (the parquet crate skips to 64).
const MAX_DEPTH: u32 = 32;

/// One column chunk of a row group, as its footer places it.
pub(super) struct Chunk {
    /// Its first byte (the dictionary page's when it has one) and its bytes.
    pub start: u64,
    pub length: u64,
    pub codec: Compression,
    /// Whether values repeat within a row (a list's elements): then a page may hold more
    /// values than the row group has rows.
    pub repeated: bool,
}

/// Checks every page of `chunk`, whose bytes are in `data` (the row group's bytes, read
/// from `base` in the file); `rows`: the row group's rows. Returns the bytes the pages
/// decompress to, in all, or what is wrong and at which byte of the file.
pub(super) fn check(data: &[u8], base: u64, chunk: &Chunk, rows: u64) -> Result<u64, (u64, String)> {
    let from =
        chunk.start.checked_sub(base).ok_or((chunk.start, "a column chunk before its row group".into()))?;
    let end = from.checked_add(chunk.length).filter(|&end| end <= data.len() as u64);
    let end = end.ok_or((chunk.start, "a column chunk past its row group's bytes".into()))? as usize;
    let (mut at, mut unpacked, mut values, mut dictionary) = (from as usize, 0u64, 0u64, false);
    while at < end {
        let place = base + at as u64;
        let (header, length) =
            read(&data[at..end]).map_err(|why| (place, format!("a page header: {why}")))?;
        let bad = |why: String| Err((place, why));
        if header.compressed < 0
            || header.uncompressed < 0
            || header.levels < 0
            || header.levels > header.uncompressed
        {
            return bad(format!("a page header of sizes {:?}", header));
        }
        let body = at + length;
        let Some(next) = body.checked_add(header.compressed as usize).filter(|&next| next <= end) else {
            return bad(format!("a page of {} bytes past its column chunk's end", header.compressed));
        };
        // A v2 page's levels are stored as they are, before its compressed values.
        if header.levels > header.compressed {
            return bad(format!("{} bytes of levels in a page of {}", header.levels, header.compressed));
        }
        unpacked += header.uncompressed as u64;
        let count = header.values.unwrap_or(0).max(0) as u64;
        match header.kind {
            // A dictionary entry takes at least a byte (booleans have no dictionaries).
            2 if count > header.uncompressed as u64 => {
                return bad(format!("a dictionary of {count} values in {} bytes", header.uncompressed));
            }
            2 => dictionary = true,
            0 | 3 if header.encoding.is_some_and(|e| DICTIONARY_ENCODINGS.contains(&e)) && !dictionary => {
                return bad("a dictionary-encoded page with no dictionary page before it".into());
            }
            0 | 3 => {
                values += count;
                // Every level of a value not in a list is a row; in a list, an element.
                let bound =
                    if chunk.repeated { rows.saturating_add(8 * header.uncompressed as u64) } else { rows };
                if values > bound || header.rows.is_some_and(|r| r < 0 || r as u64 > rows) {
                    return bad(format!(
                        "pages of {values} values{} in a row group of {rows} rows",
                        header.rows.map(|r| format!(" ({r} rows)")).unwrap_or_default()
                    ));
                }
            }
            _ => {}
        }
        // A Snappy block says what it decompresses to: it must be what the page says
        // (the crate pads a shorter one with zeros).
        let packed = &data[body + header.levels as usize..next];
        let values_compressed = header.kind != 3 || header.compressed_values;
        if chunk.codec == Compression::SNAPPY && values_compressed && header.uncompressed > header.levels {
            let stated =
                snap::raw::decompress_len(packed).map_err(|e| (place, format!("a Snappy page: {e}")))?;
            if stated as u64 != (header.uncompressed - header.levels) as u64 {
                return bad(format!(
                    "a Snappy page that decompresses to {stated} bytes where its header says {}",
                    header.uncompressed - header.levels
                ));
            }
        }
        at = next;
    }
    Ok(unpacked)
}

/// A page header from the start of `bytes`, and its length.
fn read(bytes: &[u8]) -> Result<(PageHeader, usize), String> {
    let mut input = Input { bytes, at: 0 };
    let mut header = PageHeader { compressed_values: true, ..Default::default() };
    let int = |input: &mut Input| input.int().map(|v| v as i32);
    input.fields(0, &mut |input, id, kind| {
        match (id, kind) {
            (1, I32) => header.kind = int(input)?,
            (2, I32) => header.uncompressed = int(input)?,
            (3, I32) => header.compressed = int(input)?,
            (5 | 7 | 8, STRUCT) => {
                let v2 = id == 8;
                input.fields(1, &mut |input, id, kind| {
                    match (id, kind) {
                        (1, I32) => header.values = Some(int(input)?),
                        (2, I32) if !v2 => header.encoding = Some(int(input)?),
                        (4, I32) if v2 => header.encoding = Some(int(input)?),
                        (3, I32) if v2 => header.rows = Some(int(input)?),
                        (5 | 6, I32) if v2 => {
                            let levels = int(input)?;
                            header.levels =
                                header.levels.checked_add(levels).ok_or("level lengths past 2^31")?;
                        }
                        (7, FALSE) if v2 => header.compressed_values = false,
                        (_, kind) => input.skip(kind, 2)?,
                    }
                    Ok(())
                })?;
            }
            (_, kind) => input.skip(kind, 1)?,
        }
        Ok(())
    })?;
    Ok((header, input.at))
}

const TRUE: u8 = 1;
const FALSE: u8 = 2;
const I32: u8 = 5;
const STRUCT: u8 = 12;

/// Thrift's compact protocol over a byte slice.
struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

type Field<'f, 'a> = dyn FnMut(&mut Input<'a>, i16, u8) -> Result<(), String> + 'f;

impl<'a> Input<'a> {
    fn byte(&mut self) -> Result<u8, String> {
        let byte = *self.bytes.get(self.at).ok_or("cut short")?;
        self.at += 1;
        Ok(byte)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint of more than 10 bytes".into())
    }

    /// A zigzag varint (i16, i32, i64).
    fn int(&mut self) -> Result<i64, String> {
        let n = self.varint()?;
        Ok((n >> 1) as i64 ^ -((n & 1) as i64))
    }

    /// A struct's fields, each handed to `each` (its id and type) until STOP.
    fn fields(&mut self, depth: u32, each: &mut Field<'_, 'a>) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("structs nested too deep".into());
        }
        let mut id = 0i16;
        loop {
            let byte = self.byte()?;
            if byte == 0 {
                return Ok(());
            }
            let (delta, kind) = (byte >> 4, byte & 0x0f);
            id = match delta {
                0 => i16::try_from(self.int()?).map_err(|_| "a field id past 2^15")?,
                delta => id.checked_add(i16::from(delta)).ok_or("a field id past 2^15")?,
            };
            each(self, id, kind)?;
        }
    }

    /// Skips a value of type `kind`.
    fn skip(&mut self, kind: u8, depth: u32) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("values nested too deep".into());
        }
        match kind {
            TRUE | FALSE => Ok(()),
            3 => self.byte().map(drop),
            4 | I32 | 6 => self.varint().map(drop),
            7 => self.advance(8),
            8 => {
                let length = self.varint()?;
                self.advance(usize::try_from(length).map_err(|_| "a binary past 2^64")?)
            }
            9 | 10 => {
                let head = self.byte()?;
                let (size, element) = (head >> 4, head & 0x0f);
                let size = if size == 15 { self.varint()? } else { u64::from(size) };
                // Each element takes a byte at least: a count past the bytes left is a lie.
                if size > (self.bytes.len() - self.at) as u64 {
                    return Err(format!("a list of {size} elements past the header's end"));
                }
                for _ in 0..size {
                    match element {
                        TRUE | FALSE => self.byte().map(drop)?, // a list's booleans are a byte each
                        element => self.skip(element, depth + 1)?,
                    }
                }
                Ok(())
            }
            11 => {
                let size = self.varint()?;
                if size == 0 {
                    return Ok(());
                }
                if size > (self.bytes.len() - self.at) as u64 {
                    return Err(format!("a map of {size} entries past the header's end"));
                }
                let types = self.byte()?;
                for _ in 0..size {
                    self.skip(types >> 4, depth + 1)?;
                    self.skip(types & 0x0f, depth + 1)?;
                }
                Ok(())
            }
            STRUCT => self.fields(depth + 1, &mut |input, _, kind| input.skip(kind, depth + 2)),
            other => Err(format!("a value of Thrift type {other}")),
        }
    }

    fn advance(&mut self, n: usize) -> Result<(), String> {
        let to = self.at.checked_add(n).filter(|&to| to <= self.bytes.len()).ok_or("cut short")?;
        self.at = to;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compact-protocol page header: (field id, zigzag i32) fields, a nested header.
    fn header(kind: i32, uncompressed: i32, compressed: i32, nested: u8, values: i32) -> Vec<u8> {
        let zig = |v: i32| {
            let mut n = ((v << 1) ^ (v >> 31)) as u32;
            let mut out = Vec::new();
            loop {
                let byte = (n & 0x7f) as u8;
                n >>= 7;
                if n == 0 {
                    out.push(byte);
                    return out;
                }
                out.push(byte | 0x80);
            }
        };
        let mut out = vec![0x15];
        out.extend(zig(kind));
        out.push(0x15);
        out.extend(zig(uncompressed));
        out.push(0x15);
        out.extend(zig(compressed));
        out.push(((nested - 3) << 4) | STRUCT);
        out.push(0x15);
        out.extend(zig(values));
        out.extend([0, 0]);
        out
    }

    #[test]
    fn page_headers_are_read_and_their_claims_checked() {
        let mut page = header(0, 4, 4, 5, 2);
        let (parsed, length) = read(&page).unwrap();
        assert_eq!((parsed.kind, parsed.uncompressed, parsed.compressed, parsed.values), (0, 4, 4, Some(2)));
        assert_eq!(length, page.len());
        page.extend([1, 2, 3, 4]);
        let chunk = |codec| Chunk { start: 100, length: page.len() as u64, codec, repeated: false };
        assert_eq!(check(&page, 100, &chunk(Compression::UNCOMPRESSED), 2), Ok(4));
        // More values than rows, for a column not in a list.
        assert!(check(&page, 100, &chunk(Compression::UNCOMPRESSED), 1).is_err());
        // A Snappy block stating 4 bytes is fine; one stating 3 is a page padded with zeros.
        let mut snappy = header(0, 4, 6, 5, 2);
        snappy.extend(snap::raw::Encoder::new().compress_vec(&[1, 2, 3, 4]).unwrap());
        let snappy_chunk =
            Chunk { start: 0, length: snappy.len() as u64, codec: Compression::SNAPPY, repeated: false };
        assert_eq!(check(&snappy, 0, &snappy_chunk, 2).map_err(|e| e.1), Ok(4));
        let mut short = header(0, 4, 5, 5, 2);
        short.extend(snap::raw::Encoder::new().compress_vec(&[1, 2, 3]).unwrap());
        let short_chunk =
            Chunk { start: 0, length: short.len() as u64, codec: Compression::SNAPPY, repeated: false };
        let (at, why) = check(&short, 0, &short_chunk, 2).unwrap_err();
        assert!(at == 0 && why.contains("decompresses to 3 bytes"), "{why}");
        // A dictionary of a billion entries in 16 bytes.
        let dictionary = header(2, 16, 0, 7, 1 << 30);
        let chunk = Chunk {
            start: 0,
            length: dictionary.len() as u64,
            codec: Compression::UNCOMPRESSED,
            repeated: false,
        };
        assert!(check(&dictionary, 0, &chunk, 2).unwrap_err().1.contains("dictionary"));
        // Compressed bytes past the chunk's end.
        let long = header(0, 4, 400, 5, 2);
        let chunk =
            Chunk { start: 0, length: long.len() as u64, codec: Compression::UNCOMPRESSED, repeated: false };
        assert!(check(&long, 0, &chunk, 2).unwrap_err().1.contains("past its column chunk"));
    }

    #[test]
    fn hostile_thrift_is_an_error_not_a_stack_overflow() {
        // Struct in struct in struct...: 10,000 deep.
        let mut deep = vec![0x1c; 10_000];
        deep.push(0);
        assert!(read(&deep).is_err());
        // A list claiming 2^60 elements.
        let mut list = vec![0x19, 0xf5];
        list.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(read(&list).is_err());
    }
}
