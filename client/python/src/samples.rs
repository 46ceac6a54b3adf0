//! `Client.samples(...)`: a dataset as samples of any size, indexed from its own format
//! by the Rust SDK (`shardcache_client::samples`), read in batches.

use std::sync::Arc;

use pyo3::{
    prelude::*,
    types::{PyBytes, PyList},
};
use shardcache_client::samples::{Format, SampleIndex};

use crate::{Client, ShardcacheError};

/// The format named by Python's `format=` and its options.
pub(crate) fn format(
    name: &str,
    record_size: Option<u64>,
    seq_len: Option<u64>,
    dtype: Option<String>,
) -> PyResult<Format> {
    let missing = |what: &str| ShardcacheError::new_err(format!("format={name:?} needs {what}="));
    Ok(match name {
        "records" => Format::Records { record_size: record_size.ok_or_else(|| missing("record_size"))? },
        "megatron" => Format::Megatron,
        "tokens" => Format::Tokens { seq_len: seq_len.ok_or_else(|| missing("seq_len"))?, dtype },
        other => {
            return Err(ShardcacheError::new_err(format!(
                "format={other:?}: give \"records\", \"megatron\" or \"tokens\""
            )));
        }
    })
}

/// A dataset's samples: how many in each shard, and their bytes on request. Made by
/// `Client.samples`; reads go through that client (its job tag, its connections).
#[pyclass(module = "shardcache._native", frozen)]
pub(crate) struct Samples {
    pub(crate) client: Py<Client>,
    pub(crate) index: Arc<SampleIndex>,
}

#[pymethods]
impl Samples {
    /// The shards, in the order samples are numbered.
    #[getter]
    fn shards(&self) -> Vec<String> {
        self.index.shards().to_vec()
    }

    /// Samples per shard.
    #[getter]
    fn counts(&self) -> Vec<u64> {
        self.index.counts()
    }

    /// The numpy dtype of the values, where the format says (tokens, Megatron).
    #[getter]
    fn dtype(&self) -> Option<String> {
        self.index.dtype().map(str::to_owned)
    }

    fn __len__(&self) -> usize {
        self.index.len() as usize
    }

    /// The bytes of `samples`, each `(shard number, sample number in the shard)`, in
    /// order, in as few calls as the server's bounds allow.
    fn read<'py>(&self, py: Python<'py>, samples: Vec<(usize, u64)>) -> PyResult<Bound<'py, PyList>> {
        let index = self.index.clone();
        let data = self.client.get().run(py, |c| async move { index.read(&c, &samples).await })?;
        PyList::new(py, data.iter().map(|d| PyBytes::new(py, d)))
    }
}
