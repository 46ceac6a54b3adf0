//! When a complete shard's chunk files are merged into one (the merge itself is
//! `Store::merge_shard`, in `mod.rs`), and whether the cache directory can take the
//! direct I/O a merge uses: RocksDB builds a new list of the column family's files on
//! every ingestion, so the cost of admitting a chunk grows with the number of files
//! (`store-scale-bench`).

use std::path::Path;

/// Default of `--merge-above-files`: the chunk files above which complete shards are
/// merged into one file each. Every ingestion builds a new list of the column family's
/// files (RocksDB's `VersionBuilder`), so its cost grows with the number of files, while
/// a merge costs one more write of the shard, whatever the count. Set where the first
/// approaches the second (`store-scale-bench` and `spoke-bench` with
/// `SPOKE_MERGE_ABOVE_FILES=0`, BENCHMARKS.md "store-scale-bench").
pub const DEFAULT_MERGE_ABOVE_FILES: u64 = 16_384;

/// Whether files in `dir` can be opened for direct I/O (`O_DIRECT`): tmpfs and some
/// overlay filesystems refuse it, and RocksDB would then fail every merge.
pub(super) fn direct_io_works(dir: &Path) -> bool {
    use rustix::fs::{Mode, OFlags};
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    let probe = dir.join("DIRECT_IO_PROBE");
    let works = rustix::fs::open(
        &probe,
        OFlags::CREATE | OFlags::WRONLY | OFlags::DIRECT,
        Mode::from_raw_mode(0o600),
    )
    .is_ok();
    let _ = std::fs::remove_file(&probe);
    works
}
