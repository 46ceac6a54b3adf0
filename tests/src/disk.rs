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
    let free = spoke_cache::admission::filesystem_available(dir).unwrap_or(0);
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
