//! Assembles the hub's gRPC server: health and reflection, the tower layers, the read
//! service, then serves a bound listener until the shutdown future resolves.

use std::{future::Future, sync::Arc, time::Duration};

use shardcache_proto::v1::shard_reader_server::ShardReaderServer;
use shardcache_serving::{
    server::{self, Security, ShedLayer},
    transport::Http2Settings,
};
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;

use shardcache_reader::{ReadLimits, ReadService};

use crate::{
    Error, Result,
    source::{HubSource, Storage},
    stats::HubStats,
};

/// How the server bounds its work and whom it serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub limits: ReadLimits,
    /// Requests in flight (including open streams) across all connections.
    pub max_concurrency: usize,
    /// Time a request may take to produce its response headers.
    pub request_timeout: Duration,
    /// HTTP/2 windows and frames, socket send buffer.
    pub http2: Http2Settings,
    /// Requests one connection may have open (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_streams_per_connection: u32,
    /// TLS and tokens.
    pub security: Security,
}

/// Serves `source` on `listener` until `shutdown` resolves, then lets in-flight
/// requests finish. Tests pass a listener bound to `127.0.0.1:0` and a oneshot; the
/// binary passes its `--listen` socket and SIGTERM/SIGINT. `stats` counts what was served.
pub async fn serve<S: Storage>(
    listener: TcpListener,
    source: S,
    options: ServeOptions,
    stats: Arc<HubStats>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ShardReaderServer<ReadService<HubSource<S>>>>().await;
    let (reflection_v1, reflection_v1alpha) =
        server::reflection().map_err(|e| Error::Internal(e.to_string()))?;

    let reader = ShardReaderServer::new(ReadService::new(HubSource(source), options.limits, stats))
        // Responses are bounded by --max-read; requests by the number of ranges.
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(server::MAX_REQUEST_BYTES);
    // Tokens are checked before a handler runs; health and reflection stay open (probes).
    let reader = InterceptedService::new(reader, options.security.auth.clone());

    // TLS happens in `incoming` (handshakes per connection, certificates reloadable).
    server::harden(options.http2.server(), options.max_streams_per_connection)
        // A span per request, so every log line of a request carries its method.
        .trace_fn(|request| tracing::info_span!("rpc", method = %request.uri().path()))
        // tonic wraps this around everything below: a request that cannot produce its
        // headers in time (a stuck disk) ends with CANCELLED and gives its slot back.
        .timeout(options.request_timeout)
        // In front of the services: over the global limit, refuse at once and cheaply.
        .layer(ShedLayer::new(options.max_concurrency))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(reader)
        .serve_with_incoming_shutdown(
            options.http2.incoming(listener, options.security.tls.clone()),
            shutdown,
        )
        .await?;
    Ok(())
}
