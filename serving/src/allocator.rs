//! glibc's allocator settings the servers and the mount run with: freed memory below
//! 512 MiB stays in the process, and blocks up to 32 MiB come from its heap. With
//! glibc's defaults, each message buffer of a MiB or more (a chunk fetched, a read
//! answered) is handed back to the kernel when freed and the next one faults in fresh
//! zeroed pages, which measured as a fifth to a third of a process's CPU on the data
//! path: the mount's sequential reads 0.38-0.50 CPU-s per 512 MiB with these settings
//! against 0.62-0.71 without, the spoke's cold fill over the 60 ms emulator 1.9-2.6
//! CPU-s per GiB against 3.0-3.2 (`mount-bench`, `wan-bench`, BENCHMARKS.md), at some
//! 35 MiB more resident memory for the spoke.

/// The settings, as `GLIBC_TUNABLES` takes them.
pub const MALLOC_TUNABLES: &str =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=536870912";

/// Runs this process again with [`MALLOC_TUNABLES`] added to `GLIBC_TUNABLES` (glibc
/// reads them at start only; `mallopt` would need unsafe code, which this workspace
/// forbids): the same program, arguments, process id and open files. Returns without
/// doing so where they are set already (the second run, or an operator's own choice),
/// where the binary is not glibc's, or where the exec fails (said in the log: the
/// process still works, at more CPU). `who` names the process in that log line.
pub fn rerun_with_malloc_tunables(who: &str) {
    use std::os::unix::process::CommandExt;
    let current = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if !cfg!(target_env = "gnu") || current.contains("glibc.malloc.trim_threshold") {
        return;
    }
    let tunables =
        if current.is_empty() { MALLOC_TUNABLES.to_owned() } else { format!("{current}:{MALLOC_TUNABLES}") };
    let error = match std::env::current_exe() {
        Ok(exe) => std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("GLIBC_TUNABLES", tunables)
            .exec(),
        Err(e) => e,
    };
    tracing::warn!(error = %error, "{who}: cannot run again with its allocator settings; the data path costs more CPU");
}
