//! Errors as Python sees them: `ShardcacheError` with `.code` (the gRPC code's name) and
//! `.message`, from the SDK's errors and from a panic (a bug), never pyo3's
//! `PanicException`.

use pyo3::{create_exception, exceptions::PyException, prelude::*};
use shardcache_client::Error;

create_exception!(_native, ShardcacheError, PyException, "A failed shardcache call; see .code and .message.");

/// `NotFound` -> `NOT_FOUND`, as gRPC names codes.
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// `err` as `ShardcacheError`, with its gRPC code's name as `.code`.
pub(crate) fn to_py(err: Error) -> PyErr {
    let code = match &err {
        Error::Status { status, .. } => code_name(status.code()),
        Error::Connect { .. } => "UNAVAILABLE".into(),
        Error::VersionChanged { .. } => "ABORTED".into(),
        Error::Checksum { .. } | Error::Protocol { .. } => "DATA_LOSS".into(),
        Error::Config(_) | Error::Endpoint { .. } | Error::Damaged { .. } => "INVALID_ARGUMENT".into(),
        Error::OverBudget { .. } => "RESOURCE_EXHAUSTED".into(),
    };
    let message = err.to_string();
    Python::attach(|py| {
        let err = ShardcacheError::new_err(format!("{code}: {message}"));
        let value = err.value(py);
        // Both are plain attributes; setting them cannot fail on a fresh exception.
        let _ = value.setattr("code", code);
        let _ = value.setattr("message", message);
        err
    })
}

/// `work`'s result, or a panic in it (a bug) as `ShardcacheError` with code `INTERNAL`:
/// pyo3 would raise `PanicException`, a `BaseException` that a trainer's `except
/// Exception` does not catch, from a file a DataLoader worker merely read.
pub(crate) fn no_panic<T>(work: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|payload| {
        let what = shardcache_client::error::panic_message(payload.as_ref());
        let message =
            format!("shardcache failed inside (a bug; please report it with the file read): {what}");
        Python::attach(|py| {
            let err = ShardcacheError::new_err(format!("INTERNAL: {message}"));
            let _ = err.value(py).setattr("code", "INTERNAL");
            let _ = err.value(py).setattr("message", message);
            Err(err)
        })
    })
}
