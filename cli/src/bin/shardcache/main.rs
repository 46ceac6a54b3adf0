//! `shardcache`: the command line for hubs and spokes: list, stat, fetch and print
//! shards (every byte checksum-verified), generate synthetic datasets, and make
//! development certificates and access tokens.

mod admin;
mod commands;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use shardcache_cli::dataset_gen::GenSpec;
use shardcache_client::ConnectOptions;
use shardcache_proto::units::ByteSize;
use shardcache_transport::{credentials::read_token_file, tls::ClientTlsFiles};

/// Flags every command takes, listed apart from each command's own.
const GLOBAL: &str = "Global options (any command; or their SHARDCACHE_* variables)";

#[derive(Debug, Parser)]
#[command(
    name = "shardcache",
    version,
    about,
    after_help = "Examples:\n  shardcache --endpoint http://127.0.0.1:7071 ls c4\n  \
                  SHARDCACHE_ENDPOINT=https://spoke:7071 SHARDCACHE_CA=certs/ca.pem shardcache status\n\n\
                  `shardcache COMMAND --help` shows a command's options and an example.",
    subcommand_help_heading = "Commands"
)]
struct Cli {
    /// Server to talk to: a hub, a spoke, or a group of spokes (URL1,URL2,..., file:PATH,
    /// dns+http://NAME:PORT); status, warm, evict, pin and plans need a spoke. `https://`
    /// connects with TLS.
    #[arg(
        long,
        env = "SHARDCACHE_ENDPOINT",
        default_value = "http://127.0.0.1:7070",
        global = true,
        help_heading = GLOBAL
    )]
    endpoint: String,

    /// CA that signs the server's certificate (https:// endpoints; system roots when unset).
    #[arg(long, env = "SHARDCACHE_CA", global = true, help_heading = GLOBAL)]
    ca: Option<PathBuf>,

    /// Client certificate, for servers that require one (mTLS).
    #[arg(long, env = "SHARDCACHE_CERT", global = true, requires = "key", help_heading = GLOBAL)]
    cert: Option<PathBuf>,

    /// Private key of --cert.
    #[arg(long, env = "SHARDCACHE_KEY", global = true, requires = "cert", help_heading = GLOBAL)]
    key: Option<PathBuf>,

    /// Name to check in the server's certificate when the endpoint's host is not in it.
    #[arg(long, env = "SHARDCACHE_TLS_DOMAIN", global = true, help_heading = GLOBAL)]
    tls_domain: Option<String>,

    /// File holding a bearer token (`shardcache token new` writes one), for servers
    /// started with --token-file. The file, never the token itself.
    #[arg(long, env = "SHARDCACHE_TOKEN_FILE", global = true, help_heading = GLOBAL)]
    token_file: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List datasets, or the shards of one dataset (sizes for people; a listing a spoke
    /// answered from its cache while its hub is away is marked STALE on stderr).
    #[command(after_help = "Examples:\n  shardcache ls\n  shardcache ls c4")]
    Ls {
        /// Dataset whose shards to list; every dataset when absent.
        dataset: Option<String>,
    },
    /// Show a shard's size, version and chunk size.
    #[command(after_help = "Example:\n  shardcache stat c4 shard-00000.bin")]
    Stat {
        /// Dataset (a folder under the hub's root, or a prefix in its bucket).
        dataset: String,
        /// Shard: its path inside the dataset.
        shard: String,
    },
    /// Download a shard to a file, verifying every chunk's CRC32C.
    #[command(after_help = "Examples:\n  shardcache get c4 shard-00000.bin\n  \
                            shardcache get c4 shard-00000.bin -o - | sha256sum")]
    Get {
        /// Dataset.
        dataset: String,
        /// Shard.
        shard: String,
        /// Where to write it (default: the shard's name in the current directory): `-` for
        /// standard output; a regular file is written to a temporary file and renamed when
        /// complete; a device or FIFO is written in place.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Print a range of a shard to stdout.
    #[command(
        after_help = "Example:\n  shardcache cat c4 shard-00000.bin --offset 16384 --length 64 | od -t u4"
    )]
    Cat {
        /// Dataset.
        dataset: String,
        /// Shard.
        shard: String,
        /// First byte to print.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Bytes to print; to the end of the shard when absent (refused on a terminal:
        /// shards are binary and large; give --length, or redirect the output).
        #[arg(long)]
        length: Option<u64>,
    },
    /// Show a spoke cache's occupancy and per-dataset hits, misses and upstream bytes,
    /// its hubs' trouble, and a group's members.
    #[command(after_help = "Example:\n  shardcache --endpoint http://127.0.0.1:7071 status")]
    Status,
    /// Print a job's own table: per phase (the first epoch's batches 0-100, 100-150 and
    /// the rest, then each later epoch) its samples/s, data wait and GPU utilisation as its
    /// loop measured them (the SDK's StepTimer), read latency, where its reads came from,
    /// link bytes per byte read, and the rank that waited most. Through a group, the
    /// members' tables merged.
    #[command(
        after_help = "Examples:\n  shardcache report train-7b\n  shardcache report train-7b --png train-7b.png\n  \
                      shardcache report train-7b --principal alice"
    )]
    Report {
        /// The job (its reads' `job=`; the part before the first '/').
        job: String,
        /// Whose job: an operator's token may see any principal's; others see their own.
        #[arg(long, default_value = "")]
        principal: String,
        /// Also draw the job's timeline (samples/s and data wait over time) into this PNG.
        #[arg(long)]
        png: Option<PathBuf>,
    },
    /// List the access plans your token (or certificate) has on a spoke, or drop a
    /// finished job's: `shardcache plans drop JOB` withdraws JOB and its readers'
    /// (`JOB/...`) plans. Plans also expire after --plan-idle-expiry without a read.
    #[command(after_help = "Examples:\n  shardcache plans\n  shardcache plans drop c4:0")]
    Plans {
        #[command(subcommand)]
        action: Option<PlansCommand>,
    },
    /// Fetch a dataset (or the listed shards, in order) into a spoke cache; through a
    /// group, each member fetches the shards it owns.
    #[command(
        after_help = "Examples:\n  shardcache warm c4\n  shardcache warm c4 shard-00000.bin shard-00001.bin"
    )]
    Warm {
        /// Dataset to fetch.
        dataset: String,
        /// Shards to fetch, in this order; the whole dataset when none.
        shards: Vec<String>,
        /// Shards fetched at once (0: the spoke's default).
        #[arg(long, default_value_t = 0)]
        parallelism: u32,
    },
    /// Drop a dataset (or the listed shards) from a spoke cache.
    #[command(after_help = "Examples:\n  shardcache evict c4\n  shardcache evict c4 shard-00003.bin")]
    Evict {
        /// Dataset.
        dataset: String,
        /// Shards to drop; all of the dataset's when none.
        shards: Vec<String>,
    },
    /// Keep a dataset's cached shards (or the listed shards) from eviction.
    #[command(after_help = "Example:\n  shardcache pin c4")]
    Pin {
        /// Dataset.
        dataset: String,
        /// Shards to keep; all of the dataset's cached shards when none.
        shards: Vec<String>,
    },
    /// Undo `pin`.
    #[command(after_help = "Example:\n  shardcache unpin c4")]
    Unpin {
        /// Dataset.
        dataset: String,
        /// Shards to release; all of the dataset's when none.
        shards: Vec<String>,
    },
    /// Write a synthetic tokenised dataset shaped like the seed's (16 KiB token windows).
    #[command(
        after_help = format!(
            "Example:\n  shardcache gen --dir data --dataset c4 --shards 8 --shard-size 64MiB\n\n{}",
            shardcache_proto::units::SIZE_SYNTAX
        )
    )]
    Gen {
        /// Parent folder (the hub's --root); the dataset goes in DIR/DATASET.
        #[arg(long)]
        dir: PathBuf,
        /// Name of the dataset (its folder).
        #[arg(long, default_value = "c4-synthetic")]
        dataset: String,
        /// Number of shards.
        #[arg(long, default_value_t = 8)]
        shards: u32,
        /// Size of each shard (a multiple of --record-size).
        #[arg(long, default_value = "64MiB")]
        shard_size: ByteSize,
        /// One record: 4096 u32 tokens = 16KiB, as in the seed.
        #[arg(long, default_value = "16KiB")]
        record_size: ByteSize,
        /// Seed of the token values (the same seed writes the same bytes).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// How token ids are drawn: skewed (small ids frequent), or zipf (Zipf's law over
        /// the vocabulary: compresses about as real tokenised text does).
        #[arg(long, value_enum, default_value = "skewed")]
        tokens: shardcache_cli::dataset_gen::Tokens,
    },
    /// Ask a server's gRPC health service; exit 0 when SERVING (container and Kubernetes
    /// probes: works with TLS, which Kubernetes' own gRPC probe cannot speak). A spoke
    /// that cannot reach its hubs stays SERVING and says so on a second line.
    #[command(after_help = "Example:\n  shardcache --endpoint http://127.0.0.1:7071 health")]
    Health {
        /// Service to ask about; the server as a whole when empty.
        #[arg(long, default_value = "")]
        service: String,
    },
    /// Write the compiled `shardcache.v1` descriptor set (for tools that take a protoset,
    /// such as ghz --protoset, instead of reflection).
    #[command(after_help = "Example:\n  shardcache descriptor-set --out shardcache.protoset")]
    DescriptorSet {
        /// File to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Write development certificates: a CA and hub, spoke and client certificates.
    #[command(after_help = "Example:\n  shardcache certs --out certs --name hub.internal,spoke-0.internal")]
    Certs {
        /// Folder to write ca.pem, hub.pem, spoke.pem, client.pem and their .key files.
        #[arg(long)]
        out: PathBuf,
        /// More names for the hub's and spoke's certificates (besides localhost,
        /// 127.0.0.1, ::1, "hub" and "spoke"); repeat or separate with commas.
        #[arg(long = "name", value_delimiter = ',')]
        names: Vec<String>,
        /// Days the certificates are valid.
        #[arg(long, default_value_t = 365)]
        days: i64,
    },
    /// Mount ENDPOINT's datasets read-only on MOUNTPOINT (FUSE): DATASET/SHARD files that
    /// any program can open; every byte verified. Runs until SIGTERM/SIGINT (then
    /// unmounts) or `fusermount3 -u MOUNTPOINT`.
    #[command(after_help = "Examples:\n  shardcache mount http://127.0.0.1:7071 /mnt/shards\n  \
                            SHARDCACHE_ENDPOINT=http://127.0.0.1:7071 shardcache mount /mnt/shards")]
    Mount {
        /// `[ENDPOINT] MOUNTPOINT`: the mount point (an existing directory), after the
        /// endpoint when it is not --endpoint's (a hub, a spoke or a group of spokes).
        #[arg(num_args = 1..=2, required = true, value_names = ["ENDPOINT", "MOUNTPOINT"])]
        places: Vec<String>,
        /// Seconds any one call to the server may take; past it the read fails with EIO.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
        /// Read through the kernel's page cache, with the kernel's read-ahead (16 MiB as
        /// root, 128 KiB otherwise), instead of past it with the mount's own: for
        /// programs that read the same files again and again, or in pieces of a few KiB
        /// without a buffer (each such read is otherwise a trip to the mount).
        #[arg(long)]
        kernel_cache: bool,
    },
    /// Make an access token (printed once) and add its hash to a token file, or revoke one.
    #[command(
        subcommand,
        after_help = "Example:\n  shardcache token new --name trainer --datasets c4 --file tokens > trainer.token"
    )]
    Token(TokenCommand),
}

#[derive(Debug, Subcommand)]
enum PlansCommand {
    /// Withdraw JOB's plan and its readers' (JOB/...), e.g. a finished training run.
    #[command(after_help = "Example:\n  shardcache plans drop c4:0")]
    Drop {
        /// The job, as `shardcache plans` lists it (the Python dataset's default: DATASET:SEED).
        job: String,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Print a new token on stdout and append its line to FILE.
    #[command(
        after_help = "Example:\n  shardcache token new --name trainer --datasets c4 --file tokens > trainer.token"
    )]
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
    /// Make an S3 access key and secret for NAME (a line of the spoke's token file: the
    /// key reads what that token reads), print them once, and append their line to FILE
    /// (the spoke's --s3-keys, mode 0600).
    #[command(
        name = "s3-key",
        after_help = "Example:\n  shardcache token s3-key --name trainer --file s3-keys\n                        export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_ENDPOINT_URL=http://SPOKE:9000"
    )]
    S3Key {
        /// The principal: a line name of the spoke's --token-file.
        #[arg(long)]
        name: String,
        /// The keys file the spoke reads with --s3-keys.
        #[arg(long)]
        file: PathBuf,
    },
    /// Remove NAME's token from FILE (servers reload it within seconds).
    #[command(after_help = "Example:\n  shardcache token revoke --name trainer --file tokens")]
    Revoke {
        /// Whose token to remove.
        #[arg(long)]
        name: String,
        /// The token file.
        #[arg(long)]
        file: PathBuf,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    shardcache_transport::report::exit_status("shardcache", run(Cli::parse()).await)
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
        Command::Token(TokenCommand::S3Key { name, file }) => admin::new_s3_key(&name, &file),
        Command::Gen { dir, dataset, shards, shard_size, record_size, seed, tokens } => {
            let spec = GenSpec {
                dir,
                dataset,
                shards,
                shard_size: shard_size.0,
                record_size: record_size.0,
                seed,
                tokens,
            };
            commands::generate(&spec)
        }
        Command::Mount { mut places, timeout, kernel_cache } => {
            // One place: the mount point, over --endpoint (SHARDCACHE_ENDPOINT) as every
            // other command; two: an endpoint, then the mount point.
            let mountpoint = PathBuf::from(places.pop().unwrap_or_default());
            let endpoint = places.pop().unwrap_or_else(|| server.endpoint.clone());
            let server = commands::Server { endpoint, options: server.options.clone() };
            let options = shardcache_cli::mount::MountOptions {
                deadline: std::time::Duration::from_secs(timeout),
                kernel_cache,
            };
            commands::mount(&server, &mountpoint, options).await
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
        Command::Report { job, principal, png } => {
            commands::report(server, &job, &principal, png.as_deref()).await
        }
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{Cli, GLOBAL};

    /// Every command (and subcommand), with its path.
    fn commands(command: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
        for sub in command.get_subcommands().filter(|c| c.get_name() != "help") {
            let path = format!("{path} {}", sub.get_name());
            out.push((path.clone(), sub.clone()));
            commands(sub, path, out);
        }
    }

    /// `--help` describes every option and argument, keeps the global flags under their
    /// own heading, and shows an example of every command.
    #[test]
    fn help_describes_every_option_apart_from_the_global_ones_with_an_example_per_command() {
        let mut all = vec![("shardcache".to_owned(), Cli::command())];
        commands(&Cli::command(), "shardcache".into(), &mut all);
        for (path, command) in &all {
            for arg in command.get_arguments().filter(|a| !["help", "version"].contains(&a.get_id().as_str()))
            {
                assert!(arg.get_help().is_some(), "{path}: {} has no description", arg.get_id());
                assert_eq!(
                    arg.is_global_set(),
                    arg.get_help_heading() == Some(GLOBAL),
                    "{path}: {} is under the wrong heading",
                    arg.get_id()
                );
            }
            let example = command.get_after_help().map(ToString::to_string).unwrap_or_default();
            assert!(example.contains("\n  shardcache "), "{path}: no example in --help");
        }
    }
}
