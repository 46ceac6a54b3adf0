//! What the hub and the spoke share when they serve: the assembly of a gRPC server
//! ([`serve_grpc`]: health and reflection, TLS, the tower layers, graceful shutdown),
//! accepted sockets with `TCP_NODELAY`, TLS and tokens ([`Security`]), the HTTP/2 limits
//! every connection gets ([`harden`]), reflection for both protocol versions, and the
//! shutdown signal.

use std::{future::Future, path::Path, time::Duration};

use shardcache_transport::{
    http2::Http2Settings,
    telemetry::{self, Telemetry},
};
use tokio::net::TcpListener;
use tokio_stream::{Stream, StreamExt};
use tonic::{
    service::Routes,
    transport::{Server, server::TcpIncoming},
};
use tonic_reflection::server::{
    Error as ReflectionError,
    v1::{ServerReflection, ServerReflectionServer},
    v1alpha::{
        ServerReflection as ServerReflectionAlpha, ServerReflectionServer as ServerReflectionServerAlpha,
    },
};

pub use crate::shed::{Shed, ShedLayer};
use crate::{
    auth::Authenticator,
    tls::{ServerConn, ServerTls, ServerTlsFiles},
};

/// Largest request message a server decodes. The largest legitimate request is a
/// ReadRanges of `MAX_RANGES_PER_CALL` (4096) ranges with names at their length limits:
/// ~5.2 MB. Bigger is refused with OUT_OF_RANGE before any of it is looked at.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;

/// Largest HTTP/2 header block a client may send. gRPC metadata is a few hundred bytes
/// (a bearer token is ~70); hyper's default (16 MiB) would let one request hold 16 MiB.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;

/// Default `--max-streams-per-connection` (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS):
/// one connection cannot hold more requests than this; a client's further requests wait
/// in its own queue. A trainer with 16 ranks x 64 batches in flight stays under it.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 1024;

/// Pings on idle connections, so a peer that vanished (a killed pod, a dropped NAT
/// entry) releases its connection within interval + timeout instead of never.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Streams a client may open and reset before the server answers them (the HTTP/2
/// "rapid reset" attack, CVE-2023-44487); past it the connection is closed (GOAWAY
/// ENHANCE_YOUR_CALM) with every stream on it. hyper's default, 20, is what an honest
/// client trips on busy cores: a group client cancels a hedge's loser, a DataLoader its
/// batch, often before a starved server has read their headers (`make demo`'s group of
/// three on two cores logged it). A few hundred still bounds the
/// work a client can make the server do for nothing.
pub const MAX_PENDING_RESETS: usize = 256;

/// How a server bounds its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Requests in flight (open streams included) across all connections; over it a
    /// request gets RESOURCE_EXHAUSTED at once.
    pub max_concurrency: usize,
    /// Requests one connection may have open (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_streams_per_connection: u32,
    /// Time a request may take to produce its response headers.
    pub request_timeout: Duration,
}

/// Serves `routes` (the server's own services, each behind its token check) on
/// `listener` with TLS when `security` has it, until `shutdown` resolves; in-flight
/// requests finish first. `serving` names the services gRPC health reports SERVING.
/// Both servers are assembled here, in one order: health and reflection, TLS (in
/// `incoming`, a handshake per connection, certificates reloadable), the tower layers,
/// graceful shutdown.
pub async fn serve_grpc(
    listener: TcpListener,
    routes: Routes,
    serving: &[&str],
    http2: Http2Settings,
    limits: ServerLimits,
    security: &Security,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    for service in serving {
        health.set_service_status(*service, tonic_health::ServingStatus::Serving).await;
    }
    let (reflection_v1, reflection_v1alpha) = reflection()?;
    harden(builder(&http2), limits.max_streams_per_connection)
        // A span per request, so every log line of a request carries its method; a
        // child of the caller's span when the call carries a W3C trace context.
        .trace_fn(|request| {
            let method = request.uri().path();
            // Probes at debug: no trace of their own for every health check.
            if method.starts_with("/grpc.health.") {
                return tracing::debug_span!("rpc", method = %method);
            }
            let span = tracing::info_span!("rpc", method = %method, otel.kind = "server");
            telemetry::set_parent(&span, request.headers());
            span
        })
        // tonic wraps this around everything below: a request that cannot produce its
        // headers in time (a stuck disk, a hub that hangs) ends with CANCELLED and gives
        // its slot back.
        .timeout(limits.request_timeout)
        // In front of the services: over the global limit, refuse at once and cheaply.
        .layer(ShedLayer::new(limits.max_concurrency))
        .add_routes(routes)
        // Health and reflection stay open (probes and tools carry no token).
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(tuned_incoming(&http2, listener, security.tls.clone()), shutdown)
        .await?;
    Ok(())
}

/// Why a server could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection: {0}")]
    Reflection(#[from] ReflectionError),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The per-connection limits of both servers on top of a configured builder.
pub fn harden(server: tonic::transport::Server, max_streams_per_connection: u32) -> tonic::transport::Server {
    server
        .max_concurrent_streams(max_streams_per_connection)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
}

/// Who may connect and what they may read: TLS for the listener (optional) and the
/// token check (open when there is no token file).
#[derive(Debug, Clone)]
pub struct Security {
    pub tls: Option<ServerTls>,
    pub auth: Authenticator,
}

impl Default for Security {
    fn default() -> Self {
        Self { tls: None, auth: Authenticator::open() }
    }
}

impl Security {
    /// From the security flags every server has (`--tls-cert`, `--tls-key`,
    /// `--client-ca`, `--token-file`); an error names the flag or file at fault.
    pub fn from_flags(
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
        token_file: Option<&Path>,
    ) -> Result<Self, String> {
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => Some(
                ServerTls::load(&ServerTlsFiles {
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                    client_ca: client_ca.map(Path::to_owned),
                    // With tokens too, a client may use either (see `auth`).
                    client_cert_optional: token_file.is_some(),
                })
                .map_err(|e| e.to_string())?,
            ),
            (None, None) if client_ca.is_some() => {
                return Err("--client-ca needs --tls-cert and --tls-key: client certificates are \
                            checked in the TLS handshake"
                    .into());
            }
            (None, None) => None,
            _ => return Err("--tls-cert and --tls-key go together".into()),
        };
        let auth = match token_file {
            Some(path) => Authenticator::with_token_file(path)?,
            None => Authenticator::open(),
        };
        Ok(Self { tls, auth })
    }
}

/// Accepted connections with `TCP_NODELAY`: tonic sets it only on listeners it binds
/// itself. Without it a small response (a 16 KiB sample) waits for the client's delayed
/// ACK, tens of milliseconds per ReadRange on loopback (BENCHMARKS.md, hub-bench).
pub fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// A server builder with `http2`'s settings (windows for what it receives; the frame
/// size it accepts).
fn builder(http2: &Http2Settings) -> Server {
    let builder = Server::builder()
        .initial_stream_window_size(http2.stream_window)
        .initial_connection_window_size(http2.connection_window)
        .max_frame_size(http2.max_frame_size);
    if *http2 == Http2Settings::DEFAULTS { builder } else { builder.http2_adaptive_window(Some(false)) }
}

/// Accepted connections with `TCP_NODELAY` ([`incoming`]), `http2`'s send buffer when set,
/// and a TLS handshake when `tls` is set.
fn tuned_incoming(
    http2: &Http2Settings,
    listener: TcpListener,
    tls: Option<ServerTls>,
) -> impl Stream<Item = std::io::Result<ServerConn>> + Send + use<> {
    let send_buffer = http2.socket_buffer;
    let tcp = incoming(listener).map(move |accepted| {
        let stream = accepted?;
        if send_buffer > 0 {
            socket2::SockRef::from(&stream).set_send_buffer_size(send_buffer)?;
        }
        Ok(stream)
    });
    crate::tls::incoming(tcp, tls)
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
            .register_encoded_file_descriptor_set(shardcache_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`, aws-config's only errors), and
/// exports traces as `service` when `OTEL_EXPORTER_OTLP_ENDPOINT` asks
/// (`shardcache_transport::telemetry`): the same for both servers and the mount. Keep the
/// returned export until the process ends (dropping it flushes the spans). Must run
/// within a tokio runtime.
pub fn init_tracing(service: &str) -> Option<Telemetry> {
    use tracing_subscriber::{Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _};
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in files and container logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // aws-config warns once per provider it tries (IMDS off EC2), with raw
                // HTTP responses; its failure reaches the hub's own error anyway.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,aws_config=error")),
        );
    let (telemetry, failed) = match Telemetry::from_env(service) {
        Ok(telemetry) => (telemetry, None),
        Err(e) => (None, Some(e)),
    };
    let traces = telemetry.as_ref().map(Telemetry::layer);
    tracing_subscriber::registry().with(logs).with(traces).init();
    if let Some(e) = failed {
        tracing::warn!(error = %e, "exporting no traces");
    }
    telemetry
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
