//! `Client.stream`'s iterator over a range's verified chunks.

use std::sync::{Arc, Mutex};

use pyo3::{prelude::*, types::PyBytes};
use shardcache_client::ShardStream;
use tokio::runtime::Runtime;

use crate::to_py;

/// What `Client.stream` returns: iterate it for the range's chunks (`bytes`), each
/// verified; a failure mid-way resumes from the next byte on another connection or
/// member, or raises `ShardcacheError`.
#[pyclass(module = "shardcache._native", frozen)]
pub(crate) struct ShardReader {
    pub(crate) runtime: Arc<Runtime>,
    /// `None` once the range has been read.
    pub(crate) stream: Mutex<Option<ShardStream>>,
}

#[pymethods]
impl ShardReader {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let mut slot = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let Some(stream) = slot.as_mut() else { return Ok(None) };
        let runtime = &self.runtime;
        match py.detach(|| runtime.block_on(stream.next_chunk())).map_err(to_py)? {
            Some(chunk) => Ok(Some(PyBytes::new(py, &chunk.data))),
            None => {
                *slot = None;
                Ok(None)
            }
        }
    }
}
