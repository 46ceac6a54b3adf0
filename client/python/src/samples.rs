//! `Client.samples(...)`: a dataset as samples of any size, indexed from its own format
//! by the Rust SDK (`shardcache_formats`), read in batches.

use std::sync::Arc;

use pyo3::{
    prelude::*,
    types::{PyByteArray, PyBytes, PyDict, PyList},
};
use shardcache_formats::{Fields, Format, SampleIndex, Value};

use crate::{Client, ShardcacheError};

/// The format named by Python's `format=` and its options.
pub(crate) fn format(
    name: &str,
    record_size: Option<u64>,
    seq_len: Option<u64>,
    dtype: Option<String>,
    seed: Option<u32>,
    num_samples: Option<u64>,
) -> PyResult<Format> {
    let missing = |what: &str| ShardcacheError::new_err(format!("format={name:?} needs {what}="));
    Ok(match name {
        // No record_size: the dataset's metadata says (the listing's record_size).
        "records" => Format::Records { record_size: record_size.unwrap_or(0) },
        "megatron" => Format::Megatron,
        // Megatron's default random_seed.
        "megatron-gpt" => Format::MegatronGpt {
            seq_len: seq_len.ok_or_else(|| missing("seq_len"))?,
            seed: seed.unwrap_or(1234),
            num_samples,
        },
        "mds" => Format::Mds,
        "webdataset" => Format::WebDataset,
        "parquet" => Format::Parquet,
        "tokens" => Format::Tokens { seq_len: seq_len.ok_or_else(|| missing("seq_len"))?, dtype },
        other => {
            return Err(ShardcacheError::new_err(format!(
                "format={other:?}: give \"records\", \"megatron\", \"megatron-gpt\", \"mds\", \"webdataset\", \"parquet\" or \"tokens\""
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

    /// The bytes this reader may hold for what it decodes (`Client.samples`'
    /// `memory_budget`, `SHARDCACHE_MEMORY_BUDGET`, or what the process may use).
    #[getter]
    fn memory_budget(&self) -> u64 {
        self.index.budget().limit()
    }

    /// Samples per shard.
    #[getter]
    fn counts(&self) -> Vec<u64> {
        self.index.counts()
    }

    /// What a block shuffle shuffles, `(shard, first sample, samples)` each: every shard
    /// whole, a Parquet file's row groups (each read and decoded whole).
    #[getter]
    fn units(&self) -> Vec<(usize, u64, u64)> {
        self.index.units()
    }

    /// Where each of ``samples`` (``(shard, sample)`` each) is: a list per sample of its
    /// pieces ``(shard, offset, length)`` (one for most formats; a WebDataset sample's
    /// fields; a window of tokens across two shards), what a read of it asks the server
    /// for: what a plan followed sample by sample names. Raises for a format whose
    /// samples are not ranges of its files (MDS shards compressed whole).
    fn pieces(&self, samples: Vec<(usize, u64)>) -> PyResult<Vec<Vec<(usize, u64, u64)>>> {
        samples
            .into_iter()
            .map(|(shard, k)| {
                let pieces = self.index.pieces(shard, k).map_err(crate::to_py)?;
                Ok(pieces.into_iter().map(|p| (p.shard, p.offset, p.length)).collect())
            })
            .collect()
    }

    /// The size of a record (format "records"), else None.
    #[getter]
    fn record_size(&self) -> Option<u64> {
        self.index.record_size()
    }

    /// The numpy dtype of the values, where the format says (tokens, Megatron).
    #[getter]
    fn dtype(&self) -> Option<String> {
        self.index.dtype().map(str::to_owned)
    }

    /// `(name, encoding)` of each column of a sample (MDS; Parquet: its type), else None.
    #[getter]
    fn columns(&self) -> Option<Vec<(String, String)>> {
        self.index.columns().map(|c| c.iter().map(|c| (c.name.clone(), c.encoding.clone())).collect())
    }

    /// One sample's bytes (from `read`) as a dict of its columns (MDS): numbers, str,
    /// bytes, JSON values, numpy arrays (writable); pickled columns only with
    /// `allow_unsafe_types=True` (unpickling runs the writer's code).
    #[pyo3(signature = (data, allow_unsafe_types=false))]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
        allow_unsafe_types: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::no_panic(|| {
            let fields = self.index.decode(&bytes::Bytes::copy_from_slice(data)).map_err(crate::to_py)?;
            columns_dict(py, &fields, allow_unsafe_types)
                .map_err(|e| self.unreadable(py, e, format!("{}/(a sample)", self.index.dataset())))
        })
    }

    /// `samples` read and decoded as `decode` does, without handing their bytes to
    /// Python first (MDS), or Parquet's rows as pyarrow's `to_pylist` gives them (what
    /// the datasets read).
    #[pyo3(signature = (samples, allow_unsafe_types=false))]
    fn read_decoded<'py>(
        &self,
        py: Python<'py>,
        samples: Vec<(usize, u64)>,
        allow_unsafe_types: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let (index, items) = (self.index.clone(), samples.clone());
        let rows = self.client.get().run(py, |c| async move { index.read_decoded(&c, &items).await })?;
        crate::no_panic(|| {
            let out = PyList::empty(py);
            for (fields, &(shard, k)) in rows.iter().zip(&samples) {
                let file = || format!("{}/{} (sample {k})", self.index.dataset(), self.index.shards()[shard]);
                out.append(
                    columns_dict(py, fields, allow_unsafe_types)
                        .map_err(|e| self.unreadable(py, e, file()))?,
                )?;
            }
            Ok(out)
        })
    }

    /// WebDataset samples as webdataset hands them out: dicts of `__key__` and each
    /// field's bytes by extension.
    fn read_fields<'py>(&self, py: Python<'py>, samples: Vec<(usize, u64)>) -> PyResult<Bound<'py, PyList>> {
        let (index, items) = (self.index.clone(), samples.clone());
        let data = self.client.get().run(py, |c| async move { index.read_pieces(&c, &items).await })?;
        let out = PyList::empty(py);
        for (&(shard, k), pieces) in samples.iter().zip(data) {
            let (key, fields) = self.index.fields(shard, k).ok_or_else(|| {
                ShardcacheError::new_err(format!(
                    "dataset {:?} has no fields (not webdataset)",
                    self.index.dataset()
                ))
            })?;
            let sample = PyDict::new(py);
            sample.set_item("__key__", key)?;
            for (field, bytes) in fields.into_iter().zip(pieces) {
                sample.set_item(field, PyBytes::new(py, &bytes))?;
            }
            out.append(sample)?;
        }
        Ok(out)
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

    /// [`read`](Self::read), each sample in a `bytearray`: a buffer a numpy array over it
    /// can write to, so the datasets hand out arrays of the stored dtype without a copy
    /// of their own (`datasets.py`).
    fn read_writable<'py>(
        &self,
        py: Python<'py>,
        samples: Vec<(usize, u64)>,
    ) -> PyResult<Bound<'py, PyList>> {
        let index = self.index.clone();
        let data = self.client.get().run(py, |c| async move { index.read(&c, &samples).await })?;
        PyList::new(py, data.iter().map(|d| PyByteArray::new(py, d)))
    }
}

impl Samples {
    /// A value of `file` Python refused to make (JSON that is not JSON, a date past year
    /// 9999, an array whose shape does not hold its values) as the damaged file it is:
    /// `ShardcacheError` INVALID_ARGUMENT naming the file, not Python's own exception from
    /// deep inside a read. The SDK's own errors (a pickle without consent) pass as they are.
    fn unreadable(&self, py: Python<'_>, err: PyErr, file: String) -> PyErr {
        if err.is_instance_of::<ShardcacheError>(py) {
            return err;
        }
        crate::to_py(shardcache_client::Error::Damaged { file, offset: None, what: err.to_string() })
    }
}

/// A sample's columns as a Python dict; a value Python refuses is an error naming its
/// column.
fn columns_dict<'py>(
    py: Python<'py>,
    fields: &Fields,
    allow_unsafe_types: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (name, value) in fields {
        let value = object(py, name, value, allow_unsafe_types).map_err(|e| {
            match e.is_instance_of::<ShardcacheError>(py) {
                true => e,
                false => pyo3::exceptions::PyValueError::new_err(format!("column {name}: {e}")),
            }
        })?;
        out.set_item(name, value)?;
    }
    Ok(out)
}

/// One value as Python's: numbers, str, bytes, None, JSON values, numpy arrays (one
/// copy of their bytes, writable), lists, dicts, `(key, value)` pairs of a map,
/// `datetime` dates, times and datetimes (UTC-aware where the column says), `Decimal`.
fn object<'py>(
    py: Python<'py>,
    name: &str,
    value: &Value,
    allow_unsafe_types: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let each = |v: &Value| object(py, name, v, allow_unsafe_types);
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(v) => v.into_pyobject(py)?.to_owned().into_any(),
        Value::Int(v) => v.into_pyobject(py)?.into_any(),
        Value::UInt(v) => v.into_pyobject(py)?.into_any(),
        Value::Float(v) => v.into_pyobject(py)?.into_any(),
        Value::Str(v) => v.into_pyobject(py)?.into_any(),
        Value::Bytes(v) => PyBytes::new(py, v).into_any(),
        Value::Json(text) => py.import("json")?.call_method1("loads", (text,))?,
        Value::Pickle(_) if !allow_unsafe_types => {
            return Err(ShardcacheError::new_err(format!(
                "column {name} is pickled: unpickling runs code from whoever wrote the dataset; pass \
                 allow_unsafe_types=True if you trust them"
            )));
        }
        Value::Pickle(v) => py.import("pickle")?.call_method1("loads", (PyBytes::new(py, v),))?,
        Value::NdArray { dtype, shape, data } => {
            let buffer = PyByteArray::new(py, data);
            let array = py.import("numpy")?.call_method1("frombuffer", (buffer, dtype))?;
            array.call_method1("reshape", (shape.clone(),))?
        }
        Value::List(items) => {
            PyList::new(py, items.iter().map(each).collect::<PyResult<Vec<_>>>()?)?.into_any()
        }
        Value::Struct(fields) => columns_dict(py, fields, allow_unsafe_types)?.into_any(),
        Value::Map(entries) => {
            let pairs =
                entries.iter().map(|(k, v)| Ok((each(k)?, each(v)?))).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, pairs)?.into_any()
        }
        Value::Date(days) => {
            // date.fromordinal counts from 0001-01-01 as day 1; 1970-01-01 is 719163.
            let ordinal = 719_163 + i64::from(*days);
            py.import("datetime")?.getattr("date")?.call_method1("fromordinal", (ordinal,))?
        }
        Value::Time { micros } => {
            let (s, us) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
            py.import("datetime")?.getattr("time")?.call1((s / 3600, s / 60 % 60, s % 60, us))?
        }
        Value::Timestamp { micros, utc } => {
            let datetime = py.import("datetime")?;
            let epoch = match utc {
                true => datetime.getattr("datetime")?.call1((
                    1970,
                    1,
                    1,
                    0,
                    0,
                    0,
                    0,
                    datetime.getattr("timezone")?.getattr("utc")?,
                ))?,
                false => datetime.getattr("datetime")?.call1((1970, 1, 1))?,
            };
            let delta = datetime.getattr("timedelta")?.call1((0, 0, *micros))?;
            epoch.call_method1("__add__", (delta,))?
        }
        Value::Decimal(digits) => py.import("decimal")?.getattr("Decimal")?.call1((digits,))?,
    })
}
