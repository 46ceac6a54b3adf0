//! CPU profiles of the processes a benchmark runs (`perf record`), summarised by what the
//! time went to: copies, checksums, the kernel's TCP, HTTP/2, the runtime... (`--perf`
//! of `wan-bench` and `spoke-bench`).

/// `perf record` of some processes, one recording each, stopped with SIGINT.
#[derive(Debug)]
pub struct Profile {
    recordings: Vec<(&'static str, std::process::Child, tempfile::NamedTempFile)>,
}

impl Profile {
    pub fn start(processes: &[(u32, &'static str)]) -> Self {
        let recordings = processes
            .iter()
            .map(|&(pid, name)| {
                let file = tempfile::NamedTempFile::new().unwrap();
                let child = std::process::Command::new("perf")
                    .args(["record", "-q", "-F", "999", "-g", "-p", &pid.to_string(), "-o"])
                    .arg(file.path())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .expect("--perf needs `perf` (apt-get install linux-perf)");
                (name, child, file)
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(300)); // let them attach
        Self { recordings }
    }

    /// Stops recording; returns a markdown table: per process, its CPU samples and the
    /// share of them in each category of leaf symbol.
    pub fn finish(self) -> String {
        let mut out =
            String::from("| process | samples | category | share of its samples |\n|---|---|---|---|\n");
        for (name, mut child, file) in self.recordings {
            std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
            child.wait().unwrap();
            let report = std::process::Command::new("perf")
                .args(["report", "--no-children", "--sort", "sym", "--stdio", "-g", "none", "-i"])
                .arg(file.path())
                .output()
                .unwrap();
            out += &categorise(name, &String::from_utf8_lossy(&report.stdout));
        }
        out
    }
}

/// Where the time goes: leaf symbols grouped into what they do.
const CATEGORIES: &[(&str, &[&str])] = &[
    ("CRC32C in RocksDB (portable code: no SSE4.2)", &["rocksdb::crc32c"]),
    ("CRC32C (ours, SSE4.2)", &["crc32c"]),
    ("memcpy/memmove (user space)", &["memcpy", "memmove"]),
    (
        "kernel copies (socket and file read/write)",
        &["copy_user", "copy_to_iter", "copy_from_iter", "copy_folio", "copy_page"],
    ),
    (
        "kernel file writes (ext4, page cache)",
        &["ext4_", "filemap", "folio", "generic_perform_write", "mpage", "block_", "buffer"],
    ),
    ("kernel page faults", &["page_fault", "clear_page", "do_anonymous_page", "handle_mm_fault", "memcg"]),
    ("RocksDB", &["rocksdb::"]),
    ("kernel TCP/IP", &["tcp_", "skb", "ip_", "__dev_queue", "net_rx", "loopback", "sock_", "__netif"]),
    ("HTTP/2 (h2, hyper)", &["h2::", "hyper::"]),
    ("gRPC/protobuf (tonic, prost)", &["tonic::", "prost::"]),
    ("allocator", &["malloc", "free", "realloc", "_int_", "alloc::", "cfree"]),
    ("tokio runtime", &["tokio::"]),
    ("kernel other (syscalls, scheduling, page faults)", &["[k]"]),
];

fn categorise(process: &str, report: &str) -> String {
    let samples = report
        .lines()
        .find_map(|l| l.strip_prefix("# Samples: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or("?")
        .to_owned();
    let mut shares: Vec<(&str, f64)> = Vec::new();
    for line in report.lines() {
        let Some((percent, symbol)) = line.trim().split_once('%') else { continue };
        let Ok(percent) = percent.trim().parse::<f64>() else { continue };
        let category = CATEGORIES
            .iter()
            .find(|(_, needles)| needles.iter().any(|n| symbol.contains(n)))
            .map_or("other (our code, std)", |(name, _)| name);
        match shares.iter_mut().find(|(c, _)| *c == category) {
            Some((_, sum)) => *sum += percent,
            None => shares.push((category, percent)),
        }
    }
    shares.sort_by(|a, b| b.1.total_cmp(&a.1));
    shares
        .into_iter()
        .filter(|(_, p)| *p >= 1.0)
        .map(|(category, percent)| format!("| {process} | {samples} | {category} | {percent:.1}% |\n"))
        .collect()
}
