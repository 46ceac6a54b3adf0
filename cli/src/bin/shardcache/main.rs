//! `shardcache`: the command line for hubs and spokes: list, stat, fetch and print
//! shards (every byte checksum-verified), generate synthetic datasets, and make
//! development certificates and access tokens.

mod admin;
mod commands;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use shardcache_client::ConnectOptions;
use shardcache_proto::units::ByteSize;
use shardcache_serving::{auth::read_token_file, tls::ClientTlsFiles};

#[derive(Debug, Parser)]
#[command(name = "shardcache", version, about)]
struct Cli {
    /// Server to talk to: a hub or a spoke cache (status, warm, evict, pin: a spoke).
    /// `https://` connects with TLS.
    #[arg(long, env = "SHARDCACHE_ENDPOINT", default_value = "http://127.0.0.1:7070", global = true)]
    endpoint: String,

    /// CA that signs the server's certificate (https:// endpoints; system roots when unset).
    #[arg(long, env = "SHARDCACHE_CA", global = true)]
    ca: Option<PathBuf>,

    /// Client certificate, for servers that require one (mTLS).
    #[arg(long, env = "SHARDCACHE_CERT", global = true, requires = "key")]
    cert: Option<PathBuf>,

    /// Private key of --cert.
    #[arg(long, env = "SHARDCACHE_KEY", global = true, requires = "cert")]
    key: Option<PathBuf>,

    /// Name to check in the server's certificate when the endpoint's host is not in it.
    #[arg(long, env = "SHARDCACHE_TLS_DOMAIN", global = true)]
    tls_domain: Option<String>,

    /// File holding a bearer token, for servers started with --token-file.
    #[arg(long, env = "SHARDCACHE_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List datasets, or the shards of one dataset.
    Ls { dataset: Option<String> },
    /// Show a shard's size, version and chunk size.
    Stat { dataset: String, shard: String },
    /// Download a shard to a file, verifying every chunk's CRC32C.
    Get {
        dataset: String,
        shard: String,
        /// Where to write it (default: the shard's name in the current directory): `-` for
        /// standard output; a regular file is written to a temporary file and renamed when
        /// complete; a device or FIFO is written in place.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Print a range of a shard to stdout.
    Cat {
        dataset: String,
        shard: String,
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Bytes to print; to the end of the shard when absent (refused on a terminal:
        /// shards are binary and large; give --length, or redirect the output).
        #[arg(long)]
        length: Option<u64>,
    },
    /// Show a spoke cache's occupancy and per-dataset hits, misses and upstream bytes.
    Status,
    /// List the access plans your token (or certificate) has on a spoke, or drop a
    /// finished job's: `shardcache plans drop JOB` withdraws JOB and its readers'
    /// (`JOB/...`) plans. Plans also expire after --plan-idle-expiry without a read.
    Plans {
        #[command(subcommand)]
        action: Option<PlansCommand>,
    },
    /// Fetch a dataset (or the listed shards, in order) into a spoke cache.
    Warm {
        dataset: String,
        /// Shards to fetch, in this order; the whole dataset when none.
        shards: Vec<String>,
        /// Shards fetched at once (0: the spoke's default).
        #[arg(long, default_value_t = 0)]
        parallelism: u32,
    },
    /// Drop a dataset (or the listed shards) from a spoke cache.
    Evict { dataset: String, shards: Vec<String> },
    /// Keep a dataset's cached shards (or the listed shards) from eviction.
    Pin { dataset: String, shards: Vec<String> },
    /// Undo `pin`.
    Unpin { dataset: String, shards: Vec<String> },
    /// Write a synthetic tokenised dataset shaped like the seed's (16 KiB token windows).
    Gen {
        /// Parent folder (the hub's --root); the dataset goes in DIR/DATASET.
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "c4-synthetic")]
        dataset: String,
        #[arg(long, default_value_t = 8)]
        shards: u32,
        #[arg(long, default_value = "64MiB")]
        shard_size: ByteSize,
        /// One record: 4096 u32 tokens = 16KiB, as in the seed.
        #[arg(long, default_value = "16KiB")]
        record_size: ByteSize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Ask a server's gRPC health service; exit 0 when SERVING (container and Kubernetes
    /// probes: works with TLS, which Kubernetes' own gRPC probe cannot speak).
    Health {
        /// Service to ask about; the server as a whole when empty.
        #[arg(long, default_value = "")]
        service: String,
    },
    /// Write the compiled `shardcache.v1` descriptor set (for tools that take a protoset,
    /// such as ghz --protoset, instead of reflection).
    DescriptorSet {
        #[arg(long)]
        out: PathBuf,
    },
    /// Write development certificates: a CA and hub, spoke and client certificates.
    Certs {
        /// Folder to write ca.pem, hub.pem, spoke.pem, client.pem and their .key files.
        #[arg(long)]
        out: PathBuf,
        /// More names for the hub's and spoke's certificates (besides localhost,
        /// 127.0.0.1, ::1, "hub" and "spoke"); repeat or separate with commas.
        #[arg(long = "name", value_delimiter = ',')]
        names: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: i64,
    },
    /// Mount ENDPOINT's datasets read-only on MOUNTPOINT (FUSE): DATASET/SHARD files that
    /// any program can open; every byte verified. Runs until SIGTERM/SIGINT (then
    /// unmounts) or `fusermount3 -u MOUNTPOINT`.
    Mount {
        /// `[ENDPOINT] MOUNTPOINT`: the mount point (an existing directory), after the
        /// endpoint when it is not --endpoint's (a hub, a spoke or a group of spokes).
        #[arg(num_args = 1..=2, required = true, value_names = ["ENDPOINT", "MOUNTPOINT"])]
        places: Vec<String>,
        /// Seconds any one call to the server may take; past it the read fails with EIO.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Make an access token (printed once) and add its hash to a token file, or revoke one.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Debug, Subcommand)]
enum PlansCommand {
    /// Withdraw JOB's plan and its readers' (JOB/...), e.g. a finished training run.
    Drop { job: String },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Print a new token on stdout and append its line to FILE.
    New {
        /// Who holds it (shown in PERMISSION_DENIED messages and logs, never the token).
        #[arg(long)]
        name: String,
        /// Datasets it may read: a comma-separated list, or * for all.
        #[arg(long)]
        datasets: String,
        /// It may also control a spoke's cache of those datasets (prefetch, evict, pin).
        #[arg(long)]
        control: bool,
        /// The token file a server reads with --token-file.
        #[arg(long)]
        file: PathBuf,
    },
    /// Remove NAME's token from FILE (servers reload it within seconds).
    Revoke {
        #[arg(long)]
        name: String,
        #[arg(long)]
        file: PathBuf,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shardcache: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let tls = cli.ca.is_some() || cli.cert.is_some() || cli.tls_domain.is_some();
    let server = &commands::Server {
        options: ConnectOptions {
            tls: tls.then(|| ClientTlsFiles {
                ca: cli.ca.clone(),
                cert: cli.cert.clone(),
                key: cli.key.clone(),
                domain: cli.tls_domain.clone(),
            }),
            token: cli.token_file.as_deref().map(read_token_file).transpose().map_err(anyhow::Error::msg)?,
        },
        endpoint: cli.endpoint,
    };
    match cli.command {
        Command::Certs { out, names, days } => admin::certs(&out, &names, days),
        Command::Health { service } => commands::health(server, &service).await,
        Command::DescriptorSet { out } => {
            std::fs::write(&out, shardcache_proto::FILE_DESCRIPTOR_SET)?;
            Ok(())
        }
        Command::Token(TokenCommand::New { name, datasets, control, file }) => {
            admin::new_token(&name, &datasets, control, &file)
        }
        Command::Token(TokenCommand::Revoke { name, file }) => admin::revoke_token(&name, &file),
        Command::Gen { dir, dataset, shards, shard_size, record_size, seed } => {
            commands::generate(dir, dataset, shards, shard_size, record_size, seed)
        }
        Command::Mount { mut places, timeout } => {
            // One place: the mount point, over --endpoint (SHARDCACHE_ENDPOINT) as every
            // other command; two: an endpoint, then the mount point.
            let mountpoint = PathBuf::from(places.pop().unwrap_or_default());
            let endpoint = places.pop().unwrap_or_else(|| server.endpoint.clone());
            let server = commands::Server { endpoint, options: server.options.clone() };
            commands::mount(&server, &mountpoint, std::time::Duration::from_secs(timeout)).await
        }
        Command::Ls { dataset } => commands::ls(server, dataset.as_deref()).await,
        Command::Stat { dataset, shard } => commands::stat(server, &dataset, &shard).await,
        Command::Get { dataset, shard, output } => {
            let output = output.unwrap_or_else(|| PathBuf::from(&shard));
            commands::get(server, &dataset, &shard, &output).await
        }
        Command::Cat { dataset, shard, offset, length } => {
            commands::cat(server, &dataset, &shard, offset, length).await
        }
        Command::Status => commands::status(server).await,
        Command::Plans { action: None } => commands::plans(server).await,
        Command::Plans { action: Some(PlansCommand::Drop { job }) } => {
            commands::drop_plans(server, &job).await
        }
        Command::Warm { dataset, shards, parallelism } => {
            commands::warm(server, &dataset, &shards, parallelism).await
        }
        Command::Evict { dataset, shards } => commands::evict(server, &dataset, &shards).await,
        Command::Pin { dataset, shards } => commands::pin(server, &dataset, &shards, true).await,
        Command::Unpin { dataset, shards } => commands::pin(server, &dataset, &shards, false).await,
    }
}
