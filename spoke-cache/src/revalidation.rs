//! When the hub cannot answer a revalidation, cached data stays served.
//!
//! A cached shard's version is checked with the hub after `--revalidate-after`. If the
//! hub cannot answer (unreachable, hung, overloaded, refusing the spoke's credentials,
//! garbled), the cached version is served: the spoke holds verified bytes of a version
//! the hub once served, which is what a cache is for. Only the hub's definitive answers
//! change what is served: a new version (refetched), or the shard no longer existing.
//!
//! While the hub cannot answer, revalidation backs off (1 s, doubling to 30 s): reads of
//! cached shards do not ask again in between, so they do not each wait for a dead hub,
//! and the log gets one line per attempt rather than one per read. A reader never waits
//! longer than [`REVALIDATION_WAIT`] for a revalidation, whatever `--hub-timeout` is.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use crate::Error;

/// Longest a read of a cached shard waits for its revalidation before it is served the
/// cached version (the revalidation carries on, bounded by `--hub-timeout`). Across a
/// 60 ms link a StatShard takes ~60 ms; a hub that needs more than 2 s is in trouble.
pub const REVALIDATION_WAIT: Duration = Duration::from_secs(2);

/// First pause after a failed revalidation, and the longest.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Whether the hub answers revalidations, and when to ask it again.
#[derive(Debug, Default)]
pub struct Revalidation {
    /// Failures in a row (0: the last one was answered).
    failures: AtomicU64,
    /// No revalidation before this.
    paused_until: Mutex<Option<Instant>>,
}

impl Revalidation {
    /// True while revalidations are paused after failures: serve what is cached.
    pub fn paused(&self) -> bool {
        self.paused_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|until| Instant::now() < until)
    }

    /// The hub answered (whatever it said).
    pub fn answered(&self) {
        if self.failures.swap(0, Relaxed) > 0 {
            tracing::info!("the hub answers revalidations again");
        }
        *self.paused_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The hub could not answer (`why`): pause, longer each time in a row.
    pub fn failed(&self, why: &dyn std::fmt::Display) {
        let failures = self.failures.fetch_add(1, Relaxed) + 1;
        let pause = BACKOFF_FIRST.saturating_mul(1 << (failures - 1).min(5)).min(BACKOFF_MAX);
        *self.paused_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + pause);
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
    fn pauses_double_to_a_cap_and_an_answer_ends_them() {
        let revalidation = Revalidation::default();
        assert!(!revalidation.paused());
        revalidation.failed(&"down");
        assert!(revalidation.paused());
        for _ in 0..10 {
            revalidation.failed(&"down");
        }
        let until =
            revalidation.paused_until.lock().unwrap_or_else(|p| p.into_inner()).unwrap_or_else(Instant::now);
        assert!(until <= Instant::now() + BACKOFF_MAX, "the pause is capped");
        assert_eq!(revalidation.failures.load(Relaxed), 11);
        revalidation.answered();
        assert!(!revalidation.paused());
    }
}
