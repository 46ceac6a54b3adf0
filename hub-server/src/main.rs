//! `hub-server`: parse flags, bind, serve until SIGTERM or SIGINT.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use hub_server::{config::HubArgs, source::local::LocalSource, stats::HubStats};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shardcache_proto::serving::init_tracing();
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
