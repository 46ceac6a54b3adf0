//! The CLI's subcommands, each a thin layer over the SDK, one file each (as mini-redis
//! keeps one file per command); here the server a command talks to and what several share.

mod cat;
mod evict;
mod generate;
mod get;
mod health;
mod ls;
mod mount;
mod pin;
mod plans;
mod report;
mod stat;
mod status;
mod warm;

pub use self::{
    cat::cat,
    evict::evict,
    generate::generate,
    get::get,
    health::health,
    ls::ls,
    mount::mount,
    pin::pin,
    plans::{drop_plans, plans},
    report::report,
    stat::stat,
    status::status,
    warm::warm,
};

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shardcache_cli::dataset_gen::{GenSpec, generate as generate_dataset};
use shardcache_client::{CacheClient, Client, ConnectOptions};
use shardcache_proto::units::ByteSize;
use tokio::io::AsyncWriteExt;

/// The server a command talks to, and how.
#[derive(Debug)]
pub struct Server {
    pub endpoint: String,
    pub options: ConnectOptions,
}

impl Server {
    async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::connect_with(&self.endpoint, &self.options).await?)
    }

    async fn cache(&self) -> anyhow::Result<CacheClient> {
        Ok(CacheClient::connect_with(&self.endpoint, &self.options).await?)
    }
}

/// The spoke's status, when `server` is a spoke that shows it to this caller within
/// two seconds.
async fn hub_status(server: &Server) -> Option<shardcache_proto::v1::StatusResponse> {
    let ask = async { server.cache().await.ok()?.status().await.ok() };
    tokio::time::timeout(std::time::Duration::from_secs(2), ask).await.ok().flatten()
}

/// The line `status` and `health` print for a spoke that cannot reach its hubs.
fn hubs_unreachable(age_s: u64, trouble: &str) -> String {
    format!(
        "hubs: UNREACHABLE {age_s} s ago: {trouble} (the cache serves what it holds; misses fail until a hub answers)"
    )
}

/// A listing a spoke answered from its cache says so on stderr (the table stays
/// parseable on stdout; the exit status stays 0: it is what the spoke knows).
fn warn_if_stale(stale: bool) {
    if stale {
        eprintln!(
            "shardcache: STALE LISTING: the spoke cannot reach its hub and answered from its cache: it may be out of \
             date, and shards never read through this spoke are missing (`shardcache status` says why)"
        );
    }
}

/// A byte progress bar on stderr when it is a terminal; hidden otherwise (pipes, CI).
fn progress_bar(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
    {
        bar.set_style(style);
    }
    bar
}

/// A job's name as a status table shows it: with its principal when that is not the
/// caller (an operator sees every principal's jobs).
pub(crate) fn owned_by(principal: &str, job: &str, caller: &str) -> String {
    if principal == caller || principal.is_empty() { job.to_owned() } else { format!("{principal}:{job}") }
}
