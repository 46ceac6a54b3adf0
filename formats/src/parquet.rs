//! Parquet files (what Hugging Face datasets publish), read as they are: a sample per
//! row, its columns decoded to values ([`Value`]).
//!
//! - the index: every `.parquet` file's footer (`... FileMetaData, u32 length, "PAR1"`),
//!   read with one batch of ranged reads of each file's last [`TAIL_GUESS`] bytes (a
//!   longer footer costs a second batch); the footer gives each row group's rows and the
//!   byte ranges of its column chunks;
//! - a row's bytes are not a range of their own: a row group's column chunks are read
//!   whole (one range, in the batch with the others asked for) and decoded by the
//!   `parquet` crate's record reader, off the runtime's threads. The last
//!   [`DECODED_GROUPS`] row groups are kept decoded, as a block shuffle reads the rows of
//!   a row group over several batches.
//!
//! Values are what `pyarrow`'s `to_pylist` gives: numbers, str, bytes, None, lists,
//! structs as dicts, maps as lists of pairs, dates, times, timestamps (naive, or UTC
//! where the column says so), decimals. Columns the record reader would turn into other
//! values (nanosecond times and timestamps, INT96) are refused when the index is read,
//! with the fix, never decoded wrongly.

use std::sync::Arc;

use bytes::Bytes;
use parquet::{
    basic::{ConvertedType, LogicalType, Repetition, TimeUnit, Type as Physical},
    file::{
        metadata::{ParquetMetaData, ParquetMetaDataReader, RowGroupMetaData, page_index::RowGroupPageIndex},
        properties::ReaderProperties,
        reader::{ChunkReader, Length, RowGroupReader},
        serialized_reader::SerializedRowGroupReader,
    },
    schema::types::Type as Schema,
};
use shardcache_proto::v1::ShardInfo;

use super::{Budget, Fetch, Fields, Layout, Recent, SampleIndex, budget::Held, damaged, listed_range, pages};
use shardcache_client::{Error, Result};

mod fields;

use fields::fields;

/// Bytes read from the end of every `.parquet` file to find its footer: footers of files
/// with a few hundred row groups fit, so a cold open costs one round of reads.
pub const TAIL_GUESS: u64 = 64 << 10;

/// Row groups a [`SampleIndex`] keeps decoded: the datasets' block shuffle mixes
/// `shard_block` (4 by default) row groups of Parquet files at a time (`SampleIndex::units`).
pub const DECODED_GROUPS: usize = 4;

/// Decoded row groups by (file, row group).
pub(super) type Decoded = Recent<(usize, usize), Rows>;

/// The rows of a decoded row group, and the budget's bytes for them.
#[derive(Debug)]
pub struct Rows {
    pub rows: Vec<Arc<Fields>>,
    _held: Held,
}

/// Bytes of memory a decoded value is counted as beside its data: the value, its
/// column's name, the row's vector.
const VALUE_BYTES: u64 = 64;

/// One Parquet file of a dataset: its footer, and where each row group is.
#[derive(Debug)]
pub struct File {
    meta: Arc<ParquetMetaData>,
    /// Row `r` of the file is in the row group whose `first` is the last one <= r.
    groups: Vec<Group>,
    /// Top-level columns of timestamps adjusted to UTC.
    utc: Vec<String>,
}

#[derive(Debug, Clone, Copy)]
struct Group {
    first: u64,
    rows: u64,
    offset: u64,
    length: u64,
}

impl File {
    pub fn rows(&self) -> u64 {
        self.groups.last().map_or(0, |g| g.first + g.rows)
    }

    /// The row group of row `k`, and the row's place in it.
    fn locate(&self, k: u64) -> Option<(usize, u64)> {
        if k >= self.rows() {
            return None;
        }
        let g = self.groups.partition_point(|g| g.first <= k) - 1;
        Some((g, k - self.groups[g].first))
    }

    /// `(first row, rows)` of each row group.
    pub fn row_groups(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.groups.iter().map(|g| (g.first, g.rows))
    }

    /// `(offset, length)` of the row group of row `k`.
    pub fn group_range(&self, k: u64) -> Option<(u64, u64)> {
        self.locate(k).map(|(g, _)| (self.groups[g].offset, self.groups[g].length))
    }
}

/// The rows of every `.parquet` file listed, a shard each.
pub async fn open<F: Fetch>(
    client: &F,
    dataset: &str,
    listed: &[ShardInfo],
    budget: &Budget,
) -> Result<SampleIndex> {
    let files: Vec<&ShardInfo> = listed.iter().filter(|s| s.shard.ends_with(".parquet")).collect();
    if files.is_empty() {
        return Err(Error::Config(format!("dataset {dataset:?} has no .parquet files")));
    }
    let tails = files.iter().map(|s| {
        let length = s.size.min(TAIL_GUESS);
        listed_range(dataset, s, s.size - length, length)
    });
    let mut tails = client.fetch(tails.collect()).await?;
    // Footers longer than the tail read: the rest of each, in a second batch.
    let lengths: Vec<u64> =
        files.iter().zip(&tails).map(|(s, tail)| footer_length(dataset, s, tail)).collect::<Result<_>>()?;
    let mut more = Vec::new();
    for ((s, tail), &length) in files.iter().zip(&tails).zip(&lengths) {
        if length > tail.len() as u64 {
            more.push(listed_range(dataset, s, s.size - length, length - tail.len() as u64));
        }
    }
    let mut more = client.fetch(more).await?.into_iter();
    let mut parsed = Vec::with_capacity(files.len());
    for ((s, tail), &length) in files.iter().zip(tails.iter_mut()).zip(&lengths) {
        if length > tail.len() as u64 {
            let head = more.next().unwrap_or_default();
            *tail = [head, tail.clone()].concat().into();
        }
        let footer = tail.len().checked_sub(length as usize).map(|from| &tail[from..tail.len() - 8]);
        let footer =
            footer.ok_or_else(|| damaged(dataset, &s.shard, None, "its footer was not read whole"))?;
        parsed.push(Arc::new(file(dataset, s, footer, budget)?));
    }
    same_columns(dataset, &files, &parsed)?;
    let columns = parsed[0].meta.file_metadata().schema_descr().root_schema().get_fields();
    let columns: Vec<_> = columns
        .iter()
        .map(|c| super::mds::Column { name: c.name().to_owned(), encoding: describe(c), size: None })
        .collect();
    Ok(SampleIndex {
        dataset: dataset.to_owned(),
        shards: files.iter().map(|s| s.shard.clone()).collect(),
        versions: files.iter().map(|s| s.version.clone()).collect(),
        layout: Layout::Rows { files: parsed, decoded: Decoded::new(DECODED_GROUPS) },
        dtype: None,
        columns: Some(columns),
        budget: budget.clone(),
    })
}

/// The length of `shard`'s footer with its last 8 bytes, from the tail read of it.
fn footer_length(dataset: &str, shard: &ShardInfo, tail: &[u8]) -> Result<u64> {
    let not = |why: &str| {
        damaged(dataset, &shard.shard, shard.size.saturating_sub(8), format!("not a Parquet file ({why})"))
    };
    if tail.len() < 12 || !tail.ends_with(b"PAR1") {
        return Err(not("no PAR1 at its end"));
    }
    let at = tail.len() - 8;
    let length = u64::from(u32::from_le_bytes(tail[at..at + 4].try_into().unwrap_or_default())) + 8;
    if length + 4 > shard.size {
        return Err(not("its footer is longer than the file"));
    }
    Ok(length)
}

/// A file's footer parsed, its row groups' ranges checked against its size, and its
/// columns checked for values the record reader would decode wrongly.
fn file(dataset: &str, shard: &ShardInfo, footer: &[u8], budget: &Budget) -> Result<File> {
    let name = format!("{dataset}/{}", shard.shard);
    let footer_at = shard.size.saturating_sub(footer.len() as u64 + 8);
    let bad = |what: String| damaged(dataset, &shard.shard, footer_at, what);
    let meta = ParquetMetaDataReader::decode_metadata(footer)
        .map_err(|e| bad(format!("its Parquet footer does not parse: {e}")))?;
    let mut groups = Vec::with_capacity(meta.num_row_groups());
    let mut first = 0u64;
    for (g, group) in meta.row_groups().iter().enumerate() {
        let (offset, length) = group_bytes(group)
            .filter(|&(offset, length)| offset.checked_add(length).is_some_and(|end| end <= shard.size))
            .ok_or_else(|| bad(format!("row group {g} lies outside the file")))?;
        let rows = u64::try_from(group.num_rows())
            .ok()
            .filter(|&rows| first.checked_add(rows).is_some())
            .ok_or_else(|| bad(format!("row group {g} says it has {} rows", group.num_rows())))?;
        let group = Group { first, rows, offset, length };
        // A row count or size a few bytes can claim: believed only as far as the budget
        // could hold the row group decoded.
        budget
            .admits(decoded(&meta, g, &group), || format!("decoding {name} row group {g} ({rows} rows)"))?;
        groups.push(group);
        first += rows;
    }
    let root = meta.file_metadata().schema_descr().root_schema();
    let mut utc = Vec::new();
    for column in root.get_fields() {
        check(&name, column, &[])?;
        if adjusted_to_utc(column) == Some(true) && column.is_primitive() {
            utc.push(column.name().to_owned());
        }
    }
    Ok(File { meta: Arc::new(meta), groups, utc })
}

/// What row group `g` takes decoded, as counted against the budget: its uncompressed
/// bytes and a value's overhead for each of its rows' leaf columns.
fn decoded(meta: &ParquetMetaData, g: usize, group: &Group) -> u64 {
    let columns = meta.row_group(g).num_columns() as u64;
    let bytes = u64::try_from(meta.row_group(g).total_byte_size()).unwrap_or(u64::MAX);
    group.rows.saturating_mul(columns.max(1)).saturating_mul(VALUE_BYTES).saturating_add(bytes)
}

/// What row group `g` of `file` is counted as decoded ([`decoded`]).
pub(super) fn decoded_bytes(file: &File, g: usize) -> u64 {
    decoded(&file.meta, g, &file.groups[g])
}

/// `(offset, length)` of all of a row group's column chunks (from the first page of
/// the first to the end of the last; in files as written they are contiguous).
fn group_bytes(group: &RowGroupMetaData) -> Option<(u64, u64)> {
    let (mut start, mut end) = (u64::MAX, 0u64);
    for column in group.columns() {
        let from = column.dictionary_page_offset().unwrap_or(column.data_page_offset());
        let from = u64::try_from(from).ok()?;
        let to = from.checked_add(u64::try_from(column.compressed_size()).ok()?)?;
        (start, end) = (start.min(from), end.max(to));
    }
    Some(if start == u64::MAX { (0, 0) } else { (start, end - start) })
}

/// `Some(utc)` for a timestamp column.
fn adjusted_to_utc(column: &Schema) -> Option<bool> {
    match column.get_basic_info().logical_type_ref() {
        Some(LogicalType::Timestamp(t)) => Some(t.is_adjusted_to_u_t_c),
        _ => None,
    }
}

/// Refuses columns whose values the record reader would hand out as something else.
fn check(file: &str, column: &Schema, path: &[&str]) -> Result<()> {
    let path = [path, &[column.name()]].concat();
    let refuse = |what: &str, fix: &str| {
        Err(Error::Config(format!(
            "{file}: column {} holds {what}, which this reader does not decode; {fix}",
            path.join(".")
        )))
    };
    if !column.is_primitive() {
        if let Some(why) = misshapen(column) {
            let what = format!("column {} is {why}", path.join("."));
            return Err(Error::Damaged { file: file.to_owned(), offset: None, what });
        }
        return column.get_fields().iter().try_for_each(|c| check(file, c, &path));
    }
    if column.get_basic_info().converted_type() == ConvertedType::INTERVAL {
        return refuse("INTERVAL values", "write them as three integer columns (months, days, milliseconds)");
    }
    if column.get_basic_info().converted_type() == ConvertedType::DECIMAL && column.get_precision() > 38 {
        return refuse("decimals of more than 38 digits", "write them as decimal128 or as strings");
    }
    match column.get_basic_info().logical_type_ref() {
        Some(LogicalType::Timestamp(t)) if matches!(t.unit, TimeUnit::NANOS) => {
            return refuse(
                "nanosecond timestamps",
                "write them as microseconds (pyarrow: coerce_timestamps=\"us\")",
            );
        }
        Some(LogicalType::Time(t)) if matches!(t.unit, TimeUnit::NANOS) => {
            return refuse("nanosecond times", "write them as microseconds");
        }
        Some(LogicalType::Timestamp(t)) if t.is_adjusted_to_u_t_c && path.len() > 1 => {
            return refuse("UTC timestamps inside a nested value", "make them a top-level column");
        }
        _ => {}
    }
    if column.get_physical_type() == Physical::INT96 {
        return refuse(
            "INT96 timestamps",
            "write them as INT64 microseconds (pyarrow: use_deprecated_int96_timestamps=False)",
        );
    }
    Ok(())
}

/// What is wrong with a group column's shape, where the Parquet spec (and the parquet
/// crate's record reader, which asserts it) says how a LIST or a MAP is nested: a LIST
/// holds one repeated field, a MAP one repeated group of a key and a value.
fn misshapen(group: &Schema) -> Option<&'static str> {
    let fields = group.get_fields();
    let repeated = |f: &Schema| {
        f.get_basic_info().has_repetition() && f.get_basic_info().repetition() == Repetition::REPEATED
    };
    if fields.is_empty() {
        return Some("a group of no fields");
    }
    if fields.iter().any(|f| !f.get_basic_info().has_repetition()) {
        return Some("a group with a field of no repetition");
    }
    match group.get_basic_info().converted_type() {
        ConvertedType::LIST if fields.len() != 1 || !repeated(&fields[0]) => {
            Some("a LIST not of one repeated field")
        }
        ConvertedType::LIST if !fields[0].is_primitive() && fields[0].get_fields().is_empty() => {
            Some("a LIST of an empty group")
        }
        ConvertedType::MAP | ConvertedType::MAP_KEY_VALUE
            if fields.len() != 1
                || fields[0].is_primitive()
                || !repeated(&fields[0])
                || !matches!(fields[0].get_fields().len(), 1 | 2) =>
        {
            Some("a MAP not of one repeated group of a key and a value")
        }
        _ => None,
    }
}

/// Every file must have the first one's columns: a sample's keys do not depend on the
/// file it came from.
fn same_columns(dataset: &str, files: &[&ShardInfo], parsed: &[Arc<File>]) -> Result<()> {
    let names = |f: &File| -> Vec<String> {
        let root = f.meta.file_metadata().schema_descr().root_schema();
        root.get_fields().iter().map(|c| c.name().to_owned()).collect()
    };
    let first = names(&parsed[0]);
    for (s, f) in files.iter().zip(parsed).skip(1) {
        if names(f) != first {
            return Err(Error::Config(format!(
                "{dataset}/{}: its columns {:?} differ from {}'s {first:?}; one dataset's files share their columns",
                s.shard,
                names(f),
                files[0].shard
            )));
        }
    }
    Ok(())
}

/// A column's type as a person reads it: `INT64`, `BYTE_ARRAY (String)`, `group (List)`.
fn describe(column: &Schema) -> String {
    let kind =
        if column.is_primitive() { format!("{}", column.get_physical_type()) } else { "group".to_owned() };
    match column.get_basic_info().logical_type_ref() {
        Some(logical) => format!("{kind} ({logical:?})"),
        None => kind,
    }
}

/// The rows of row group `g` of `file` (`name`), decoded from `data`: its bytes read
/// from `offset` (the row group's first byte). Its pages' headers are checked first
/// ([`pages`]); `held`: the budget's bytes for the row group decoded.
pub fn decode_group(name: &str, file: &File, g: usize, offset: u64, data: Bytes, held: Held) -> Result<Rows> {
    let group = file.meta.row_group(g);
    let bad = |at: Option<u64>, what: String| Error::Damaged {
        file: name.to_owned(),
        offset: at,
        what: format!("row group {g}: {what}"),
    };
    let mut unpacked = 0u64;
    for column in group.columns() {
        let start = column.dictionary_page_offset().unwrap_or(column.data_page_offset());
        let chunk = pages::Chunk {
            start: u64::try_from(start).unwrap_or(u64::MAX),
            length: u64::try_from(column.compressed_size()).unwrap_or(u64::MAX),
            codec: column.compression(),
            repeated: column.column_descr().max_rep_level() > 0,
        };
        let bytes = pages::check(&data, offset, &chunk, file.groups[g].rows)
            .map_err(|(at, why)| bad(Some(at), format!("column {}: {why}", column.column_path())))?;
        unpacked = unpacked.saturating_add(bytes);
    }
    let budget = decoded_bytes(file, g);
    if unpacked > budget {
        return Err(bad(
            None,
            format!("pages that decompress to {unpacked} bytes where its footer says {budget}"),
        ));
    }
    // The parquet crate's record reader panics on some damaged pages (60.1: an assertion
    // in bit_util's unpacking, "Cannot extract value" in record/triplet.rs, found by the
    // fuzz harness): each call into it is caught and the row group refused as damaged,
    // never a crash of the trainer. Only the crate's calls: a panic of ours is a bug.
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let caught = |panic: Box<dyn std::any::Any + Send>| {
        let why = shardcache_client::error::panic_message(panic.as_ref());
        bad(None, format!("the Parquet decoder failed on its pages ({why})"))
    };
    let crate_error = |e: parquet::errors::ParquetError| bad(None, e.to_string());
    let (part, properties) = (Arc::new(Part { offset, data }), Arc::new(ReaderProperties::builder().build()));
    let index = RowGroupPageIndex::new(g, None);
    let reader =
        catch_unwind(AssertUnwindSafe(|| SerializedRowGroupReader::new(part, group, index, properties)))
            .map_err(caught)?
            .map_err(crate_error)?;
    let mut rows =
        catch_unwind(AssertUnwindSafe(|| reader.get_row_iter(None))).map_err(caught)?.map_err(crate_error)?;
    // The footer's count, checked below: not trusted for an allocation.
    let mut out = Vec::with_capacity(file.groups[g].rows.min(1 << 16) as usize);
    while let Some(row) = catch_unwind(AssertUnwindSafe(|| rows.next())).map_err(caught)? {
        out.push(Arc::new(fields(row.map_err(crate_error)?, &file.utc)));
        if out.len() as u64 > file.groups[g].rows {
            break; // more rows than the footer says: refused below, not all decoded
        }
    }
    if out.len() as u64 != file.groups[g].rows {
        let what = format!("decoded to {} rows where its footer says {}", out.len(), file.groups[g].rows);
        return Err(bad(None, what));
    }
    Ok(Rows { rows: out, _held: held })
}

/// The bytes of one row group, answering reads at the file's offsets.
struct Part {
    offset: u64,
    data: Bytes,
}

impl Part {
    fn slice(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let from = start.checked_sub(self.offset).map(|f| f as usize);
        match from.filter(|&f| f.checked_add(length).is_some_and(|end| end <= self.data.len())) {
            Some(f) => Ok(self.data.slice(f..f + length)),
            None => Err(parquet::errors::ParquetError::General(format!(
                "a read of {length} bytes at {start} outside the row group's bytes ({} at {})",
                self.data.len(),
                self.offset
            ))),
        }
    }
}

impl Length for Part {
    fn len(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

impl ChunkReader for Part {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let rest = (self.len()).saturating_sub(start) as usize;
        Ok(bytes::Buf::reader(self.slice(start, rest)?))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, length)
    }
}

/// Which row groups `samples` need: `(file, group)` each once, in order of first need.
pub(super) fn groups_of(
    files: &[Arc<File>],
    dataset: &str,
    samples: &[(usize, u64)],
) -> Result<Vec<(usize, usize)>> {
    let mut needed: Vec<(usize, usize)> = Vec::new();
    for &(shard, k) in samples {
        let (g, _) = locate(files, shard, k)
            .ok_or_else(|| Error::Config(format!("no sample {k} in shard {shard} of {dataset:?}")))?;
        if !needed.contains(&(shard, g)) {
            needed.push((shard, g));
        }
    }
    Ok(needed)
}

/// The place of row `k` of file `shard`: (row group, row in it).
pub(super) fn locate(files: &[Arc<File>], shard: usize, k: u64) -> Option<(usize, u64)> {
    files.get(shard)?.locate(k)
}

/// `(offset, length)` of row group `g` of `file`.
pub(super) fn group_at(file: &File, g: usize) -> (u64, u64) {
    (file.groups[g].offset, file.groups[g].length)
}
