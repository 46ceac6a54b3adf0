//! The read-only POSIX mount (`shardcache mount`, FUSE) as a program without the SDK
//! sees it: every shard byte for byte through the mount, the tree equal to the listing,
//! EROFS for any change, ENOENT for what does not exist, EIO (and a log line) for a shard
//! that changes while open and for a server that stops, never a hung reader; SIGTERM and
//! `fusermount3 -u` leave nothing mounted; a group of spokes mounts as one tree.
//!
//! A test that cannot mount (no /dev/fuse or no fusermount3) fails, saying why: `make
//! test` installs fuse3. Where FUSE cannot be had (a container without /dev/fuse),
//! `SHARDCACHE_SKIP_MOUNT=1` skips them, and `make test` says it did.

#![allow(clippy::unwrap_used)]

use std::{
    io::{ErrorKind, Read, Seek, SeekFrom},
    path::Path,
    process::Command,
    time::Duration,
};

use shardcache_tests::{MountProcess, TestHub, TestSpoke, make_dataset, spoke_options, until, write_pattern};
use shardcache_wan::{LinkConfig, WanProxy};
use spoke_cache::PeerGroup;
use tokio::net::TcpListener;

const MIB: u64 = 1 << 20;

macro_rules! skip_without_fuse {
    () => {
        if let Some(why) = MountProcess::unavailable() {
            assert!(
                std::env::var_os("SHARDCACHE_SKIP_MOUNT").is_some_and(|v| v == "1"),
                "FUSE cannot be mounted here: {why}; set SHARDCACHE_SKIP_MOUNT=1 to skip the mount tests"
            );
            eprintln!("skipped (SHARDCACHE_SKIP_MOUNT=1): {why}");
            return;
        }
    };
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shard_reads_the_same_through_the_mount_and_the_tree_is_the_listing() {
    skip_without_fuse!();
    let root = tempfile::tempdir().unwrap();
    let c4 = make_dataset(root.path(), "c4", 4, 3 * MIB);
    // Sizes that end mid-chunk and mid-page.
    write_pattern(&root.path().join("odd/a.bin"), 1_000_003, 1);
    write_pattern(&root.path().join("odd/b.bin"), 4097, 2);
    let hub = TestHub::start(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache.path(), spoke_options(&hub.endpoint)).await;
    let mnt = tempfile::tempdir().unwrap();
    let log = cache.path().join("mount.log");
    let _mount = MountProcess::start(&spoke.endpoint, mnt.path(), &[], &log);

    // The tree is the listing: `ls -R` of the mount, and ListDatasets/ListShards.
    let client = spoke.client().await;
    let mut datasets: Vec<String> =
        client.list_datasets().await.unwrap().into_iter().map(|d| d.name).collect();
    datasets.sort();
    assert_eq!(names(mnt.path()), datasets);
    for dataset in &datasets {
        let mut shards: Vec<String> =
            client.list_shards(dataset).await.unwrap().into_iter().map(|s| s.shard).collect();
        shards.sort();
        assert_eq!(names(&mnt.path().join(dataset)), shards, "{dataset}");
        // Every shard byte for byte, its size as listed.
        for shard in &shards {
            let (through, source) =
                (mnt.path().join(dataset).join(shard), root.path().join(dataset).join(shard));
            assert_eq!(std::fs::metadata(&through).unwrap().len(), std::fs::metadata(&source).unwrap().len());
            assert!(std::fs::read(&through).unwrap() == std::fs::read(&source).unwrap(), "{dataset}/{shard}");
            assert!(
                Command::new("cmp").arg(&through).arg(&source).status().unwrap().success(),
                "cmp {shard}"
            );
        }
    }
    let ls = Command::new("ls").arg("-R").arg(mnt.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&ls.stdout).contains("shard-00003.bin"), "ls -R lists the shards");
    // A read that starts mid-file after a seek.
    let (first, source) = (mnt.path().join("c4/shard-00001.bin"), c4.join("shard-00001.bin"));
    let mut file = std::fs::File::open(&first).unwrap();
    file.seek(SeekFrom::Start(MIB + 5)).unwrap();
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).unwrap();
    assert!(tail == std::fs::read(&source).unwrap()[(MIB + 5) as usize..], "read after a seek");

    // What does not exist is ENOENT; any change is EROFS.
    let missing = std::fs::File::open(mnt.path().join("c4/shard-99999.bin")).unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);
    assert_eq!(
        std::fs::metadata(mnt.path().join("no-such-dataset")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let read_only = [
        std::fs::write(mnt.path().join("c4/new.bin"), b"x").unwrap_err(),
        std::fs::OpenOptions::new().write(true).open(&first).unwrap_err(),
        std::fs::rename(&first, mnt.path().join("c4/renamed.bin")).unwrap_err(),
        std::fs::create_dir(mnt.path().join("c4/dir")).unwrap_err(),
        std::fs::remove_file(&first).unwrap_err(),
    ];
    for error in read_only {
        assert_eq!(error.kind(), ErrorKind::ReadOnlyFilesystem, "{error}");
    }
}

/// An 8 MiB shard mounted straight over a hub (the mount reads a hub as it reads a
/// spoke), opened by this process at version 1 with its head read, then replaced by
/// version 2 on the hub while the file stays open.
struct ReplacedWhileOpen {
    root: tempfile::TempDir,
    _hub: TestHub,
    _mnt: tempfile::TempDir,
    _mount: MountProcess,
    log: std::path::PathBuf,
    through: std::path::PathBuf,
    file: std::fs::File,
    old: Vec<u8>,
    new: Vec<u8>,
}

async fn replaced_while_open() -> ReplacedWhileOpen {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("ds/big.bin");
    let old = write_pattern(&path, (8 * MIB) as usize, 1);
    let hub = TestHub::start(root.path()).await;
    let mnt = tempfile::tempdir().unwrap();
    let log = root.path().join("mount.log");
    let mount = MountProcess::start(&hub.endpoint, mnt.path(), &[], &log);
    let through = mnt.path().join("ds/big.bin");
    let mut file = std::fs::File::open(&through).unwrap();
    let mut head = vec![0; 4096];
    file.read_exact(&mut head).unwrap();
    assert!(head == old[..4096]);
    let new = write_pattern(&root.path().join("ds/big.next"), (8 * MIB) as usize, 2);
    std::fs::rename(root.path().join("ds/big.next"), &path).unwrap();
    ReplacedWhileOpen { root, _hub: hub, _mnt: mnt, _mount: mount, log, through, file, old, new }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_changes_while_open_fails_with_eio_and_a_log_line_never_mixed_bytes() {
    skip_without_fuse!();
    // Every field bound (`_hub`, not `..`): the mount and the hub live as long as the test.
    let ReplacedWhileOpen { root: _root, _hub, _mnt, _mount, log, through, mut file, old: _, new } =
        replaced_while_open().await;
    // Past what read-ahead may have brought in: the read fails, it does not mix.
    file.seek(SeekFrom::Start(6 * MIB)).unwrap();
    let mut rest = vec![0; 4096];
    let error = file.read_exact(&mut rest).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(5), "EIO: {error}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("changed while open"), "the mount says why: {logged}");
    // Opened again: the new version, whole.
    drop(file);
    assert!(std::fs::read(&through).unwrap() == new, "reopened, the new bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_each_read_the_version_they_opened_and_pages_never_mix() {
    skip_without_fuse!();
    // Process A (this one) opened the shard at version 1 and read its head; the shard
    // changed. Process B opens it at once (through the name the kernel has cached) and
    // reads it whole: the new version, whole.
    // Every field bound (`_hub`, not `..`): the mount and the hub live as long as the test.
    let ReplacedWhileOpen { root, _hub, _mnt, _mount, log: _, through, file: mut a, old, new } =
        replaced_while_open().await;
    let copy = root.path().join("b.out");
    let b = Command::new("dd")
        .arg(format!("if={}", through.display()))
        .arg(format!("of={}", copy.display()))
        .arg("bs=1M")
        .output()
        .unwrap();
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    assert!(std::fs::read(&copy).unwrap() == new, "process B reads the new version");
    // A reads on: every byte it gets is version 1's (what the kernel cached for it), or
    // EIO; never a page of version 2 that B's reads brought in.
    let mut served = 0;
    for offset in (0..8 * MIB).step_by(MIB as usize) {
        a.seek(SeekFrom::Start(offset)).unwrap();
        let mut page = vec![0; 4096];
        match a.read_exact(&mut page) {
            Ok(()) => {
                assert!(page == old[offset as usize..][..4096], "A got another version's bytes at {offset}");
                served += 1;
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(5), "EIO: {e}"),
        }
    }
    assert!(served >= 1, "A's head is cached at its version");
    // Opened again (after B), A's name leads to the new version.
    drop(a);
    assert!(std::fs::read(&through).unwrap() == new);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_takes_the_endpoint_from_the_environment_like_every_command() {
    skip_without_fuse!();
    let root = tempfile::tempdir().unwrap();
    let files = make_dataset(root.path(), "c4", 1, MIB);
    let hub = TestHub::start(root.path()).await;
    let mnt = tempfile::tempdir().unwrap();
    let _mount = MountProcess::start_from_env(&hub.endpoint, mnt.path(), &root.path().join("mount.log"));
    let got = std::fs::read(mnt.path().join("c4/shard-00000.bin")).unwrap();
    assert!(got == std::fs::read(files.join("shard-00000.bin")).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_mid_read_is_eio_not_a_hung_reader() {
    skip_without_fuse!();
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 2, 8 * MIB);
    let hub = TestHub::start(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = spoke_options(&hub.endpoint);
    options.cache.fetch_whole_shard = false;
    let spoke = TestSpoke::start(cache.path(), options).await;
    let mnt = tempfile::tempdir().unwrap();
    let log = cache.path().join("mount.log");
    let _mount = MountProcess::start(&spoke.endpoint, mnt.path(), &["--timeout", "5"], &log);

    let mut file = std::fs::File::open(mnt.path().join("c4/shard-00000.bin")).unwrap();
    let mut head = vec![0; 4096];
    file.read_exact(&mut head).unwrap();
    spoke.stop().await;
    hub.stop().await.unwrap();
    let read = tokio::task::spawn_blocking(move || {
        file.seek(SeekFrom::Start(6 * MIB)).unwrap();
        let mut rest = vec![0; 4096];
        file.read_exact(&mut rest)
    });
    // Bounded: the mount's deadline is 5 s; a hung reader fails the test here.
    let result = tokio::time::timeout(Duration::from_secs(60), read).await.expect("the read hung").unwrap();
    assert_eq!(result.unwrap_err().raw_os_error(), Some(5), "EIO");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_fusermount_unmount_leave_nothing_behind() {
    skip_without_fuse!();
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 1, MIB);
    let hub = TestHub::start(root.path()).await;
    for how in ["SIGTERM", "fusermount3 -u"] {
        let mnt = tempfile::tempdir().unwrap();
        let log = root.path().join("mount.log");
        let mut mount = MountProcess::start(&hub.endpoint, mnt.path(), &[], &log);
        assert!(MountProcess::is_mounted(mnt.path()));
        assert_eq!(names(&mnt.path().join("c4")), ["shard-00000.bin"]);
        let done = if how == "SIGTERM" {
            Command::new("kill").args(["-TERM", &mount.child.id().to_string()]).status().unwrap()
        } else {
            Command::new("fusermount3").arg("-u").arg(mnt.path()).status().unwrap()
        };
        assert!(done.success(), "{how}");
        until(&format!("the mount process ending after {how}"), || {
            mount.child.try_wait().unwrap().is_some_and(|status| status.success())
        })
        .await;
        assert!(!MountProcess::is_mounted(mnt.path()), "{how} left the mount in place");
        assert!(names(mnt.path()).is_empty(), "the mount point is an empty directory again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_spokes_mounts_as_one_tree_and_fetches_once() {
    skip_without_fuse!();
    let root = tempfile::tempdir().unwrap();
    let c4 = make_dataset(root.path(), "c4", 6, MIB);
    let hub = TestHub::start(root.path()).await;
    // The hub across a link of 100 ms, as a group's hub is: a member that a read is
    // hedged to waits for the owner's fetch about as long as a fetch takes (twice its
    // p95); with the hub on loopback that wait is 50 ms, which an owner sharing two busy
    // cores can outlast, and the hedge would then fetch its read itself (by design).
    let link = WanProxy::start(
        "127.0.0.1:0".parse().unwrap(),
        hub.addr,
        LinkConfig::rtt(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let listeners =
        [TcpListener::bind("127.0.0.1:0").await.unwrap(), TcpListener::bind("127.0.0.1:0").await.unwrap()];
    let urls: Vec<String> = listeners.iter().map(|l| format!("http://{}", l.local_addr().unwrap())).collect();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut spokes = Vec::new();
    for ((listener, url), dir) in listeners.into_iter().zip(&urls).zip(&dirs) {
        let mut options = spoke_options(&link.endpoint());
        options.group =
            Some(PeerGroup { spec: urls.join(","), me: url.clone(), credentials: Default::default() });
        spokes.push(TestSpoke::start_on(listener, dir.path(), options).await);
    }
    let mnt = tempfile::tempdir().unwrap();
    let log = dirs[0].path().join("mount.log");
    let _mount = MountProcess::start(&urls.join(","), mnt.path(), &[], &log);
    let shards: Vec<String> = names(&c4).into_iter().filter(|n| n.ends_with(".bin")).collect();
    // Read on a blocking thread: the spokes serve the mount from this runtime's two
    // workers, and a read blocking one of them would slow them into hedging.
    let tree = mnt.path().join("c4");
    tokio::task::spawn_blocking(move || {
        assert_eq!(names(&tree), shards);
        for name in shards {
            assert!(std::fs::read(tree.join(&name)).unwrap() == std::fs::read(c4.join(&name)).unwrap());
        }
    })
    .await
    .unwrap();
    for spoke in &spokes {
        spoke.settled().await;
    }
    assert_eq!(hub.stats.snapshot().bytes_served, 6 * MIB, "the group fetched each shard once");
    let held: u64 = spokes.iter().map(|s| s.cache.used_bytes()).sum();
    assert_eq!(held, 6 * MIB, "each shard held by its owner only");
}

/// Reads `file` (whose bytes are `want`) as readers do, on one descriptor: sequential
/// runs in pieces from 1 byte to 3 MiB (the mount's read-ahead starts, grows and is
/// consumed), seeks back and forward (it is dropped), `pread`s at random offsets from
/// two threads at once, reads that cross the end; every byte must be the file's.
fn read_every_way(file: &std::fs::File, want: &[u8], seed: u64) {
    use std::os::unix::fs::FileExt;
    let mut rng = seed;
    let mut offset = 0u64;
    let sizes = [1u64, 4096, 65_536, MIB, 3 * MIB, 100_003];
    for step in 0..120 {
        if step % 7 == 6 {
            // Somewhere else: back, forward, or past the end.
            offset = shardcache_tests::next_random(&mut rng) % (want.len() as u64 + MIB);
        }
        let size = sizes[(shardcache_tests::next_random(&mut rng) % sizes.len() as u64) as usize];
        let mut buffer = vec![0; size as usize];
        let n = file.read_at(&mut buffer, offset).unwrap();
        let from = (offset as usize).min(want.len());
        let expected = &want[from..(from + size as usize).min(want.len())];
        assert_eq!(n, expected.len(), "read of {size} at {offset}: its length");
        assert!(buffer[..n] == *expected, "read of {size} at {offset}: its bytes");
        offset += n as u64;
    }
    std::thread::scope(|scope| {
        for thread in 0..2u64 {
            scope.spawn(move || {
                let mut rng = seed ^ (thread + 1);
                let mut buffer = vec![0; 16 << 10];
                for _ in 0..200 {
                    let at =
                        shardcache_tests::next_random(&mut rng) % (want.len() as u64 - buffer.len() as u64);
                    file.read_exact_at(&mut buffer, at).unwrap();
                    assert!(buffer[..] == want[at as usize..at as usize + buffer.len()], "pread at {at}");
                }
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_any_shape_and_order_are_the_files_bytes_past_the_page_cache_and_through_it() {
    skip_without_fuse!();
    let root = tempfile::tempdir().unwrap();
    // 41 MiB and a bit: past the read-ahead's largest window, ending mid-part.
    let want = write_pattern(&root.path().join("c4/long.bin"), (41 * MIB + 12_345) as usize, 7);
    let hub = TestHub::start(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let spoke = TestSpoke::start(cache.path(), spoke_options(&hub.endpoint)).await;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut version = release.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u32>().ok());
    let direct_io_mmap = (version.next().unwrap(), version.next().unwrap()) >= (6, 6);
    for (flags, said) in [
        (
            &[][..],
            if direct_io_mmap { "reads bypass the page cache" } else { "reads go through the page cache" },
        ),
        (&["--kernel-cache"][..], "reads go through the page cache (--kernel-cache)"),
    ] {
        let mnt = tempfile::tempdir().unwrap();
        let log = cache.path().join("mount.log");
        let mount = MountProcess::start_logged_with(&spoke.endpoint, mnt.path(), flags, &log, "info");
        let file = std::fs::File::open(mnt.path().join("c4/long.bin")).unwrap();
        tokio::task::block_in_place(|| read_every_way(&file, &want, flags.len() as u64 + 1));
        // A whole read in one go (as `cat` or numpy's fromfile): the file.
        assert!(std::fs::read(mnt.path().join("c4/long.bin")).unwrap() == want, "{flags:?}: a whole read");
        drop(file);
        drop(mount);
        let log = std::fs::read_to_string(&log).unwrap();
        assert!(log.contains(said), "{flags:?}: the mount says how it reads: {log}");
    }
}

/// A sequential reader's reads reach the server as fewer, larger calls: the mount's own
/// read-ahead streams a window ahead of it (a part, doubling to 32 MiB) instead of one
/// call per read. Mounted straight over a hub, which counts its calls. On kernels before
/// 6.6 the mount reads through the page cache instead (the kernel's read-ahead, in calls
/// of 128 KiB as a user): there only fewer calls than reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_reader_makes_fewer_larger_calls_to_the_server_than_its_reads() {
    skip_without_fuse!();
    let root = tempfile::tempdir().unwrap();
    let want = write_pattern(&root.path().join("c4/long.bin"), (24 * MIB) as usize, 3);
    let hub = TestHub::start(root.path()).await;
    let mnt = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let _mount = MountProcess::start(&hub.endpoint, mnt.path(), &[], &logs.path().join("mount.log"));
    let path = mnt.path().join("c4/long.bin");
    let (before, reads, got) = tokio::task::block_in_place(|| {
        let mut file = std::fs::File::open(&path).unwrap();
        let before = hub.stats.snapshot();
        let (mut got, mut buffer, mut reads) = (Vec::new(), vec![0u8; 64 << 10], 0u64);
        loop {
            let n = file.read(&mut buffer).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buffer[..n]);
            reads += 1;
        }
        (before, reads, got)
    });
    assert!(got == want, "the file's bytes");
    let calls = hub.stats.snapshot().read_requests - before.read_requests;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut version = release.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u32>().ok());
    let read_ahead = (version.next().unwrap(), version.next().unwrap()) >= (6, 6);
    eprintln!("{reads} reads of 64 KiB, {calls} calls to the server");
    assert!(reads >= 384, "{reads} reads of 64 KiB");
    if read_ahead {
        assert!(
            calls * 8 <= reads,
            "{calls} calls to the server for {reads} reads: the read-ahead streams ahead"
        );
    } else {
        assert!(calls < reads, "{calls} calls to the server for {reads} reads");
    }
}

/// On the spoke's node the mount reads what the spoke holds through its same-node door
/// (the SDK finds it by itself), the file's bytes as on the hub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_spokes_node_the_mount_reads_warm_bytes_through_the_door() {
    skip_without_fuse!();
    let root = tempfile::tempdir().unwrap();
    let want = write_pattern(&root.path().join("c4/door.bin"), (3 * MIB + 777) as usize, 3);
    let hub = TestHub::start(root.path()).await;
    let cache = tempfile::tempdir().unwrap();
    let mut options = spoke_options(&hub.endpoint);
    options.local_socket = Some(cache.path().join("local.sock"));
    let spoke = TestSpoke::start(&cache.path().join("store"), options).await;
    for phase in ["cold", "warm"] {
        // A new mount each time: the warm read is not the first mount's memory.
        let mnt = tempfile::tempdir().unwrap();
        let mount = MountProcess::start(&spoke.endpoint, mnt.path(), &[], &cache.path().join("mount.log"));
        let read = tokio::task::block_in_place(|| std::fs::read(mnt.path().join("c4/door.bin")).unwrap());
        assert!(read == want, "{phase}: the file's bytes");
        drop(mount);
        spoke.settled().await;
    }
    let placed = spoke.metric("shardcache_spoke_local_door_placed_bytes_total").await;
    assert!(placed >= want.len() as f64, "the warm read came through the door: {placed} bytes placed");
}
