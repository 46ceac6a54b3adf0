//! Helpers for shardcache's end-to-end tests: real servers on `127.0.0.1:0` (in-process
//! or as child processes of the built binaries), datasets made by the real generator,
//! and digests to compare bytes.
//!
//! No fixed ports and no sleeps: an in-process server is ready once its listener is
//! bound (the kernel queues connections before `accept`), and a child process is ready
//! once it prints its `listening on` line.

#![allow(clippy::unwrap_used)] // test support: a failed setup should fail the test loudly

pub mod address;
pub mod chaos;
pub mod disk;
pub mod group;
pub mod otel;
pub mod pki;
pub mod process;
pub mod s3;
pub mod soak;
pub mod watchdog;
pub mod wire;
pub use address::KeptAddress;
pub use group::TestGroup;
pub use process::{Cli, HubProcess, MountProcess, ProxyProcess, SpokeProcess, binary, workspace_dir};
/// The WAN emulator (its own crate, `tools/wan-proxy`), under the name the tests use.
pub use shardcache_wan as wan;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use hub_server::{ServeOptions, source::local::LocalSource, stats::HubStats};
use sha2::{Digest, Sha256};
use shardcache_cli::dataset_gen::{GenSpec, generate};
use shardcache_client::{CacheClient, Client};
use shardcache_reader::ReadLimits;
use shardcache_serving::server::ServerLimits;
use spoke_cache::{
    SpokeOptions,
    cache::{Cache, CacheConfig},
    policy::window::PlanWindow,
    store::StoreOptions,
};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};

/// Serving options for tests: small chunks so chunk edges are cheap to reach; link
/// compression at the hub's default, as hubs run.
pub fn test_options() -> ServeOptions {
    ServeOptions {
        limits: ReadLimits {
            message_size: 64 << 10,
            max_read: 1 << 20,
            compression: Some(hub_server::config::DEFAULT_COMPRESSION_LEVEL),
        },
        server: server_limits(64),
        http2: shardcache_transport::http2::Http2Settings::TUNED,
        security: Default::default(),
    }
}

/// Server limits for tests: `max_concurrency` requests in flight, the default streams
/// per connection, 30 s per request.
pub fn server_limits(max_concurrency: usize) -> ServerLimits {
    ServerLimits {
        max_concurrency,
        max_streams_per_connection: shardcache_serving::server::DEFAULT_MAX_STREAMS_PER_CONNECTION,
        request_timeout: Duration::from_secs(30),
    }
}

/// A hub served in-process on `127.0.0.1:0`; stops when dropped.
#[derive(Debug)]
pub struct TestHub {
    pub addr: SocketAddr,
    pub endpoint: String,
    /// What this hub has served: a warm spoke must not move these.
    pub stats: Arc<HubStats>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<hub_server::Result<()>>>,
    _watched: watchdog::Watched,
}

impl TestHub {
    pub async fn start(root: &Path) -> Self {
        Self::start_with(root, test_options()).await
    }

    pub async fn start_with(root: &Path, options: ServeOptions) -> Self {
        Self::start_source(Arc::new(LocalSource::new(root).unwrap()), options).await
    }

    /// A hub over any source (S3 in the S3 tests).
    pub async fn start_source<S: hub_server::source::Storage>(source: S, options: ServeOptions) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let stats = Arc::new(HubStats::default());
        let scheme = if options.security.tls.is_some() { "https" } else { "http" };
        let task = tokio::spawn(hub_server::serve(listener, source, options, stats.clone(), async {
            let _ = rx.await;
        }));
        Self {
            addr,
            endpoint: format!("{scheme}://{addr}"),
            stats,
            shutdown: Some(tx),
            task: Some(task),
            _watched: watchdog::watch(),
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.endpoint).await.unwrap()
    }

    /// A raw channel with tonic's default settings (64 KiB HTTP/2 windows), for the
    /// generated clients of other services (health, reflection).
    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Channel::from_shared(self.endpoint.clone()).unwrap().connect().await.unwrap()
    }

    /// An SDK client over [`Self::channel`]'s small windows, for tests that need an open
    /// stream to stay open: with the SDK's own 8 MiB windows the hub can send a whole
    /// test-sized shard into the window and finish before the test acts on the stream.
    pub async fn client_with_small_windows(&self) -> Client {
        Client::from_channel(self.channel().await, &self.endpoint)
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

/// Logs of the servers under test, when `RUST_LOG` asks for them (e.g.
/// `RUST_LOG=spoke_cache=debug cargo test ...`); silent otherwise.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Spoke options for tests: small chunks, a long TTL (tests that need revalidation
/// set it), whole-shard fetch on.
pub fn spoke_options(hub: &str) -> SpokeOptions {
    SpokeOptions {
        group: None,
        hub_transport: Default::default(),
        hubs: vec![hub.to_owned()],
        cache: CacheConfig {
            capacity: 1 << 30,
            high_watermark: 0.95,
            low_watermark: 0.85,
            chunk_size: 256 << 10,
            revalidate_after: Duration::from_secs(3600),
            fetch_whole_shard: true,
            read_ahead_chunks: 2,
            shard_fetch_parallelism: 4,
            upstream_bytes_in_flight: 64 << 20,
            plan_window: PlanWindow::Blocks,
            plan_limits: Default::default(),
            metric_jobs: ["trainer".to_owned()].into(),
            empty_entries_kept: spoke_cache::cache::EMPTY_ENTRIES_KEPT,
            tenant_shares: Default::default(),
        },
        store: StoreOptions::default(),
        max_read: 1 << 20,
        server: server_limits(1024),
        hub_credentials: Default::default(),
        security: Default::default(),
        metrics_access: shardcache_serving::scrape::ScrapeAccess { token: None },
        // Off unless a test opens it (`tests/tests/local_door.rs`): the other tests read
        // over gRPC, as a reader on another node does.
        local_socket: None,
        // The S3 door is served by `TestSpoke::start_with_s3` only.
        s3: Default::default(),
    }
}

/// A spoke served in-process on `127.0.0.1:0` over a cache directory; stops when dropped.
#[derive(Debug)]
pub struct TestSpoke {
    pub endpoint: String,
    pub metrics_addr: SocketAddr,
    /// The S3 door's address (`start_with_s3`).
    pub s3_addr: Option<SocketAddr>,
    pub cache: Arc<Cache>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<spoke_cache::Result<()>>>,
    _watched: watchdog::Watched,
}

impl TestSpoke {
    pub async fn start(cache_dir: &Path, options: SpokeOptions) -> Self {
        Self::start_on(TcpListener::bind("127.0.0.1:0").await.unwrap(), cache_dir, options).await
    }

    /// Starts with its S3 door open too, on `127.0.0.1:0` ([`TestSpoke::s3_addr`]).
    pub async fn start_with_s3(cache_dir: &Path, options: SpokeOptions) -> Self {
        let (listener, s3) = (
            TcpListener::bind("127.0.0.1:0").await.unwrap(),
            TcpListener::bind("127.0.0.1:0").await.unwrap(),
        );
        Self::start_on_with(listener, Some(s3), cache_dir, options).await
    }

    /// Starts on `listener` (a group's members must know each other's addresses first).
    pub async fn start_on(listener: TcpListener, cache_dir: &Path, options: SpokeOptions) -> Self {
        Self::start_on_with(listener, None, cache_dir, options).await
    }

    async fn start_on_with(
        listener: TcpListener,
        s3: Option<TcpListener>,
        cache_dir: &Path,
        options: SpokeOptions,
    ) -> Self {
        init_logging();
        let s3_addr = s3.as_ref().map(|s3| s3.local_addr().unwrap());
        let cache = spoke_cache::open_cache(cache_dir, &options).unwrap();
        let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (addr, metrics_addr) = (listener.local_addr().unwrap(), metrics.local_addr().unwrap());
        let (tx, rx) = oneshot::channel();
        let served = cache.clone();
        let scheme = if options.security.tls.is_some() { "https" } else { "http" };
        let task = tokio::spawn(async move {
            spoke_cache::serve(listener, metrics, s3, served, &options, async {
                let _ = rx.await;
            })
            .await
        });
        Self {
            endpoint: format!("{scheme}://{addr}"),
            metrics_addr,
            s3_addr,
            cache,
            shutdown: Some(tx),
            task: Some(task),
            _watched: watchdog::watch(),
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.endpoint).await.unwrap()
    }

    pub async fn control(&self) -> CacheClient {
        CacheClient::connect(&self.endpoint).await.unwrap()
    }

    /// Waits (bounded) until every fetched chunk is stored (a reader gets a chunk's
    /// bytes before it is) and the evictor has brought `used` back under the high
    /// watermark.
    pub async fn settled(&self) {
        let limit = (self.cache.config().capacity as f64 * self.cache.config().high_watermark) as u64;
        for _ in 0..2000 {
            let cache = &self.cache;
            let idle = cache.fetches_running() == 0;
            if idle && cache.used_bytes() <= limit && !cache.is_evicting() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("eviction did not bring {} under {limit}", self.cache.used_bytes());
    }

    /// The Prometheus page, fetched over HTTP like a scraper would.
    pub async fn scrape(&self) -> String {
        let page = scrape_metrics(self.metrics_addr).await.unwrap();
        assert!(page.starts_with("HTTP/1.") && page.contains(" 200 OK"), "{page}");
        page
    }

    /// The value of one metric line (`name{labels}`) on the metrics page.
    pub async fn metric(&self, series: &str) -> f64 {
        let page = self.scrape().await;
        page.lines()
            .find_map(|l| {
                l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).map(|v| v.parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no {series} in\n{page}"))
    }

    /// Graceful stop; returns once the cache (and its RocksDB) is closed, so the same
    /// directory can be opened again. Background shard fetches still running hold the
    /// cache until they finish: bounded wait for them.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.take().unwrap().await.unwrap().unwrap();
        for _ in 0..1000 {
            if Arc::strong_count(&self.cache) == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the cache is still in use 10 s after the spoke stopped");
    }
}

impl Drop for TestSpoke {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Generates `shards` shards of `shard_size` bytes (16 KiB records) as dataset `name`.
/// `length` bytes that do not compress (images, encrypted or already compressed data),
/// quickly: xorshift64 from `seed` (not zero).
pub fn incompressible(length: usize, mut seed: u64) -> Vec<u8> {
    (0..length)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
}

pub fn make_dataset(root: &Path, name: &str, shards: u32, shard_size: u64) -> PathBuf {
    let spec = GenSpec {
        dir: root.to_owned(),
        dataset: name.to_owned(),
        shards,
        shard_size,
        record_size: 16 << 10,
        seed: 42,
        tokens: Default::default(),
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

/// Writes a token file at `path` with a new token for each `(name, datasets)` holder
/// (`datasets`: `*` or a comma-separated list, then ` control` for a token that may
/// control a spoke's cache); returns the tokens, in order.
pub fn token_file(path: &Path, holders: &[(&str, &str)]) -> Vec<String> {
    use shardcache_serving::auth::{Datasets, TokenHolder, new_token};
    let mut text = String::from("# test tokens\n");
    let mut tokens = Vec::new();
    for (name, datasets) in holders {
        let token = new_token().unwrap();
        let (datasets, control) = match datasets.split_once(' ') {
            Some((datasets, "control")) => (datasets, true),
            _ => (*datasets, false),
        };
        let holder =
            TokenHolder { name: (*name).into(), datasets: Datasets::parse(datasets).unwrap(), control };
        text.push_str(&holder.line(&token));
        text.push('\n');
        tokens.push(token);
    }
    std::fs::write(path, text).unwrap();
    tokens
}

/// Serves `reader` (a test's wrapper around the real read service) on `127.0.0.1:0` with
/// the open authenticator (every dataset granted, as on a server without tokens);
/// returns its `http://` endpoint.
pub async fn serve_reader<R>(reader: Arc<R>) -> String
where
    R: shardcache_proto::v1::shard_reader_server::ShardReader,
{
    use shardcache_proto::v1::shard_reader_server::ShardReaderServer;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(tonic::service::interceptor::InterceptedService::new(
                ShardReaderServer::from_arc(reader),
                shardcache_serving::auth::Authenticator::open(),
            ))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    endpoint
}

/// A small LCG for reproducible random offsets.
pub fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    *state >> 11
}

/// Every `record`-byte record of `shards` shards of `shard_size` bytes as (shard,
/// offset), in an order shuffled by `seed` (a reader that reads each once an epoch).
pub fn shuffled_records(shards: u32, shard_size: u64, record: u64, seed: u64) -> Vec<(u32, u64)> {
    let per_shard = shard_size / record;
    let mut order: Vec<(u32, u64)> =
        (0..shards).flat_map(|s| (0..per_shard).map(move |i| (s, i * record))).collect();
    let mut rng = seed;
    for i in (1..order.len()).rev() {
        order.swap(i, (next_random(&mut rng) % (i as u64 + 1)) as usize);
    }
    order
}

pub fn sha256(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// `GET /metrics` from a spoke's metrics address (HTTP/1.0, as Prometheus would): the
/// whole response, status line included.
pub async fn scrape_metrics(addr: impl tokio::net::ToSocketAddrs) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await?;
    socket.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await?;
    let mut page = String::new();
    socket.read_to_string(&mut page).await?;
    Ok(page)
}

/// Waits until `done()` holds, checking every 100 ms for at most 30 s, and panics
/// naming `what` if it never does: a bounded wait for something that happens in the
/// background (a process ending, a membership change seen), never a timing assertion.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..300 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen within 30 s");
}

/// A free loopback address (`127.0.0.1:PORT`), for servers that must be told each
/// other's addresses before they start (a group of spokes). The port is free again when
/// this returns; the server that binds it next takes it.
pub fn free_loopback_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Every byte of every shard in `dataset_dir`, read through `client`, equals the file.
pub async fn assert_dataset_reads_back(client: &Client, dataset: &str, dataset_dir: &Path) {
    for shard in client.list_shards(dataset).await.unwrap() {
        let got =
            client.stream_shard(dataset, &shard.shard, 0, None).await.unwrap().read_to_end().await.unwrap();
        let want = std::fs::read(dataset_dir.join(&shard.shard)).unwrap();
        assert_eq!(sha256(&got), sha256(&want), "{dataset}/{}", shard.shard);
    }
}

/// Disk usage of a directory tree in bytes (allocated blocks, like `du`: a file linked
/// twice counted once).
pub fn disk_usage(dir: &Path) -> u64 {
    let (data, own) = disk::cache_dir_bytes(dir);
    data + own
}
