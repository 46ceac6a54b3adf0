//! Command-line flags of `spoke-cache`; every flag is also an environment variable,
//! `SPOKE_` and its name (`shardcache_serving::flags`).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Parser;
use shardcache_client::ConnectOptions;
use shardcache_proto::units::ByteSize;
use shardcache_serving::flags::ServingFlags;
use shardcache_transport::{
    credentials::read_token_file,
    http2::{DEFAULT_HUB_CONNECTIONS, Http2Settings},
    tls::ClientTlsFiles,
};

use crate::{
    Error, PeerGroup, SpokeOptions,
    cache::CacheConfig,
    fetch::suppliers::hubs::HubTransport,
    plans::shards::PlanLimits,
    policy::window::PlanWindow,
    serve::s3::S3Options,
    store::{DEFAULT_MAX_OPEN_FILES, DEFAULT_MERGE_ABOVE_FILES, PAGE_SIZE, StoreOptions},
};

/// Read-through cache of hub shards in RocksDB on local disk.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "spoke-cache",
    version,
    about,
    after_help = "Example:\n  spoke-cache --hub http://hub.example:7070 --cache-dir /nvme/shardcache --capacity 1.5TiB \\\n    \
                  --listen 0.0.0.0:7071"
)]
pub struct SpokeArgs {
    /// Hub to fetch from; repeat (or separate with commas) for several hubs over one source.
    #[arg(long = "hub", value_delimiter = ',', required = true)]
    pub hubs: Vec<String>,

    /// The spoke's group, named as clients name it: every member's URL as clients reach
    /// it, this spoke's too (comma-separated, `URL?weight=N` for a larger share),
    /// `file:PATH` (re-read when it changes) or `dns+http://NAME:PORT` (every address of
    /// NAME, e.g. a headless Service; re-resolved every 5 s). A chunk this spoke lacks is
    /// asked of the members ranked before it for the shard (rendezvous hashing, the owner
    /// first) before the hub, so the group fetches each shard over the long link once.
    /// Needs --peer-self.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,

    /// This spoke's URL as it appears in --peers.
    #[arg(long)]
    pub peer_self: Option<String>,

    /// Directory of the cache (RocksDB); created if missing; survives restarts.
    #[arg(long, default_value = "./spoke-cache-data")]
    pub cache_dir: PathBuf,

    /// Bytes of shard data to keep; eviction keeps the cache under this.
    #[arg(long, default_value = "10GiB")]
    pub capacity: ByteSize,

    /// Address for the read and cache-control API (port 0 picks one; it is printed).
    #[arg(long, default_value = "127.0.0.1:7071")]
    pub listen: SocketAddr,

    /// The same-node door: a Unix socket through which readers on this node (the SDK finds
    /// it by itself) read warm bytes from the cache's files, with no copy through a
    /// socket; `off` for none. Default: `local.sock` in --cache-dir.
    #[arg(long)]
    pub local_socket: Option<String>,

    /// Address for the S3 door (docs/s3.md): S3 clients read the cache's datasets as
    /// buckets. Off unless given: a port that serves data is opened only when asked for.
    #[arg(long)]
    pub s3_listen: Option<SocketAddr>,

    /// The S3 door's access keys (`PRINCIPAL ACCESS_KEY SECRET` lines, mode 0600; make
    /// one with `shardcache token s3-key`); needed with --token-file.
    #[arg(long)]
    pub s3_keys: Option<PathBuf>,

    /// Domains whose subdomains name buckets (virtual-hosted style,
    /// `BUCKET.DOMAIN`); path style (`DOMAIN/BUCKET/KEY`) is always served.
    #[arg(long, value_delimiter = ',')]
    pub s3_domain: Vec<String>,

    /// Address for Prometheus metrics (`GET /metrics`).
    #[arg(long, default_value = "127.0.0.1:9071")]
    pub metrics_listen: SocketAddr,

    /// Unit of fetching and caching; a multiple of 64KiB, up to 8MiB.
    // 4 MiB: each chunk is one file, and a file's fixed costs (create, a fresh write
    // buffer, fsync, ingestion) made 1 MiB chunks cost more CPU per GiB than 4 MiB ones
    // (`store-bench`, BENCHMARKS.md "store"). A cold random sample waits for the whole
    // chunk, a few milliseconds more than for 1 MiB.
    #[arg(long, default_value = "4MiB")]
    pub chunk_size: ByteSize,

    /// Check a cached shard's version with the hub after this long (e.g. 30s, 5m, 0s).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub revalidate_after: Duration,

    /// On the first miss in a shard, fetch the rest of it in the background.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub fetch_whole_shard: bool,

    /// Chunks to fetch ahead of a sequential reader.
    #[arg(long, default_value_t = 4)]
    pub read_ahead_chunks: u64,

    /// Chunk fetches in flight per shard being fetched.
    #[arg(long, default_value_t = 8)]
    pub shard_fetch_parallelism: usize,

    /// Requests in flight before new ones get RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 1024)]
    pub max_concurrency: usize,

    /// Bytes fetched from hubs but not yet stored, across all fetches (bounds memory).
    #[arg(long, default_value = "64MiB")]
    pub upstream_bytes_in_flight: ByteSize,

    /// How far ahead of the jobs' reads the spoke fetches the shards their access plans
    /// name (whole shards, nearest first; never past what fits under the low watermark):
    /// `auto`, the rest of the block being read and the next block as the plans delimit
    /// them (a block shuffle's blocks; one shard for shard-after-shard reading), or bytes
    /// of shards beyond those being read (e.g. 256MiB). 0 turns planned prefetch off.
    #[arg(long, default_value = "auto", value_parser = parse_plan_window)]
    pub plan_window: PlanWindow,

    /// Access plans one principal (a token's or certificate's line name) may keep; a
    /// SetPlan past it gets RESOURCE_EXHAUSTED naming this flag.
    #[arg(long, default_value_t = PlanLimits::default().plans_per_principal)]
    pub max_plans_per_principal: usize,

    /// Plan positions (reads planned) one principal's plans may hold in all.
    #[arg(long, default_value_t = PlanLimits::default().positions_per_principal)]
    pub max_plan_positions_per_principal: usize,

    /// Access plans the spoke keeps, over all principals.
    #[arg(long, default_value_t = PlanLimits::default().plans)]
    pub max_plans: usize,

    /// Plan positions the spoke keeps, over all principals (~150 bytes of memory each).
    #[arg(long, default_value_t = PlanLimits::default().positions)]
    pub max_plan_positions: usize,

    /// A plan no read has met for this long is dropped (a finished job's; e.g. 30m, 2h).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub plan_idle_expiry: Duration,

    /// Each tenant's share of the capacity, as weights of principals (the names of
    /// token-file lines or certificates): `alice=3,bob=1`, `*=W` for those not named (1
    /// by default: equal shares). A principal's share is its weight over the weights of
    /// the principals holding bytes now, so an unused share is lent out; eviction takes
    /// from principals over their share first, so one tenant's scan cannot evict
    /// another's working set below its share.
    #[arg(long, default_value = "", value_parser = parse_shares)]
    pub tenant_shares: crate::policy::shares::Shares,

    /// Jobs whose counters get their own `job_id` label in the metrics (comma-separated,
    /// e.g. llama-pretrain,eval); the others are summed under `job_id="other"`, since a
    /// client chooses its job's name. `Status` shows every job either way.
    #[arg(long, value_delimiter = ',')]
    pub metric_jobs: Vec<String>,

    /// RocksDB options for the pages column family, as RocksDB's option string (e.g.
    /// "block_based_table_factory={cache_index_and_filter_blocks=true}"), applied
    /// over the spoke's own; for tuning a cache to its disks. A bad string stops the start.
    #[arg(long, default_value = "")]
    pub rocksdb_pages_options: String,

    /// Chunk files the store keeps open at most (descriptors and table readers); files
    /// open on first use and the least recently used close. Each chunk is a file.
    #[arg(long, default_value_t = DEFAULT_MAX_OPEN_FILES)]
    pub max_open_files: u32,

    /// Chunk files above which each shard whose chunks are all stored is merged into one
    /// file (written once more, in the background): the store's per-file costs grow with
    /// the number of files. 0 merges every complete shard.
    #[arg(long, default_value_t = DEFAULT_MERGE_ABOVE_FILES)]
    pub merge_above_files: u64,

    /// HTTP/2 connections to each hub; fetches use them in turn.
    #[arg(long, default_value_t = DEFAULT_HUB_CONNECTIONS)]
    pub hub_connections: usize,

    /// HTTP/2 stream window for hub responses (fixed; adaptive window is off).
    #[arg(long, default_value = "8MiB")]
    pub hub_stream_window: ByteSize,

    /// HTTP/2 connection window for hub responses, per connection.
    #[arg(long, default_value = "64MiB")]
    pub hub_connection_window: ByteSize,

    /// Largest HTTP/2 frame the hub may send (16KiB..16MiB).
    #[arg(long, default_value = "1MiB")]
    pub hub_max_frame_size: ByteSize,

    /// SO_RCVBUF of hub connections; 0 = kernel autotuning (see README: long links).
    #[arg(long, default_value = "0")]
    pub hub_socket_recv_buffer: ByteSize,

    /// Ignore the five flags above: one connection with tonic's default settings (to
    /// measure what the tuning is worth).
    #[arg(long)]
    pub hub_transport_defaults: bool,

    /// Deadline of every call to a hub (a chunk fetch, a stat, a listing): a hub that
    /// hangs fails the call with UNAVAILABLE after this, and cached data is served.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub hub_timeout: Duration,

    /// Whether chunk fetches ask the hubs for zstd (the hub compresses what shrinks; the
    /// cache stores the decoded bytes): `auto`, zstd only while it fetches clearly faster
    /// per byte, measured per hub as fetches go (compression pays where the link, not
    /// the CPU, bounds delivery); `zstd` always (where the link's bytes are billed); `off`.
    #[arg(long, default_value = "auto", value_parser = crate::fetch::suppliers::compression::HubCompression::parse)]
    pub hub_compression: crate::fetch::suppliers::compression::HubCompression,

    /// CA that signs the hubs' certificates (for https:// hubs; system roots when unset).
    #[arg(long)]
    pub hub_ca: Option<PathBuf>,

    /// Client certificate the spoke presents to hubs that require one (mTLS).
    #[arg(long, requires = "hub_key")]
    pub hub_cert: Option<PathBuf>,

    /// PEM private key of --hub-cert; must not be world-readable.
    #[arg(long, requires = "hub_cert")]
    pub hub_key: Option<PathBuf>,

    /// Name to check in the hubs' certificates when the --hub host is not in them.
    #[arg(long)]
    pub hub_tls_domain: Option<String>,

    /// File holding the bearer token the spoke presents to hubs started with --token-file.
    #[arg(long)]
    pub hub_token_file: Option<PathBuf>,

    /// File holding the bearer token the spoke presents to its peers (their token files
    /// hold its line). Without it, peers know the spoke by its --hub-cert certificate
    /// (verified against their --client-ca); the hub token is never sent to peers.
    #[arg(long)]
    pub peer_token_file: Option<PathBuf>,

    #[command(flatten)]
    pub serving: ServingFlags,
}

/// The prefix of the spoke's environment variables.
pub const ENV_PREFIX: &str = "SPOKE_";

/// `--plan-window`: `auto` or a size.
fn parse_plan_window(text: &str) -> Result<PlanWindow, String> {
    match text {
        "auto" => Ok(PlanWindow::Blocks),
        size => size
            .parse::<ByteSize>()
            .map(|s| PlanWindow::Bytes(s.0))
            .map_err(|e| format!("{e}; or `auto` for the next block of the plans")),
    }
}

/// `--tenant-shares`.
fn parse_shares(text: &str) -> Result<crate::policy::shares::Shares, String> {
    crate::policy::shares::Shares::parse(text)
}

impl SpokeArgs {
    pub fn hub_transport(&self) -> Result<HubTransport, Error> {
        if self.hub_transport_defaults {
            return Ok(HubTransport {
                connections: 1,
                http2: Http2Settings::DEFAULTS,
                timeout: self.hub_timeout,
                compression: self.hub_compression,
            });
        }
        if self.hub_connections == 0 {
            return Err(Error::Config("--hub-connections must be at least 1".into()));
        }
        let http2 = Http2Settings::new(
            self.hub_stream_window.0,
            self.hub_connection_window.0,
            self.hub_max_frame_size.0,
            self.hub_socket_recv_buffer.0,
        )
        .map_err(|e| Error::Config(format!("--hub-*: {e}")))?;
        if self.hub_timeout.is_zero() {
            return Err(Error::Config("--hub-timeout must be more than 0".into()));
        }
        Ok(HubTransport {
            connections: self.hub_connections,
            http2,
            timeout: self.hub_timeout,
            compression: self.hub_compression,
        })
    }

    /// Everything the spoke needs to serve, from these flags; loads certificates and
    /// token files (an error names the flag or file).
    pub fn options(&self) -> Result<SpokeOptions, Error> {
        let tls = [&self.hub_ca, &self.hub_cert, &self.hub_key].iter().any(|f| f.is_some())
            || self.hub_tls_domain.is_some();
        let hub_credentials = ConnectOptions {
            tls: tls.then(|| ClientTlsFiles {
                ca: self.hub_ca.clone(),
                cert: self.hub_cert.clone(),
                key: self.hub_key.clone(),
                domain: self.hub_tls_domain.clone(),
            }),
            token: self.hub_token_file.as_deref().map(read_token_file).transpose().map_err(Error::Config)?,
        };
        let peers: Vec<String> =
            self.peers.iter().map(|p| p.trim().to_owned()).filter(|p| !p.is_empty()).collect();
        let group = match (&self.peer_self, peers.is_empty()) {
            (_, true) => None,
            (Some(me), false) => Some(PeerGroup {
                spec: peers.join(","),
                me: me.clone(),
                credentials: ConnectOptions {
                    tls: hub_credentials.tls.clone(),
                    token: self
                        .peer_token_file
                        .as_deref()
                        .map(read_token_file)
                        .transpose()
                        .map_err(Error::Config)?,
                },
            }),
            (None, false) => {
                return Err(Error::Config(
                    "--peers needs --peer-self: this spoke's URL as the list has it".into(),
                ));
            }
        };
        let serving = &self.serving;
        Ok(SpokeOptions {
            group,
            hubs: self.hubs.clone(),
            hub_transport: self.hub_transport()?,
            hub_credentials,
            metrics_access: serving.metrics_access().map_err(Error::Config)?,
            cache: self.cache_config()?,
            store: StoreOptions {
                pages_options: self.rocksdb_pages_options.clone(),
                max_open_files: self.max_open_files,
                merge_above_files: self.merge_above_files,
                ..StoreOptions::default()
            },
            max_read: serving.max_read().map_err(Error::Config)?,
            server: serving.limits(self.max_concurrency).map_err(Error::Config)?,
            security: serving.security().map_err(Error::Config)?,
            local_socket: match self.local_socket.as_deref() {
                None => Some(self.cache_dir.join("local.sock")),
                Some("off") => None,
                Some(path) => Some(PathBuf::from(path)),
            },
            s3: S3Options { keys: self.s3_keys.clone(), domains: self.s3_domain.clone() },
        })
    }

    pub fn cache_config(&self) -> Result<CacheConfig, Error> {
        let chunk = self.chunk_size.0;
        if chunk == 0 || !chunk.is_multiple_of(PAGE_SIZE) || chunk > 8 << 20 {
            return Err(Error::Config(format!(
                "--chunk-size {} must be a multiple of {} and at most 8MiB",
                self.chunk_size,
                ByteSize(PAGE_SIZE)
            )));
        }
        if self.capacity.0 < chunk {
            return Err(Error::Config(format!("--capacity {} is smaller than one chunk", self.capacity)));
        }
        Ok(CacheConfig {
            capacity: self.capacity.0,
            high_watermark: crate::policy::evict::HIGH_WATERMARK,
            low_watermark: crate::policy::evict::LOW_WATERMARK,
            chunk_size: chunk,
            revalidate_after: self.revalidate_after,
            fetch_whole_shard: self.fetch_whole_shard,
            read_ahead_chunks: self.read_ahead_chunks,
            shard_fetch_parallelism: self.shard_fetch_parallelism.max(1),
            upstream_bytes_in_flight: self.upstream_bytes_in_flight.0,
            plan_window: self.plan_window,
            plan_limits: PlanLimits {
                plans_per_principal: self.max_plans_per_principal,
                positions_per_principal: self.max_plan_positions_per_principal,
                plans: self.max_plans,
                positions: self.max_plan_positions,
                idle_expiry: self.plan_idle_expiry,
            },
            metric_jobs: self.metric_jobs.iter().filter(|j| !j.is_empty()).cloned().collect(),
            empty_entries_kept: crate::cache::EMPTY_ENTRIES_KEPT,
            tenant_shares: self.tenant_shares.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: impl IntoIterator<Item = &'static str>) -> Result<SpokeArgs, clap::Error> {
        let args: Vec<&str> = args.into_iter().collect();
        shardcache_serving::flags::try_parse_from(ENV_PREFIX, &args)
    }

    #[test]
    fn defaults_and_bad_chunk_sizes() {
        let args = parse(["spoke-cache", "--hub", "http://a:1,http://b:2"]).unwrap();
        assert_eq!(args.hubs, ["http://a:1", "http://b:2"]);
        let config = args.cache_config().unwrap();
        assert_eq!(config.chunk_size, 4 << 20);
        assert!(config.fetch_whole_shard);
        let bad = parse(["spoke-cache", "--hub", "http://a:1", "--chunk-size", "100KiB"]).unwrap();
        assert!(bad.cache_config().unwrap_err().to_string().contains("multiple of 64KiB"));
        assert!(parse(["spoke-cache"]).is_err(), "--hub is required");
        assert_eq!(args.hub_transport().unwrap(), HubTransport::default());
        let plain = parse(["spoke-cache", "--hub", "http://a:1", "--hub-transport-defaults"]).unwrap();
        assert_eq!(plain.hub_transport().unwrap().connections, 1);
        let bad = parse(["spoke-cache", "--hub", "http://a:1", "--hub-max-frame-size", "32MiB"]).unwrap();
        assert!(bad.hub_transport().unwrap_err().to_string().contains("max frame size"));
    }
}
