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

use super::{Budget, Fetch, Layout, SampleIndex, budget::Held, damaged, listed_range};
use shardcache_client::{Error, Result};

mod values;
pub use values::decode;

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
        if table_bytes(shard.samples).is_none_or(|t| t > listed.size) || shard.raw_data.bytes != listed.size {
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
    let table = |s: &ShardEntry| table_bytes(s.samples).unwrap_or(u64::MAX); // checked just above
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
        if table_bytes(shard.samples).is_none_or(|t| t > shard.raw_data.bytes) {
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
    for (shard, zipped) in file.shards.iter().zip(files) {
        let codec = shard.compression.as_deref().and_then(Codec::of).unwrap_or(Codec::Zstd);
        if let Err(why) = within_expansion(codec, zipped.size, shard.raw_data.bytes) {
            return Err(damaged(dataset, INDEX, None, format!("{}: {why}", zipped.shard)));
        }
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

    /// The most one compressed byte can decompress to, by the format: zstd's RLE block (a
    /// 3-byte header and one byte) is a block of 128 KiB; deflate's longest match (258
    /// bytes) costs at least 2 bits (1032:1, zlib's own bound); snappy's longest copy (64
    /// bytes) is 3 bytes. A size claimed past `compressed x` this is a lie, refused before
    /// anything is allocated for it.
    pub fn max_expansion(self) -> u64 {
        match self {
            Self::Zstd => 32 << 10,
            Self::Gzip => 1032,
            Self::Snappy => 22,
        }
    }
}

/// What a compressed shard holds: its uncompressed size and samples, and how it was
/// compressed.
#[derive(Debug, Clone)]
pub struct Raw {
    pub bytes: u64,
    pub samples: u64,
    pub codec: Codec,
}

/// Decompresses `zipped` (the file `file` of the dataset) into the shard `raw` names,
/// checking its size and offset table; `held`: the budget's bytes for what it
/// decompresses to (`raw.bytes`). Errors name `file`, the one the dataset has (MosaicML
/// deletes the uncompressed one), with offsets in the decompressed bytes said so.
pub fn unpack(dataset: &str, file: &str, raw: &Raw, zipped: &[u8], held: Held) -> Result<Unpacked> {
    use std::io::Read;
    let Raw { bytes, samples, codec } = raw;
    let bad = |why: String| damaged(dataset, file, None, why);
    // A size no stream of these bytes can decompress to: a damaged index.json, refused
    // before anything is allocated (checked at open against the listed size too).
    within_expansion(*codec, zipped.len() as u64, *bytes).map_err(bad)?;
    usize::try_from(*bytes).map_err(|_| bad(format!("{bytes} bytes")))?;
    // Never more than index.json says, which the budget had room for (held), and grown
    // as the stream produces it: a claim larger than the stream allocates what the
    // stream gives, not what it claims.
    let mut data = Vec::new();
    let mut limited = |reader: &mut dyn Read| read_growing(reader, *bytes + 1, &mut data);
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
            // Into the buffer held for it: decompress_vec would allocate a second one.
            Ok(length) if length as u64 == *bytes => {
                data.resize(length, 0);
                snap::raw::Decoder::new()
                    .decompress(zipped, &mut data)
                    .map(|_| ())
                    .map_err(std::io::Error::other)
            }
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
    let bounds = offsets(dataset, &format!("{file} (decompressed)"), *samples, *bytes, &data)?;
    Ok(Unpacked { bounds, data: Bytes::from(data), _held: held })
}

/// Whether `compressed` bytes of `codec` can decompress to the `claimed` bytes; why not.
fn within_expansion(codec: Codec, compressed: u64, claimed: u64) -> std::result::Result<(), String> {
    let most = compressed.saturating_mul(codec.max_expansion());
    match claimed <= most {
        true => Ok(()),
        false => Err(format!(
            "{INDEX} says it decompresses to {claimed} bytes, but {compressed} bytes of {codec:?} decompress to \
             {most} at most ({}x)",
            codec.max_expansion()
        )),
    }
}

/// Decompressed bytes appended to `data` as `reader` produces them, `limit` at most:
/// capacity doubled as it fills (at least [`UNPACK_STEP`], never past `limit`), so what
/// is allocated is at most twice what the stream gave, never what a file claims.
fn read_growing(reader: &mut dyn std::io::Read, limit: u64, data: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::Read;
    loop {
        let room = limit - data.len() as u64;
        if room == 0 {
            return Ok(());
        }
        if data.len() == data.capacity() {
            let more = (data.capacity() as u64).max(UNPACK_STEP).min(room);
            data.reserve_exact(more as usize); // within `limit`: held by the budget
        }
        let spare = (data.capacity() - data.len()) as u64;
        if (&mut *reader).take(spare.min(room)).read_to_end(data)? == 0 {
            return Ok(());
        }
    }
}

/// The first step of a decompressed shard's buffer.
const UNPACK_STEP: u64 = 4 << 20;

/// The bytes of a shard's count and offset table: `u32 N`, `u32 offsets[N + 1]`; `None`
/// past 2^64 (a count no file holds).
fn table_bytes(samples: u64) -> Option<u64> {
    samples.checked_add(2)?.checked_mul(4)
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
    let table_end = table_bytes(samples).unwrap_or(u64::MAX);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_past_what_the_codec_can_expand_to_is_refused_before_allocating() {
        let raw = |bytes, codec| Raw { bytes, samples: 1, codec };
        let held = || Budget::new(u64::MAX).take(0, String::new).unwrap();
        // 100 bytes of snappy claimed to be 4 GiB: damaged, named, nothing allocated.
        let err =
            unpack("d", "s.mds.snappy", &raw(u32::MAX as u64, Codec::Snappy), &[0; 100], held()).unwrap_err();
        assert!(matches!(err, Error::Damaged { .. }), "{err}");
        assert!(err.to_string().contains("100 bytes of Snappy decompress to 2200 at most"), "{err}");
        assert!(within_expansion(Codec::Zstd, 32 << 10, 1 << 30).is_ok(), "zstd's RLE blocks: 32768x");
        assert!(within_expansion(Codec::Zstd, 32 << 10, (1 << 30) + 1).is_err());
        assert!(within_expansion(Codec::Gzip, 1000, 1_032_001).is_err());
    }

    #[test]
    fn a_buffer_grows_with_what_the_stream_gives_not_with_the_claim() {
        // A claim of 1 GiB, a stream of 10 bytes: a step allocated, not the claim.
        let mut data = Vec::new();
        read_growing(&mut &[7u8; 10][..], (1 << 30) + 1, &mut data).unwrap();
        assert_eq!(data, [7; 10]);
        assert!(data.capacity() as u64 <= UNPACK_STEP, "{}", data.capacity());
        // A long stream: at most twice what it gave, and never past the limit.
        let long = vec![1u8; (9 << 20) + 3];
        let mut data = Vec::new();
        read_growing(&mut &long[..], 1 << 30, &mut data).unwrap();
        assert_eq!(data.len(), long.len());
        assert!(data.capacity() <= 2 * long.len(), "{}", data.capacity());
        let mut data = Vec::new();
        read_growing(&mut &long[..], 5 << 20, &mut data).unwrap();
        assert_eq!((data.len(), data.capacity()), (5 << 20, 5 << 20), "stops at the limit");
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
}
