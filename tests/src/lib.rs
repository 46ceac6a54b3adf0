//! Helpers for shardcache's end-to-end tests: real servers on `127.0.0.1:0` (in-process
//! or as child processes of the built binaries), datasets made by the real generator,
//! and digests to compare bytes.
//!
//! No fixed ports and no sleeps: an in-process server is ready once its listener is
//! bound (the kernel queues connections before `accept`), and a child process is ready
//! once it prints its `listening on` line.

#![allow(clippy::unwrap_used)] // test support: a failed setup should fail the test loudly

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use hub_server::{ServeOptions, service::ReadLimits, source::local::LocalSource};
use sha2::{Digest, Sha256};
use shardcache_client::{
    Client,
    dataset_gen::{GenSpec, generate},
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};

/// Serving options for tests: small chunks so chunk edges are cheap to reach.
pub fn test_options() -> ServeOptions {
    ServeOptions {
        limits: ReadLimits { chunk_size: 64 << 10, max_read: 1 << 20 },
        max_concurrency: 64,
        request_timeout: Duration::from_secs(30),
    }
}

/// A hub served in-process on `127.0.0.1:0`; stops when dropped.
#[derive(Debug)]
pub struct TestHub {
    pub addr: SocketAddr,
    pub endpoint: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<hub_server::Result<()>>>,
}

impl TestHub {
    pub async fn start(root: &Path) -> Self {
        Self::start_with(root, test_options()).await
    }

    pub async fn start_with(root: &Path, options: ServeOptions) -> Self {
        let source = Arc::new(LocalSource::new(root).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(hub_server::serve(listener, source, options, async {
            let _ = rx.await;
        }));
        Self { addr, endpoint: format!("http://{addr}"), shutdown: Some(tx), task: Some(task) }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.endpoint).await.unwrap()
    }

    /// A raw channel, for the generated clients of other services (health, reflection).
    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Channel::from_shared(self.endpoint.clone()).unwrap().connect().await.unwrap()
    }

    /// Graceful stop; returns what `serve` returned.
    pub async fn stop(mut self) -> hub_server::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.take().unwrap().await.unwrap()
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Generates `shards` shards of `shard_size` bytes (16 KiB records) as dataset `name`.
pub fn make_dataset(root: &Path, name: &str, shards: u32, shard_size: u64) -> PathBuf {
    let spec = GenSpec {
        dir: root.to_owned(),
        dataset: name.to_owned(),
        shards,
        shard_size,
        record_size: 16 << 10,
        seed: 42,
    };
    generate(&spec).unwrap().dataset_dir
}

/// Writes a file of `len` deterministic bytes (not a multiple of any chunk size unless asked).
pub fn write_pattern(path: &Path, len: usize, salt: u8) -> Vec<u8> {
    let data: Vec<u8> =
        (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ salt).collect();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, &data).unwrap();
    data
}

/// Overwrites `path` in place (same inode, same size) with `data`, and makes sure the
/// change is visible in ctime: a rewrite within the same filesystem clock tick (a few
/// ms) as the previous write would be invisible to any timestamp-based version, so the
/// write is repeated until the tick has moved (bounded).
pub fn rewrite_in_place(path: &Path, data: &[u8]) {
    use std::{io::Write, os::unix::fs::MetadataExt};
    let stamp = |m: &std::fs::Metadata| (m.ctime(), m.ctime_nsec());
    let before = stamp(&std::fs::metadata(path).unwrap());
    for _ in 0..1000 {
        let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        file.write_all(data).unwrap();
        file.sync_all().unwrap();
        if stamp(&file.metadata().unwrap()) != before {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("ctime of {} never moved", path.display());
}

pub fn sha256(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// Path of a binary of this workspace, built by `cargo build --bins` (`make test` does).
pub fn binary(name: &str) -> PathBuf {
    // The test executable lives in target/<profile>/deps/.
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (`make test` does)",
        path.display()
    );
    path
}

/// A `hub-server` child process on `127.0.0.1:0`; killed when dropped.
#[derive(Debug)]
pub struct HubProcess {
    pub child: Child,
    pub endpoint: String,
}

impl HubProcess {
    pub fn start(root: &Path, extra_args: &[&str]) -> Self {
        let mut child = Command::new(binary("hub-server"))
            .args(["--root", root.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(extra_args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("hub-server listening on ")
            .unwrap_or_else(|| panic!("hub-server did not report its address; it printed {line:?}"));
        Self { endpoint: format!("http://{addr}"), child }
    }
}

impl Drop for HubProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
