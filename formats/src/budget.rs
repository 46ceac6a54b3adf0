//! The memory a reader may hold for what it makes from a dataset's files: the index's
//! entries, decompressed MDS shards, decoded Parquet row groups, the tar headers a walk
//! holds. One bound per
//! [`SampleIndex`](super::SampleIndex) (`SHARDCACHE_MEMORY_BUDGET`, Python
//! `Client.samples(memory_budget=...)`), taken before anything is allocated for a number a
//! file gave: no file can push a reader past it, and a decompression stops at what it
//! was told, not after.
//!
//! What is held is counted until the last handle of it is dropped ([`Held`] lives in the
//! kept value); a read that needs more than is free first lets go of the values it does
//! not need, then fails with [`Error::OverBudget`](crate::Error::OverBudget).

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use shardcache_proto::units::ByteSize;

use shardcache_client::{Error, Result};

/// The most a default budget is: 4 GiB a process (each DataLoader worker has its own).
/// MosaicML's shards are 64 MiB by default and 4 are kept decompressed; a decoded Parquet
/// row group of 128 MiB takes a few times that as values. Less where the process may use
/// less ([`for_process`]).
pub const DEFAULT_BUDGET: u64 = 4 << 30;

/// The environment variable that sets the budget: bytes, or a size as the servers' flags
/// take it (`512MiB`, `512M`, `8G`; `8GB` is 8 x 10^9).
pub const BUDGET_ENV: &str = "SHARDCACHE_MEMORY_BUDGET";

/// Bytes a reader may hold, and what it holds now.
#[derive(Debug, Clone)]
pub struct Budget {
    limit: u64,
    used: Arc<AtomicU64>,
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(DEFAULT_BUDGET)
    }
}

impl Budget {
    pub fn new(limit: u64) -> Self {
        Self { limit, used: Default::default() }
    }

    /// The budget `SHARDCACHE_MEMORY_BUDGET` gives, else [`for_process`]'s for a process
    /// alone; an error for a value that is not a size.
    pub fn from_env() -> Result<Self> {
        Self::from_env_sharing(1)
    }

    /// [`Budget::from_env`] in one of `sharing` processes that share the machine's memory
    /// (a DataLoader's main process and its workers).
    pub fn from_env_sharing(sharing: u64) -> Result<Self> {
        match std::env::var(BUDGET_ENV) {
            Ok(text) => text
                .parse::<ByteSize>()
                .map(|size| Self::new(size.0))
                .map_err(|e| Error::Config(format!("{BUDGET_ENV}: {e}"))),
            Err(_) => Ok(for_process(sharing)),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// `bytes` taken for `what` (a person's words: "decompressing ds/shard.mds"), or
    /// [`Error::OverBudget`] when they do not fit beside what is held.
    pub fn take(&self, bytes: u64, what: impl FnOnce() -> String) -> Result<Held> {
        match reserve(&self.used, self.limit, bytes) {
            true => Ok(Held { bytes, limit: self.limit, used: self.used.clone() }),
            false => Err(Error::OverBudget { what: what(), needed: bytes, budget: self.limit }),
        }
    }

    /// Whether `bytes` could ever fit: a claim checked before anything is read for it.
    pub fn admits(&self, bytes: u64, what: impl FnOnce() -> String) -> Result<()> {
        match bytes <= self.limit {
            true => Ok(()),
            false => Err(Error::OverBudget { what: what(), needed: bytes, budget: self.limit }),
        }
    }
}

/// The default budget when nothing sets one: what this process may really use, at most
/// [`DEFAULT_BUDGET`]. The smallest of an eighth of its address space (`RLIMIT_AS`:
/// thread stacks, malloc's arenas, mapped libraries and the interpreter take address
/// space no allocation of ours sees), and half of its memory (its cgroup's `memory.max`,
/// else physical memory) divided between the `sharing` processes beside it (a DataLoader's
/// workers, each its own process with a budget of its own); at least [`MIN_BUDGET`]. A
/// decompression the budget refuses fails with `RESOURCE_EXHAUSTED`, which a trainer can
/// catch; one the allocator refuses aborts the process, which it cannot.
pub fn for_process(sharing: u64) -> Budget {
    let limits = Limits::of_process();
    let budget = process_budget(&limits, sharing);
    tracing::info!(
        budget,
        sharing,
        address_space = ?limits.address_space,
        cgroup = ?limits.cgroup,
        physical = ?limits.physical,
        "memory budget for what is decoded from dataset files ({BUDGET_ENV} sets another)"
    );
    Budget::new(budget)
}

/// The least a default budget is: one MosaicML shard of 64 MiB decompressed.
pub const MIN_BUDGET: u64 = 64 << 20;

/// What bounds this process's memory, where the system says (Linux's /proc and cgroup
/// files); `None` where nothing does or it cannot tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// `RLIMIT_AS` (`ulimit -v`).
    pub address_space: Option<u64>,
    /// The cgroup's `memory.max` (v2) or `memory.limit_in_bytes` (v1).
    pub cgroup: Option<u64>,
    /// Physical memory (`MemTotal`).
    pub physical: Option<u64>,
}

impl Limits {
    pub fn of_process() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let address_space = read("/proc/self/limits").and_then(|t| limits_address_space(&t));
        // v2: the process's own group (`0::/path` in /proc/self/cgroup), else the root of
        // the container's namespace; v1: the memory controller's.
        let own = read("/proc/self/cgroup")
            .and_then(|t| t.lines().find_map(|l| l.strip_prefix("0::").map(str::to_owned)))
            .map(|path| format!("/sys/fs/cgroup{}/memory.max", path.trim_end_matches('/')));
        let cgroup = own
            .iter()
            .map(String::as_str)
            .chain(["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"])
            .find_map(|path| read(path).map(|t| cgroup_limit(&t)))
            .flatten();
        let physical = read("/proc/meminfo").and_then(|t| meminfo_total(&t));
        Self { address_space, cgroup, physical }
    }
}

/// The budget [`for_process`] gives under `limits`, shared by `sharing` processes.
pub fn process_budget(limits: &Limits, sharing: u64) -> u64 {
    let memory = match (limits.cgroup, limits.physical) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let from_memory = memory.map(|m| m / 2 / sharing.max(1));
    let from_address_space = limits.address_space.map(|a| a / 8);
    [Some(DEFAULT_BUDGET), from_memory, from_address_space]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(DEFAULT_BUDGET)
        .max(MIN_BUDGET)
}

/// "Max address space  unlimited  unlimited  bytes" of /proc/self/limits: the soft limit.
fn limits_address_space(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max address space"))?;
    line["Max address space".len()..].split_whitespace().next()?.parse().ok()
}

/// A cgroup's memory limit file: a number of bytes, or "max" (v2) or a number near 2^63
/// (v1) for none.
fn cgroup_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&b| b < 1 << 60)
}

/// "MemTotal:  24576000 kB" of /proc/meminfo, in bytes.
fn meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok()?.checked_mul(1024)
}

/// Bytes taken from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    bytes: u64,
    limit: u64,
    used: Arc<AtomicU64>,
}

impl Held {
    /// Holds `bytes` from now on: the difference taken (or [`Error::OverBudget`], holding
    /// what it held), or given back. For a buffer that grows and shrinks as it is read.
    pub fn resize(&mut self, bytes: u64, what: impl FnOnce() -> String) -> Result<()> {
        if bytes <= self.bytes {
            self.used.fetch_sub(self.bytes - bytes, Ordering::AcqRel);
            self.bytes = bytes;
            return Ok(());
        }
        let more = bytes - self.bytes;
        match reserve(&self.used, self.limit, more) {
            true => {
                self.bytes = bytes;
                Ok(())
            }
            // What this holder would hold in all: the number a person compares with the budget.
            false => Err(Error::OverBudget { what: what(), needed: bytes, budget: self.limit }),
        }
    }
}

/// Adds `more` to `used` if the total stays within `limit`; whether it did.
fn reserve(used: &AtomicU64, limit: u64, more: u64) -> bool {
    used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
        used.checked_add(more).filter(|&t| t <= limit)
    })
    .is_ok()
}

impl Drop for Held {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_held_counts_until_dropped_and_nothing_passes_the_limit() {
        let budget = Budget::new(100);
        let a = budget.take(60, || "a".into()).unwrap();
        let err = budget.take(41, || "b".into()).unwrap_err();
        assert!(matches!(err, Error::OverBudget { needed: 41, budget: 100, .. }), "{err}");
        assert!(budget.take(u64::MAX, || "huge".into()).is_err(), "no wrap past 2^64");
        drop(a);
        assert_eq!(budget.used(), 0);
        let _b = budget.take(100, || "b".into()).unwrap();
        assert_eq!(budget.used(), 100);
    }

    #[test]
    fn the_default_budget_is_what_the_process_may_use_divided_between_its_workers() {
        const GIB: u64 = 1 << 30;
        let none = Limits::default();
        assert_eq!(process_budget(&none, 1), DEFAULT_BUDGET, "nothing known: the old default");
        // A 24 GiB machine: 4 GiB alone, and with two DataLoader workers (three processes).
        let machine = Limits { physical: Some(24 * GIB), ..none };
        assert_eq!(process_budget(&machine, 1), DEFAULT_BUDGET);
        assert_eq!(process_budget(&machine, 3), 4 * GIB);
        assert_eq!(process_budget(&machine, 8), 24 * GIB / 2 / 8);
        // A container of 2 GiB on it: half of it, shared.
        let container = Limits { cgroup: Some(2 * GIB), ..machine };
        assert_eq!(process_budget(&container, 1), GIB);
        assert_eq!(process_budget(&container, 4), GIB / 4);
        // `ulimit -v 4G`: an eighth, the rest of the address space for everything else.
        let limited = Limits { address_space: Some(4 * GIB), ..machine };
        assert_eq!(process_budget(&limited, 1), GIB / 2);
        assert_eq!(process_budget(&Limits { address_space: Some(100 << 20), ..none }, 1), MIN_BUDGET);
    }

    #[test]
    fn the_limits_are_read_from_what_linux_writes() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max stack size            8388608              unlimited            bytes     \n\
                      Max address space         4294967296           unlimited            bytes     \n";
        assert_eq!(limits_address_space(limits), Some(4 << 30));
        assert_eq!(limits_address_space(&limits.replace("4294967296", "unlimited")), None);
        assert_eq!(cgroup_limit("max\n"), None);
        assert_eq!(cgroup_limit("9223372036854771712\n"), None, "cgroup v1's none");
        assert_eq!(cgroup_limit("2147483648\n"), Some(2 << 30));
        assert_eq!(meminfo_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"), Some(24_576_000 * 1024));
        // This process's own: whatever it is, a budget within the bounds.
        let budget = for_process(1).limit();
        assert!((MIN_BUDGET..=DEFAULT_BUDGET).contains(&budget), "{budget}");
    }

    #[test]
    fn a_held_buffer_grows_within_the_limit_and_gives_back_as_it_shrinks() {
        let budget = Budget::new(100);
        let mut held = budget.take(10, || "walk".into()).unwrap();
        held.resize(70, || "walk".into()).unwrap();
        assert_eq!(budget.used(), 70);
        let err = held.resize(101, || "walk".into()).unwrap_err();
        assert!(matches!(err, Error::OverBudget { needed: 101, .. }), "{err}");
        assert_eq!(budget.used(), 70, "a refused growth holds what it held");
        held.resize(5, || "walk".into()).unwrap();
        assert_eq!(budget.used(), 5);
        drop(held);
        assert_eq!(budget.used(), 0);
    }
}
