//! A small filesystem of its own for a test's cache (a tmpfs; mounting one needs root:
//! `make test` runs as root, elsewhere the caller says it skipped), and another tenant
//! that fills it.

use std::path::{Path, PathBuf};

/// A tmpfs of a given size mounted on a temporary directory, unmounted when dropped.
#[derive(Debug)]
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// A tmpfs of `size` bytes, or `None` (said on stderr) where it cannot be mounted.
    pub fn mount(size: u64) -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status();
        match status {
            Ok(s) if s.success() => Some(Self { dir }),
            other => {
                eprintln!("SKIPPED: cannot mount a tmpfs (needs root): {other:?}");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Another tenant of the filesystem of `dir`: a file that takes all but `leave` bytes of
/// its free space. Returns its path (remove it to give the space back).
pub fn fill(dir: &Path, leave: u64) -> PathBuf {
    use std::io::Write;
    let path = dir.join("another-tenant");
    let free = spoke_cache::store::admission::filesystem_available(dir).unwrap_or(0);
    let Ok(mut file) = std::fs::File::create(&path) else { return path };
    let block = vec![7u8; 64 << 10];
    let mut written = 0;
    while written + block.len() as u64 + leave <= free {
        if file.write_all(&block).is_err() {
            break;
        }
        written += block.len() as u64;
    }
    path
}

/// (data, own) bytes on disk under a spoke's cache directory now: chunk and pack files
/// (RocksDB's tables, and the files being written in `ingest/`), and RocksDB's own files
/// (its log, MANIFEST, options). Files deleted while it looks are skipped.
pub fn cache_dir_bytes(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut data, mut own) = (0, 0);
    // RocksDB ingests a chunk file by linking it into its directory (`move_files`): while
    // both names exist, one file, counted once.
    let mut seen = std::collections::HashSet::new();
    let mut pending = vec![(dir.to_owned(), true)];
    while let Some((dir, top)) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            if meta.is_dir() {
                pending.push((entry.path(), false));
            } else if !top || entry.file_name().to_string_lossy().ends_with(".sst") {
                data += meta.blocks() * 512;
            } else {
                own += meta.blocks() * 512;
            }
        }
    }
    (data, own)
}

/// The largest [`cache_dir_bytes`] of a cache directory, sampled every millisecond on a
/// thread of its own until [`DiskPeak::stop`].
#[derive(Debug)]
pub struct DiskPeak {
    running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<Peak>,
}

/// What a [`DiskPeak`] saw: the peaks of data and of RocksDB's own files, and how many
/// samples it took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peak {
    pub data: u64,
    pub own: u64,
    pub samples: u64,
}

impl DiskPeak {
    pub fn start(dir: &Path) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (flag, dir) = (running.clone(), dir.to_owned());
        let sampler = std::thread::spawn(move || {
            let mut peak = Peak::default();
            while flag.load(Relaxed) {
                let (data, own) = cache_dir_bytes(&dir);
                peak = Peak { data: peak.data.max(data), own: peak.own.max(own), samples: peak.samples + 1 };
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            peak
        });
        Self { running, sampler }
    }

    pub fn stop(self) -> Peak {
        self.running.store(false, std::sync::atomic::Ordering::Relaxed);
        self.sampler.join().unwrap_or_default()
    }
}
