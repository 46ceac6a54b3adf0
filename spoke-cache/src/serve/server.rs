//! Assembles the spoke: opens the cache, then serves health, reflection, the read API and
//! cache control on one listener and metrics on another, until shutdown.

use std::{
    future::Future,
    path::{Path, PathBuf},
    sync::Arc,
};

use shardcache_client::ConnectOptions;
use shardcache_proto::v1::{
    cache_control_server::{self, CacheControlServer},
    shard_reader_server::{self, ShardReaderServer},
};
use shardcache_reader::{ReadLimits, ReadService};
use shardcache_serving::{
    scrape::{ScrapeAccess, serve_metrics},
    server::{self, Security, ServerLimits},
};
use shardcache_transport::http2::Http2Settings;
use tokio::net::TcpListener;
use tonic::service::{Routes, interceptor::InterceptedService};

use crate::{
    Error, Result,
    cache::{Cache, CacheConfig},
    fetch::suppliers::{Chain, hubs::HubTransport},
    observe::metrics::{Metrics, Occupancy},
    serve::control::Control,
    serve::local_door::{Announced, LocalDoor},
    serve::s3::{S3Door, S3Options},
    serve::source::{CachedSource, STREAM_MESSAGE_MAX},
    store::{Store, StoreOptions},
};

/// Everything the spoke needs to serve.
#[derive(Debug, Clone)]
pub struct SpokeOptions {
    pub hubs: Vec<String>,
    /// The spoke's group (`--peers`, `--peer-self`), if it has one.
    pub group: Option<PeerGroup>,
    pub hub_transport: HubTransport,
    /// TLS files and token for the hubs (`Debug` redacts the token).
    pub hub_credentials: ConnectOptions,
    pub cache: CacheConfig,
    pub store: StoreOptions,
    pub max_read: u64,
    /// Requests in flight, per connection, and their deadline.
    pub server: ServerLimits,
    /// TLS (gRPC and metrics listeners) and client tokens.
    pub security: Security,
    /// Who may scrape the metrics listener.
    pub metrics_access: ScrapeAccess,
    /// The same-node door's socket (`--local-socket`; `serve/local_door.rs`), or none.
    pub local_socket: Option<PathBuf>,
    /// The S3 door's keys and domains (`serve/s3/`), for when it has a listener.
    pub s3: S3Options,
}

/// A spoke's group: its members (`URL1,URL2,...`, `file:PATH` or
/// `dns+http://NAME:PORT`: `shardcache_client::discovery`), and this spoke's URL.
#[derive(Debug, Clone)]
pub struct PeerGroup {
    pub spec: String,
    pub me: String,
    /// What this spoke presents to its peers: the TLS files it presents to its hubs and
    /// its `--peer-token-file` (never its hub token; `Debug` redacts the token).
    pub credentials: ConnectOptions,
}

/// Opens the cache in `dir`. A cache whose files are damaged (RocksDB's `Corruption`
/// status while opening or loading it) is removed and started empty, with an error in
/// the log: the hub has every byte, so a broken cache costs a refill, never a refusal to
/// start, and its damaged files do not keep taking the disk. Only the store's own files
/// are removed; any other error (a bad option, a permission) stops the start instead.
pub fn open_cache(dir: &Path, options: &SpokeOptions) -> Result<Arc<Cache>> {
    let group = options.group.as_ref().map(|g| (g.spec.as_str(), g.me.as_str(), &g.credentials));
    let create = |dir: &Path| {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Config(format!("cannot create --cache-dir {}: {e}", dir.display())))
    };
    create(dir)?;
    // The jobs' tables are kept beside the store (the directory exists now).
    let metrics = Arc::new(Metrics::labelling(options.cache.metric_jobs.clone()).with_job_tables(dir));
    let chain = || {
        let (hubs, transport, credentials) =
            (&options.hubs, &options.hub_transport, &options.hub_credentials);
        Chain::new(hubs, transport, credentials, group, metrics.hedges.clone())
    };
    let open = || {
        let store = Store::open(dir, &options.store)?;
        Cache::open(store, chain()?, options.cache.clone(), metrics.clone())
    };
    let opened = match open() {
        Err(e) if e.is_damage() => {
            // Only the store's own files go: --cache-dir is the user's directory and may
            // hold other things.
            tracing::error!(error = %e, dir = %dir.display(), "cache files are damaged; removing the store's files and starting empty");
            let left = Store::destroy(dir)?;
            if !left.is_empty() {
                tracing::warn!(dir = %dir.display(), ?left, "kept files in the cache directory that are not the store's");
            }
            create(dir)?;
            open()
        }
        other => other,
    }?;
    fit_filesystem(&opened, dir);
    Ok(opened)
}

/// A `--capacity` larger than the cache's filesystem can hold (what the cache holds and
/// what is free) is a warning, and the capacity in effect is what it can hold: the
/// evictor then keeps the cache within the disk rather than storing until it fails.
fn fit_filesystem(cache: &Cache, dir: &Path) {
    let Some(available) = crate::store::admission::filesystem_available(dir) else { return };
    let holds = cache.used_bytes() + available;
    let capacity = cache.capacity();
    if capacity.configured() > holds {
        capacity.limit_to(holds);
        tracing::warn!(
            dir = %dir.display(),
            capacity = capacity.configured(),
            holds,
            "--capacity is larger than the cache's filesystem can hold; storing at most what it holds"
        );
    }
}

/// What a user would otherwise find out later, said at start: a group that is open or
/// cannot authenticate its members, a `--peer-self` that names another port than the
/// one listened on, and (in the background) hubs that cannot be used.
fn say_what_is_wrong_at_start(
    cache: &Arc<Cache>,
    options: &SpokeOptions,
    listening: Option<std::net::SocketAddr>,
) {
    if let Some(group) = &options.group {
        warn_about_the_group(group, &options.security);
        if let (Some(named), Some(listening)) = (url_port(&group.me), listening)
            && named != listening.port()
        {
            tracing::warn!(
                peer_self = group.me,
                listening = %listening,
                "--peer-self names port {named} but this spoke listens on {}: its members know it by a URL that \
                 is not its own (shards it should own go unfetched or twice); make --peer-self this spoke's \
                 address as the group lists it",
                listening.port()
            );
        }
    }
    // The hubs at start: a spoke that cannot use them serves only what it has cached,
    // and says so now rather than on the first miss.
    let checked = cache.clone();
    tokio::spawn(async move {
        for problem in checked.hubs().check().await {
            tracing::error!(%problem, "the spoke serves what it has cached; misses fail until a hub answers");
        }
    });
}

/// The port `url` names (`http://HOST:PORT/...`), if it names one.
fn url_port(url: &str) -> Option<u16> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    authority.rsplit_once(':')?.1.trim_end_matches(']').parse().ok()
}

/// Says at start, once, what a group's security means: an open group trusts whoever
/// reaches its ports, and a secured one whose members cannot prove who they are to each
/// other fetches one copy per member (every peer read refused).
fn warn_about_the_group(group: &PeerGroup, security: &Security) {
    let verifies_certificates = security.tls.as_ref().is_some_and(|tls| tls.verifies_client_certs());
    let secured = security.auth.requires_credentials() || verifies_certificates;
    if !secured {
        tracing::warn!(
            "this spoke's group is open: its members are trusted without proof (bytes from any server at a \
             member's address are taken), and anyone who reaches a member's port reads through it; secure it \
             with TLS, --client-ca and tokens (README: Running securely)"
        );
    } else if group.spec.split([',', ' ']).any(|member| member.trim().starts_with("http://")) {
        tracing::warn!(
            peers = group.spec,
            "this spoke is secured but its --peers are plaintext (http://): members cannot prove who they are; \
             list them as https:// URLs"
        );
    } else if security.auth.requires_credentials()
        && !verifies_certificates
        && group.credentials.token.is_none()
    {
        tracing::warn!(
            "this spoke asks every request for a token but its members present none to each other (no \
             --client-ca to see their --hub-cert certificates, no --peer-token-file): every peer read will be \
             refused and each member will fetch every shard from the hub"
        );
    }
}

/// Serves `cache` on `listener` (gRPC), `metrics_listener` (Prometheus) and
/// `s3_listener` (the S3 door, when given) until `shutdown` resolves; in-flight
/// requests finish first.
pub async fn serve(
    listener: TcpListener,
    metrics_listener: TcpListener,
    s3_listener: Option<TcpListener>,
    cache: Arc<Cache>,
    options: &SpokeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    say_what_is_wrong_at_start(&cache, options, listener.local_addr().ok());
    let evictor = tokio::spawn(cache.evictor().run(stopped()));
    let follower = tokio::spawn(cache.follower().run(stopped()));
    let kept_flusher = tokio::spawn(flush_kept(cache.clone(), stopped()));
    let tables_saver = tokio::spawn(save_job_tables(cache.clone(), stopped()));
    let scraped = cache.clone();
    let metrics = tokio::spawn(serve_metrics(
        metrics_listener,
        options.security.tls.clone(),
        options.metrics_access.clone(),
        {
            let auth = options.security.auth.clone();
            move || {
                let occupancy = Occupancy {
                    token_file_broken: auth.token_file_failure().is_some(),
                    ..occupancy(&scraped)
                };
                scraped.metrics().render(&occupancy)
            }
        },
        stopped(),
    ));

    let limits = ReadLimits {
        // Streams send messages of at most STREAM_MESSAGE_MAX (a cache chunk is larger).
        message_size: cache.config().chunk_size.min(STREAM_MESSAGE_MAX) as u32,
        max_read: options.max_read,
        // Its readers are next to it: bytes are cheaper than CPU on that side.
        compression: None,
    };
    let s3 = s3_listener.map(|listener| open_s3(&cache, limits, options).map(|door| (door, listener)));
    let s3 = tokio::spawn(serve_s3(s3.transpose()?, options.security.tls.clone(), stopped()));
    let service = ReadService::new(CachedSource(cache.clone()), limits, cache.metrics().clone());
    let reader = ShardReaderServer::new(service)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(server::MAX_REQUEST_BYTES);
    let door = open_door(&cache, options);
    let announcement = door.as_ref().map(|(door, _)| door.announcement());
    let control = CacheControlServer::new(Control::new(cache.clone(), options.max_read))
        .max_decoding_message_size(server::MAX_REQUEST_BYTES);
    // Tokens are checked before a handler runs.
    let auth = &options.security.auth;
    let routes = Routes::new(Announced::new(InterceptedService::new(reader, auth.clone()), announcement))
        .add_service(InterceptedService::new(control, auth.clone()));
    let serving = [shard_reader_server::SERVICE_NAME, cache_control_server::SERVICE_NAME];
    let door = tokio::spawn(async move {
        if let Some((door, listener)) = door {
            Arc::new(door).serve(listener, stopped()).await;
        }
    });

    // The spoke's own clients are near; the same large windows cost nothing.
    let served = server::serve_grpc(
        listener,
        routes,
        &serving,
        Http2Settings::TUNED,
        options.server,
        &options.security,
        shutdown,
    )
    .await;
    let _ = stop_tx.send(true);
    let _ = tokio::join!(evictor, follower, metrics, door, s3);
    // Readers get a fetched chunk's bytes before it is stored: let the chunks fetched so
    // far land, so that a clean stop keeps what was read (bounded: a fetch that is still
    // waiting for a stalled hub is given up).
    let deadline = tokio::time::Instant::now() + SHUTDOWN_STORE_WAIT;
    while cache.fetches_in_flight() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Kept samples waiting for their pack are written: a clean stop keeps them too.
    let _ = kept_flusher.await;
    let _ = tables_saver.await;
    served.map_err(|e| Error::Transport(e.to_string()))
}

/// The S3 door over the cache: its requests are the read service's, made in process
/// (`serve/s3/`).
fn open_s3(cache: &Arc<Cache>, limits: ReadLimits, options: &SpokeOptions) -> Result<S3Door> {
    let reads = ReadService::new(CachedSource(cache.clone()), limits, cache.metrics().clone());
    let security = &options.security;
    let verifies = security.tls.as_ref().is_some_and(|t| t.verifies_client_certs());
    S3Door::new(reads, security.auth.clone(), verifies, &options.s3)
}

async fn serve_s3(
    door: Option<(S3Door, TcpListener)>,
    tls: Option<shardcache_serving::tls::ServerTls>,
    shutdown: impl Future<Output = ()>,
) {
    if let Some((door, listener)) = door {
        door.serve(listener, tls, shutdown).await;
    }
}

/// The same-node door on `--local-socket`, when it has one and it can be bound (a
/// socket that cannot be is said in the log; readers then read over gRPC).
fn open_door(cache: &Arc<Cache>, options: &SpokeOptions) -> Option<(LocalDoor, tokio::net::UnixListener)> {
    let path = options.local_socket.as_ref()?;
    let security = &options.security;
    // Client certificates without a token file: the gRPC port knows its readers by their
    // certificates, which a Unix socket does not carry (the door would grant everything).
    if !security.auth.requires_credentials()
        && security.tls.as_ref().is_some_and(|t| t.verifies_client_certs())
    {
        tracing::warn!(
            socket = %path.display(),
            "no same-node door: readers are known by their client certificates here, which a Unix socket does \
             not carry; give the spoke a --token-file (a grants line per certificate) to open it"
        );
        return None;
    }
    match LocalDoor::bind(path, cache.clone(), security.auth.clone(), options.max_read) {
        Ok(door) => {
            tracing::info!(socket = %path.display(), "same-node door open: readers on this node read warm bytes from the cache's files");
            Some(door)
        }
        Err(e) => {
            tracing::warn!(
                socket = %path.display(),
                error = %e,
                "cannot open the same-node door (--local-socket); readers on this node read over gRPC"
            );
            None
        }
    }
}

/// How often kept samples waiting for their pack are written when fewer than a pack's
/// worth wait: a job that keeps slowly (the last samples of an epoch) is on disk within
/// a second, and a pack is a few dozen samples at least.
pub const KEPT_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes the kept samples that wait, every [`KEPT_FLUSH_EVERY`] and once more at
/// `shutdown`.
async fn flush_kept(cache: Arc<Cache>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut every = tokio::time::interval(KEPT_FLUSH_EVERY);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = every.tick() => cache.flush_kept().await,
        }
    }
    cache.flush_kept().await;
}

/// How often the jobs' tables are written to their file (`job_table/`): a restart
/// loses at most this much of a job's table.
pub const JOB_TABLES_SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Writes the jobs' tables every [`JOB_TABLES_SAVE_EVERY`] and once more at `shutdown`.
async fn save_job_tables(cache: Arc<Cache>, shutdown: impl Future<Output = ()>) {
    let save = || {
        let cache = cache.clone();
        async move {
            let saved = tokio::task::spawn_blocking(move || cache.metrics().job_tables.save()).await;
            if let Ok(Err(e)) = saved {
                tracing::warn!(error = %e, "could not write the jobs' tables; a restart would lose them");
            }
        }
    };
    tokio::pin!(shutdown);
    let mut every = tokio::time::interval(JOB_TABLES_SAVE_EVERY);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = every.tick() => save().await,
        }
    }
    save().await;
}

/// How long a stopping spoke waits for fetched chunks to be stored. Storing what the
/// in-flight bound allows (64 MiB by default) takes well under a second on a local disk.
const SHUTDOWN_STORE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Occupancy for metrics.
fn occupancy(cache: &Cache) -> Occupancy {
    let mut occupancy = Occupancy {
        capacity_bytes: cache.capacity().capacity(),
        configured_capacity_bytes: cache.capacity().configured(),
        used_bytes: cache.used_bytes(),
        disk_bytes: cache.disk_bytes(),
        group_members: cache.chain().peers().map_or(0, |p| p.urls().len() as u64),
        peer_refusals: cache.chain().peers().map_or(0, |p| p.reports().refusals()),
        peer_bad_chunks: cache.chain().peers().map_or(0, |p| p.reports().bad_chunks()),
        members_refusing: cache
            .chain()
            .peers()
            .map_or(0, |p| p.states().iter().filter(|m| m.state == "refusing this spoke").count() as u64),
        hub_fetches: cache.hubs().fetches_asked(),
        hub_bytes_received: cache.hubs().bytes_received(),
        fetches_running: cache.fetches_running() as u64,
        ..Default::default()
    };
    let (held, shares) = cache.held_and_shares();
    occupancy.principals = held
        .into_iter()
        .map(|(principal, bytes)| {
            let share = shares.get(&principal).copied().unwrap_or_default();
            (principal, (bytes, share))
        })
        .collect();
    (occupancy.kept_sample_bytes, _, occupancy.staged_sample_bytes) = cache.samples_held();
    occupancy.speculation_useful_share = cache.speculation().useful_share();
    occupancy.speculation_unread_bytes = cache.speculation().unread();
    for entry in cache.entries() {
        let slot = occupancy.datasets.entry(entry.dataset.clone()).or_default();
        let bytes = entry.cached_bytes();
        slot.0 += u64::from(bytes > 0);
        slot.1 += bytes;
        slot.2 += u64::from(entry.is_pinned());
    }
    occupancy
}
