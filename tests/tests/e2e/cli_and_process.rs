//! The binaries as a user runs them: `hub-server` as a process on port 0, the
//! `shardcache` CLI against it, `shardcache gen` determinism, graceful SIGTERM, and
//! discovery through gRPC reflection (what grpcurl and ghz use).

#![allow(clippy::unwrap_used)]

use std::process::Command;

use shardcache_tests::{Cli, HubProcess, TestHub, binary, make_dataset, sha256};
use tonic_reflection::pb::{v1, v1alpha};

#[test]
fn cli_get_writes_the_shard_and_cat_prints_the_range() {
    let root = tempfile::tempdir().unwrap();
    let dir = make_dataset(root.path(), "c4", 2, 1 << 20);
    let hub = HubProcess::start(root.path(), &["--message-size", "256KiB"]);
    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("shard.bin");

    let get = Cli::at(&hub.endpoint, &["get", "c4", "shard-00001.bin", "-o", target.to_str().unwrap()]);
    assert!(get.ok, "{}", get.stderr);
    let original = std::fs::read(dir.join("shard-00001.bin")).unwrap();
    assert_eq!(sha256(&std::fs::read(&target).unwrap()), sha256(&original));
    let report = get.stderr;
    assert!(report.contains("1048576 bytes in 4 chunks, CRC32C verified"), "{report}");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 1, "no partial file left behind");

    let cat =
        Cli::at(&hub.endpoint, &["cat", "c4", "shard-00000.bin", "--offset", "16384", "--length", "16384"]);
    assert!(cat.ok);
    assert_eq!(cat.stdout, std::fs::read(dir.join("shard-00000.bin")).unwrap()[16384..32768]);

    let ls = Cli::at(&hub.endpoint, &["ls"]);
    let listing = ls.text();
    assert!(
        listing.lines().any(|l| l.starts_with("c4") && l.contains("2MiB") && l.contains("16KiB")),
        "{listing}"
    );
    let stat = Cli::at(&hub.endpoint, &["stat", "c4", "shard-00000.bin"]);
    assert!(stat.text().contains("size:        1048576 bytes"));
}

/// `get -o` to something that is not a regular file writes into it and leaves it what it
/// was: `/dev/null` stays the character device (renaming a partial file over it replaced
/// the machine's /dev/null), a FIFO's reader gets the shard, and `-` is standard output.
#[test]
fn cli_get_writes_devices_fifos_and_stdout_in_place() {
    use std::os::unix::fs::FileTypeExt;
    let root = tempfile::tempdir().unwrap();
    let dir = make_dataset(root.path(), "c4", 1, 1 << 20);
    let original = std::fs::read(dir.join("shard-00000.bin")).unwrap();
    let hub = HubProcess::start(root.path(), &["--message-size", "256KiB"]);

    let get = Cli::at(&hub.endpoint, &["get", "c4", "shard-00000.bin", "-o", "/dev/null"]);
    assert!(get.ok, "{}", get.stderr);
    assert!(get.stderr.contains("1048576 bytes"));
    let null = std::fs::metadata("/dev/null").unwrap();
    assert!(null.file_type().is_char_device(), "/dev/null is no longer a character device");
    assert!(!std::path::Path::new("/dev/.null.partial").exists());

    let stdout = Cli::at(&hub.endpoint, &["get", "c4", "shard-00000.bin", "-o", "-"]);
    assert!(stdout.ok, "{}", stdout.stderr);
    assert_eq!(sha256(&stdout.stdout), sha256(&original));
    assert!(!std::path::Path::new("-").exists(), "'-' means standard output, not a file named '-'");

    let out = tempfile::tempdir().unwrap();
    let fifo = out.path().join("pipe");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let get = Cli::at(&hub.endpoint, &["get", "c4", "shard-00000.bin", "-o", fifo.to_str().unwrap()]);
    assert!(get.ok, "{}", get.stderr);
    assert_eq!(sha256(&reader.join().unwrap()), sha256(&original));
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 1, "no partial file left behind");
}

#[test]
fn cli_errors_are_one_readable_line_and_a_failure_exit() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 1, 1 << 20);
    let hub = HubProcess::start(root.path(), &[]);
    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("x.bin");
    let get = Cli::at(&hub.endpoint, &["get", "c4", "../../etc/passwd", "-o", target.to_str().unwrap()]);
    assert!(!get.ok);
    let message = get.stderr;
    assert!(message.contains("InvalidArgument") && message.contains("'..' component"), "{message}");
    assert!(!target.exists());
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "no partial file left behind");

    let down = Cli::at("http://127.0.0.1:1", &["ls"]);
    assert!(!down.ok);
    assert!(down.stderr.contains("cannot connect to http://127.0.0.1:1"));
}

#[test]
fn gen_is_deterministic_across_runs() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for dir in [&a, &b] {
        let dir = dir.path().to_str().unwrap();
        let args = ["gen", "--dir", dir, "--dataset", "c4", "--shards", "3", "--shard-size", "1MiB"];
        Cli::run(&[&args[..], &["--record-size", "16KiB", "--seed", "9"]].concat()).ok_bytes();
    }
    for i in 0..3 {
        let name = format!("c4/shard-0000{i}.bin");
        let (x, y) =
            (std::fs::read(a.path().join(&name)).unwrap(), std::fs::read(b.path().join(&name)).unwrap());
        assert_eq!(x.len(), 1 << 20);
        assert_eq!(sha256(&x), sha256(&y));
    }
}

#[test]
fn hub_refuses_bad_flags_and_stops_gracefully_on_sigterm() {
    let bad = Command::new(binary("hub-server"))
        .args(["--root", "/nonexistent/dir", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("cannot serve --root /nonexistent/dir"));
    let bad = Command::new(binary("hub-server"))
        .args(["--root", "/tmp", "--message-size", "1GiB"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--message-size 1GiB is outside"));

    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 1, 1 << 20);
    let mut hub = HubProcess::start(root.path(), &[]);
    let pid = hub.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = hub.child.wait().unwrap();
    assert!(status.success(), "hub-server exits 0 after SIGTERM, got {status}");
}

#[tokio::test]
async fn reflection_v1_and_v1alpha_list_the_read_service() {
    let root = tempfile::tempdir().unwrap();
    let hub = TestHub::start(root.path()).await;

    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(hub.channel().await);
    let mut responses =
        client.server_reflection_info(tokio_stream::iter([request])).await.unwrap().into_inner();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        responses.message().await.unwrap().unwrap().message_response
    else {
        panic!("not a service list")
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"shardcache.v1.ShardReader".to_owned()), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health".to_owned()), "{names:?}");

    // v1alpha: ask for the file that defines the read service.
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
            "shardcache.v1.ShardReader".into(),
        )),
    };
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(hub.channel().await);
    let mut responses =
        client.server_reflection_info(tokio_stream::iter([request])).await.unwrap().into_inner();
    let Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(files)) =
        responses.message().await.unwrap().unwrap().message_response
    else {
        panic!("not a file descriptor")
    };
    assert!(!files.file_descriptor_proto.is_empty());
}

#[tokio::test]
async fn the_hub_serves_prometheus_metrics_of_what_it_served() {
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "c4", 2, 1 << 20);
    let hub = HubProcess::start(root.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let metrics = hub.metrics_addr.clone().expect("the hub reports its metrics address");
    let client = shardcache_client::Client::connect(&hub.endpoint).await.unwrap();
    client.stat("c4", "shard-00000.bin").await.unwrap();
    let ranges = [
        shardcache_client::Range::new("c4", "shard-00000.bin", 0, 4096),
        shardcache_client::Range::new("c4", "shard-00001.bin", 100, 1000),
    ];
    client.read_ranges(&ranges).await.unwrap();
    let page = shardcache_tests::scrape_metrics(metrics.as_str()).await.unwrap();
    assert!(page.contains(" 200 OK"), "{page}");
    for line in [
        "shardcache_hub_bytes_served_total 5096",
        "shardcache_hub_read_requests_total 1",
        "shardcache_hub_stat_requests_total 1",
        "shardcache_hub_read_seconds_count 1",
        "shardcache_hub_token_file_broken 0",
    ] {
        assert!(page.lines().any(|l| l == line), "no {line:?} in\n{page}");
    }
}

#[test]
fn the_spoke_runs_with_its_allocator_settings_and_keeps_an_operators_own() {
    // glibc's settings the spoke runs again with (`shardcache_serving::allocator`): the
    // process that serves has them in its environment, by the same process id.
    let root = tempfile::tempdir().unwrap();
    make_dataset(root.path(), "ds", 1, 1 << 20);
    let hub = HubProcess::start(root.path(), &[]);
    let environment = |pid: u32| std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let has = |env: &[u8], what: &str| env.windows(what.len()).any(|w| w == what.as_bytes());
    let cache = tempfile::tempdir().unwrap();
    let spoke = shardcache_tests::SpokeProcess::start(&hub.endpoint, cache.path(), &[]);
    let env = environment(spoke.child.id());
    assert!(
        has(&env, "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432"),
        "the spoke runs with its settings"
    );
    drop(spoke);
    // An operator's own trim threshold is theirs: not run again, not overridden.
    let spoke = shardcache_tests::SpokeProcess::start_with_env(
        &hub.endpoint,
        cache.path(),
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576"),
    );
    let env = environment(spoke.child.id());
    assert!(has(&env, "GLIBC_TUNABLES=glibc.malloc.trim_threshold=1048576"), "the operator's setting stays");
    assert!(!has(&env, "mmap_threshold"), "nothing added to it");
}
