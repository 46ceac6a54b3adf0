//! Token arrays: `.npy` files (NumPy's format: a magic string, a version, a header
//! length, then a Python dict literal with `descr`, `fortran_order` and `shape`, then
//! the values) or raw files of a given dtype (nanoGPT's `train.bin`), read as windows
//! of `seq_len + 1` tokens every `seq_len` tokens over the files joined end to end.
//!
//! All `.npy` headers are read in one batch of ranged reads (the first
//! [`HEADER_READ`] bytes of each file), so a cold epoch waits one round trip for them.

use shardcache_proto::v1::ShardInfo;

use super::{Fetch, Piece, SampleIndex, damaged, listed_range};
use shardcache_client::{Error, Result};

/// Bytes read from the start of each `.npy` file for its header: NumPy pads headers to
/// a multiple of 64 bytes and they rarely pass 128; a longer one is read again whole.
pub const HEADER_READ: u64 = 4096;

const MAGIC: &[u8] = b"\x93NUMPY";

/// What an `.npy` header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// Where the values start.
    pub data_offset: u64,
    /// numpy's name of the dtype (`uint16`, `int32`...).
    pub dtype: String,
    pub item_size: u64,
    /// Values in all (the product of the shape; C order).
    pub count: u64,
}

impl NpyHeader {
    /// Parses the header at the start of `bytes`. `Ok(None)` when `bytes` holds only
    /// part of it (then `needed` bytes must be read): returns `Err` for a file that is
    /// not a little-endian, C-order `.npy` of integers or floats.
    pub fn parse(name: &str, bytes: &[u8]) -> Result<Result<Self, u64>> {
        let bad = |why: &str| Error::Damaged {
            file: name.to_owned(),
            offset: None,
            what: format!("not a .npy file this reader takes: {why}"),
        };
        if bytes.len() < 10 || !bytes.starts_with(MAGIC) {
            return Err(bad("no \\x93NUMPY magic"));
        }
        // numpy reads format versions 1.0, 2.0 and 3.0 and refuses any other minor version.
        if bytes[7] != 0 {
            return Err(bad(&format!("version {}.{}", bytes[6], bytes[7])));
        }
        let (length, start) = match bytes[6] {
            1 => (u64::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
            2 | 3 if bytes.len() >= 12 => {
                (u64::from(u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]])), 12)
            }
            v => return Err(bad(&format!("version {v}"))),
        };
        let end = start + length;
        if (bytes.len() as u64) < end {
            return Ok(Err(end));
        }
        let text =
            std::str::from_utf8(&bytes[start as usize..end as usize]).map_err(|_| bad("header not text"))?;
        let dict = HeaderDict::parse(text).map_err(|why| bad(&why))?;
        if dict.fortran_order {
            return Err(bad("Fortran order"));
        }
        let descr = dict.descr;
        let (dtype, item_size) = dtype_of_descr(&descr).ok_or_else(|| bad(&format!("dtype {descr}")))?;
        let shape = dict.shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        let mut count = 1u64;
        for &dim in &dict.shape {
            // Checked: a product past 2^64 must not wrap into a small count.
            count = count
                .checked_mul(dim)
                .ok_or_else(|| bad(&format!("shape ({shape}) of more than 2^64 values")))?;
        }
        count
            .checked_mul(item_size)
            .and_then(|bytes| bytes.checked_add(end))
            .ok_or_else(|| bad(&format!("shape ({shape}) of more than 2^64 bytes")))?;
        Ok(Ok(Self { data_offset: end, dtype, item_size, count }))
    }
}

/// A `.npy` header's dict, read as numpy reads it (`ast.literal_eval`, then exactly the
/// keys `descr`, `fortran_order` and `shape`): a string, a bool, a tuple of integers,
/// nothing but blanks after the `}`. Anything else numpy refuses, and so does this.
struct HeaderDict {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

impl HeaderDict {
    fn parse(text: &str) -> std::result::Result<Self, String> {
        let mut p = Literal { rest: text };
        let (mut descr, mut fortran_order, mut shape) = (None, None, None);
        p.expect('{')?;
        while !p.eat('}') {
            let key = p.string()?;
            p.expect(':')?;
            match key.as_str() {
                "descr" if descr.is_none() => descr = Some(p.string()?),
                "fortran_order" if fortran_order.is_none() => fortran_order = Some(p.boolean()?),
                "shape" if shape.is_none() => shape = Some(p.tuple()?),
                other => return Err(format!("the header has the key {other:?} (or it twice)")),
            }
            if !p.eat(',') {
                p.expect('}')?;
                break;
            }
        }
        if !p.rest.trim_ascii().is_empty() {
            return Err("text after the header's dict".into());
        }
        match (descr, fortran_order, shape) {
            (Some(descr), Some(fortran_order), Some(shape)) => Ok(Self { descr, fortran_order, shape }),
            _ => Err("the header lacks one of 'descr', 'fortran_order', 'shape'".into()),
        }
    }
}

/// The few Python literals a `.npy` header has, read from the front of `rest`.
struct Literal<'a> {
    rest: &'a str,
}

impl Literal<'_> {
    fn eat(&mut self, c: char) -> bool {
        self.rest = self.rest.trim_ascii_start();
        match self.rest.strip_prefix(c) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn expect(&mut self, c: char) -> std::result::Result<(), String> {
        self.eat(c).then_some(()).ok_or_else(|| format!("no {c:?} where the header's dict needs one"))
    }

    /// A quoted string without escapes (numpy writes none in a header).
    fn string(&mut self) -> std::result::Result<String, String> {
        self.rest = self.rest.trim_ascii_start();
        let quote = self.rest.chars().next().filter(|&c| c == '\'' || c == '"').ok_or("no string")?;
        let body = &self.rest[1..];
        let end = body.find(quote).ok_or("an unterminated string")?;
        if body[..end].contains(['\\', '\n']) {
            return Err("a string with escapes".into());
        }
        self.rest = &body[end + 1..];
        Ok(body[..end].to_owned())
    }

    fn boolean(&mut self) -> std::result::Result<bool, String> {
        self.rest = self.rest.trim_ascii_start();
        for (word, value) in [("True", true), ("False", false)] {
            if let Some(rest) = self.rest.strip_prefix(word) {
                self.rest = rest;
                return Ok(value);
            }
        }
        Err("fortran_order is not True or False".into())
    }

    /// `()`, `(n,)`, `(n, m)`, `(n, m,)`: a tuple of decimal integers.
    fn tuple(&mut self) -> std::result::Result<Vec<u64>, String> {
        self.expect('(')?;
        let mut dims = Vec::new();
        loop {
            if self.eat(')') {
                return Ok(dims); // `()`, or after a comma
            }
            self.rest = self.rest.trim_ascii_start();
            let digits = self.rest.len() - self.rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let number = &self.rest[..digits];
            if number.is_empty() || (number.len() > 1 && number.starts_with('0')) {
                return Err("a shape that is not a tuple of integers".into());
            }
            dims.push(number.parse().map_err(|_| format!("a dimension of {number} (past 2^64)"))?);
            self.rest = &self.rest[digits..];
            if !self.eat(',') {
                if dims.len() == 1 {
                    return Err("a shape of `(n)`: a number, not a tuple".into());
                }
                self.expect(')')?;
                return Ok(dims);
            }
        }
    }
}

/// The header `numpy.save` writes for a C-order array of `descr` (e.g. `<u2`) and
/// `shape` (e.g. `(1000,)`): version 1.0, padded to a multiple of 64 bytes.
pub fn npy_header(descr: &str, shape: &str) -> Vec<u8> {
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// numpy's dtype name and size for a little-endian (or one-byte) `descr` like `<u2`.
fn dtype_of_descr(descr: &str) -> Option<(String, u64)> {
    // Not split_at: an empty or non-ASCII descr is refused, not a panic.
    let (order, code) = (descr.get(..1)?, descr.get(1..)?);
    // Little-endian, or one byte (no order); "=" is the writer's own order, little here.
    let little = matches!(order, "<" | "|") || (order == "=" && cfg!(target_endian = "little"));
    if !little {
        return None;
    }
    let (kind, size) = (code.get(..1)?, code.get(1..)?);
    let size: u64 = size.parse().ok()?;
    let name = match kind {
        "u" => "uint",
        "i" => "int",
        "f" => "float",
        _ => return None,
    };
    matches!(size, 1 | 2 | 4 | 8).then(|| (format!("{name}{}", size * 8), size))
}

/// Bytes per value of a numpy dtype name given by the user (`uint16`, `int32`...).
pub fn item_size(dtype: &str) -> Option<u64> {
    let bits = dtype.trim_start_matches(|c: char| c.is_ascii_alphabetic());
    let kind = &dtype[..dtype.len() - bits.len()];
    let size = bits.parse::<u64>().ok()? / 8;
    (matches!(kind, "uint" | "int" | "float") && matches!(size, 1 | 2 | 4 | 8)).then_some(size)
}

/// The windows index over `listed`: `.npy` files (headers read), or every file as raw
/// `dtype` values.
pub async fn open<F: Fetch>(
    client: &F,
    dataset: &str,
    listed: &[ShardInfo],
    seq_len: u64,
    dtype: &Option<String>,
) -> Result<SampleIndex> {
    if seq_len == 0 {
        return Err(Error::Config("seq_len must be at least 1 token".into()));
    }
    let (shards, regions, dtype, item) = match dtype {
        Some(dtype) => {
            let item = item_size(dtype).ok_or_else(|| {
                Error::Config(format!("dtype {dtype:?}: give a numpy integer or float type, e.g. uint16"))
            })?;
            // A size that is no whole number of values: cut short, or written as another dtype
            // (numpy.memmap, which nanoGPT reads these with, refuses it too).
            if let Some(odd) = listed.iter().find(|s| s.size % item != 0) {
                return Err(super::damaged(
                    dataset,
                    &odd.shard,
                    odd.size - odd.size % item,
                    format!(
                        "{} bytes are no whole number of {dtype} values ({item} bytes each): the file was cut \
                         short, or it holds another dtype",
                        odd.size
                    ),
                ));
            }
            let shards = listed.iter().map(|s| (s.shard.clone(), s.version.clone())).collect();
            let regions = listed.iter().map(|s| (0, s.size)).collect();
            (shards, regions, dtype.clone(), item)
        }
        None => npy_regions(client, dataset, listed).await?,
    };
    let window = seq_len
        .checked_add(1)
        .and_then(|n| n.checked_mul(item))
        .ok_or_else(|| Error::Config(format!("seq_len {seq_len}: windows of more than 2^64 bytes")))?;
    Ok(SampleIndex::windows(dataset, shards, regions, seq_len * item, window, Some(dtype)))
}

/// The `.npy` files of `listed` (with their versions), their data regions, and their one
/// dtype and its size.
async fn npy_regions<F: Fetch>(
    client: &F,
    dataset: &str,
    listed: &[ShardInfo],
) -> Result<(Vec<(String, String)>, Vec<(u64, u64)>, String, u64)> {
    let files: Vec<&ShardInfo> = listed.iter().filter(|s| s.shard.ends_with(".npy")).collect();
    if files.is_empty() {
        return Err(Error::Config(format!(
            "dataset {dataset:?} has no .npy files; for raw token files give their dtype"
        )));
    }
    let heads = files.iter().map(|s| listed_range(dataset, s, 0, s.size.min(HEADER_READ))).collect();
    let heads = client.fetch(heads).await?;
    let (mut regions, mut kind) = (Vec::new(), None::<(String, u64)>);
    for (file, head) in files.iter().zip(heads) {
        let name = format!("{dataset}/{}", file.shard);
        let header = match NpyHeader::parse(&name, &head)? {
            Ok(header) => header,
            Err(needed) if needed <= file.size => {
                let whole = client.fetch(vec![listed_range(dataset, file, 0, needed)]).await?;
                let whole = whole.into_iter().next().unwrap_or_default();
                NpyHeader::parse(&name, &whole)?.map_err(|_| {
                    damaged(dataset, &file.shard, 8, "the .npy header runs past its stated length")
                })?
            }
            Err(needed) => {
                let what = format!("a header of {needed} bytes in a file of {}", file.size);
                return Err(damaged(dataset, &file.shard, 8, what));
            }
        };
        // Checked in parse: no overflow.
        let end = header.data_offset + header.count * header.item_size;
        if end > file.size {
            let what = format!("its header says {end} bytes, the file has {}", file.size);
            return Err(damaged(dataset, &file.shard, 8, what));
        }
        match &kind {
            Some((dtype, _)) if *dtype != header.dtype => {
                let what = format!("dtype {} where the other files have {dtype}", header.dtype);
                return Err(damaged(dataset, &file.shard, None, what));
            }
            _ => kind = Some((header.dtype.clone(), header.item_size)),
        }
        regions.push((header.data_offset, end));
    }
    let (dtype, item) = kind.unwrap_or_default();
    Ok((files.iter().map(|s| (s.shard.clone(), s.version.clone())).collect(), regions, dtype, item))
}

/// The pieces of the window of `window` bytes starting `offset` bytes into shard
/// `shard`'s region, running on into the following shards' regions.
pub(super) fn window_pieces(regions: &[(u64, u64)], shard: usize, offset: u64, window: u64) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let (mut shard, mut at, mut left) = (shard, regions[shard].0 + offset, window);
    while left > 0 && shard < regions.len() {
        let end = regions[shard].1;
        let length = left.min(end.saturating_sub(at));
        if length > 0 {
            pieces.push(Piece { shard, offset: at, length });
        }
        left -= length;
        shard += 1;
        at = regions.get(shard).map_or(0, |r| r.0);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_headers_give_dtype_offset_and_count() {
        let head = npy_header("<u2", "(1000,)");
        let parsed = NpyHeader::parse("a.npy", &head).unwrap().unwrap();
        assert_eq!(parsed, NpyHeader { data_offset: 128, dtype: "uint16".into(), item_size: 2, count: 1000 });
        let parsed = NpyHeader::parse("b.npy", &npy_header("<i4", "(10, 3)")).unwrap().unwrap();
        assert_eq!((parsed.dtype.as_str(), parsed.count), ("int32", 30));
        assert_eq!(NpyHeader::parse("c.npy", &head[..20]).unwrap(), Err(128), "the rest is asked for");
        assert!(NpyHeader::parse("d.npy", &npy_header(">u2", "(4,)")).is_err(), "big-endian");
        assert!(NpyHeader::parse("e.npy", b"not numpy at all").is_err());
        let mut minor = head.clone();
        minor[7] = 8; // version 1.8: numpy refuses it
        assert!(NpyHeader::parse("g.npy", &minor).is_err());
        assert_eq!(item_size("uint16"), Some(2));
        assert_eq!(item_size("float64"), Some(8));
        assert_eq!(item_size("u2"), None);
        // Damaged headers: an error, never a panic or a wrapped count.
        for (descr, shape) in
            [("", "(4,)"), ("<", "(4,)"), ("é2", "(4,)"), ("<u2", "(4294967296, 4294967296, 16)")]
        {
            let err = NpyHeader::parse("f.npy", &npy_header(descr, shape)).unwrap_err();
            assert!(matches!(err, Error::Damaged { .. }), "{descr} {shape}: {err}");
        }
    }

    #[tokio::test]
    async fn a_raw_file_of_no_whole_number_of_values_is_refused() {
        use crate::{Budget, Files, Format, SampleIndex};
        let files = Files::new([
            ("a.bin".to_owned(), bytes::Bytes::from(vec![1u8; 64])),
            ("b.bin".to_owned(), vec![1u8; 33].into()),
        ]);
        let open = |dtype: &str| {
            let format = Format::Tokens { seq_len: 4, dtype: Some(dtype.into()) };
            let files = &files;
            async move {
                SampleIndex::open_listed(files, "ds", &files.listing(), &format, Budget::default()).await
            }
        };
        let Err(err) = open("uint16").await else { panic!("an odd-sized file read") };
        assert!(
            err.to_string().contains("ds/b.bin: damaged at byte 32: 33 bytes are no whole number of uint16"),
            "{err}"
        );
        assert_eq!(open("uint8").await.expect("bytes are whole uint8 values").len(), (97 - 5) / 4 + 1);
    }

    #[test]
    fn a_header_numpy_refuses_is_refused() {
        let dict = |text: &str| HeaderDict::parse(text).map(|d| (d.descr, d.fortran_order, d.shape));
        // What numpy writes, and other spellings ast.literal_eval takes.
        assert_eq!(
            dict("{'descr': '<u2', 'fortran_order': False, 'shape': (37,), }   \n"),
            Ok(("<u2".into(), false, vec![37]))
        );
        assert_eq!(
            dict("{\"shape\": (2, 3), \"descr\": \"<f4\", \"fortran_order\": True}"),
            Ok(("<f4".into(), true, vec![2, 3]))
        );
        assert_eq!(
            dict("{'descr': '<u2', 'fortran_order': False, 'shape': ()}"),
            Ok(("<u2".into(), false, vec![]))
        );
        // What numpy refuses (each found by the differential fuzz run against numpy.load).
        for text in [
            "{'descr': '<u2', 'fortran_order': False, 'shape': (37,), }   \x7f  \n", // not blank after the dict
            "{'descr': '<u2', 'fortran_orde\x01': False, 'shape': (37,), }",         // another key
            "{'descr': '<u2', 'shape': (37,), }",                                    // a key missing
            "{'descr': '<u2', 'fortran_order': False, 'shape': (37), }",             // a number, not a tuple
            "{'descr': '<u2', 'fortran_order': False, 'shape': (037,), }",           // not a Python integer
            "{'descr': '<u2', 'fortran_order': 0, 'shape': (37,), }",
            "{'descr': '<u2', 'descr': '<u2', 'fortran_order': False, 'shape': (37,), }",
            "{'descr': '<u2', 'fortran_order': False, 'shape': (37,), ",
        ] {
            assert!(dict(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_window_runs_on_into_the_next_shards() {
        // Three regions of 10, 4 and 10 bytes (the first after a 6-byte header).
        let regions = [(6, 16), (0, 4), (0, 10)];
        assert_eq!(window_pieces(&regions, 0, 2, 5), [Piece { shard: 0, offset: 8, length: 5 }]);
        assert_eq!(
            window_pieces(&regions, 0, 8, 8),
            [
                Piece { shard: 0, offset: 14, length: 2 },
                Piece { shard: 1, offset: 0, length: 4 },
                Piece { shard: 2, offset: 0, length: 2 }
            ]
        );
        assert_eq!(window_pieces(&regions, 2, 8, 2), [Piece { shard: 2, offset: 8, length: 2 }]);
    }
}
