//! Datasets as samples of any size: [`SampleIndex`] says where each sample's bytes are,
//! and reads batches of samples with [`Client::read_ranges`] (a sample never costs a
//! round trip of its own when it shares a batch).
//!
//! The index comes from the dataset's own format, read through the same server with
//! ranged reads (a spoke caches those bytes like any others); nothing is converted:
//!
//! - [`Format::Records`]: fixed-size records in flat files (the seed's token windows);
//! - [`Format::Megatron`]: Megatron-LM indexed datasets (`PREFIX.bin` + `PREFIX.idx`),
//!   one sample per sequence (a document of any length) ([`megatron`]);
//! - [`Format::Mds`]: MosaicML Streaming's MDS datasets (`index.json` + shards), one
//!   sample per MDS sample, decoded by column with [`SampleIndex::decode`] ([`mds`]);
//! - [`Format::WebDataset`]: WebDataset tar shards, a sample per run of files with one
//!   key, its fields by extension ([`webdataset`]);
//! - [`Format::Parquet`]: Parquet files, a sample per row, decoded by column with
//!   [`SampleIndex::read_decoded`] ([`parquet`]);
//! - [`Format::Tokens`]: token arrays (`.npy`, or raw files of a given dtype) read as
//!   windows of `seq_len + 1` tokens every `seq_len`, over the shards joined end to end
//!   (a window may cross from one shard into the next, as nanoGPT's loader reads one
//!   long array) ([`tokens`]).
//!
//! Samples are numbered per shard: a sample belongs to the shard its first byte is in,
//! so a block shuffle over shards (the Python datasets') works for every format.

mod batch;
pub mod budget;
mod decoded;
mod fetch;
mod format;
pub mod gpt;
pub mod mds;
pub mod megatron;
mod pages;
pub mod parquet;
mod recent;
pub mod tokens;
mod values;
pub mod webdataset;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use shardcache_proto::v1::ShardInfo;

use shardcache_client::{Client, Error, Range, Result};

pub(crate) use self::batch::{listed_range, pinned};
pub use self::{
    batch::{BATCH_BYTES, read_batched},
    budget::Budget,
    fetch::{Fetch, Files},
    format::Format,
    recent::Recent,
    tokens::NpyHeader,
    values::{Fields, Value},
};

/// Where the bytes of one sample are: a range of one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub shard: usize,
    pub offset: u64,
    pub length: u64,
}

/// How the samples of the shards are laid out.
#[derive(Debug, Clone)]
enum Layout {
    /// Sample `k` of shard `s` is `[bounds[s][k], bounds[s][k + 1])`.
    Bounds(Vec<Vec<u64>>),
    /// GPT samples of one Megatron shard: `bounds[s]` where sequence `s` starts in the
    /// `.bin`, values of `item` bytes.
    Gpt { index: Arc<gpt::GptIndex>, bounds: Vec<u64>, item: u64 },
    /// WebDataset: the samples of each shard, their fields' bytes each a piece.
    Groups(Vec<Vec<webdataset::Group>>),
    /// Shards compressed whole (MDS with zstd): `counts[s]` samples, the file of
    /// `sizes[s]` bytes, what it decompresses to (`raw[s]`: name, bytes, samples, codec); the
    /// last shards decompressed, most recent last.
    Packed { counts: Vec<u64>, sizes: Vec<u64>, raw: Vec<mds::Raw>, unpacked: Recent<usize, mds::Unpacked> },
    /// Parquet: a sample per row; a row group is read whole and kept decoded.
    Rows { files: Vec<Arc<parquet::File>>, decoded: parquet::Decoded },
    /// Records of `size` bytes from `first[s]`, `counts[s]` of them in shard `s`.
    Records { size: u64, first: Vec<u64>, counts: Vec<u64> },
    /// Windows of `window` bytes every `step` bytes over the shards' data regions joined
    /// end to end (`regions[s]` = (start, end) in shard `s`); `counts[s]` windows start
    /// in shard `s`, the first `firsts[s]` bytes into its region.
    Windows { regions: Vec<(u64, u64)>, step: u64, window: u64, counts: Vec<u64>, firsts: Vec<u64> },
}

/// The samples of a dataset: per shard, how many and where their bytes are.
///
/// Every read of a shard (its header, its samples) names the version the listing gave
/// (`Range::expected_version`): a shard that changed since the index was read fails the
/// read with ABORTED, never returns another version's bytes at this version's offsets.
#[derive(Debug, Clone)]
pub struct SampleIndex {
    dataset: String,
    shards: Vec<String>,
    /// Each shard's version, as listed when the index was read.
    versions: Vec<String>,
    layout: Layout,
    /// numpy dtype of the values (tokens), when the format says.
    dtype: Option<String>,
    /// The columns of a sample (MDS).
    columns: Option<Vec<mds::Column>>,
    /// What the index and the values decoded from its files may hold.
    budget: Budget,
}

/// A damaged file of `dataset`: [`Error::Damaged`] naming it, the byte where it goes
/// wrong (when known) and what is wrong.
pub(crate) fn damaged(
    dataset: &str,
    file: &str,
    offset: impl Into<Option<u64>>,
    what: impl Into<String>,
) -> Error {
    Error::Damaged { file: format!("{dataset}/{file}"), offset: offset.into(), what: what.into() }
}

/// Bytes of memory an index entry (a sample's bounds) is counted as.
const ENTRY_BYTES: u64 = 16;

impl SampleIndex {
    /// Reads `dataset`'s index in `format` through `client`.
    /// Index reads say so (`Client::for_index`): a spoke does not start fetching every
    /// shard whose header was read.
    /// The memory budget is `SHARDCACHE_MEMORY_BUDGET`'s, else what this process may use
    /// ([`budget::for_process`]).
    pub async fn open(client: &Client, dataset: &str, format: &Format) -> Result<Self> {
        Self::open_with(client, dataset, format, Budget::from_env()?).await
    }

    /// [`SampleIndex::open`] with a memory budget of its own.
    pub async fn open_with(client: &Client, dataset: &str, format: &Format, budget: Budget) -> Result<Self> {
        let listed = client.list_shards(dataset).await?;
        // A tar's walk reads every byte, as the epoch will: not index reads.
        let index_reads = match format {
            Format::WebDataset => client.untagged(),
            _ => client.for_index(),
        };
        Self::open_listed(&index_reads, dataset, &listed, format, budget).await
    }

    /// The index of `listed` (the dataset's files, as listed) in `format`, read through
    /// `fetch`: a server, or [`Files`] in memory.
    pub async fn open_listed<F: Fetch>(
        fetch: &F,
        dataset: &str,
        listed: &[ShardInfo],
        format: &Format,
        budget: Budget,
    ) -> Result<Self> {
        let index = match format {
            Format::Records { record_size } => Self::records(dataset, listed, *record_size)?,
            Format::Megatron => megatron::open(fetch, dataset, listed).await?,
            Format::MegatronGpt { seq_len, seed, num_samples } => {
                megatron::open_gpt(fetch, dataset, listed, *seq_len, *seed, *num_samples, &budget).await?
            }
            Format::Mds => mds::open(fetch, dataset, listed, &budget).await?,
            Format::WebDataset => webdataset::open(fetch, dataset, listed, &budget).await?,
            Format::Parquet => parquet::open(fetch, dataset, listed, &budget).await?,
            Format::Tokens { seq_len, dtype } => {
                tokens::open(fetch, dataset, listed, *seq_len, dtype).await?
            }
        };
        // The index's entries count against the budget: each was read from the files
        // (at least 4 bytes of them an entry), so this bounds what the files' sizes already
        // bound, by what this process may hold.
        let entries = index.entries();
        budget.admits(entries.saturating_mul(ENTRY_BYTES), || {
            format!("the index of {dataset:?} ({entries} entries)")
        })?;
        Ok(Self { budget, ..index })
    }

    /// Entries the index holds (sample bounds, a tar's fields); computed layouts hold none.
    fn entries(&self) -> u64 {
        match &self.layout {
            Layout::Bounds(bounds) => bounds.iter().map(|b| b.len() as u64).sum(),
            Layout::Groups(groups) => groups.iter().flatten().map(|g| g.fields.len() as u64 + 1).sum(),
            _ => 0,
        }
    }

    /// Windows of `window` bytes every `step` bytes over `regions` joined end to end,
    /// each window whole (the last ones, which would run past the end, are not samples).
    fn windows(
        dataset: &str,
        shards: Vec<(String, String)>,
        regions: Vec<(u64, u64)>,
        step: u64,
        window: u64,
        dtype: Option<String>,
    ) -> Self {
        let total: u64 = regions.iter().map(|(start, end)| end - start).sum();
        let windows = if total >= window { (total - window) / step + 1 } else { 0 };
        let (mut counts, mut firsts, mut at) = (Vec::new(), Vec::new(), 0u64);
        for (start, end) in &regions {
            // Windows starting in [at, at + len): indices ceil(at / step) .. ceil((at + len) / step).
            let first = at.div_ceil(step).min(windows);
            let last = (at + end - start).div_ceil(step).min(windows);
            counts.push(last - first);
            firsts.push((first * step).saturating_sub(at));
            at += end - start;
        }
        let layout = Layout::Windows { regions, step, window, counts, firsts };
        let (shards, versions) = shards.into_iter().unzip();
        Self {
            dataset: dataset.to_owned(),
            shards,
            versions,
            layout,
            dtype,
            columns: None,
            budget: Budget::default(),
        }
    }

    /// Fixed-size records in every listed file.
    fn records(dataset: &str, listed: &[ShardInfo], size: u64) -> Result<Self> {
        let size = match size {
            0 => listed.iter().map(|s| u64::from(s.record_size)).find(|&r| r > 0).unwrap_or(0),
            size => size,
        };
        if size == 0 {
            return Err(Error::Config(format!(
                "dataset {dataset:?} has no record_size in its metadata; pass record_size= (or format=\"megatron\", \
                 \"mds\", \"webdataset\" or \"tokens\" for those layouts)"
            )));
        }
        Ok(Self {
            dataset: dataset.to_owned(),
            shards: listed.iter().map(|s| s.shard.clone()).collect(),
            versions: listed.iter().map(|s| s.version.clone()).collect(),
            layout: Layout::Records {
                size,
                first: vec![0; listed.len()],
                counts: listed.iter().map(|s| s.size / size).collect(),
            },
            dtype: None,
            columns: None,
            budget: Budget::default(),
        })
    }

    /// The memory budget of what this index decodes.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    /// The shards, in the order samples are numbered.
    pub fn shards(&self) -> &[String] {
        &self.shards
    }

    /// The size of a record (fixed-size records), else None.
    pub fn record_size(&self) -> Option<u64> {
        match &self.layout {
            Layout::Records { size, .. } => Some(*size),
            _ => None,
        }
    }

    /// The numpy dtype of the samples' values, when the format says (tokens, Megatron).
    pub fn dtype(&self) -> Option<&str> {
        self.dtype.as_deref()
    }

    /// The columns of each sample, where the format has columns (MDS, Parquet).
    pub fn columns(&self) -> Option<&[mds::Column]> {
        self.columns.as_deref()
    }

    /// A sample's columns decoded from its bytes (MDS); an error for a format without
    /// columns, and for Parquet's rows, which are not bytes of their own
    /// ([`SampleIndex::read_decoded`] reads them).
    pub fn decode(&self, sample: &Bytes) -> Result<Fields> {
        let columns = self.mds_columns()?;
        // Bytes a caller hands in: of no file this index knows.
        mds::decode(columns, sample).map_err(|what| Error::Damaged {
            file: format!("{}: a sample", self.dataset),
            offset: None,
            what,
        })
    }

    /// The columns an MDS sample's bytes decode into; an error for any other format.
    fn mds_columns(&self) -> Result<&[mds::Column]> {
        let columns = self.columns.as_deref().ok_or_else(|| {
            Error::Config(format!("dataset {:?}: its samples have no columns to decode", self.dataset))
        })?;
        if let Layout::Rows { .. } = self.layout {
            return Err(self.rows_are_values());
        }
        Ok(columns)
    }

    fn rows_are_values(&self) -> Error {
        Error::Config(format!(
            "dataset {:?} is Parquet: its rows are values, not bytes of their own; read them with read_decoded",
            self.dataset
        ))
    }

    /// `samples` read and decoded by column (MDS, Parquet), in order.
    pub async fn read_decoded<F: Fetch>(
        &self,
        client: &F,
        samples: &[(usize, u64)],
    ) -> Result<Vec<Arc<Fields>>> {
        if let Layout::Rows { .. } = self.layout {
            return self.read_rows(client, samples).await;
        }
        let data = self.read(client, samples).await?;
        let columns = self.mds_columns()?;
        let decoded =
            data.iter().zip(samples).map(|(sample, &(shard, k))| match mds::decode(columns, sample) {
                Ok(fields) => Ok(Arc::new(fields)),
                // The sample's file and where the sample starts in it.
                Err(what) => {
                    let at = self.pieces(shard, k).ok().and_then(|p| p.first().map(|p| p.offset));
                    Err(damaged(&self.dataset, &self.shards[shard], at, format!("sample {k}: {what}")))
                }
            });
        decoded.collect()
    }

    /// The key and field names of sample `k` of `shard` (WebDataset), in the order
    /// [`SampleIndex::pieces`] gives their bytes.
    pub fn fields(&self, shard: usize, k: u64) -> Option<(&str, Vec<&str>)> {
        let Layout::Groups(groups) = &self.layout else { return None };
        let group = groups.get(shard)?.get(k as usize)?;
        Some((&group.key, group.fields.iter().map(|(name, _, _)| name.as_str()).collect()))
    }

    /// Samples per shard.
    pub fn counts(&self) -> Vec<u64> {
        match &self.layout {
            Layout::Bounds(bounds) => bounds.iter().map(|b| b.len().saturating_sub(1) as u64).collect(),
            Layout::Groups(groups) => groups.iter().map(|g| g.len() as u64).collect(),
            Layout::Gpt { index, .. } => vec![index.len() as u64],
            Layout::Rows { files, .. } => files.iter().map(|f| f.rows()).collect(),
            Layout::Records { counts, .. }
            | Layout::Windows { counts, .. }
            | Layout::Packed { counts, .. } => counts.clone(),
        }
    }

    /// What a block shuffle shuffles, `(shard, first sample, samples)` each: every shard
    /// whole, but each row group of a Parquet file (read and decoded whole: a block of
    /// files would mix hundreds of row groups in each batch).
    pub fn units(&self) -> Vec<(usize, u64, u64)> {
        match &self.layout {
            Layout::Rows { files, .. } => files
                .iter()
                .enumerate()
                .flat_map(|(s, f)| f.row_groups().map(move |(first, rows)| (s, first, rows)))
                .collect(),
            _ => self.counts().into_iter().enumerate().map(|(s, count)| (s, 0, count)).collect(),
        }
    }

    /// Samples in all.
    pub fn len(&self) -> u64 {
        self.counts().iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where sample `k` of shard `shard` is: one piece, or several when it crosses shards.
    pub fn pieces(&self, shard: usize, k: u64) -> Result<Vec<Piece>> {
        let outside = || Error::Config(format!("no sample {k} in shard {shard} of {:?}", self.dataset));
        match &self.layout {
            Layout::Bounds(bounds) => {
                let b = bounds.get(shard).ok_or_else(outside)?;
                let (start, end) = match (b.get(k as usize), b.get(k as usize + 1)) {
                    (Some(&start), Some(&end)) => (start, end),
                    _ => return Err(outside()),
                };
                Ok(vec![Piece { shard, offset: start, length: end - start }])
            }
            Layout::Rows { files, .. } => {
                // A row's bytes are its row group's, read whole.
                let (offset, length) = files.get(shard).and_then(|f| f.group_range(k)).ok_or_else(outside)?;
                Ok(vec![Piece { shard, offset, length }])
            }
            Layout::Packed { .. } => Err(Error::Config(format!(
                "{:?}: a compressed shard's samples are where its decompressed bytes say",
                self.dataset
            ))),
            Layout::Gpt { index, bounds, item } => {
                let spans = index.spans(k as usize).filter(|_| shard == 0).ok_or_else(outside)?;
                Ok(spans
                    .into_iter()
                    .map(|(seq, offset, tokens)| Piece {
                        shard: 0,
                        offset: bounds[seq as usize] + offset * item,
                        length: tokens * item,
                    })
                    .collect())
            }
            Layout::Groups(groups) => {
                let group = groups.get(shard).and_then(|g| g.get(k as usize)).ok_or_else(outside)?;
                Ok(group.fields.iter().map(|&(_, offset, length)| Piece { shard, offset, length }).collect())
            }
            Layout::Records { size, first, counts } => {
                if counts.get(shard).is_none_or(|&c| k >= c) {
                    return Err(outside());
                }
                Ok(vec![Piece { shard, offset: first[shard] + k * size, length: *size }])
            }
            Layout::Windows { regions, step, window, counts, firsts } => {
                if counts.get(shard).is_none_or(|&c| k >= c) {
                    return Err(outside());
                }
                Ok(tokens::window_pieces(regions, shard, firsts[shard] + k * step, *window))
            }
        }
    }

    /// Each of `samples` as its pieces' bytes (a WebDataset sample's fields), in order.
    pub async fn read_pieces<F: Fetch>(
        &self,
        client: &F,
        samples: &[(usize, u64)],
    ) -> Result<Vec<Vec<Bytes>>> {
        if let Layout::Packed { .. } = &self.layout {
            return Ok(self.read_packed(client, samples).await?.into_iter().map(|b| vec![b]).collect());
        }
        if let Layout::Rows { .. } = &self.layout {
            return Err(self.rows_are_values());
        }
        let mut ranges = Vec::new();
        let mut counts = Vec::with_capacity(samples.len());
        for &(shard, k) in samples {
            let pieces = self.pieces(shard, k)?;
            counts.push(pieces.len());
            for piece in pieces {
                ranges.push(self.range(piece.shard, piece.offset, piece.length));
            }
        }
        let mut data = client.fetch(ranges).await?.into_iter();
        Ok(counts.into_iter().map(|n| data.by_ref().take(n).collect()).collect())
    }

    /// `[offset, offset + length)` of shard `shard`, at the version the index was read at.
    fn range(&self, shard: usize, offset: u64, length: u64) -> Range {
        pinned(
            Range::new(self.dataset.clone(), self.shards[shard].clone(), offset, length),
            &self.versions[shard],
        )
    }

    /// The bytes of `samples` ((shard, k) each), in order, verified; batched into as few
    /// `ReadRanges` calls as the servers' bounds allow. A sample of several pieces (a
    /// window across shards, a WebDataset sample's fields) is their bytes joined.
    pub async fn read<F: Fetch>(&self, client: &F, samples: &[(usize, u64)]) -> Result<Vec<Bytes>> {
        let pieces = self.read_pieces(client, samples).await?;
        Ok(pieces
            .into_iter()
            .map(|mut pieces| match pieces.len() {
                1 => pieces.pop().unwrap_or_default(),
                _ => {
                    let mut joined = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
                    pieces.iter().for_each(|p| joined.extend_from_slice(p));
                    joined.freeze()
                }
            })
            .collect())
    }
}
