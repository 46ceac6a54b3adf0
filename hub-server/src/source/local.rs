//! A local directory as a source: each top-level folder of `--root` is a dataset, each
//! regular file below it a shard.
//!
//! - Versions come from `fstat`: size, mtime, ctime and inode. ctime cannot be set by
//!   users (`touch -d` moves mtime only), so an in-place rewrite always changes it. The
//!   limit is the filesystem's timestamp granularity (a few ms on ext4): two writes in
//!   the same tick that keep the size are indistinguishable, as for every mtime-based
//!   cache (nginx, rsync).
//! - Every read is a positioned read (`pread`) on the blocking pool, never on the async
//!   runtime, followed by an `fstat` of the same descriptor: a write overlapping the read
//!   moves ctime, so the read fails with `VersionChanged` instead of returning mixed bytes.
//! - Open descriptors are kept in a small cache keyed by canonical path and reused while
//!   the file on disk is still the same version.
//! - Symlinks are followed only while they stay inside the shard's own dataset, so a
//!   grant for one dataset never reads another's files: checked on the canonical path,
//!   and again on the descriptor actually opened (its path as the kernel reports it), so
//!   a link swapped between the check and the open is caught. A dataset is a real folder
//!   of the root (a symlinked dataset folder would alias another dataset); symlinked
//!   folders are not walked when listing, so listing cannot loop.

use std::{
    collections::HashMap,
    fs::{File, Metadata},
    os::unix::fs::{FileExt, MetadataExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use shardcache_proto::{
    checksum::Checked,
    names::{DATASET_META_FILE, DatasetName, ShardName},
};

use super::{DatasetMeta, ShardHandle, ShardMeta, Storage};
use crate::{Error, Result};

/// Open descriptors kept for reuse. Each costs one fd; 1024 stays well under the usual
/// `ulimit -n` of 65536 in containers while covering a training job's working set of
/// shards (the seed's C4 at 64 MiB shards is ~12k shards, read a few at a time).
pub const MAX_OPEN_FILES: usize = 1024;

/// Serves the datasets under one directory.
#[derive(Debug)]
pub struct LocalSource {
    /// Canonical (symlink-free, absolute) path of `--root`.
    root: PathBuf,
    open_files: Mutex<OpenFiles>,
}

/// A shard opened at one version; cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct LocalShard(Arc<OpenShard>);

#[derive(Debug)]
struct OpenShard {
    file: Arc<File>,
    meta: ShardMeta,
    dataset: String,
}

#[derive(Debug, Default)]
struct OpenFiles {
    by_path: HashMap<PathBuf, CachedFile>,
    tick: u64,
}

impl OpenFiles {
    /// Drops the descriptor used longest ago (a linear scan: rare, and 1024 entries).
    fn evict_least_recent(&mut self) {
        let oldest = self.by_path.iter().min_by_key(|(_, c)| c.last_used).map(|(p, _)| p.clone());
        if let Some(oldest) = oldest {
            self.by_path.remove(&oldest);
        }
    }
}

#[derive(Debug)]
struct CachedFile {
    file: Arc<File>,
    version: String,
    last_used: u64,
}

impl LocalSource {
    /// Serves `root`, which must be an existing directory.
    pub fn new(root: &Path) -> Result<Self> {
        let canonical = std::fs::canonicalize(root).map_err(|e| Error::io(root.display().to_string(), e))?;
        if !canonical.is_dir() {
            return Err(Error::Internal(format!("--root {} is not a directory", root.display())));
        }
        if let Some(warning) = looks_like_a_dataset(&canonical) {
            tracing::warn!("{warning}");
        }
        Ok(Self { root: canonical, open_files: Mutex::default() })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// Why `root` looks like one dataset rather than the folder of datasets the hub serves
/// (`ROOT/DATASET/SHARD`): it holds files and no folder, so the hub would serve nothing.
pub fn looks_like_a_dataset(root: &Path) -> Option<String> {
    let entries: Vec<_> = std::fs::read_dir(root).ok()?.flatten().collect();
    let visible = |e: &&std::fs::DirEntry| !e.file_name().to_string_lossy().starts_with('.');
    let folders = entries.iter().filter(visible).filter(|e| e.path().is_dir()).count();
    let files = entries.iter().filter(visible).filter(|e| e.path().is_file()).count();
    (folders == 0 && files > 0).then(|| {
        format!(
            "--root {} holds {files} files and no dataset folder, so the hub serves no dataset: give its parent \
             ({}), which serves it as dataset {:?}",
            root.display(),
            root.parent().map_or_else(|| "/".into(), |p| p.display().to_string()),
            root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        )
    })
}

impl LocalSource {
    /// Canonical path of `dataset`, which must be a real folder of the root: a symlink
    /// there would let a grant for its name read the dataset it points to.
    fn dataset_dir(&self, dataset: &DatasetName) -> Result<PathBuf> {
        let not_found = || Error::DatasetNotFound { dataset: dataset.to_string() };
        let dir = self.inside_root(&self.root.join(dataset.as_str()), dataset.as_str(), not_found)?;
        if dir != self.root.join(dataset.as_str()) {
            return Err(Error::OutsideDataset { what: dataset.to_string(), dataset: dataset.to_string() });
        }
        if dir.is_dir() { Ok(dir) } else { Err(not_found()) }
    }

    /// Canonicalizes `path`, shard `shard` of `dataset` (whose canonical folder is
    /// `dir`), refusing anything that resolves outside that folder.
    fn inside_dataset(&self, path: &Path, dir: &Path, dataset: &DatasetName, shard: &str) -> Result<PathBuf> {
        let what = format!("{dataset}/{shard}");
        let what = what.as_str();
        let not_found = || Error::ShardNotFound { dataset: dataset.to_string(), shard: shard.to_owned() };
        let canonical = self.inside_root(path, what, not_found).map_err(|e| match e {
            Error::OutsideRoot { what } => Error::OutsideDataset { what, dataset: dataset.to_string() },
            other => other,
        })?;
        if canonical.starts_with(dir) {
            Ok(canonical)
        } else {
            Err(Error::OutsideDataset { what: what.to_owned(), dataset: dataset.to_string() })
        }
    }

    /// Canonicalizes `path`, refusing anything that resolves outside the root.
    fn inside_root(&self, path: &Path, what: &str, not_found: impl FnOnce() -> Error) -> Result<PathBuf> {
        let canonical = std::fs::canonicalize(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => not_found(),
            _ => Error::io(what, e),
        })?;
        if canonical.starts_with(&self.root) {
            Ok(canonical)
        } else {
            Err(Error::OutsideRoot { what: what.to_owned() })
        }
    }

    fn dataset_meta(&self, dataset: &DatasetName, dir: &Path) -> DatasetMeta {
        DatasetMeta { name: dataset.to_string(), record_size: read_record_size(&dir.join(DATASET_META_FILE)) }
    }

    fn open_blocking(&self, dataset: &DatasetName, shard: &ShardName) -> Result<LocalShard> {
        let dir = self.dataset_dir(dataset)?;
        let what = format!("{dataset}/{shard}");
        let mut path = dir.clone();
        path.extend(shard.components());
        let path = self.inside_dataset(&path, &dir, dataset, shard.as_str())?;
        let on_disk = std::fs::metadata(&path).map_err(|e| Error::io(&what, e))?;
        if !on_disk.is_file() {
            return Err(Error::NotAFile { dataset: dataset.to_string(), shard: shard.to_string() });
        }
        let (file, size, version) = self.cached_or_open(&path, &on_disk, &what)?;
        // What was opened, not what was checked: a link swapped in between is caught here
        // (a cached descriptor was checked when it was opened, and is keyed by this path).
        let opened = opened_path(&file).map_err(|e| Error::io(&what, e))?;
        if !opened.starts_with(&dir) {
            return Err(Error::OutsideDataset { what, dataset: dataset.to_string() });
        }
        // The version read with the descriptor includes the mtime: `on_disk`'s is its.
        let meta = ShardMeta { name: shard.to_string(), size, version, modified_ms: modified_ms(&on_disk) };
        Ok(LocalShard(Arc::new(OpenShard { file, meta, dataset: dataset.to_string() })))
    }

    /// Reuses the cached descriptor of `path` if it is still at the version `on_disk`
    /// shows, else opens it. Returns the descriptor with its size and version.
    fn cached_or_open(
        &self,
        path: &Path,
        on_disk: &Metadata,
        what: &str,
    ) -> Result<(Arc<File>, u64, String)> {
        let version = version_of(on_disk);
        {
            let mut cache = self.lock_open_files();
            cache.tick += 1;
            let tick = cache.tick;
            if let Some(hit) = cache.by_path.get_mut(path).filter(|c| c.version == version) {
                hit.last_used = tick;
                return Ok((hit.file.clone(), on_disk.len(), version));
            }
        }
        let file = Arc::new(File::open(path).map_err(|e| Error::io(what, e))?);
        // The version of what we opened, which wins if the file changed since `stat`.
        let opened = file.metadata().map_err(|e| Error::io(what, e))?;
        let version = version_of(&opened);
        let mut cache = self.lock_open_files();
        if cache.by_path.len() >= MAX_OPEN_FILES {
            cache.evict_least_recent();
        }
        let tick = cache.tick;
        cache.by_path.insert(
            path.to_owned(),
            CachedFile { file: file.clone(), version: version.clone(), last_used: tick },
        );
        Ok((file, opened.len(), version))
    }

    fn lock_open_files(&self) -> std::sync::MutexGuard<'_, OpenFiles> {
        // The cache holds no invariant a panic could break halfway; keep using it.
        self.open_files.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn list_datasets_blocking(&self) -> Result<Vec<DatasetMeta>> {
        let mut datasets = Vec::new();
        for entry in std::fs::read_dir(&self.root).map_err(|e| Error::io("the root", e))? {
            let entry = entry.map_err(|e| Error::io("the root", e))?;
            let Some(name) = entry.file_name().to_str().and_then(|n| DatasetName::new(n).ok()) else {
                continue;
            };
            if let Ok(dir) = self.dataset_dir(&name) {
                datasets.push(self.dataset_meta(&name, &dir));
            }
        }
        datasets.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(datasets)
    }

    fn list_shards_blocking(&self, dataset: &DatasetName) -> Result<Vec<ShardMeta>> {
        let dataset_dir = self.dataset_dir(dataset)?;
        let mut shards = Vec::new();
        let mut pending = vec![(dataset_dir.clone(), String::new())];
        while let Some((dir, prefix)) = pending.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(format!("{dataset}/{prefix}"), e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(dataset.as_str(), e))?;
                let Some(file_name) = entry.file_name().to_str().map(str::to_owned) else { continue };
                let name = format!("{prefix}{file_name}");
                if ShardName::new(&name).is_err() {
                    continue; // hidden, or a name no client could ask for
                }
                let Ok(file_type) = entry.file_type() else { continue };
                if file_type.is_dir() {
                    pending.push((entry.path(), format!("{name}/")));
                } else if file_type.is_file() || file_type.is_symlink() {
                    let Ok(target) = self.inside_dataset(&entry.path(), &dataset_dir, dataset, &name) else {
                        continue; // dangling, or leading out of the dataset
                    };
                    match std::fs::metadata(&target) {
                        Ok(m) if m.is_file() => shards.push(ShardMeta {
                            name,
                            size: m.len(),
                            version: version_of(&m),
                            modified_ms: modified_ms(&m),
                        }),
                        _ => continue,
                    }
                }
            }
        }
        shards.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(shards)
    }
}

/// The path of the file `file` is open on, as the kernel reports it.
fn opened_path(file: &File) -> std::io::Result<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The version string of a file's metadata.
fn version_of(m: &Metadata) -> String {
    let ns = |secs: i64, nanos: i64| (secs as i128 * 1_000_000_000 + nanos as i128) as u128;
    format!(
        "{:x}-{:x}-{:x}-{:x}",
        m.size(),
        ns(m.mtime(), m.mtime_nsec()),
        ns(m.ctime(), m.ctime_nsec()),
        m.ino()
    )
}

/// A file's mtime in milliseconds since the Unix epoch (0 for one before it; saturated for
/// one past what 64 bits of milliseconds hold: `touch` takes any date).
fn modified_ms(m: &Metadata) -> u64 {
    let millis = u64::try_from(m.mtime_nsec()).unwrap_or(0) / 1_000_000;
    u64::try_from(m.mtime()).map_or(0, |secs| secs.saturating_mul(1000).saturating_add(millis))
}

/// `record_size` from a dataset's metadata file; 0 when absent or unreadable.
fn read_record_size(path: &Path) -> u32 {
    use std::io::Read;
    // At most the bound and a byte (a file past it is not metadata): never a file of
    // any size read whole because of its name.
    let mut raw = Vec::new();
    let read =
        std::fs::File::open(path).and_then(|f| f.take(super::MAX_META_BYTES + 1).read_to_end(&mut raw));
    match read {
        Ok(n) if n as u64 <= super::MAX_META_BYTES => super::parse_record_size(&raw),
        _ => 0,
    }
}

/// Runs filesystem work on tokio's blocking pool, off the async workers.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Error::Internal(format!("filesystem task failed: {e}"))))
}

impl Storage for Arc<LocalSource> {
    type Shard = LocalShard;

    async fn list_datasets(&self) -> Result<Vec<DatasetMeta>> {
        let this = self.clone();
        blocking(move || this.list_datasets_blocking()).await
    }

    async fn dataset(&self, dataset: &DatasetName) -> Result<DatasetMeta> {
        let (this, dataset) = (self.clone(), dataset.clone());
        blocking(move || this.dataset_dir(&dataset).map(|dir| this.dataset_meta(&dataset, &dir))).await
    }

    async fn list_shards(&self, dataset: &DatasetName) -> Result<Vec<ShardMeta>> {
        let (this, dataset) = (self.clone(), dataset.clone());
        blocking(move || this.list_shards_blocking(&dataset)).await
    }

    async fn open(&self, dataset: &DatasetName, shard: &ShardName) -> Result<LocalShard> {
        let (this, dataset, shard) = (self.clone(), dataset.clone(), shard.clone());
        blocking(move || this.open_blocking(&dataset, &shard)).await
    }
}

impl ShardHandle for LocalShard {
    type Error = Error;

    fn meta(&self) -> &ShardMeta {
        &self.0.meta
    }

    async fn read_at(&self, offset: u64, len: usize) -> Result<Checked> {
        let shard = self.0.clone();
        // The checksum is computed on the blocking thread too, next to the read.
        blocking(move || Ok(Checked::new(shard.read_at_blocking(offset, len)?))).await
    }
}

impl OpenShard {
    fn changed(&self, found: String) -> Error {
        Error::version_changed(&self.dataset, &self.meta.name, &self.meta.version, found)
    }

    fn read_at_blocking(&self, offset: u64, len: usize) -> Result<Bytes> {
        let what = || format!("{}/{}", self.dataset, self.meta.name);
        let mut buf = vec![0u8; len];
        if let Err(e) = self.file.read_exact_at(&mut buf, offset) {
            return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.changed("(truncated while reading)".to_owned())
            } else {
                Error::io(what(), e)
            });
        }
        // After the read: any write that overlapped it has already moved ctime.
        let now = version_of(&self.file.metadata().map_err(|e| Error::io(what(), e))?);
        if now != self.meta.version {
            return Err(self.changed(now));
        }
        Ok(Bytes::from(buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> ShardName {
        ShardName::new(n).unwrap()
    }

    #[tokio::test]
    async fn descriptors_are_reused_until_the_file_changes_and_stay_bounded() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("ds")).unwrap();
        std::fs::write(root.path().join("ds/a.bin"), b"first").unwrap();
        let source = Arc::new(LocalSource::new(root.path()).unwrap());
        let ds = DatasetName::new("ds").unwrap();

        let one = source.open(&ds, &name("a.bin")).await.unwrap();
        let two = source.open(&ds, &name("a.bin")).await.unwrap();
        assert!(Arc::ptr_eq(&one.0.file, &two.0.file), "same version: same descriptor");

        // Replace the file (new inode): a new descriptor, the new bytes, the new version.
        std::fs::write(root.path().join("ds/b.tmp"), b"second!").unwrap();
        std::fs::rename(root.path().join("ds/b.tmp"), root.path().join("ds/a.bin")).unwrap();
        let three = source.open(&ds, &name("a.bin")).await.unwrap();
        assert!(!Arc::ptr_eq(&one.0.file, &three.0.file));
        assert_ne!(one.meta().version, three.meta().version);
        assert_eq!(&three.read_at(0, 7).await.unwrap().data[..], b"second!");
        // The old handle never returns the new bytes: replacing the file unlinked the old
        // inode, which moved its ctime, so reads through the old handle are refused.
        assert!(matches!(
            one.read_at(0, 5).await,
            Err(Error::Read(shardcache_reader::ReadError::VersionChanged { .. }))
        ));

        for i in 0..MAX_OPEN_FILES + 10 {
            let shard = format!("f{i}");
            std::fs::write(root.path().join("ds").join(&shard), b"x").unwrap();
            source.open(&ds, &name(&shard)).await.unwrap();
        }
        assert_eq!(source.lock_open_files().by_path.len(), MAX_OPEN_FILES);
    }
}
