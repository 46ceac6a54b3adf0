//! Work shared by concurrent callers: one shard lookup, one chunk fetch, whoever asks.

use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
use tracing::Instrument as _;

use crate::{Error, Result};

/// Runs `job` in its own task, so a caller that goes away does not cancel it for the
/// others sharing it; `done` runs in that task once the job has finished (to take it out
/// of the map that lets callers share it). `what` names the job in a failure.
pub fn spawn_shared<T: Clone + Send + Sync + 'static>(
    what: &'static str,
    job: impl std::future::Future<Output = Result<T>> + Send + 'static,
    done: impl FnOnce() + Send + 'static,
) -> Shared<BoxFuture<'static, Result<T>>> {
    // In the span of the read that started it: a trace shows the fetch under that read.
    let task = tokio::spawn(
        async move {
            let result = job.await;
            done();
            result
        }
        .instrument(tracing::Span::current()),
    );
    async move { task.await.unwrap_or_else(|e| Err(Error::Internal(format!("{what} failed: {e}")))) }
        .boxed()
        .shared()
}
