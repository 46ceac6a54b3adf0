//! `shardcache._native.Client`: a connection to a hub, a spoke or a group, made again in
//! a forked process (`process.rs`), with every call of the Python SDK's: listings,
//! stats, verified reads of ranges, batches and samples, streams, cache control, plans
//! and the steps a training loop reports.

use std::sync::{Arc, Mutex};

use pyo3::{
    prelude::*,
    types::{PyBytes, PyDict, PyList},
};
use shardcache_client::{
    CacheClient, Client as RustClient, ConnectOptions, Error, PlannedEpoch, PlannedSample, Range,
};
use shardcache_formats::{Budget, SampleIndex};
use shardcache_proto::v1::StepReport;
use shardcache_transport::tls::ClientTlsFiles;
use tokio::runtime::Runtime;

use crate::{
    ShardcacheError,
    dicts::{job_report_dict, shard_dict},
    no_panic, runtime, samples,
    stream::ShardReader,
    to_py,
};

/// A connection made in one process.
struct Connected {
    pid: u32,
    reader: RustClient,
    control: Option<CacheClient>,
}

/// A client of a shardcache hub or spoke (`endpoint` like `http://127.0.0.1:7071`,
/// `https://...` for TLS). Cheap to share between threads; safe across `fork`.
#[pyclass(module = "shardcache._native", frozen)]
pub(crate) struct Client {
    endpoint: String,
    options: ConnectOptions,
    connected: Mutex<Option<Connected>>,
    /// The job and epoch reads say they are for (`set_job`).
    job: Mutex<Option<(String, u64)>>,
}

impl Client {
    /// Runs `work` on the runtime with the GIL released.
    pub(crate) fn run<T: Send, F>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(RustClient) -> F + Send,
    ) -> PyResult<T>
    where
        F: std::future::Future<Output = Result<T, Error>> + Send,
    {
        let runtime = runtime()?;
        let mut reader = self.reader(py, &runtime)?;
        if let Some((job, epoch)) = self.job.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            reader = reader.for_job(job, *epoch).map_err(to_py)?;
        }
        py.detach(|| no_panic(|| runtime.block_on(work(reader)).map_err(to_py)))
    }

    fn reader(&self, py: Python<'_>, runtime: &Runtime) -> PyResult<RustClient> {
        let mut slot = self.connected.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if let Some(c) = slot.as_ref().filter(|c| c.pid == pid) {
            return Ok(c.reader.clone());
        }
        let (endpoint, options) = (&self.endpoint, &self.options);
        let reader =
            py.detach(|| runtime.block_on(RustClient::connect_with(endpoint, options))).map_err(to_py)?;
        *slot = Some(Connected { pid, reader: reader.clone(), control: None });
        Ok(reader)
    }

    fn control(&self, py: Python<'_>, runtime: &Runtime) -> PyResult<CacheClient> {
        self.reader(py, runtime)?;
        let mut slot = self.connected.lock().unwrap_or_else(|p| p.into_inner());
        let connected = slot.as_mut().ok_or_else(|| ShardcacheError::new_err("not connected"))?;
        if let Some(control) = &connected.control {
            return Ok(control.clone());
        }
        let (endpoint, options) = (&self.endpoint, &self.options);
        let control =
            py.detach(|| runtime.block_on(CacheClient::connect_with(endpoint, options))).map_err(to_py)?;
        connected.control = Some(control.clone());
        Ok(control)
    }
}

#[pymethods]
impl Client {
    /// Each argument left out falls back to the CLI's environment variable
    /// (`SHARDCACHE_ENDPOINT`, `SHARDCACHE_TOKEN_FILE`, `SHARDCACHE_CA`, `SHARDCACHE_CERT`,
    /// `SHARDCACHE_KEY`, `SHARDCACHE_TLS_DOMAIN`), so a script and the CLI take the same
    /// settings. `token_file` is read as the CLI reads it (its trailing newline is fine; a
    /// file every user can read is refused); `token` takes the secret itself.
    #[new]
    #[pyo3(signature = (endpoint=None, token=None, ca=None, cert=None, key=None, tls_domain=None, token_file=None))]
    fn new(
        endpoint: Option<String>,
        token: Option<String>,
        ca: Option<String>,
        cert: Option<String>,
        key: Option<String>,
        tls_domain: Option<String>,
        token_file: Option<String>,
    ) -> PyResult<Self> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let endpoint = endpoint.or_else(|| env("SHARDCACHE_ENDPOINT")).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(
                "no endpoint: pass Client(\"http://HOST:7071\") or set SHARDCACHE_ENDPOINT",
            )
        })?;
        let token = match (token, token_file.or_else(|| env("SHARDCACHE_TOKEN_FILE"))) {
            (Some(_), Some(_)) => {
                return Err(pyo3::exceptions::PyValueError::new_err("pass token or token_file, not both"));
            }
            (Some(token), None) => Some(token),
            (None, Some(file)) => Some(
                shardcache_transport::credentials::read_token_file(std::path::Path::new(&file))
                    .map_err(pyo3::exceptions::PyValueError::new_err)?,
            ),
            (None, None) => None,
        };
        let (ca, cert, key, tls_domain) = (
            ca.or_else(|| env("SHARDCACHE_CA")),
            cert.or_else(|| env("SHARDCACHE_CERT")),
            key.or_else(|| env("SHARDCACHE_KEY")),
            tls_domain.or_else(|| env("SHARDCACHE_TLS_DOMAIN")),
        );
        let tls = (ca.is_some() || cert.is_some() || tls_domain.is_some()).then(|| ClientTlsFiles {
            ca: ca.map(Into::into),
            cert: cert.map(Into::into),
            key: key.map(Into::into),
            domain: tls_domain,
        });
        Ok(Self {
            endpoint,
            options: ConnectOptions { tls, token },
            connected: Mutex::new(None),
            job: Mutex::new(None),
        })
    }

    /// Reads from now on say they are for ``job``'s ``epoch`` (a spoke reports reads,
    /// hits and hub bytes per job and epoch in ``status()["jobs"]``); ``None`` stops.
    #[pyo3(signature = (job, epoch=0))]
    fn set_job(&self, job: Option<String>, epoch: u64) -> PyResult<()> {
        if let Some(job) = &job {
            shardcache_proto::job_headers::check_job_name(job)
                .map_err(pyo3::exceptions::PyValueError::new_err)?;
        }
        *self.job.lock().unwrap_or_else(|p| p.into_inner()) = job.map(|job| (job, epoch));
        Ok(())
    }

    #[getter]
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn __repr__(&self) -> String {
        format!("Client({:?})", self.endpoint)
    }

    /// Datasets (no argument) or the shards of `dataset`, as dicts.
    #[pyo3(signature = (dataset=None))]
    fn ls<'py>(&self, py: Python<'py>, dataset: Option<String>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        match dataset {
            None => {
                for d in self.run(py, |c| async move { c.list_datasets().await })? {
                    let item = PyDict::new(py);
                    item.set_item("name", &d.name)?;
                    item.set_item("shard_count", d.shard_count)?;
                    item.set_item("total_bytes", d.total_bytes)?;
                    item.set_item("record_size", d.record_size)?;
                    list.append(item)?;
                }
            }
            Some(dataset) => {
                for s in self.run(py, |c| async move { c.list_shards(&dataset).await })? {
                    list.append(shard_dict(py, &s)?)?;
                }
            }
        }
        Ok(list)
    }

    /// Size, version, chunk and record size of one shard.
    fn stat<'py>(&self, py: Python<'py>, dataset: String, shard: String) -> PyResult<Bound<'py, PyDict>> {
        let info = self.run(py, |c| async move { c.stat(&dataset, &shard).await })?;
        shard_dict(py, &info)
    }

    /// `length` bytes of `shard` from `offset`, verified.
    fn read<'py>(
        &self,
        py: Python<'py>,
        dataset: String,
        shard: String,
        offset: u64,
        length: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let range = Range::new(dataset, shard, offset, length);
        let data = self.run(py, |c| async move { c.read_range(&range).await })?;
        Ok(PyBytes::new(py, &data.data))
    }

    /// `[offset, offset + length)` of a shard (to its end when `length` is None) as an
    /// iterator of verified chunks of the server's message size: constant memory for a
    /// range of any size, where `read` is bounded by the server's `--max-read`.
    #[pyo3(signature = (dataset, shard, offset=0, length=None))]
    fn stream(
        &self,
        py: Python<'_>,
        dataset: String,
        shard: String,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<ShardReader> {
        let stream =
            self.run(py, |c| async move { c.stream_shard(&dataset, &shard, offset, length).await })?;
        Ok(ShardReader { runtime: runtime()?, stream: Mutex::new(Some(stream)) })
    }

    /// `dataset` as samples of any size, indexed from its format: `"records"` (fixed
    /// `record_size`), `"megatron"` (PREFIX.bin + PREFIX.idx: one sample per sequence),
    /// `"megatron-gpt"` (one such dataset packed as Megatron's GPTDataset packs it:
    /// `seq_len`, `seed` its random_seed, 1234 by default, `num_samples`), `"mds"`,
    /// `"webdataset"`, `"parquet"` (a sample per row) or `"tokens"` (.npy files, or raw files of `dtype`: windows of `seq_len + 1` tokens
    /// every `seq_len`). `memory_budget`: the bytes the reader may hold for what it
    /// decodes from the files (decompressed MDS shards, decoded Parquet row groups, the
    /// index); `SHARDCACHE_MEMORY_BUDGET`, else what this process may use (an eighth of
    /// its address-space limit, half its cgroup's or the machine's memory shared with a
    /// DataLoader's workers, 4 GiB at most), logged and kept as `Samples.memory_budget`.
    /// A damaged file raises
    /// `ShardcacheError` (`INVALID_ARGUMENT`, naming the file and byte); one that needs
    /// more than the budget, `RESOURCE_EXHAUSTED`.
    #[pyo3(signature = (dataset, format="records", record_size=None, seq_len=None, dtype=None, seed=None, num_samples=None, memory_budget=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn samples(
        slf: Bound<'_, Self>,
        dataset: String,
        format: &str,
        record_size: Option<u64>,
        seq_len: Option<u64>,
        dtype: Option<String>,
        seed: Option<u32>,
        num_samples: Option<u64>,
        memory_budget: Option<u64>,
    ) -> PyResult<samples::Samples> {
        let format = samples::format(format, record_size, seq_len, dtype, seed, num_samples)?;
        let budget = match memory_budget {
            Some(bytes) => Budget::new(bytes),
            None => crate::budget::default_budget(slf.py(), &dataset).map_err(to_py)?,
        };
        let index = slf
            .get()
            .run(slf.py(), |c| async move { SampleIndex::open_with(&c, &dataset, &format, budget).await })?;
        Ok(samples::Samples { client: slf.unbind(), index: Arc::new(index) })
    }

    /// A batch of `(dataset, shard, offset, length)` ranges in one round trip; the
    /// results in the same order.
    fn read_many<'py>(
        &self,
        py: Python<'py>,
        ranges: Vec<(String, String, u64, u64)>,
    ) -> PyResult<Bound<'py, PyList>> {
        let ranges: Vec<Range> = ranges.into_iter().map(|(d, s, o, l)| Range::new(d, s, o, l)).collect();
        let chunks = self.run(py, |c| async move { c.read_ranges(&ranges).await })?;
        PyList::new(py, chunks.iter().map(|c| PyBytes::new(py, &c.data)))
    }

    /// Asks a spoke to fetch `shards` of `dataset` (all when None) in this order. With
    /// `wait`, returns the final progress; without, returns at once while it runs.
    #[pyo3(signature = (dataset, shards=None, parallelism=0, wait=true))]
    fn prefetch<'py>(
        &self,
        py: Python<'py>,
        dataset: String,
        shards: Option<Vec<String>>,
        parallelism: u32,
        wait: bool,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let runtime = runtime()?;
        let control = self.control(py, &runtime)?;
        let shards = shards.unwrap_or_default();
        let fetch = async move { control.prefetch(&dataset, &shards, parallelism).await?.finish().await };
        if !wait {
            runtime.spawn(async move {
                if let Err(error) = fetch.await {
                    eprintln!("shardcache: background prefetch failed: {error}");
                }
            });
            return Ok(None);
        }
        let progress = py.detach(|| runtime.block_on(fetch)).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("shards_done", progress.shards_done)?;
        d.set_item("shards_total", progress.shards_total)?;
        d.set_item("bytes_done", progress.bytes_done)?;
        d.set_item("bytes_total", progress.bytes_total)?;
        d.set_item("bytes_fetched", progress.bytes_fetched)?;
        Ok(Some(d))
    }

    /// Tells a spoke the order in which ``job`` will read shards of ``dataset``: one
    /// shard list per epoch from ``epoch`` on (the rest of this one, then the next), in
    /// the order of their first reads, so a cache smaller than the data evicts what is
    /// read again furthest away and prefetches what is read next. ``until`` (one list
    /// per epoch, or None) gives for each shard the index of the last shard first read
    /// before its own last read (shards read together, as under a block shuffle).
    /// Returns the distinct shards the plan names; an empty ``epochs`` withdraws it.
    #[pyo3(signature = (job, epoch, dataset, epochs, until=None))]
    fn set_plan(
        &self,
        py: Python<'_>,
        job: String,
        epoch: u64,
        dataset: String,
        epochs: Vec<Vec<String>>,
        until: Option<Vec<Vec<u32>>>,
    ) -> PyResult<u64> {
        let epochs = planned_epochs(epochs, until);
        let runtime = runtime()?;
        let control = self.control(py, &runtime)?;
        py.detach(|| runtime.block_on(control.set_plan(&job, epoch, &dataset, &epochs))).map_err(to_py)
    }

    /// ``set_plan``, answering a dict: ``shards`` (the distinct shards the plan names) and
    /// ``samples`` (True: a block of it does not fit the spoke's cache, so the spoke
    /// follows it sample by sample: send its samples with ``plan_samples``).
    #[pyo3(signature = (job, epoch, dataset, epochs, until=None))]
    fn plan<'py>(
        &self,
        py: Python<'py>,
        job: String,
        epoch: u64,
        dataset: String,
        epochs: Vec<Vec<String>>,
        until: Option<Vec<Vec<u32>>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let epochs = planned_epochs(epochs, until);
        let runtime = runtime()?;
        let control = self.control(py, &runtime)?;
        let answer =
            py.detach(|| runtime.block_on(control.plan(&job, epoch, &dataset, &epochs))).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("shards", answer.shards)?;
        d.set_item("samples", answer.samples)?;
        Ok(d)
    }

    /// Tells a spoke ``job``'s next reads of ``dataset`` sample by sample: ``reads`` are
    /// ``(position, shard, offset, length, next_use)`` (positions counted across epochs
    /// of ``epoch_samples`` samples; ``next_use`` the position of the sample's next read,
    /// or None). The spoke fetches the nearest ahead, holds them until read and keeps
    /// those read again. Answers a dict: ``planned`` (reads it holds in the plan) and
    /// ``window_bytes`` (how far ahead it fetches).
    fn plan_samples<'py>(
        &self,
        py: Python<'py>,
        job: String,
        dataset: String,
        epoch_samples: u64,
        reads: Vec<(u64, String, u64, u64, Option<u64>)>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let reads: Vec<PlannedSample> = reads
            .into_iter()
            .map(|(position, shard, offset, length, next_use)| PlannedSample {
                position,
                shard,
                offset,
                length,
                next_use,
            })
            .collect();
        let runtime = runtime()?;
        let control = self.control(py, &runtime)?;
        let answer = py
            .detach(|| runtime.block_on(control.plan_samples(&job, &dataset, epoch_samples, &reads)))
            .map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("planned", answer.planned)?;
        d.set_item("window_bytes", answer.window_bytes)?;
        Ok(d)
    }

    /// A spoke's occupancy and per-dataset counters.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let runtime = runtime()?;
        let control = self.control(py, &runtime)?;
        let status = py.detach(|| runtime.block_on(control.status())).map_err(to_py)?;
        crate::dicts::status_dict(py, status)
    }

    /// Sends one rank's step timings of ``job`` (what ``shardcache.StepTimer`` measured):
    /// batches from ``first_batch`` of ``epoch``, each with the microseconds the loop
    /// waited for it, worked after it, and its samples; ``started_ms``: when the loop asked
    /// for the first (ms since the Unix epoch, 0 unknown). Every member of a group takes it.
    #[allow(clippy::too_many_arguments)] // the report's fields, as the Python timer holds them
    #[pyo3(signature = (job, rank, ranks, epoch, first_batch, wait_us, busy_us, samples, started_ms=0))]
    fn report_steps(
        &self,
        py: Python<'_>,
        job: String,
        rank: u32,
        ranks: u32,
        epoch: u64,
        first_batch: u64,
        wait_us: Vec<u32>,
        busy_us: Vec<u32>,
        samples: Vec<u32>,
        started_ms: u64,
    ) -> PyResult<()> {
        let report =
            StepReport { job, rank, ranks, epoch, first_batch, wait_us, busy_us, samples, started_ms };
        let runtime = runtime()?;
        let control = self.control(py, &runtime)?;
        py.detach(|| runtime.block_on(control.report_steps(report))).map_err(to_py)
    }

    /// ``job``'s own table on the spoke (a group's members' merged): a dict with
    /// ``principal``, ``job``, ``ranks``, ``members``, ``phases`` (one dict a phase in the
    /// columns of ``shardcache report``), ``timeline`` (steps by wall clock) and
    /// ``markdown``. ``principal``: another's job, for an operator's token.
    #[pyo3(signature = (job, principal=String::new()))]
    fn report<'py>(&self, py: Python<'py>, job: String, principal: String) -> PyResult<Bound<'py, PyDict>> {
        let runtime = runtime()?;
        let control = self.control(py, &runtime)?;
        let table = py.detach(|| runtime.block_on(control.job_report(&job, &principal))).map_err(to_py)?;
        job_report_dict(py, &table)
    }

    /// The Rust SDK's own time for `rounds` x `read_many(ranges)`, with no Python in the
    /// loop: the baseline of the Python-vs-Rust benchmark (seconds).
    fn _bench_read_many(
        &self,
        py: Python<'_>,
        ranges: Vec<(String, String, u64, u64)>,
        rounds: u32,
    ) -> PyResult<f64> {
        let ranges: Vec<Range> = ranges.into_iter().map(|(d, s, o, l)| Range::new(d, s, o, l)).collect();
        self.run(py, |c| async move {
            let started = std::time::Instant::now();
            for _ in 0..rounds {
                c.read_ranges(&ranges).await?;
            }
            Ok(started.elapsed().as_secs_f64())
        })
    }
}

/// A plan's epochs as Python gives them: one shard list each, and (or not) one `until`
/// list each.
fn planned_epochs(epochs: Vec<Vec<String>>, until: Option<Vec<Vec<u32>>>) -> Vec<PlannedEpoch> {
    let mut until = until.unwrap_or_default().into_iter();
    epochs
        .into_iter()
        .map(|shards| PlannedEpoch { shards, until: until.next().unwrap_or_default() })
        .collect()
}
