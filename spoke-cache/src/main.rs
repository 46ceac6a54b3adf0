//! `spoke-cache`: parse flags, open the cache, serve until SIGTERM or SIGINT.

use anyhow::Context;
use spoke_cache::serve::config::{ENV_PREFIX, SpokeArgs};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    shardcache_transport::report::exit_status("spoke-cache", serve().await)
}

async fn serve() -> anyhow::Result<()> {
    // Kept to the end: dropping it flushes the spans not yet exported.
    let _traces = shardcache_serving::server::init_tracing("shardcache-spoke");
    let args: SpokeArgs = shardcache_serving::flags::parse(ENV_PREFIX);
    shardcache_serving::allocator::rerun_with_malloc_tunables("spoke-cache");
    let shutdown = shardcache_serving::server::shutdown_signal().context("cannot handle SIGINT/SIGTERM")?;
    let options = args.options()?;
    let cache = spoke_cache::open_cache(&args.cache_dir, &options)
        .with_context(|| format!("cannot open --cache-dir {}", args.cache_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {} for metrics", args.metrics_listen))?;
    let s3_listener = match args.s3_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} for the S3 door"))?,
        ),
        None => None,
    };
    let (addr, metrics_addr) = (listener.local_addr()?, metrics_listener.local_addr()?);
    let s3 = match &s3_listener {
        Some(listener) => format!(" s3 on {}", listener.local_addr()?),
        None => String::new(),
    };
    // The contract for scripts and tests that start us on port 0.
    println!("spoke-cache listening on {addr} metrics on {metrics_addr}{s3}");
    tracing::info!(
        %addr,
        %metrics_addr,
        hubs = %args.hubs.join(","),
        cache_dir = %args.cache_dir.display(),
        capacity = %args.capacity,
        peers = %if args.peers.is_empty() { "none".to_owned() } else { args.peers.join(",") },
        "serving"
    );
    spoke_cache::serve(listener, metrics_listener, s3_listener, cache, &options, shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}
