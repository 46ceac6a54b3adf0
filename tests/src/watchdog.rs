//! Names a test that has run far longer than any should, while its servers are up.
//!
//! A test that hangs holds the whole test binary, and CI, until CI's own limit kills it
//! (stop 45: 85 minutes, and the tail of the log named no test). Every server the
//! harness starts is [`watch`]ed under the name of the test thread that started it
//! (libtest names each test's thread after the test); past [`STALLED`], a line naming
//! the test and how long it has run is printed every [`EVERY`], so the last lines of a
//! killed run say which test it was waiting for. Nothing is stopped: a child server
//! left behind by an abrupt exit could hold CI's pipe open.

use std::{
    collections::BTreeMap,
    io::Write,
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

/// Far beyond the slowest test (about 100 s on a loaded 2-core machine).
pub const STALLED: Duration = Duration::from_secs(600);
/// How often a stalled test is named again.
pub const EVERY: Duration = Duration::from_secs(60);

/// The servers up, by id: the test that started each, and when.
fn running() -> &'static Mutex<BTreeMap<u64, (String, Instant)>> {
    static RUNNING: OnceLock<Mutex<BTreeMap<u64, (String, Instant)>>> = OnceLock::new();
    RUNNING.get_or_init(|| {
        std::thread::Builder::new()
            .name("test-watchdog".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(EVERY);
                    for (test, started) in stalled(STALLED) {
                        // Not `eprintln!`: this thread inherits the output capture of
                        // the test that spawned it, whose captured output libtest has
                        // already taken, so the line would never be printed.
                        let _ = writeln!(
                            std::io::stderr().lock(),
                            "watchdog: test {test} has run for {} s with its servers up: stalled?",
                            started.elapsed().as_secs()
                        );
                    }
                }
            })
            .unwrap();
        Mutex::default()
    })
}

/// The tests (each once, at its oldest server's start) with a server up longer than
/// `limit`.
fn stalled(limit: Duration) -> Vec<(String, Instant)> {
    let running = running().lock().unwrap_or_else(|e| e.into_inner());
    let mut oldest: BTreeMap<&str, Instant> = BTreeMap::new();
    for (test, started) in running.values().filter(|(_, s)| s.elapsed() > limit) {
        let at = oldest.entry(test).or_insert(*started);
        *at = (*at).min(*started);
    }
    oldest.into_iter().map(|(t, s)| (t.to_owned(), s)).collect()
}

/// A server of the current test, watched until dropped (`None`: not started by a test).
#[derive(Debug)]
pub struct Watched(Option<u64>);

/// Watches a server the current test thread starts, until the returned value is dropped.
/// A server started outside a test's thread (a benchmark's `main`, which may run for
/// longer, or an unnamed thread) is not watched.
pub fn watch() -> Watched {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let test = match std::thread::current().name() {
        None | Some("main") => return Watched(None),
        Some(test) => test.to_owned(),
    };
    let id = NEXT.fetch_add(1, Relaxed);
    running().lock().unwrap_or_else(|e| e.into_inner()).insert(id, (test, Instant::now()));
    Watched(Some(id))
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(id) = self.0 {
            running().lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_is_named_once_while_a_server_it_started_is_up() {
        let name = "watchdog::a test that stalls";
        let servers = std::thread::Builder::new()
            .name(name.into())
            .spawn(|| (watch(), watch()))
            .unwrap()
            .join()
            .unwrap();
        let named = |limit| stalled(limit).into_iter().filter(|(t, _)| t == name).count();
        assert_eq!(named(Duration::ZERO), 1, "two servers, one test");
        assert_eq!(named(Duration::from_secs(3600)), 0, "not for an hour yet");
        drop(servers);
        assert_eq!(named(Duration::ZERO), 0, "its servers are down");
        // A benchmark's servers (started on `main`) are not watched.
        let benchmark = std::thread::Builder::new().name("main".into()).spawn(watch).unwrap().join().unwrap();
        assert!(benchmark.0.is_none());
    }
}
