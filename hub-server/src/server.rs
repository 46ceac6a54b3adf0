//! Assembles the hub's gRPC server: health and reflection, the tower layers, the read
//! service, then serves a bound listener until the shutdown future resolves.

use std::{future::Future, time::Duration};

use shardcache_proto::{FILE_DESCRIPTOR_SET, v1::shard_reader_server::ShardReaderServer};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use crate::{
    Error, Result,
    limits::ShedLayer,
    service::{ReadLimits, ReadService},
    source::Source,
};

/// How the server bounds its work.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    pub limits: ReadLimits,
    /// Requests in flight (including open streams) across all connections.
    pub max_concurrency: usize,
    /// Time a request may take to produce its response headers.
    pub request_timeout: Duration,
}

/// Serves `source` on `listener` until `shutdown` resolves, then lets in-flight
/// requests finish. Tests pass a listener bound to `127.0.0.1:0` and a oneshot; the
/// binary passes its `--listen` socket and SIGTERM/SIGINT.
pub async fn serve<S: Source>(
    listener: TcpListener,
    source: S,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ShardReaderServer<ReadService<S>>>().await;
    // Both reflection versions: grpcurl speaks v1, ghz and older tools v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_error = |e: tonic_reflection::server::Error| Error::Internal(e.to_string());
    let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;

    let reader = ShardReaderServer::new(ReadService::new(source, options.limits))
        // Responses are bounded by --max-read; requests by the number of ranges.
        .max_encoding_message_size(usize::MAX);

    tonic::transport::Server::builder()
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
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}

/// Accepted connections with `TCP_NODELAY`: tonic sets it only on listeners it binds
/// itself. Without it a small response (a 16 KiB sample) waits for the client's delayed
/// ACK: measured 44 ms p50 per ReadRange on loopback, against well under 1 ms with it.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}
