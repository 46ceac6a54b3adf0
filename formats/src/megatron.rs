//! Megatron-LM indexed datasets (`megatron/core/datasets/indexed_dataset.py`, what
//! Megatron-LM, NeMo and GPT-NeoX pretrain from): `PREFIX.bin` holds the tokens of every
//! sequence end to end, `PREFIX.idx` says where each starts:
//!
//! ```text
//! "MMIDIDX\0\0"                 9 bytes
//! version            u64 = 1
//! dtype code         u8     1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//!                           7 float32, 8 uint16
//! sequence count     u64    S
//! document count     u64    D (entries of the document index: documents + 1)
//! sequence lengths   i32 x S    (tokens)
//! sequence pointers  i64 x S    (byte offsets into PREFIX.bin)
//! document indices   i64 x D    (first sequence of each document, then S)
//! ```
//!
//! all little-endian. A sample is one sequence: what `IndexedDataset[i]` returns (for
//! text, one document).

use shardcache_proto::v1::ShardInfo;

use super::{Budget, Fetch, Layout, SampleIndex, damaged, listed_range};
use shardcache_client::{Error, Result};

const MAGIC: &[u8] = b"MMIDIDX\x00\x00";
const HEADER: usize = 9 + 8 + 1 + 8 + 8;

/// The dtype of a Megatron dtype code, and its size.
fn dtype(code: u8) -> Option<(&'static str, u64)> {
    Some(match code {
        1 => ("uint8", 1),
        2 => ("int8", 1),
        3 => ("int16", 2),
        4 => ("int32", 4),
        5 => ("int64", 8),
        6 => ("float64", 8),
        7 => ("float32", 4),
        8 => ("uint16", 2),
        _ => return None,
    })
}

/// One `.idx` file, parsed: the dtype, and each sequence's byte bounds in the `.bin`
/// (`bounds[i]..bounds[i + 1]`: the builder writes sequences end to end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx {
    pub dtype: &'static str,
    pub bounds: Vec<u64>,
}

impl Idx {
    pub fn parse(name: &str, bytes: &[u8]) -> Result<Self> {
        let bad = |at: u64, why: String| Error::Damaged {
            file: name.to_owned(),
            offset: Some(at),
            what: format!("not a Megatron .idx file: {why}"),
        };
        if bytes.len() < HEADER || !bytes.starts_with(MAGIC) {
            return Err(bad(0, "no MMIDIDX magic".into()));
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        let version = u64_at(9);
        if version != 1 {
            return Err(bad(9, format!("version {version}")));
        }
        let (dtype, item) = dtype(bytes[17]).ok_or_else(|| bad(17, format!("dtype code {}", bytes[17])))?;
        let (sequences, documents) = (u64_at(18), u64_at(26));
        // Checked: counts near 2^64 must not wrap past the size check (then index out of
        // bounds); the counts are believed only as far as the file holds their entries.
        let need = sequences
            .checked_mul(12)
            .and_then(|n| n.checked_add(documents.checked_mul(8)?))
            .and_then(|n| n.checked_add(HEADER as u64));
        if need.is_none_or(|need| need > bytes.len() as u64) {
            let what =
                format!("{sequences} sequences and {documents} documents in a file of {} bytes", bytes.len());
            return Err(bad(18, what));
        }
        let sequences = sequences as usize; // at most the file's bytes / 12
        let lengths = &bytes[HEADER..HEADER + sequences * 4];
        let pointers = &bytes[HEADER + sequences * 4..HEADER + sequences * 12];
        let mut bounds = Vec::with_capacity(sequences + 1);
        let mut end = 0;
        for i in 0..sequences {
            let length =
                u64::from(u32::from_le_bytes(lengths[i * 4..i * 4 + 4].try_into().unwrap_or_default()));
            let pointer = u64::from_le_bytes(pointers[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            let at = (HEADER + sequences * 4 + i * 8) as u64;
            if i > 0 && pointer != end {
                return Err(bad(
                    at,
                    format!("sequence {i} starts at byte {pointer}, not where the one before ends ({end})"),
                ));
            }
            bounds.push(pointer);
            // Checked: the .bin's size is compared with the last end by the caller.
            end = (length * item)
                .checked_add(pointer)
                .ok_or_else(|| bad(at, format!("sequence {i} ends past 2^64")))?;
        }
        bounds.push(end);
        // The document index ends at the sequence count (megatron-core asserts it; a
        // file where it does not was cut or overwritten, whatever the lengths say).
        let documents_at = HEADER + sequences * 12;
        let last = documents.checked_sub(1).map(|d| documents_at + d as usize * 8);
        let last = last.map(|at| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default()));
        if last != Some(sequences as u64) {
            let what = format!("the document index ends at {last:?}, not at the {sequences} sequences");
            return Err(bad(documents_at as u64, what));
        }
        Ok(Self { dtype, bounds })
    }
}

/// One Megatron prefix packed as `GPTDataset` packs it ([`super::gpt`]).
pub async fn open_gpt<F: Fetch>(
    client: &F,
    dataset: &str,
    listed: &[ShardInfo],
    seq_len: u64,
    seed: u32,
    num_samples: Option<u64>,
    budget: &Budget,
) -> Result<SampleIndex> {
    if seq_len == 0 {
        return Err(Error::Config("seq_len must be at least 1 token".into()));
    }
    let SampleIndex { dataset: name, shards, versions, layout, dtype, columns, .. } =
        open(client, dataset, listed).await?;
    let (Layout::Bounds(mut bounds), 1) = (layout, shards.len()) else {
        return Err(Error::Config(format!(
            "dataset {dataset:?}: GPT packing takes one PREFIX.bin + PREFIX.idx (a blend of several is not packed here)"
        )));
    };
    let bounds = bounds.pop().unwrap_or_default();
    let item = dtype.as_deref().and_then(super::tokens::item_size).unwrap_or(1);
    let lengths: Vec<u64> = bounds.windows(2).map(|w| (w[1] - w[0]) / item).collect();
    if lengths.iter().sum::<u64>() == 0 {
        return Err(Error::Config(format!("dataset {dataset:?} holds no tokens: nothing to pack")));
    }
    let index =
        super::gpt::GptIndex::new(lengths, seq_len, seed, num_samples, budget).map_err(|e| match e {
            Error::OverBudget { what, needed, budget } => {
                Error::OverBudget { what: format!("{what} of {dataset:?}"), needed, budget }
            }
            e => e,
        })?;
    let layout = Layout::Gpt { index: std::sync::Arc::new(index), bounds, item };
    Ok(SampleIndex { dataset: name, shards, versions, layout, dtype, columns, budget: budget.clone() })
}

/// The sequences of every `PREFIX.bin` that has its `PREFIX.idx` in `listed`; the
/// `.idx` files are read in one batch.
pub async fn open<F: Fetch>(client: &F, dataset: &str, listed: &[ShardInfo]) -> Result<SampleIndex> {
    let names: std::collections::HashMap<&str, &ShardInfo> =
        listed.iter().map(|s| (s.shard.as_str(), s)).collect();
    let pairs: Vec<(&ShardInfo, &ShardInfo)> = listed
        .iter()
        .filter_map(|bin| {
            let prefix = bin.shard.strip_suffix(".bin")?;
            Some((bin, *names.get(format!("{prefix}.idx").as_str())?))
        })
        .collect();
    if pairs.is_empty() {
        return Err(Error::Config(format!("dataset {dataset:?} has no PREFIX.bin with its PREFIX.idx")));
    }
    let reads = pairs.iter().map(|(_, idx)| listed_range(dataset, idx, 0, idx.size)).collect();
    let (mut bounds, mut kind) = (Vec::new(), None);
    for ((bin, idx), bytes) in pairs.iter().zip(client.fetch(reads).await?) {
        let parsed = Idx::parse(&format!("{dataset}/{}", idx.shard), &bytes)?;
        if let Some(&end) = parsed.bounds.last().filter(|&&end| end > bin.size) {
            let what =
                format!("its sequences end at byte {end} of {}, which has {} bytes", bin.shard, bin.size);
            return Err(damaged(dataset, &idx.shard, None, what));
        }
        if kind.is_some_and(|k| k != parsed.dtype) {
            return Err(damaged(
                dataset,
                &idx.shard,
                17,
                format!("dtype {} unlike the other files'", parsed.dtype),
            ));
        }
        kind = Some(parsed.dtype);
        bounds.push(parsed.bounds);
    }
    Ok(SampleIndex {
        dataset: dataset.to_owned(),
        shards: pairs.iter().map(|(bin, _)| bin.shard.clone()).collect(),
        versions: pairs.iter().map(|(bin, _)| bin.version.clone()).collect(),
        layout: Layout::Bounds(bounds),
        dtype: kind.map(str::to_owned),
        columns: None,
        budget: Budget::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An .idx as Megatron's builder writes it: int32 tokens, three one-sequence documents.
    fn idx(lengths: &[u32]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&1u64.to_le_bytes());
        out.push(4);
        out.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
        out.extend_from_slice(&(lengths.len() as u64 + 1).to_le_bytes());
        for l in lengths {
            out.extend_from_slice(&l.to_le_bytes());
        }
        let mut at = 0u64;
        for l in lengths {
            out.extend_from_slice(&at.to_le_bytes());
            at += u64::from(*l) * 4;
        }
        for d in 0..=lengths.len() as u64 {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out
    }

    #[test]
    fn an_idx_gives_each_sequences_bytes() {
        let parsed = Idx::parse("x.idx", &idx(&[3, 1, 5])).unwrap();
        assert_eq!(parsed, Idx { dtype: "int32", bounds: vec![0, 12, 16, 36] });
        assert!(Idx::parse("x.idx", &idx(&[3, 1, 5])[..40]).is_err(), "short");
        let mut other = idx(&[3]);
        other[17] = 99;
        assert!(Idx::parse("x.idx", &other).is_err(), "unknown dtype code");
        // A sequence count whose product with 12 wraps to 8, past the size check before.
        let mut wrapped = idx(&[3, 1, 5]);
        wrapped[18..26].copy_from_slice(&0x1555_5555_5555_5556u64.to_le_bytes());
        let err = Idx::parse("x.idx", &wrapped).unwrap_err();
        assert!(matches!(err, Error::Damaged { offset: Some(18), .. }), "{err}");
        // A document index that does not end at the sequence count (megatron-core asserts).
        let mut short = idx(&[3, 1, 5]);
        let last = short.len() - 8;
        short[last..].copy_from_slice(&2u64.to_le_bytes());
        let err = Idx::parse("x.idx", &short).unwrap_err();
        assert!(
            err.to_string().contains("the document index ends at Some(2), not at the 3 sequences"),
            "{err}"
        );
    }
}
