//! The memory budget a `Client.samples` reader gets when none is given: the SDK's
//! (`shardcache_formats::budget::for_process`), divided between a DataLoader's processes,
//! and logged to Python's logging.

use pyo3::prelude::*;
use shardcache_formats::Budget;

/// `SHARDCACHE_MEMORY_BUDGET`'s budget, else what this process may use beside the
/// DataLoader processes that share its machine; logged for `dataset`.
pub(crate) fn default_budget(py: Python<'_>, dataset: &str) -> Result<Budget, shardcache_client::Error> {
    let budget = Budget::from_env_sharing(dataloader_processes(py))?;
    log_info(py, &format!("{dataset}: memory budget {} bytes", budget.limit()));
    Ok(budget)
}

/// The processes sharing this machine's memory with this one, as the budget divides it:
/// inside a DataLoader worker, its workers and the main process; else 1. Asks torch only
/// when it is already imported (a worker is started by torch).
fn dataloader_processes(py: Python<'_>) -> u64 {
    let workers = || -> PyResult<Option<u64>> {
        let modules = py.import("sys")?.getattr("modules")?;
        if !modules.contains("torch.utils.data")? {
            return Ok(None);
        }
        let info = py.import("torch.utils.data")?.call_method0("get_worker_info")?;
        match info.is_none() {
            true => Ok(None),
            false => Ok(Some(info.getattr("num_workers")?.extract()?)),
        }
    };
    workers().ok().flatten().map_or(1, |workers| workers + 1)
}

/// `message` to Python's logger "shardcache" at INFO (shown where the trainer's logging
/// shows INFO); a logging failure is not the read's.
fn log_info(py: Python<'_>, message: &str) {
    let _ = py
        .import("logging")
        .and_then(|logging| logging.call_method1("getLogger", ("shardcache",)))
        .and_then(|logger| logger.call_method1("info", (message,)));
}
