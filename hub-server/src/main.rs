//! `hub-server`: parse flags, bind, serve until SIGTERM or SIGINT.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use hub_server::{config::HubArgs, source::local::LocalSource};
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
    let shutdown = shutdown_signal()?;
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
    hub_server::serve(listener, Arc::new(source), options, shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Installs SIGINT (Ctrl-C) and SIGTERM (`docker stop`, Kubernetes) handlers now and
/// returns a future that resolves on either.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down: finishing in-flight requests");
    })
}
