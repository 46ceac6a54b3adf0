//! Configuration read from files that operators rotate without a restart: certificates,
//! keys, client CAs and token files.
//!
//! [`Reloading`] holds the current value built from a set of files and reloads it when
//! the files' *contents* change (checked every [`RELOAD_POLL`]) or the process gets
//! SIGHUP. Contents rather than mtimes: Kubernetes rotates a mounted secret by swapping
//! a symlink, and a rewrite within one filesystem tick keeps the mtime. A reload that
//! fails (a half-written key, a cert without its key) keeps the old value and logs why,
//! so a botched rotation never takes a server down; [`Reloading::failure`] says that the
//! files no longer load, for values that must fail closed instead (a token file: a
//! revocation must not be undone by breaking the file). Connections and requests already
//! in progress keep what they started with; only new ones see the new value.

use std::{
    fmt,
    path::PathBuf,
    sync::{Arc, RwLock, Weak},
    time::Duration,
};

/// How often the files are compared with what was loaded. A rotation takes effect
/// within this; reading a few KiB of PEM every 2 s costs nothing measurable.
pub const RELOAD_POLL: Duration = Duration::from_secs(2);

type Loader<T> = dyn Fn() -> Result<T, String> + Send + Sync;

/// A value built from files, rebuilt when they change. Cheap to clone.
pub struct Reloading<T> {
    current: Arc<RwLock<Arc<T>>>,
    /// Why the files stopped loading, while they do not (cleared by the next good load).
    failure: Arc<RwLock<Option<String>>>,
}

impl<T> Clone for Reloading<T> {
    fn clone(&self) -> Self {
        Self { current: self.current.clone(), failure: self.failure.clone() }
    }
}

impl<T> fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading").finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static> Reloading<T> {
    /// Builds the value with `load` (an error here is the caller's to report: a server
    /// must not start with a broken certificate) and, inside a tokio runtime, watches
    /// `files` until the last clone is dropped. `what` names the value in logs.
    pub fn watch(
        what: &str,
        files: Vec<PathBuf>,
        load: impl Fn() -> Result<T, String> + Send + Sync + 'static,
    ) -> Result<Self, String> {
        let seen = fingerprint(&files);
        let current = Arc::new(RwLock::new(Arc::new(load()?)));
        let failure = Arc::new(RwLock::new(None));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let watched = Watcher {
                what: what.to_owned(),
                files,
                load: Box::new(load),
                current: Arc::downgrade(&current),
                failure: failure.clone(),
                seen,
            };
            runtime.spawn(watched.run());
        }
        Ok(Self { current, failure })
    }

    /// A value that never changes (tests, and values not read from files).
    pub fn fixed(value: T) -> Self {
        Self { current: Arc::new(RwLock::new(Arc::new(value))), failure: Arc::default() }
    }

    /// Why the files no longer load (the value is then the last one that did), or
    /// `None` while they do.
    pub fn failure(&self) -> Option<String> {
        self.failure.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The value now.
    pub fn get(&self) -> Arc<T> {
        // A poisoned lock only means a panic while swapping an Arc: the Arc is whole.
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

struct Watcher<T> {
    what: String,
    files: Vec<PathBuf>,
    load: Box<Loader<T>>,
    current: Weak<RwLock<Arc<T>>>,
    failure: Arc<RwLock<Option<String>>>,
    seen: Vec<Option<Vec<u8>>>,
}

impl<T> Watcher<T> {
    async fn run(mut self) {
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            let forced = tokio::select! {
                _ = tokio::time::sleep(RELOAD_POLL) => false,
                Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
            };
            let Some(current) = self.current.upgrade() else { return };
            let now = fingerprint(&self.files);
            if !forced && now == self.seen {
                continue;
            }
            match (self.load)() {
                Ok(value) => {
                    *current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(value);
                    *self.failure.write().unwrap_or_else(|p| p.into_inner()) = None;
                    self.seen = now;
                    tracing::info!(what = %self.what, forced, "reloaded");
                }
                Err(error) => {
                    // Remember the broken contents so the error is logged once, not
                    // every poll; a further change (the fix) triggers a new attempt.
                    self.seen = now;
                    tracing::error!(what = %self.what, %error, "reload failed; keeping the previous version");
                    *self.failure.write().unwrap_or_else(|p| p.into_inner()) = Some(error);
                }
            }
        }
    }
}

/// The files' contents (None: unreadable), compared to notice a change.
fn fingerprint(files: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    files.iter().map(|path| std::fs::read(path).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_changed_file_is_reloaded_and_a_broken_one_keeps_the_old_value() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("value");
        std::fs::write(&path, "1").expect("write");
        let read = {
            let path = path.clone();
            move || {
                let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
                text.trim().parse::<u32>().map_err(|e| format!("{text:?}: {e}"))
            }
        };
        let value = Reloading::watch("test value", vec![path.clone()], read).expect("loads");
        assert_eq!(*value.get(), 1);

        std::fs::write(&path, "not a number").expect("write");
        std::fs::write(dir.path().join("unrelated"), "x").expect("write");
        tokio::time::sleep(RELOAD_POLL * 2).await;
        assert_eq!(*value.get(), 1, "a broken file must not replace a good value");
        assert!(value.failure().is_some_and(|why| why.contains("not a number")), "{:?}", value.failure());

        std::fs::write(&path, "2").expect("write");
        let mut waited = Duration::ZERO;
        while *value.get() != 2 && waited < RELOAD_POLL * 10 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            waited += Duration::from_millis(50);
        }
        assert_eq!(*value.get(), 2);
        assert_eq!(value.failure(), None, "a good load clears the failure");
    }
}
