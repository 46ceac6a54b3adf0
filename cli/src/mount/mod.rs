//! `shardcache mount ENDPOINT MOUNTPOINT`: a read-only FUSE tree `DATASET/SHARD` over a
//! hub, a spoke or a group of spokes, so that loaders which want a path (`open()`,
//! `numpy.memmap`, `ImageFolder`, tar readers) read through shardcache unchanged.
//!
//! - Every byte comes through the SDK: CRC32C, offset, length and the shard's version are
//!   checked. A file opened at one version is read at that version only: a shard that
//!   changes while open makes the next read the kernel has not cached fail with EIO (and
//!   a log line), never a mix.
//! - Each shard version is its own inode (`tree.rs`), so the kernel's page cache never
//!   holds pages of two versions in one file: a process that opens the new version (a
//!   new inode) cannot fill the pages of one still reading the old. An open through a
//!   name the kernel resolved before the change is answered ESTALE, and the kernel looks
//!   the name up again (its one retry) and opens the new inode.
//! - Reads bypass the kernel's page cache (`FOPEN_DIRECT_IO`) where the kernel can still
//!   map such files (`FUSE_DIRECT_IO_ALLOW_MMAP`, Linux 6.6 and later: `numpy.memmap`
//!   keeps working): a reader's request comes to the mount as it was made (up to
//!   [`MAX_READ`]) and its reply goes into the reader's buffer, one copy fewer than
//!   through the cache, and sequential readers get the mount's own read-ahead
//!   (`prefetch.rs`, the same for every user: the kernel's needs root to be raised). The
//!   spoke is the cache; a warm read is a local round trip. Where the kernel cannot map
//!   such files, or with `--kernel-cache`, the kernel caches instead: pages stay cached
//!   across opens (`FOPEN_KEEP_CACHE`: an inode's pages are of its one version), with
//!   [`READ_AHEAD_KB`] of the kernel's read-ahead where root can raise it. Attributes
//!   are cached for [`ATTR_TTL`], listings for [`tree::LISTING_TTL`].
//! - Reads run on the tokio runtime and answer the kernel when done, so the kernel's
//!   concurrent requests (read-ahead, several readers) are served concurrently (a read
//!   whose bytes the read-ahead holds already is answered at once); every call has a
//!   deadline ([`MountOptions::deadline`]): an unreachable server is EIO, never a hung
//!   reader.
//! - Read-only: the kernel answers writes, creates and renames with EROFS. SIGTERM or
//!   SIGINT unmounts; an unmount from outside (`fusermount -u`) ends the process.

pub mod prefetch;
pub mod tree;

use std::{
    collections::HashMap,
    ffi::OsStr,
    os::unix::fs::MetadataExt,
    path::Path,
    time::{Duration, SystemTime},
};

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEntry, ReplyOpen, Request,
    consts::{FOPEN_DIRECT_IO, FOPEN_KEEP_CACHE},
};
use prefetch::{ReadAhead, Source};
use shardcache_client::{Client, Error};
use tree::{Node, ROOT, Tree};

/// Largest read the kernel sends: 1 MiB, FUSE's most by default (256 pages).
pub const MAX_READ: u32 = 1 << 20;
/// `FUSE_DIRECT_IO_ALLOW_MMAP` (protocol 7.39, Linux 6.6; fuser 0.16 has no name for
/// it): files opened with `FOPEN_DIRECT_IO` may still be mapped shared.
const FUSE_DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
/// The kernel's read-ahead on the mount. FUSE starts at 128 KiB whatever the filesystem
/// asks, so sequential reads arrive as 128 KiB requests one or two at a time (a `dd
/// bs=1M` through a warm spoke: 512 requests of 128 KiB for 64 MiB); raised through sysfs
/// (root only) they arrive as 1 MiB requests, up to 16 in flight (`mount-bench` compares
/// the steps, BENCHMARKS.md).
pub const READ_AHEAD_KB: u32 = 16384;
/// How long the kernel keeps attributes and names: short, as a shard may be replaced.
pub const ATTR_TTL: Duration = Duration::from_secs(1);

/// How the mount behaves.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Deadline of any one call to the server; past it the read fails with EIO.
    pub deadline: Duration,
    /// Read through the kernel's page cache (with its read-ahead) even where the
    /// kernel could map files read past it (`--kernel-cache`).
    pub kernel_cache: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self { deadline: Duration::from_secs(30), kernel_cache: false }
    }
}

/// The filesystem.
struct ShardFs {
    client: Client,
    runtime: tokio::runtime::Handle,
    options: MountOptions,
    tree: Tree,
    /// Open files (each the shard at the version it was opened at): their read-ahead.
    handles: HashMap<u64, ReadAhead>,
    next_handle: u64,
    /// Whether files are opened past the page cache (`FOPEN_DIRECT_IO`): the kernel
    /// said it can map them (`init`).
    direct: bool,
    /// Owner of every file: who mounted it.
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

/// Maps an SDK error to the errno a reader gets.
fn errno(error: &Error) -> i32 {
    match error.code() {
        Some(tonic::Code::NotFound) => libc::ENOENT,
        Some(tonic::Code::PermissionDenied | tonic::Code::Unauthenticated) => libc::EACCES,
        _ => libc::EIO,
    }
}

impl ShardFs {
    /// Runs `call` on the runtime within the deadline (from the FUSE thread, which is
    /// not one of the runtime's).
    fn wait<T>(&self, call: impl std::future::Future<Output = Result<T, Error>>) -> Result<T, i32> {
        let deadline = self.options.deadline;
        match self.runtime.block_on(async { tokio::time::timeout(deadline, call).await }) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "mount: a call to the server failed");
                Err(errno(&e))
            }
            Err(_) => {
                tracing::warn!("mount: the server did not answer within {deadline:?}");
                Err(libc::EIO)
            }
        }
    }

    /// The dataset names, listed when the last listing is older than its TTL.
    fn datasets(&mut self) -> Result<Vec<String>, i32> {
        if let Some(names) = self.tree.datasets() {
            return Ok(names.to_vec());
        }
        let client = self.client.clone();
        let listed = self.wait(async move { client.list_datasets().await })?;
        let names: Vec<String> = listed.into_iter().map(|d| d.name).collect();
        self.tree.set_datasets(names.clone());
        Ok(names)
    }

    /// `dataset`'s shard names, listed when the last listing is older than its TTL.
    fn shards(&mut self, dataset: &str) -> Result<Vec<String>, i32> {
        if let Some(names) = self.tree.shards(dataset) {
            return Ok(names.to_vec());
        }
        let (client, name) = (self.client.clone(), dataset.to_owned());
        let listed = self.wait(async move { client.list_shards(&name).await })?;
        let shards: Vec<(String, u64, String)> =
            listed.into_iter().map(|s| (s.shard, s.size, s.version)).collect();
        let names = shards.iter().map(|(n, ..)| n.clone()).collect();
        self.tree.set_shards(dataset, shards);
        Ok(names)
    }

    fn attr(&self, ino: u64, node: &Node) -> FileAttr {
        let (kind, perm, size) = match node {
            Node::Root | Node::Dataset(_) => (FileType::Directory, 0o555, 0),
            Node::Shard { size, .. } => (FileType::RegularFile, 0o444, *size),
        };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: MAX_READ,
            flags: 0,
        }
    }
}

impl Filesystem for ShardFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        // Requests of up to 1 MiB need max_pages above 256 KiB's worth: fuser asks for
        // max(max_write, max_readahead), and its max_write (16 MiB) already is; the
        // kernel caps it at 1 MiB. Read-ahead cannot be raised above the kernel's offer
        // (128 KiB) here: `raise_read_ahead` does it through sysfs after mounting.
        let _ = config.set_max_readahead(MAX_READ);
        // Read-ahead requests the kernel keeps in flight (default 12): 16 MiB of
        // read-ahead is 16 requests.
        let _ = config.set_max_background(64);
        if self.options.kernel_cache {
            tracing::info!("mount: reads go through the page cache (--kernel-cache)");
            return Ok(());
        }
        self.direct = config.add_capabilities(FUSE_DIRECT_IO_ALLOW_MMAP).is_ok();
        if self.direct {
            tracing::info!(
                "mount: reads bypass the page cache; sequential readers get the mount's own read-ahead (up to {} MiB each)",
                prefetch::MAX_WINDOW >> 20
            );
        } else {
            tracing::info!(
                "mount: this kernel cannot map files read past its page cache (Linux 6.6 can); reads go through the page cache"
            );
        }
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str() else { return reply.error(libc::ENOENT) };
        let found = match self.tree.node(parent).cloned() {
            Some(Node::Root) => self
                .datasets()
                .map(|names| names.iter().any(|n| n == name).then(|| self.tree.find(name, None)).flatten()),
            Some(Node::Dataset(dataset)) => self.shards(&dataset).map(|names| {
                names.iter().any(|n| n == name).then(|| self.tree.find(&dataset, Some(name))).flatten()
            }),
            _ => Ok(None),
        };
        match found {
            Ok(Some(ino)) => match self.tree.node(ino) {
                Some(node) => reply.entry(&ATTR_TTL, &self.attr(ino, node), 0),
                None => reply.error(libc::ENOENT),
            },
            Ok(None) => reply.error(libc::ENOENT),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.tree.node(ino) {
            Some(node) => reply.attr(&ATTR_TTL, &self.attr(ino, node)),
            None => reply.error(libc::ENOENT),
        }
    }

    fn readdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory) {
        let children = match self.tree.node(ino).cloned() {
            Some(Node::Root) => self.datasets().map(|names| {
                names
                    .into_iter()
                    .filter_map(|n| Some((self.tree.find(&n, None)?, FileType::Directory, n)))
                    .collect()
            }),
            Some(Node::Dataset(dataset)) => self.shards(&dataset).map(|names| {
                names
                    .into_iter()
                    .filter_map(|n| Some((self.tree.find(&dataset, Some(&n))?, FileType::RegularFile, n)))
                    .collect::<Vec<_>>()
            }),
            Some(Node::Shard { .. }) => Err(libc::ENOTDIR),
            None => Err(libc::ENOENT),
        };
        let children = match children {
            Ok(children) => children,
            Err(e) => return reply.error(e),
        };
        let dots = [(ino, FileType::Directory, ".".to_owned()), (ROOT, FileType::Directory, "..".to_owned())];
        for (i, (child, kind, name)) in
            dots.into_iter().chain(children).enumerate().skip(offset.max(0) as usize)
        {
            if reply.add(child, i as i64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(libc::EROFS);
        }
        let Some(Node::Shard { dataset, shard, .. }) = self.tree.node(ino).cloned() else {
            return reply.error(libc::EISDIR);
        };
        // The version it is read at from now on, and its current size.
        let (client, d, s) = (self.client.clone(), dataset.clone(), shard.clone());
        let info = match self.wait(async move { client.stat(&d, &s).await }) {
            Ok(info) => info,
            Err(e) => return reply.error(e),
        };
        let current = self.tree.number(&dataset, Some((&shard, info.size, Some(&info.version))));
        if current != ino {
            // The shard changed since the kernel resolved its name: this inode's pages
            // are of the old version. The name now leads to a new inode; ESTALE makes
            // the kernel look it up again and open that one.
            tracing::info!(
                dataset,
                shard,
                version = info.version,
                "mount: opened after a change; the new version is a new file"
            );
            return reply.error(libc::ESTALE);
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        let source = Source {
            client: self.client.clone(),
            dataset,
            shard,
            version: info.version,
            size: info.size,
            deadline: self.options.deadline,
            runtime: self.runtime.clone(),
        };
        self.handles.insert(handle, ReadAhead::new(source, self.direct));
        // KEEP_CACHE still matters past the page cache: a mapped file's pages are cached.
        reply.opened(handle, if self.direct { FOPEN_DIRECT_IO | FOPEN_KEEP_CACHE } else { FOPEN_KEEP_CACHE });
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let Some(read_ahead) = self.handles.get_mut(&fh) else { return reply.error(libc::EBADF) };
        tracing::debug!(offset, size, "mount: read");
        let offset = offset.max(0) as u64;
        let end = (offset + u64::from(size)).min(read_ahead.size());
        if offset >= end {
            return reply.data(&[]);
        }
        let pieces = read_ahead.plan(offset, end);
        match prefetch::answer_now(&pieces, offset, end) {
            Some(Ok(data)) => return reply.data(&data),
            Some(Err(e)) => return reply.error(e),
            None => {}
        }
        self.runtime.spawn(async move {
            match prefetch::answer(pieces, offset, end).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(e),
            }
        });
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock_owner: u64, reply: fuser::ReplyEmpty) {
        // Nothing is ever written: nothing to flush (every close sends one).
        reply.ok();
    }

    fn getxattr(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // No extended attributes (security labels are asked for on every lookup).
        reply.error(libc::ENODATA);
    }

    fn listxattr(&mut self, _req: &Request<'_>, _ino: u64, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 { reply.size(0) } else { reply.data(&[]) }
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        self.handles.remove(&fh);
        reply.ok();
    }
}

/// Mounts `client`'s datasets read-only on `mountpoint` (an existing, empty directory)
/// and serves until SIGTERM or SIGINT (then unmounts) or until unmounted from outside.
/// `mounted` is called once the mount is in place.
pub async fn serve(
    client: Client,
    mountpoint: &Path,
    options: MountOptions,
    mounted: impl FnOnce(),
) -> anyhow::Result<()> {
    use anyhow::Context;
    let owner = std::fs::metadata(mountpoint)
        .with_context(|| format!("mount point {} must be an existing directory", mountpoint.display()))?;
    anyhow::ensure!(owner.is_dir(), "mount point {} is not a directory", mountpoint.display());
    let fs = ShardFs {
        client,
        runtime: tokio::runtime::Handle::current(),
        options,
        tree: Tree::new(),
        handles: HashMap::new(),
        next_handle: 1,
        direct: false,
        uid: owner.uid(),
        gid: owner.gid(),
        mounted_at: SystemTime::now(),
    };
    let mount_options = [
        MountOption::RO,
        MountOption::FSName("shardcache".into()),
        MountOption::Subtype("shardcache".into()),
        MountOption::NoAtime,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    let session = fuser::spawn_mount2(fs, mountpoint, &mount_options).with_context(|| {
        format!("cannot mount on {} (is /dev/fuse there, and fusermount3 installed?)", mountpoint.display())
    })?;
    raise_read_ahead(mountpoint);
    mounted();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut poll = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = poll.tick() => {
                if session.guard.is_finished() {
                    tracing::info!(mountpoint = %mountpoint.display(), "unmounted from outside");
                    return Ok(());
                }
            }
        }
    }
    // Dropping the session unmounts.
    drop(session);
    tracing::info!(mountpoint = %mountpoint.display(), "unmounted");
    Ok(())
}

/// Raises the kernel's read-ahead on the mount at `mountpoint` to [`READ_AHEAD_KB`]
/// (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb` of its device); where that is not allowed
/// (not root), says so and keeps the kernel's 128 KiB.
fn raise_read_ahead(mountpoint: &Path) {
    let dev = match std::fs::metadata(mountpoint) {
        Ok(m) => m.dev(),
        Err(e) => return tracing::warn!(error = %e, "mount: cannot stat the mount point"),
    };
    // glibc's major()/minor() of a dev_t.
    let (major, minor) =
        (((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff), (dev & 0xff) | ((dev >> 12) & !0xff));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    match std::fs::write(&knob, READ_AHEAD_KB.to_string()) {
        Ok(()) => tracing::info!(
            knob,
            "mount: the kernel's read-ahead (reads through the page cache) {READ_AHEAD_KB} KiB"
        ),
        Err(e) => tracing::info!(
            knob,
            error = %e,
            "mount: the kernel's read-ahead stays at 128 KiB (raising it needs root): reads through the page cache (of mapped files; of every file before Linux 6.6) are slower"
        ),
    }
}
