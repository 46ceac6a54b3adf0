//! What the hub and the spoke share when they serve: accepted sockets with
//! `TCP_NODELAY`, reflection for both protocol versions, and the shutdown signal.

use std::future::Future;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic_reflection::server::{
    Error as ReflectionError,
    v1::{ServerReflection, ServerReflectionServer},
    v1alpha::{
        ServerReflection as ServerReflectionAlpha, ServerReflectionServer as ServerReflectionServerAlpha,
    },
};

pub use crate::shed::{Shed, ShedLayer};

/// Accepted connections with `TCP_NODELAY`: tonic sets it only on listeners it binds
/// itself. Without it a small response (a 16 KiB sample) waits for the client's delayed
/// ACK: measured 44 ms p50 per ReadRange on loopback, against 0.3 ms with it.
pub fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Reflection services, v1 (grpcurl) and v1alpha (ghz, older tools), describing
/// `shardcache.v1` and health.
#[allow(clippy::type_complexity)]
pub fn reflection() -> Result<
    (ServerReflectionServer<impl ServerReflection>, ServerReflectionServerAlpha<impl ServerReflectionAlpha>),
    ReflectionError,
> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`): the same for both servers.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Installs SIGINT (Ctrl-C) and SIGTERM (`docker stop`, Kubernetes) handlers *now* and
/// returns a future that resolves on either. Installing them before the server reports
/// its address means a SIGTERM sent right after is a graceful stop, not a kill.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down: finishing in-flight requests");
    })
}
