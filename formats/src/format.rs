//! The formats a dataset's files may hold its samples in ([`Format`]).

/// How a dataset's files hold its samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// Every file is a shard of records of `record_size` bytes (a tail shorter than a
    /// record is not a sample); 0: the size the dataset's metadata gives (the listing's
    /// `record_size`).
    Records { record_size: u64 },
    /// Megatron-LM indexed datasets: each `PREFIX.bin` with its `PREFIX.idx` is a shard
    /// whose samples are its sequences.
    Megatron,
    /// One Megatron indexed dataset packed as Megatron's `GPTDataset` packs it: samples
    /// of `seq_len + 1` tokens, with its `random_seed` (Megatron's default: 1234), enough
    /// epochs for `num_samples` (one when `None`) ([`gpt`](crate::gpt)).
    MegatronGpt { seq_len: u64, seed: u32, num_samples: Option<u64> },
    /// MosaicML Streaming's MDS: `index.json` and the shards it lists.
    Mds,
    /// WebDataset: every `.tar` file, samples grouped by key.
    WebDataset,
    /// Parquet: every `.parquet` file, a sample per row.
    Parquet,
    /// Token arrays: every `.npy` file (its header gives the dtype), or, with `dtype`,
    /// every file as raw tokens of that numpy dtype (`"uint16"`, `"int32"`...); samples are
    /// windows of `seq_len + 1` tokens starting every `seq_len` tokens (inputs and their
    /// next-token labels).
    Tokens { seq_len: u64, dtype: Option<String> },
}
