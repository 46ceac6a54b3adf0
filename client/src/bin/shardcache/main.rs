//! `shardcache`: the command line for hubs and spokes: list, stat, fetch and print
//! shards (every byte checksum-verified), and generate synthetic datasets.

mod commands;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use shardcache_proto::units::ByteSize;

#[derive(Debug, Parser)]
#[command(name = "shardcache", version, about)]
struct Cli {
    /// Server to talk to: a hub or a spoke cache (status, warm, evict, pin: a spoke).
    #[arg(long, env = "SHARDCACHE_ENDPOINT", default_value = "http://127.0.0.1:7070", global = true)]
    endpoint: String,

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
        /// Where to write it (written to a temporary file, renamed when complete).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Print a range of a shard to stdout.
    Cat {
        dataset: String,
        shard: String,
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Bytes to print; to the end of the shard when absent.
        #[arg(long)]
        length: Option<u64>,
    },
    /// Show a spoke cache's occupancy and per-dataset hits, misses and upstream bytes.
    Status,
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
    match cli.command {
        Command::Gen { dir, dataset, shards, shard_size, record_size, seed } => {
            commands::generate(dir, dataset, shards, shard_size, record_size, seed)
        }
        Command::Ls { dataset } => commands::ls(&cli.endpoint, dataset.as_deref()).await,
        Command::Stat { dataset, shard } => commands::stat(&cli.endpoint, &dataset, &shard).await,
        Command::Get { dataset, shard, output } => {
            commands::get(&cli.endpoint, &dataset, &shard, &output).await
        }
        Command::Cat { dataset, shard, offset, length } => {
            commands::cat(&cli.endpoint, &dataset, &shard, offset, length).await
        }
        Command::Status => commands::status(&cli.endpoint).await,
        Command::Warm { dataset, shards, parallelism } => {
            commands::warm(&cli.endpoint, &dataset, &shards, parallelism).await
        }
        Command::Evict { dataset, shards } => commands::evict(&cli.endpoint, &dataset, &shards).await,
        Command::Pin { dataset, shards } => commands::pin(&cli.endpoint, &dataset, &shards, true).await,
        Command::Unpin { dataset, shards } => commands::pin(&cli.endpoint, &dataset, &shards, false).await,
    }
}
