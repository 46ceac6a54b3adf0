//! The SDK's orders for Python (`shardcache_client::order`): one implementation for the
//! Rust and Python SDKs. `Permutation` shuffles `shardcache.order`'s large blocks;
//! `SamplerOrder` is `shardcache.ShardSampler`'s order over ranks; both say where a
//! sample is read (their inverses), which a plan sends the spoke as each read's next use.

use pyo3::{exceptions::PyIndexError, prelude::*};
use shardcache_client::order;

/// A keyed bijection of ``range(n)``, computed per position, with its inverse.
#[pyclass(module = "shardcache._native", frozen)]
pub(crate) struct Permutation(order::Permutation);

#[pymethods]
impl Permutation {
    #[new]
    fn new(n: u64, key: &str) -> PyResult<Self> {
        if n == 0 {
            return Err(PyIndexError::new_err("a permutation of no positions"));
        }
        Ok(Self(order::Permutation::new(n, key)))
    }

    fn __len__(&self) -> usize {
        self.0.len() as usize
    }

    fn __getitem__(&self, position: i64) -> PyResult<u64> {
        let n = self.0.len();
        match u64::try_from(position) {
            Ok(p) if p < n => Ok(self.0.at(p)),
            _ => Err(PyIndexError::new_err(format!("position {position} is outside 0..{n}"))),
        }
    }

    /// The position whose value is ``value``.
    fn position_of(&self, value: u64) -> PyResult<u64> {
        if value >= self.0.len() {
            return Err(PyIndexError::new_err(format!("value {value} is outside 0..{}", self.0.len())));
        }
        Ok(self.0.position_of(value))
    }

    /// The values at ``count`` positions from ``start`` on (fewer at the end).
    fn take(&self, start: u64, count: u64) -> Vec<u64> {
        (start..self.0.len().min(start.saturating_add(count))).map(|p| self.0.at(p)).collect()
    }
}

/// The order of a map-style sampler over ranks (``DistributedSampler``'s dealing).
#[pyclass(module = "shardcache._native", frozen)]
pub(crate) struct SamplerOrder(order::SamplerOrder);

#[pymethods]
impl SamplerOrder {
    #[new]
    fn new(n: u64, seed: u64, shuffle: bool, num_replicas: u64, drop_last: bool) -> Self {
        Self(order::SamplerOrder { n, seed, shuffle, ranks: num_replicas.max(1), drop_last })
    }

    /// Places of an epoch (samples padded to, or cut to, a multiple of the ranks).
    #[getter]
    fn places(&self) -> u64 {
        self.0.places()
    }

    /// Samples each rank reads an epoch.
    #[getter]
    fn per_rank(&self) -> u64 {
        self.0.per_rank()
    }

    /// The places rank ``rank`` reads past the first ``base`` places of an epoch (read
    /// before a resume), ``count`` of them from its ``start``-th on: every
    /// ``num_replicas``-th from ``base + rank``.
    fn rank_places(&self, rank: u64, base: u64, start: u64, count: u64) -> Vec<u64> {
        self.0.rank_places(rank, (base, start), count)
    }

    /// The samples read at ``rank_places`` in ``epoch``.
    fn rank_samples(&self, epoch: u64, rank: u64, base: u64, start: u64, count: u64) -> Vec<u64> {
        self.0.rank_samples(epoch, rank, (base, start), count)
    }

    /// The first place of ``epoch`` that reads ``sample`` (None: cut by ``drop_last``).
    fn place_of(&self, epoch: u64, sample: u64) -> Option<u64> {
        self.0.place_of(epoch, sample)
    }
}
