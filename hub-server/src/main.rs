//! `hub-server`: parse flags, bind, serve until SIGTERM or SIGINT.

use std::sync::Arc;

use anyhow::Context;
use hub_server::{
    config::{ENV_PREFIX, HubArgs, SourceSpec},
    source::{Storage, local::LocalSource, s3::S3Source},
    stats::HubStats,
};
use shardcache_proto::units::ByteSize;
use shardcache_serving::scrape::serve_metrics;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    shardcache_transport::report::exit_status("hub-server", serve().await)
}

async fn serve() -> anyhow::Result<()> {
    // Kept to the end: dropping it flushes the spans not yet exported.
    let _traces = shardcache_serving::server::init_tracing("shardcache-hub");
    let args: HubArgs = shardcache_serving::flags::parse(ENV_PREFIX);
    // Handlers first: a SIGTERM that arrives right after we report the address must
    // still mean a graceful stop, not the default of dying on the spot.
    let shutdown = shardcache_serving::server::shutdown_signal().context("cannot handle SIGINT/SIGTERM")?;
    let options = args.serve_options()?;
    match args.source_spec()? {
        SourceSpec::Local(root) => {
            let flag = match &args.source {
                Some(url) => format!("--source {url}"),
                None => format!("--root {}", root.display()),
            };
            let source = LocalSource::new(&root).with_context(|| format!("cannot serve {flag}"))?;
            run(&args, Arc::new(source), &root.display().to_string(), options, shutdown).await
        }
        SourceSpec::S3(location) => {
            let what = format!("s3://{}/{}", location.bucket, location.prefix);
            let source = S3Source::connect(location, &args.s3_options())
                .await
                .with_context(|| format!("cannot serve {what}"))?;
            run(&args, Arc::new(source), &what, options, shutdown).await
        }
    }
}

async fn run<S: Storage>(
    args: &HubArgs,
    source: S,
    what: &str,
    options: hub_server::ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let metrics_listener = match args.metrics_listen {
        Some(at) => Some(
            tokio::net::TcpListener::bind(at)
                .await
                .with_context(|| format!("cannot listen on {at} for metrics"))?,
        ),
        None => None,
    };
    // One line on stdout, the contract for scripts and tests that start us on port 0.
    match &metrics_listener {
        Some(metrics) => println!("hub-server listening on {addr} metrics on {}", metrics.local_addr()?),
        None => println!("hub-server listening on {addr}"),
    }
    let limits = (ByteSize(options.limits.message_size.into()), ByteSize(options.limits.max_read));
    tracing::info!(
        %addr,
        source = %what,
        tls = %match &options.security.tls {
            None => "off",
            Some(tls) if tls.verifies_client_certs() => "on, client certificates required",
            Some(_) => "on",
        },
        tokens = %if options.security.auth.requires_credentials() { "required" } else { "off" },
        message_size = %limits.0,
        max_read = %limits.1,
        max_concurrency = options.server.max_concurrency,
        request_timeout = %humantime::format_duration(options.server.request_timeout),
        "serving"
    );
    let stats = Arc::new(HubStats::default());
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    let metrics = match metrics_listener {
        None => None,
        Some(listener) => {
            let access = args.serving.metrics_access().map_err(anyhow::Error::msg)?;
            let (stats, auth) = (stats.clone(), options.security.auth.clone());
            let render = move || stats.render(auth.token_file_failure().is_some());
            Some(serve_metrics(listener, options.security.tls.clone(), access, render, shutdown.clone()))
        }
    };
    let serving = hub_server::serve(listener, source, options, stats.clone(), shutdown);
    match metrics {
        Some(metrics) => tokio::join!(serving, metrics).0?,
        None => serving.await?,
    }
    let served = stats.snapshot();
    tracing::info!(
        stat_requests = served.stat_requests,
        read_requests = served.read_requests,
        bytes_served = %ByteSize(served.bytes_served).human(),
        "stopped"
    );
    Ok(())
}
