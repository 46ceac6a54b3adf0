//! A synthetic tokenised corpus shaped like the seed experiment's C4-for-LLaMA data:
//! documents of LLaMA-3 token ids (u32, little-endian) packed back to back into fixed
//! windows (4096 tokens = 16 KiB records), split into shard files.
//!
//! Deterministic: the bytes depend only on (seed, dataset, shard index, sizes), so two
//! runs, or two machines, produce identical shards and tests can compare digests.
//! Each document is `BOS tokens... EOS` with a length drawn from 64..=2048 tokens;
//! token ids are skewed towards small ids (frequent tokens) like real text
//! ([`Tokens::Skewed`]), or drawn from Zipf's law over the vocabulary
//! ([`Tokens::Zipf`]: the frequency of the k-th most frequent token ~ 1/k, as in real
//! tokenised text, so it compresses about as real text's ids do; for tests and demos of
//! link compression that need such data quickly).

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use shardcache_proto::names::{DATASET_META_FILE, DatasetName};

/// LLaMA 3 vocabulary: 128,000 text tokens plus 256 special ones.
pub const VOCAB_SIZE: u32 = 128_256;
/// LLaMA 3 `<|begin_of_text|>`.
pub const BOS: u32 = 128_000;
/// LLaMA 3 `<|end_of_text|>`.
pub const EOS: u32 = 128_001;
const TEXT_TOKENS: u32 = 128_000;
const DOC_TOKENS: (u64, u64) = (64, 2048);

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenSpec {
    /// Parent folder; the dataset becomes `dir/dataset/`.
    pub dir: PathBuf,
    pub dataset: String,
    pub shards: u32,
    /// Bytes per shard; a multiple of `record_size`.
    pub shard_size: u64,
    /// Bytes per record (sample); a multiple of 4 (one u32 token).
    pub record_size: u64,
    pub seed: u64,
    pub tokens: Tokens,
}

/// How token ids are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Tokens {
    /// A uniform id shifted right by 0..15 bits (the default; what the seed demo used).
    #[default]
    Skewed,
    /// Zipf's law over the 128,000 text tokens (exponent 1): realistic frequencies.
    Zipf,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct GenReport {
    pub dataset_dir: PathBuf,
    pub shards: Vec<PathBuf>,
    pub bytes: u64,
    pub records: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("invalid dataset spec: {0}")]
    Invalid(String),
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Name of shard `index`.
pub fn shard_name(index: u32) -> String {
    format!("shard-{index:05}.bin")
}

/// Writes the dataset, shards in parallel (one thread per core). Each shard is written
/// under a hidden temporary name and renamed, so a server never lists half a shard.
pub fn generate(spec: &GenSpec) -> Result<GenReport, GenError> {
    let invalid = GenError::Invalid;
    if let Err(e) = DatasetName::new(&spec.dataset) {
        return Err(invalid(e.to_string()));
    }
    if spec.record_size == 0 || !spec.record_size.is_multiple_of(4) {
        return Err(invalid(format!(
            "--record-size {} must be a positive multiple of 4 (u32 tokens)",
            spec.record_size
        )));
    }
    if spec.shard_size == 0 || !spec.shard_size.is_multiple_of(spec.record_size) {
        return Err(invalid(format!(
            "--shard-size {} must be a positive multiple of --record-size {}",
            spec.shard_size, spec.record_size
        )));
    }
    let dataset_dir = spec.dir.join(&spec.dataset);
    std::fs::create_dir_all(&dataset_dir)
        .map_err(|source| GenError::Io { path: dataset_dir.clone(), source })?;

    let threads =
        std::thread::available_parallelism().map_or(1, |n| n.get()).min(spec.shards.max(1) as usize);
    let shards: Vec<PathBuf> = (0..spec.shards).map(|i| dataset_dir.join(shard_name(i))).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|worker| {
                let shards = &shards;
                scope.spawn(move || -> Result<(), GenError> {
                    for index in (worker..shards.len()).step_by(threads) {
                        write_shard(spec, index as u32, &shards[index])?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|_| Err(invalid("a writer thread panicked".into()))))
    })?;

    let meta_path = dataset_dir.join(DATASET_META_FILE);
    let meta = serde_json::json!({
        "record_size": spec.record_size,
        "token_bytes": 4,
        "tokens_per_record": spec.record_size / 4,
        "vocab_size": VOCAB_SIZE,
        "bos": BOS,
        "eos": EOS,
        "generator": "shardcache gen",
        "seed": spec.seed,
        "tokens": format!("{:?}", spec.tokens).to_lowercase(),
        "shards": spec.shards,
        "shard_size": spec.shard_size,
    });
    std::fs::write(&meta_path, format!("{meta:#}\n"))
        .map_err(|source| GenError::Io { path: meta_path.clone(), source })?;
    Ok(GenReport {
        dataset_dir,
        shards,
        bytes: spec.shard_size * u64::from(spec.shards),
        records: spec.shard_size / spec.record_size * u64::from(spec.shards),
    })
}

fn write_shard(spec: &GenSpec, index: u32, path: &Path) -> Result<(), GenError> {
    let io = |source| GenError::Io { path: path.to_owned(), source };
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp"));
    let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp).map_err(io)?);
    let mut tokens = TokenStream::new(shard_seed(spec.seed, &spec.dataset, index), spec.tokens);
    let mut record = vec![0u8; spec.record_size as usize];
    for _ in 0..spec.shard_size / spec.record_size {
        for token in record.chunks_exact_mut(4) {
            token.copy_from_slice(&tokens.next_token().to_le_bytes());
        }
        out.write_all(&record).map_err(io)?;
    }
    out.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Seed of one shard's token stream: FNV-1a over (seed, dataset, index).
fn shard_seed(seed: u64, dataset: &str, index: u32) -> u64 {
    let bytes = seed.to_le_bytes().into_iter().chain(dataset.bytes()).chain(index.to_le_bytes());
    bytes.fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Documents of token ids, packed back to back.
struct TokenStream {
    state: u64,
    left_in_doc: u64,
    /// Zipf: the cumulative weights of ranks 1..=TEXT_TOKENS, scaled to u64.
    zipf: Option<Vec<u64>>,
}

/// Cumulative weights of Zipf's law (weight 1/k for rank k) over the text tokens, as
/// fractions of u64::MAX: a uniform u64 finds its rank by binary search.
fn zipf_table() -> Vec<u64> {
    let total: f64 = (1..=TEXT_TOKENS).map(|k| 1.0 / f64::from(k)).sum();
    let mut at = 0.0;
    (1..=TEXT_TOKENS)
        .map(|k| {
            at += 1.0 / f64::from(k) / total;
            (at.min(1.0) * u64::MAX as f64) as u64
        })
        .collect()
}

impl TokenStream {
    fn new(seed: u64, tokens: Tokens) -> Self {
        Self { state: seed, left_in_doc: 0, zipf: (tokens == Tokens::Zipf).then(zipf_table) }
    }

    /// SplitMix64: fast, and good enough for synthetic data.
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn next_token(&mut self) -> u32 {
        match self.left_in_doc {
            0 => {
                let (lo, hi) = DOC_TOKENS;
                self.left_in_doc = lo + self.next_u64() % (hi - lo + 1);
                BOS
            }
            1 => {
                self.left_in_doc = 0;
                EOS
            }
            _ => {
                self.left_in_doc -= 1;
                let r = self.next_u64();
                match &self.zipf {
                    // Rank k (0-based) is token id k: frequent tokens have small ids, as BPE's do.
                    Some(table) => (table.partition_point(|&c| c < r) as u32).min(TEXT_TOKENS - 1),
                    // A uniform id shifted right by 0..15 bits: small (frequent) ids dominate.
                    None => ((r as u32 % TEXT_TOKENS) >> (r >> 60)) % TEXT_TOKENS,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path, seed: u64) -> GenSpec {
        GenSpec {
            dir: dir.to_owned(),
            dataset: "c4".into(),
            shards: 3,
            shard_size: 4 * 16384,
            record_size: 16384,
            seed,
            tokens: Tokens::Skewed,
        }
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let (a, b, c) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let report = generate(&spec(a.path(), 7)).unwrap();
        generate(&spec(b.path(), 7)).unwrap();
        generate(&spec(c.path(), 8)).unwrap();
        assert_eq!(report.records, 12);
        for name in (0..3).map(shard_name) {
            let first = std::fs::read(a.path().join("c4").join(&name)).unwrap();
            assert_eq!(first.len(), 4 * 16384);
            assert_eq!(first, std::fs::read(b.path().join("c4").join(&name)).unwrap());
            assert_ne!(first, std::fs::read(c.path().join("c4").join(&name)).unwrap());
        }
        let shard0 = std::fs::read(a.path().join("c4").join(shard_name(0))).unwrap();
        let shard1 = std::fs::read(a.path().join("c4").join(shard_name(1))).unwrap();
        assert_ne!(shard0, shard1, "shards differ from each other");
    }

    #[test]
    fn records_are_llama_token_windows() {
        let dir = tempfile::tempdir().unwrap();
        generate(&spec(dir.path(), 1)).unwrap();
        let bytes = std::fs::read(dir.path().join("c4").join(shard_name(0))).unwrap();
        let tokens: Vec<u32> =
            bytes.chunks_exact(4).map(|t| u32::from_le_bytes(t.try_into().unwrap())).collect();
        assert_eq!(tokens[0], BOS, "a shard starts with a document");
        assert!(tokens.iter().all(|&t| t < VOCAB_SIZE));
        assert!(tokens.contains(&EOS), "documents end inside the shard");
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("c4").join(DATASET_META_FILE)).unwrap())
                .unwrap();
        assert_eq!(meta["record_size"], 16384);
    }

    #[test]
    fn refuses_sizes_that_do_not_pack() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = spec(dir.path(), 1);
        bad.shard_size = 16384 * 4 + 1;
        assert!(generate(&bad).unwrap_err().to_string().contains("multiple of --record-size"));
        bad.shard_size = 16384;
        bad.record_size = 6;
        assert!(generate(&bad).unwrap_err().to_string().contains("multiple of 4"));
    }

    #[test]
    fn zipf_tokens_follow_zipfs_law() {
        let dir = tempfile::tempdir().unwrap();
        let mut zipf = spec(dir.path(), 3);
        zipf.tokens = Tokens::Zipf;
        zipf.shard_size = 64 * 16384; // 256k tokens a shard
        let report = generate(&zipf).unwrap();
        let bytes = std::fs::read(&report.shards[0]).unwrap();
        let ids: Vec<u32> =
            bytes.chunks_exact(4).map(|t| u32::from_le_bytes(t.try_into().unwrap())).collect();
        let text: Vec<u32> = ids.into_iter().filter(|&t| t < TEXT_TOKENS).collect();
        let share = |below: u32| text.iter().filter(|&&t| t < below).count() as f64 / text.len() as f64;
        // P(rank <= k) = H(k) / H(128,000): 1/12.3 for the first, 0.42 for the first 100.
        assert!((0.07..0.095).contains(&share(1)), "{}", share(1));
        assert!((0.39..0.45).contains(&share(100)), "{}", share(100));
        assert!(text.iter().any(|&t| t > 100_000), "the tail is drawn too");
    }
}
