//! `shardcache._native`: the Rust client SDK for Python (PyO3, abi3).
//!
//! - Every call releases the GIL while it waits on the network, so DataLoader threads and
//!   other Python work run meanwhile.
//! - One tokio runtime per process, made on first use (`process.rs`). A forked
//!   DataLoader worker inherits a copy of the parent's runtime without its threads, so
//!   the runtime and every connection are keyed by process id and made again in the child.
//! - Traces (`traces.rs`): with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the SDK's calls are
//!   exported as spans, the parents of the servers' spans.
//! - Errors are `ShardcacheError` with `.code` (the gRPC code, e.g. `"NOT_FOUND"`) and
//!   `.message`; bytes handed out have passed the SDK's CRC32C, offset and version checks.

mod budget;
mod client;
mod dicts;
mod errors;
mod order;
mod process;
mod samples;
mod stream;
mod traces;

use pyo3::prelude::*;

use client::Client;
pub(crate) use errors::{ShardcacheError, no_panic, to_py};
pub(crate) use process::runtime;
use stream::ShardReader;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<ShardReader>()?;
    m.add_class::<samples::Samples>()?;
    m.add_class::<order::Permutation>()?;
    m.add_class::<order::SamplerOrder>()?;
    m.add("ShardcacheError", m.py().get_type::<ShardcacheError>())?;
    m.add_function(wrap_pyfunction!(process::flush_traces, m)?)?;
    Ok(())
}
