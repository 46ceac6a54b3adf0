//! `hub-server`: parse flags, bind, serve until SIGTERM or SIGINT.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use hub_server::{config::HubArgs, source::local::LocalSource, stats::HubStats};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    let args = HubArgs::parse();
    // Handlers first: a SIGTERM that arrives right after we report the address must
    // still mean a graceful stop, not the default of dying on the spot.
    let shutdown = shardcache_proto::serving::shutdown_signal().context("cannot handle SIGINT/SIGTERM")?;
    let options = args.serve_options()?;
    let source = LocalSource::new(&args.root)
        .with_context(|| format!("cannot serve --root {}", args.root.display()))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    // One line on stdout, the contract for scripts and tests that start us on port 0.
    println!("hub-server listening on {addr}");
    tracing::info!(%addr, root = %source.root().display(), ?options, "serving");
    let stats = Arc::new(HubStats::default());
    hub_server::serve(listener, Arc::new(source), options, stats.clone(), shutdown).await?;
    tracing::info!(served = ?stats.snapshot(), "stopped");
    Ok(())
}
