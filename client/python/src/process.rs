//! What each process makes for itself, and a forked DataLoader worker makes again: its
//! tokio runtime and its trace export. A child inherits a copy of the parent's without
//! their threads, so both are keyed by process id.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use shardcache_transport::telemetry::Telemetry;
use tokio::runtime::Runtime;

use crate::{ShardcacheError, traces};

/// Worker threads of the per-process runtime. Reads are I/O-bound and the GIL is
/// released while they wait; two threads keep a batch's requests and responses moving
/// without competing with DataLoader workers for cores.
const RUNTIME_THREADS: usize = 2;

/// This process's runtime and trace export (`None` unless the environment asks).
struct Process {
    pid: u32,
    runtime: Arc<Runtime>,
    traces: Option<Telemetry>,
}

static PROCESS: Mutex<Option<Process>> = Mutex::new(None);

/// This process's runtime (a new one after a fork, with its own trace export).
pub(crate) fn runtime() -> PyResult<Arc<Runtime>> {
    let mut slot = PROCESS.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some(process) = slot.as_ref()
        && process.pid == pid
    {
        return Ok(process.runtime.clone());
    }
    if let Some(inherited) = slot.take() {
        // Its threads (the runtime's, the exporter's) live only in the parent: dropping
        // it here would wait for them.
        std::mem::forget(inherited);
    }
    let runtime = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("shardcache-io")
            .enable_all()
            .build()
            .map_err(|e| ShardcacheError::new_err(format!("cannot start the I/O runtime: {e}")))?,
    );
    let traces = traces::start(&runtime);
    *slot = Some(Process { pid, runtime: runtime.clone(), traces });
    Ok(runtime)
}

/// Sends the spans this process holds to the collector now (the package calls it at
/// exit); nothing when it exports none.
#[pyfunction]
pub(crate) fn flush_traces(py: Python<'_>) {
    py.detach(|| {
        let slot = PROCESS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Process { pid, traces: Some(traces), .. }) = slot.as_ref()
            && *pid == std::process::id()
        {
            traces.flush();
        }
    });
}
