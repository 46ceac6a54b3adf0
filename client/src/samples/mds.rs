//! MosaicML Streaming's MDS datasets (`streaming/base/format/mds`), read as they are:
//!
//! - `index.json`: `{"shards": [...], "version": 2}`; each shard entry names its file
//!   (`raw_data.basename`), its sample count, and its columns (`column_names`, sorted;
//!   `column_encodings`; `column_sizes`, `null` for a variable-size column);
//! - a shard file: `u32 N`, `u32 offsets[N + 1]` (absolute; sample `i` is
//!   `offsets[i]..offsets[i + 1]`, `offsets[N]` the file's length), the shard's config
//!   as JSON, then the samples;
//! - a sample: a `u32` size for each variable-size column, in column order, then every
//!   column's bytes in that order. All little-endian.
//!
//! Every shard's offset table is read in one batch of ranged reads. A shard compressed
//! whole (`compression: "zstd"`, `"gz"` or `"snappy"`, its file `zip_data.basename`) cannot be read by ranges:
//! its sample count comes from `index.json`, and the first read of one of its samples
//! fetches the whole file (cached compressed by the spoke) and decompresses it in the
//! client, which keeps the last [`UNPACKED_SHARDS`] shards so decompressed, as MosaicML
//! Streaming decompresses a shard to its local cache.

use bytes::Bytes;
use serde::Deserialize;
use shardcache_proto::v1::ShardInfo;

use super::{Budget, Fetch, Layout, SampleIndex, Value, budget::Held, damaged, listed_range};
use crate::{Error, Result};

/// The index file at the top of an MDS dataset.
pub const INDEX: &str = "index.json";

#[derive(Debug, Deserialize)]
struct IndexFile {
    shards: Vec<ShardEntry>,
    /// 2: the only version MosaicML Streaming writes and reads (it refuses others).
    version: u64,
}

/// Bytes read from the start of every listed `.mds` file beside `index.json`, before
/// knowing its sample count, so a cold open costs one round of reads, not two: 1/256 of
/// the file (the offset table of samples of 1 KiB on average and more), from 4 KiB to
/// 64 KiB; a longer table is read again whole. The share is what the open adds to the
/// bytes of a cold epoch (the epoch fetches the head's chunk again): 0.4% at most.
pub fn head_guess(size: u64) -> u64 {
    (size / 256).clamp(4 << 10, 64 << 10).min(size)
}

/// Compressed shards a [`SampleIndex`] keeps decompressed: a block of the datasets'
/// shuffle (`shard_block`, 4 by default) is read at a time.
pub const UNPACKED_SHARDS: usize = 4;

#[derive(Debug, Deserialize)]
struct ShardEntry {
    /// 2, as in the index (MosaicML asserts it of every shard).
    version: u64,
    format: String,
    samples: u64,
    column_names: Vec<String>,
    column_encodings: Vec<String>,
    column_sizes: Vec<Option<u64>>,
    compression: Option<String>,
    raw_data: FileEntry,
    zip_data: Option<FileEntry>,
}

#[derive(Debug, Deserialize)]
struct FileEntry {
    basename: String,
    bytes: u64,
}

/// One column of an MDS dataset: its name, encoding, and size when fixed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub encoding: String,
    pub size: Option<u64>,
}

/// The samples of the shards `index.json` lists, and their columns.
pub async fn open<F: Fetch>(
    client: &F,
    dataset: &str,
    listed: &[ShardInfo],
    budget: &Budget,
) -> Result<SampleIndex> {
    let Some(index) = listed.iter().find(|s| s.shard == INDEX) else {
        return Err(Error::Config(format!(
            "dataset {dataset:?} has no {INDEX} at its top (not an MDS dataset)"
        )));
    };
    // index.json and the head of every .mds file listed, in one batch.
    let plain: Vec<&ShardInfo> = listed.iter().filter(|s| s.shard.ends_with(".mds")).collect();
    let mut reads = vec![listed_range(dataset, index, 0, index.size)];
    reads.extend(plain.iter().map(|s| listed_range(dataset, s, 0, head_guess(s.size))));
    budget.admits(index.size, || format!("reading {dataset}/{INDEX}"))?;
    let mut read = client.fetch(reads).await?.into_iter();
    let index_bytes = read.next().unwrap_or_default();
    let guessed: std::collections::HashMap<&str, Bytes> =
        plain.iter().map(|s| s.shard.as_str()).zip(read).collect();
    let file: IndexFile = serde_json::from_slice(&index_bytes)
        .map_err(|e| damaged(dataset, INDEX, None, format!("not MDS's index: {e}")))?;
    if file.version != 2 {
        let what = format!("version {}: MosaicML Streaming writes and reads version 2", file.version);
        return Err(damaged(dataset, INDEX, None, what));
    }
    let columns = columns(dataset, &file)?;
    // The files the index names, as listed (their versions pin every read).
    let find = |name: &str| {
        listed.iter().find(|s| s.shard == name).ok_or_else(|| {
            damaged(dataset, INDEX, None, format!("it names {name}, which the dataset does not have"))
        })
    };
    if file.shards.iter().any(|s| s.compression.is_some()) {
        let files = file.shards.iter().filter_map(|s| s.zip_data.as_ref());
        let files: Vec<&ShardInfo> = files.map(|z| find(&z.basename)).collect::<Result<_>>()?;
        return compressed(dataset, &file, &files, columns);
    }
    let shards: Vec<&ShardEntry> = file.shards.iter().collect();
    let files: Vec<&ShardInfo> = shards.iter().map(|s| find(&s.raw_data.basename)).collect::<Result<_>>()?;
    // A count index.json gives is believed only as far as the file could hold its table
    // (and the table is the file's own: offsets checked below).
    for (shard, listed) in shards.iter().zip(&files) {
        let table = shard.samples.checked_add(2).and_then(|n| n.checked_mul(4));
        if table.is_none_or(|t| t > listed.size) || shard.raw_data.bytes != listed.size {
            return Err(damaged(
                dataset,
                INDEX,
                None,
                format!(
                    "{} of {} bytes with {} samples, where the file has {} bytes",
                    listed.shard, shard.raw_data.bytes, shard.samples, listed.size
                ),
            ));
        }
    }
    // The tables the guessed heads did not hold whole, read in one more batch.
    let table = |s: &ShardEntry| 4 * (s.samples + 2);
    let short: Vec<usize> = (0..shards.len())
        .filter(|&i| {
            guessed
                .get(shards[i].raw_data.basename.as_str())
                .is_none_or(|h| (h.len() as u64) < table(shards[i]))
        })
        .collect();
    let again = short.iter().map(|&i| listed_range(dataset, files[i], 0, table(shards[i]))).collect();
    let mut again: std::collections::HashMap<usize, Bytes> =
        short.iter().copied().zip(client.fetch(again).await?).collect();
    let mut bounds = Vec::with_capacity(shards.len());
    for (i, shard) in shards.iter().enumerate() {
        let head = match again.remove(&i) {
            Some(head) => head,
            None => guessed[shard.raw_data.basename.as_str()].clone(),
        };
        bounds.push(offsets(dataset, &shard.raw_data.basename, shard.samples, shard.raw_data.bytes, &head)?);
    }
    Ok(SampleIndex {
        dataset: dataset.to_owned(),
        shards: shards.iter().map(|s| s.raw_data.basename.clone()).collect(),
        versions: files.iter().map(|f| f.version.clone()).collect(),
        layout: Layout::Bounds(bounds),
        dtype: None,
        columns: Some(columns),
        budget: budget.clone(),
    })
}

/// The dataset's columns: every shard's must be the same, and uncompressed.
fn columns(dataset: &str, file: &IndexFile) -> Result<Vec<Column>> {
    let mut columns: Option<Vec<Column>> = None;
    for shard in &file.shards {
        let name = &shard.raw_data.basename;
        if shard.format != "mds" || shard.version != 2 {
            let what =
                format!("{name}: format {:?} version {}, not mds version 2", shard.format, shard.version);
            return Err(damaged(dataset, INDEX, None, what));
        }
        match (shard.compression.as_deref(), &shard.zip_data) {
            (None, _) => {}
            (Some(c), Some(_)) if Codec::of(c).is_some() => {}
            (Some(c), _) => {
                return Err(Error::Config(format!(
                    "{dataset}/{name} is compressed with {c}: zstd (MosaicML's recommended), gz, snappy or no \
                     compression is read; write the dataset with compression=\"zstd\" or none"
                )));
            }
        }
        if shard.compression.is_some() != file.shards[0].compression.is_some() {
            return Err(damaged(dataset, INDEX, None, format!("{name}: some shards compressed, others not")));
        }
        let these: Vec<Column> =
            (shard.column_names.iter().zip(&shard.column_encodings).zip(&shard.column_sizes))
                .map(|((name, encoding), size)| Column {
                    name: name.clone(),
                    encoding: encoding.clone(),
                    size: *size,
                })
                .collect();
        if these.len() != shard.column_names.len() || shard.column_encodings.len() != shard.column_sizes.len()
        {
            return Err(damaged(dataset, INDEX, None, format!("{name} lists columns of unequal counts")));
        }
        match &columns {
            Some(first) if *first != these => {
                return Err(damaged(
                    dataset,
                    INDEX,
                    None,
                    format!("{name}: columns unlike the first shard's"),
                ));
            }
            _ => columns = Some(these),
        }
    }
    columns.ok_or_else(|| damaged(dataset, INDEX, None, "it lists no shards"))
}

/// The index of a dataset of zstd-compressed shards: counts from `index.json`, the
/// samples' bounds known once a shard is fetched and decompressed.
fn compressed(
    dataset: &str,
    file: &IndexFile,
    files: &[&ShardInfo],
    columns: Vec<Column>,
) -> Result<SampleIndex> {
    // A count is believed only as far as the decompressed file could hold its offset table.
    for shard in &file.shards {
        let table = shard.samples.checked_add(2).and_then(|n| n.checked_mul(4));
        if table.is_none_or(|t| t > shard.raw_data.bytes) {
            return Err(damaged(
                dataset,
                INDEX,
                None,
                format!(
                    "{} says {} samples in {} bytes, more than its offset table could list",
                    shard.raw_data.basename, shard.samples, shard.raw_data.bytes
                ),
            ));
        }
    }
    if files.len() != file.shards.len() {
        return Err(damaged(dataset, INDEX, None, "a compressed shard without its zip_data"));
    }
    Ok(SampleIndex {
        dataset: dataset.to_owned(),
        shards: files.iter().map(|f| f.shard.clone()).collect(),
        versions: files.iter().map(|f| f.version.clone()).collect(),
        layout: Layout::Packed {
            counts: file.shards.iter().map(|s| s.samples).collect(),
            sizes: files.iter().map(|f| f.size).collect(),
            raw: file
                .shards
                .iter()
                .map(|s| Raw {
                    name: s.raw_data.basename.clone(),
                    bytes: s.raw_data.bytes,
                    samples: s.samples,
                    codec: s.compression.as_deref().and_then(Codec::of).unwrap_or(Codec::Zstd),
                })
                .collect(),
            unpacked: super::Recent::new(UNPACKED_SHARDS),
        },
        dtype: None,
        columns: Some(columns),
        budget: Budget::default(),
    })
}

/// A compressed shard's bytes, decompressed, and its samples' bounds.
#[derive(Debug)]
pub struct Unpacked {
    pub bounds: Vec<u64>,
    pub data: Bytes,
    /// The budget's bytes for `data`, given back when the last handle is dropped.
    _held: Held,
}

/// How a shard was compressed whole: MosaicML's `compression` (`zstd:7`, `gz`...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// One zstd frame (`zstd.compress`).
    Zstd,
    /// A gzip member (`gzip.compress`).
    Gzip,
    /// Raw snappy, not framed (python-snappy's `snappy.compress`).
    Snappy,
}

impl Codec {
    /// The codec of MosaicML's compression name, its level (`:N`) aside.
    pub fn of(compression: &str) -> Option<Self> {
        match compression.split(':').next() {
            Some("zstd") => Some(Self::Zstd),
            Some("gz") => Some(Self::Gzip),
            Some("snappy") => Some(Self::Snappy),
            _ => None,
        }
    }
}

/// What a compressed shard holds: its uncompressed file's name, size and samples, and
/// how it was compressed.
#[derive(Debug, Clone)]
pub struct Raw {
    pub name: String,
    pub bytes: u64,
    pub samples: u64,
    pub codec: Codec,
}

/// Decompresses `zipped` into the shard `raw` names, checking its size and offset table;
/// `held`: the budget's bytes for what it decompresses to (`raw.bytes`).
pub fn unpack(dataset: &str, raw: &Raw, zipped: &[u8], held: Held) -> Result<Unpacked> {
    use std::io::Read;
    let Raw { name, bytes, samples, codec } = raw;
    let bad = |why: String| damaged(dataset, name, None, why);
    // Never more than index.json says, which the budget had room for (held): a hostile
    // file cannot make it allocate more.
    let mut data = Vec::with_capacity(usize::try_from(*bytes).map_err(|_| bad(format!("{bytes} bytes")))?);
    let mut limited = |reader: &mut dyn Read| reader.take(*bytes + 1).read_to_end(&mut data).map(|_| ());
    // What follows the compressed stream: nothing (zeros after a gzip member, as
    // Python's gzip.decompress allows), else the file is damaged (zstd.decompress and
    // gzip.decompress refuse it; decoding only the first stream would hide the damage).
    let mut rest: &[u8] = zipped;
    match codec {
        Codec::Zstd => limited(
            &mut ruzstd::decoding::StreamingDecoder::new(&mut rest)
                .map_err(|e| bad(format!("not a zstd frame: {e}")))?,
        ),
        Codec::Gzip => {
            let mut member = flate2::bufread::GzDecoder::new(rest);
            let read = limited(&mut member);
            rest = member.into_inner();
            rest = &rest[rest.iter().position(|&b| b != 0).unwrap_or(rest.len())..];
            read
        }
        Codec::Snappy => match snap::raw::decompress_len(zipped) {
            Ok(length) if length as u64 == *bytes => snap::raw::Decoder::new()
                .decompress_vec(zipped)
                .map(|d| data = d)
                .map_err(std::io::Error::other),
            Ok(length) => Err(std::io::Error::other(format!("a snappy block of {length} bytes"))),
            Err(e) => Err(std::io::Error::other(e)),
        },
    }
    .map_err(|e| bad(format!("cannot be decompressed ({codec:?}): {e}")))?;
    if data.len() as u64 != *bytes {
        return Err(bad(format!("decompresses to {} bytes where {INDEX} says {bytes}", data.len())));
    }
    if matches!(codec, Codec::Zstd | Codec::Gzip) && !rest.is_empty() {
        let at = zipped.len() - rest.len();
        let what =
            format!("{} bytes after the compressed stream (at byte {at} of its compressed file)", rest.len());
        return Err(bad(what));
    }
    let bounds = offsets(dataset, name, *samples, *bytes, &data)?;
    Ok(Unpacked { bounds, data: Bytes::from(data), _held: held })
}

/// Sample bounds from the start of the shard file `name` (`head`), which `index.json`
/// says holds `samples` samples in `bytes` bytes: its count, then an offset table whose
/// offsets are sorted, start past the table itself and end at the file's end.
fn offsets(dataset: &str, name: &str, samples: u64, bytes: u64, head: &[u8]) -> Result<Vec<u64>> {
    let u32_at = |i: u64| {
        let at = usize::try_from(i.checked_mul(4)?).ok()?;
        head.get(at..at.checked_add(4)?).map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
    };
    if u32_at(0) != Some(samples) {
        return Err(damaged(
            dataset,
            name,
            0,
            format!(
                "{} samples where {INDEX} says {samples}",
                u32_at(0).map_or("no count of".into(), |n| n.to_string())
            ),
        ));
    }
    // Checked by the caller against the file's size: the table fits.
    let table_end = samples.checked_add(2).and_then(|n| n.checked_mul(4)).unwrap_or(u64::MAX);
    let bounds: Option<Vec<u64>> = (1..=samples.saturating_add(1)).map(u32_at).collect();
    let bounds =
        bounds.ok_or_else(|| damaged(dataset, name, head.len() as u64, "its offset table is cut short"))?;
    if let Some(i) = bounds.windows(2).position(|w| w[0] > w[1]) {
        let what =
            format!("offset {} of sample {} comes before sample {i}'s ({})", bounds[i + 1], i + 1, bounds[i]);
        return Err(damaged(dataset, name, 4 * (i as u64 + 2), what));
    }
    if bounds.first().is_some_and(|&first| first < table_end) {
        let what = format!(
            "the first sample starts at byte {}, inside its offset table (ends at {table_end})",
            bounds[0]
        );
        return Err(damaged(dataset, name, 4, what));
    }
    if bounds.last() != Some(&bytes) {
        return Err(damaged(
            dataset,
            name,
            4 * (samples + 1),
            format!("its offsets do not end at its {bytes} bytes"),
        ));
    }
    Ok(bounds)
}

/// Decodes one sample's bytes into its columns' values, in column order.
pub fn decode(columns: &[Column], sample: &Bytes) -> Result<Vec<(String, Value)>> {
    let bad = |why: String| Error::Damaged { file: "an MDS sample".into(), offset: None, what: why };
    let variable = columns.iter().filter(|c| c.size.is_none()).count();
    let mut at = 4 * variable;
    if sample.len() < at {
        return Err(bad(format!("{} bytes, shorter than its {variable} sizes", sample.len())));
    }
    let mut sizes = (0..variable)
        .map(|i| u64::from(u32::from_le_bytes(sample[i * 4..i * 4 + 4].try_into().unwrap_or_default())));
    let mut out = Vec::with_capacity(columns.len());
    for column in columns {
        let size = column.size.or_else(|| sizes.next()).unwrap_or_default();
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let data = at
            .checked_add(size)
            .and_then(|end| sample.get(at..end))
            .ok_or_else(|| bad(format!("column {} runs past the sample", column.name)))?;
        let value = value(&column.encoding, sample.slice(at..at + data.len()))
            .map_err(|why| bad(format!("column {} ({}): {why}", column.name, column.encoding)))?;
        out.push((column.name.clone(), value));
        at += size;
    }
    if at != sample.len() {
        return Err(bad(format!("{} bytes where its columns take {at}", sample.len())));
    }
    Ok(out)
}

/// A column's bytes as its encoding says.
fn value(encoding: &str, data: Bytes) -> std::result::Result<Value, String> {
    let fixed = |n: usize| -> std::result::Result<[u8; 8], String> {
        let mut out = [0u8; 8];
        if data.len() != n {
            return Err(format!("{} bytes where {n} are expected", data.len()));
        }
        out[..n].copy_from_slice(&data);
        Ok(out)
    };
    let text = || String::from_utf8(data.to_vec()).map_err(|_| "not UTF-8".to_owned());
    let word = |n: usize| fixed(n).map(u64::from_le_bytes);
    Ok(match encoding {
        "int8" => Value::Int(i64::from(word(1)? as u8 as i8)),
        "int16" => Value::Int(i64::from(word(2)? as u16 as i16)),
        "int32" => Value::Int(i64::from(word(4)? as u32 as i32)),
        "int64" | "int" => Value::Int(word(8)? as i64),
        "uint8" => Value::UInt(word(1)?),
        "uint16" => Value::UInt(word(2)?),
        "uint32" => Value::UInt(word(4)?),
        "uint64" => Value::UInt(word(8)?),
        "float16" => Value::Float(f64::from(half_to_f32(word(2)? as u16))),
        "float32" => Value::Float(f64::from(f32::from_bits(word(4)? as u32))),
        "float64" => Value::Float(f64::from_bits(word(8)?)),
        "str" | "str_decimal" => Value::Str(text()?),
        "str_int" => Value::Int(text()?.trim().parse().map_err(|_| "not an integer".to_owned())?),
        "str_float" => Value::Float(text()?.trim().parse().map_err(|_| "not a number".to_owned())?),
        "bytes" | "jpeg" | "png" => Value::Bytes(data),
        "json" => Value::Json(text()?),
        "pkl" => Value::Pickle(data),
        nd if nd == "ndarray" || nd.starts_with("ndarray:") => ndarray(nd, data)?,
        other => return Err(format!("the encoding {other:?} is not read here")),
    })
}

/// An `ndarray[:DTYPE[:D0,D1,...]]` column: a dtype code byte unless the encoding names
/// the dtype, a shape (`ndim << 2 | width` then dims of 1, 2, 4 or 8 bytes) unless it
/// names the shape, then the values.
fn ndarray(encoding: &str, data: Bytes) -> std::result::Result<Value, String> {
    let mut parts = encoding.split(':').skip(1);
    let (named_dtype, named_shape) = (parts.next(), parts.next());
    let mut at = 0usize;
    let dtype = match named_dtype {
        Some(dtype) => dtype.to_owned(),
        None => {
            let code = *data.first().ok_or("empty")?;
            at = 1;
            let name = match code {
                8 => "uint8",
                9 => "int8",
                16 => "uint16",
                17 => "int16",
                18 => "float16",
                32 => "uint32",
                33 => "int32",
                34 => "float32",
                64 => "uint64",
                65 => "int64",
                66 => "float64",
                other => return Err(format!("dtype code {other}")),
            };
            name.to_owned()
        }
    };
    let shape: Vec<u64> = match named_shape {
        Some(dims) => dims
            .split(',')
            .map(|d| d.trim().parse().map_err(|_| format!("shape {dims}")))
            .collect::<std::result::Result<_, _>>()?,
        None => {
            let head = *data.get(at).ok_or("no shape")?;
            at += 1;
            let (ndim, width) = (usize::from(head >> 2), 1usize << (head & 3));
            let mut dims = Vec::with_capacity(ndim);
            for _ in 0..ndim {
                let bytes = data.get(at..at + width).ok_or("shape cut short")?;
                // (at most 63 dims of 8 bytes: no overflow)
                let mut word = [0u8; 8];
                word[..width].copy_from_slice(bytes);
                dims.push(u64::from_le_bytes(word));
                at += width;
            }
            dims
        }
    };
    let item = super::tokens::item_size(&dtype).ok_or_else(|| format!("dtype {dtype}"))?;
    let expected = shape.iter().try_fold(item, |n, &d| n.checked_mul(d));
    let values = data.len().checked_sub(at).ok_or("shape cut short")? as u64;
    if expected != Some(values) {
        let needs = expected.map_or_else(|| "more than 2^64".to_owned(), |e| e.to_string());
        return Err(format!("{values} bytes of values where the shape {shape:?} needs {needs}"));
    }
    Ok(Value::NdArray { dtype, shape, data: data.slice(at..) })
}

/// An IEEE half-precision value as f32.
fn half_to_f32(h: u16) -> f32 {
    let (sign, exp, frac) = (u32::from(h >> 15), u32::from((h >> 10) & 0x1f), u32::from(h & 0x3ff));
    let bits = match (exp, frac) {
        (0, 0) => sign << 31,
        (0, _) => {
            // Subnormal: normalise.
            let shift = frac.leading_zeros() - 21;
            ((sign << 31) | ((127 - 15 + 1 - shift) << 23)) | ((frac << shift) & 0x3ff) << 13
        }
        (0x1f, _) => (sign << 31) | (0xff << 23) | (frac << 13),
        _ => (sign << 31) | ((exp + 127 - 15) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_decodes_column_by_column() {
        // {"blob": bytes, "id": int, "text": str, "tokens": ndarray:int32} as MDSWriter
        // writes {blob: b"\x00\x01", id: 0, text: "hello", tokens: [1, 2, 3]}.
        let columns = [
            ("blob", "bytes", None),
            ("id", "int", Some(8)),
            ("text", "str", None),
            ("tokens", "ndarray:int32", None),
        ]
        .map(|(n, e, s)| Column { name: n.into(), encoding: e.into(), size: s });
        let mut sample = Vec::new();
        for size in [2u32, 5, 14] {
            sample.extend_from_slice(&size.to_le_bytes());
        }
        sample.extend_from_slice(&[0, 1]);
        sample.extend_from_slice(&0i64.to_le_bytes());
        sample.extend_from_slice(b"hello");
        sample.extend_from_slice(&[4, 3]);
        for v in [1i32, 2, 3] {
            sample.extend_from_slice(&v.to_le_bytes());
        }
        let values = decode(&columns, &Bytes::from(sample)).unwrap();
        assert_eq!(values[0].1, Value::Bytes(Bytes::from_static(&[0, 1])));
        assert_eq!(values[1].1, Value::Int(0));
        assert_eq!(values[2].1, Value::Str("hello".into()));
        let Value::NdArray { dtype, shape, data } = &values[3].1 else { panic!("{values:?}") };
        assert_eq!((dtype.as_str(), shape.as_slice(), data.len()), ("int32", &[3u64][..], 12));
        assert!(decode(&columns, &Bytes::from_static(&[9, 0, 0, 0])).is_err(), "cut short");
    }

    #[test]
    fn offsets_must_be_sorted_start_past_their_table_and_end_at_the_file() {
        let table = |offsets: &[u32]| -> Vec<u8> {
            let mut head = ((offsets.len() - 1) as u32).to_le_bytes().to_vec();
            offsets.iter().for_each(|o| head.extend_from_slice(&o.to_le_bytes()));
            head
        };
        // Two samples: the table is 16 bytes, the file 30.
        assert_eq!(offsets("d", "s", 2, 30, &table(&[16, 20, 30])).unwrap(), [16, 20, 30]);
        let inside = offsets("d", "s", 2, 30, &table(&[4, 20, 30])).unwrap_err();
        assert!(inside.to_string().contains("inside its offset table"), "{inside}");
        assert!(offsets("d", "s", 2, 30, &table(&[16, 25, 20])).is_err(), "unsorted");
        assert!(offsets("d", "s", 2, 31, &table(&[16, 20, 30])).is_err(), "short of the file's end");
        assert!(offsets("d", "s", 3, 30, &table(&[16, 20, 30])).is_err(), "count unlike index.json's");
        let huge = offsets("d", "s", u64::MAX, 30, &table(&[16, 20, 30])).unwrap_err();
        assert!(matches!(huge, Error::Damaged { .. }), "{huge}");
    }

    #[test]
    fn fixed_columns_that_do_not_fill_the_sample_are_refused() {
        let columns = [Column { name: "id".into(), encoding: "int".into(), size: Some(8) }];
        assert!(decode(&columns, &Bytes::from(vec![0u8; 8])).is_ok());
        let err = decode(&columns, &Bytes::from(vec![0u8; 12])).unwrap_err();
        assert!(err.to_string().contains("12 bytes where its columns take 8"), "{err}");
        // An ndarray whose shape's product wraps past 2^64.
        let columns =
            [Column { name: "a".into(), encoding: "ndarray:uint8:4294967296,4294967296".into(), size: None }];
        let mut sample = 0u32.to_le_bytes().to_vec();
        sample[0] = 0;
        assert!(decode(&columns, &Bytes::from(sample)).is_err());
    }

    #[test]
    fn half_precision_values() {
        assert_eq!(half_to_f32(0x3c00), 1.0);
        assert_eq!(half_to_f32(0xc000), -2.0);
        assert_eq!(half_to_f32(0x0001), 2f32.powi(-24));
        assert!(half_to_f32(0x7e00).is_nan());
    }
}
