//! The memory a reader may hold for what it makes from a dataset's files: the index's
//! entries, decompressed MDS shards, decoded Parquet row groups, the tar headers a walk
//! holds. One bound per
//! [`SampleIndex`](super::SampleIndex) (`SHARDCACHE_MEMORY_BUDGET`, Python
//! `Client.samples(memory_budget=...)`), taken before anything is allocated for a number a
//! file gave: no file can push a reader past it, and a decompression stops at what it
//! was told, not after.
//!
//! What is held is counted until the last handle of it is dropped ([`Held`] lives in the
//! kept value); a read that needs more than is free first lets go of the values it does
//! not need, then fails with [`Error::OverBudget`](crate::Error::OverBudget).

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use shardcache_proto::units::ByteSize;

use shardcache_client::{Error, Result};

/// The default: 4 GiB a process (each DataLoader worker has its own). MosaicML's shards
/// are 64 MiB by default and 4 are kept decompressed; a decoded Parquet row group of
/// 128 MiB takes a few times that as values.
pub const DEFAULT_BUDGET: u64 = 4 << 30;

/// The environment variable that sets the budget: bytes, or a size as the servers' flags
/// take it (`512MiB`, `512M`, `8G`; `8GB` is 8 x 10^9).
pub const BUDGET_ENV: &str = "SHARDCACHE_MEMORY_BUDGET";

/// Bytes a reader may hold, and what it holds now.
#[derive(Debug, Clone)]
pub struct Budget {
    limit: u64,
    used: Arc<AtomicU64>,
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(DEFAULT_BUDGET)
    }
}

impl Budget {
    pub fn new(limit: u64) -> Self {
        Self { limit, used: Default::default() }
    }

    /// The budget `SHARDCACHE_MEMORY_BUDGET` gives, else the default; an error for a
    /// value that is not a size.
    pub fn from_env() -> Result<Self> {
        match std::env::var(BUDGET_ENV) {
            Ok(text) => text
                .parse::<ByteSize>()
                .map(|size| Self::new(size.0))
                .map_err(|e| Error::Config(format!("{BUDGET_ENV}: {e}"))),
            Err(_) => Ok(Self::default()),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// `bytes` taken for `what` (a person's words: "decompressing ds/shard.mds"), or
    /// [`Error::OverBudget`] when they do not fit beside what is held.
    pub fn take(&self, bytes: u64, what: impl FnOnce() -> String) -> Result<Held> {
        match reserve(&self.used, self.limit, bytes) {
            true => Ok(Held { bytes, limit: self.limit, used: self.used.clone() }),
            false => Err(Error::OverBudget { what: what(), needed: bytes, budget: self.limit }),
        }
    }

    /// Whether `bytes` could ever fit: a claim checked before anything is read for it.
    pub fn admits(&self, bytes: u64, what: impl FnOnce() -> String) -> Result<()> {
        match bytes <= self.limit {
            true => Ok(()),
            false => Err(Error::OverBudget { what: what(), needed: bytes, budget: self.limit }),
        }
    }
}

/// Bytes taken from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    bytes: u64,
    limit: u64,
    used: Arc<AtomicU64>,
}

impl Held {
    /// Holds `bytes` from now on: the difference taken (or [`Error::OverBudget`], holding
    /// what it held), or given back. For a buffer that grows and shrinks as it is read.
    pub fn resize(&mut self, bytes: u64, what: impl FnOnce() -> String) -> Result<()> {
        if bytes <= self.bytes {
            self.used.fetch_sub(self.bytes - bytes, Ordering::AcqRel);
            self.bytes = bytes;
            return Ok(());
        }
        let more = bytes - self.bytes;
        match reserve(&self.used, self.limit, more) {
            true => {
                self.bytes = bytes;
                Ok(())
            }
            // What this holder would hold in all: the number a person compares with the budget.
            false => Err(Error::OverBudget { what: what(), needed: bytes, budget: self.limit }),
        }
    }
}

/// Adds `more` to `used` if the total stays within `limit`; whether it did.
fn reserve(used: &AtomicU64, limit: u64, more: u64) -> bool {
    used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
        used.checked_add(more).filter(|&t| t <= limit)
    })
    .is_ok()
}

impl Drop for Held {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_held_counts_until_dropped_and_nothing_passes_the_limit() {
        let budget = Budget::new(100);
        let a = budget.take(60, || "a".into()).unwrap();
        let err = budget.take(41, || "b".into()).unwrap_err();
        assert!(matches!(err, Error::OverBudget { needed: 41, budget: 100, .. }), "{err}");
        assert!(budget.take(u64::MAX, || "huge".into()).is_err(), "no wrap past 2^64");
        drop(a);
        assert_eq!(budget.used(), 0);
        let _b = budget.take(100, || "b".into()).unwrap();
        assert_eq!(budget.used(), 100);
    }

    #[test]
    fn a_held_buffer_grows_within_the_limit_and_gives_back_as_it_shrinks() {
        let budget = Budget::new(100);
        let mut held = budget.take(10, || "walk".into()).unwrap();
        held.resize(70, || "walk".into()).unwrap();
        assert_eq!(budget.used(), 70);
        let err = held.resize(101, || "walk".into()).unwrap_err();
        assert!(matches!(err, Error::OverBudget { needed: 101, .. }), "{err}");
        assert_eq!(budget.used(), 70, "a refused growth holds what it held");
        held.resize(5, || "walk".into()).unwrap();
        assert_eq!(budget.used(), 5);
        drop(held);
        assert_eq!(budget.used(), 0);
    }
}
