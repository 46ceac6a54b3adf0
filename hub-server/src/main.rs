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
    hub_server::serve(listener, Arc::new(source), options, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (`docker stop`, Kubernetes).
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
