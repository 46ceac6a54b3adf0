//! When the hub cannot answer a revalidation, cached data stays served.
//!
//! A cached shard's version is checked with the hub after `--revalidate-after`. If the
//! hub cannot answer (unreachable, hung, overloaded, refusing the spoke's credentials,
//! garbled), the cached version is served: the spoke holds verified bytes of a version
//! the hub once served, which is what a cache is for. Only the hub's definitive answers
//! change what is served: a new version (refetched), or the shard no longer existing.
//!
//! While the hub cannot answer, revalidation backs off (the SDK's `routing::Backoff`: 1 s,
//! doubling to 30 s): reads of cached shards do not ask again in between, so they do not
//! each wait for a dead hub, and the log gets one line per attempt rather than one per
//! read. A reader never waits longer than [`REVALIDATION_WAIT`] for a revalidation,
//! whatever `--hub-timeout` is.

use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use shardcache_routing::Backoff;

use crate::Error;

/// Longest a read of a cached shard waits for its revalidation before it is served the
/// cached version (the revalidation carries on, bounded by `--hub-timeout`). Across a
/// 60 ms link a StatShard takes ~60 ms; a hub that needs more than 2 s is in trouble.
pub const REVALIDATION_WAIT: Duration = Duration::from_secs(2);

/// Whether the hub answers revalidations, and when to ask it again.
#[derive(Debug, Default)]
pub struct Revalidation {
    /// Failures in a row (0: the last one was answered), for the log.
    failures: AtomicU64,
    /// No revalidation while paused (the project's one backoff: 1 s doubling to 30 s).
    backoff: Backoff,
}

impl Revalidation {
    /// True while revalidations are paused after failures: serve what is cached.
    pub fn paused(&self) -> bool {
        self.backoff.paused()
    }

    /// The hub answered (whatever it said).
    pub fn answered(&self) {
        self.backoff.reset();
        if self.failures.swap(0, Relaxed) > 0 {
            tracing::info!("the hub answers revalidations again");
        }
    }

    /// The hub could not answer (`why`): pause, longer each time in a row.
    pub fn failed(&self, why: &dyn std::fmt::Display) {
        let failures = self.failures.fetch_add(1, Relaxed) + 1;
        let pause = self.backoff.fail();
        // One line per attempt, and attempts are paused: rate-limited by the backoff.
        tracing::warn!(error = %why, failures, next_attempt_in = ?pause, "cannot revalidate with the hub: serving cached versions");
    }
}

impl Error {
    /// The hub could not answer (as opposed to answering "not found" or "bad request"):
    /// unreachable, hung, overloaded, refusing the spoke, or garbled.
    pub fn hub_cannot_answer(&self) -> bool {
        use tonic::Code;
        match self {
            Error::HubUnavailable { .. } | Error::HubRefused { .. } | Error::HubCorrupt { .. } => true,
            Error::Hub { code, .. } => !matches!(
                code,
                Code::NotFound
                    | Code::InvalidArgument
                    | Code::OutOfRange
                    | Code::Aborted
                    | Code::FailedPrecondition
            ),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_pause_revalidation_and_an_answer_ends_the_pause() {
        let revalidation = Revalidation::default();
        assert!(!revalidation.paused());
        revalidation.failed(&"down");
        assert!(revalidation.paused());
        for _ in 0..10 {
            revalidation.failed(&"down");
        }
        assert_eq!(revalidation.failures.load(Relaxed), 11);
        revalidation.answered();
        assert!(!revalidation.paused());
    }
}
