//! `seed-demo`'s flags: the job's shape, the link, and which setups run.

use std::{path::PathBuf, time::Duration};

use clap::Parser;
use shardcache_proto::units::ByteSize;

/// The seed experiment, reproduced: hub, WAN emulator, spoke, simulated trainer.
#[derive(Debug, Parser)]
#[command(name = "seed-demo", about)]
pub struct Args {
    /// Where to write results.md, results.json, results.png (and the run's files).
    #[arg(long, default_value = "target/demo")]
    pub out: PathBuf,
    /// Data-parallel ranks (GPUs).
    #[arg(long, default_value_t = 16)]
    pub ranks: usize,
    /// Samples per rank per step.
    #[arg(long, default_value_t = 24)]
    pub batch: usize,
    /// Steps per epoch; the dataset holds exactly one epoch.
    #[arg(long, default_value_t = 200)]
    pub steps: usize,
    /// Simulated GPU time per step.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    pub compute: Duration,
    /// Job start to first step (model loading); loaders and prefetch already run.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub startup: Duration,
    /// Batches each rank reads ahead (DataLoader num_workers x prefetch_factor).
    #[arg(long, default_value_t = 4)]
    pub read_ahead: usize,
    /// Shards whose samples are shuffled together (the sampler's shuffle block).
    #[arg(long, default_value_t = 4)]
    pub block_shards: u32,
    /// Bytes per shard (a multiple of 16KiB).
    #[arg(long, default_value = "16MiB")]
    pub shard_size: ByteSize,
    /// Round-trip time of the emulated link.
    #[arg(long, default_value = "60ms")]
    pub rtt: String,
    /// Skip the nginx peer row.
    #[arg(long)]
    pub skip_nginx: bool,
    /// Skip the small-cache setups.
    #[arg(long)]
    pub skip_small_cache: bool,
    /// Run only the small-cache setups.
    #[arg(long, conflicts_with = "skip_small_cache")]
    pub small_cache_only: bool,
    /// Skip the group setups (two nodes, a spoke each or a group of three).
    #[arg(long)]
    pub skip_group: bool,
    /// Run only the group setups.
    #[arg(long, conflicts_with_all = ["skip_group", "small_cache_only"])]
    pub group_only: bool,
    /// Skip the link-compression setups.
    #[arg(long)]
    pub skip_compression: bool,
    /// The hub's --link-compression-level for the seed's and the later setups (the
    /// hub's own default when not given; 0 turns compression off).
    #[arg(long)]
    pub hub_compression_level: Option<i32>,
    /// The small-cache spoke's --plan-window: `auto` (the spoke's default: the next block
    /// of the plan) or bytes of shards fetched ahead of the block being read.
    #[arg(long, default_value = "auto")]
    pub plan_window: String,
}
