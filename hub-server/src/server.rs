//! Assembles the hub's gRPC server: the read service over the hub's storage, behind its
//! token check, served by the assembly both servers share (`shardcache_serving::server`).

use std::{future::Future, sync::Arc};

use shardcache_proto::v1::shard_reader_server::ShardReaderServer;
use shardcache_reader::{ReadLimits, ReadService};
use shardcache_serving::server::{self, Security, ServerLimits};
use shardcache_transport::http2::Http2Settings;
use tokio::net::TcpListener;
use tonic::{service::Routes, service::interceptor::InterceptedService};

use crate::{
    Result,
    source::{HubSource, Storage},
    stats::HubStats,
};

/// How the server bounds its work and whom it serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub limits: ReadLimits,
    /// Requests in flight, per connection, and their deadline.
    pub server: ServerLimits,
    /// HTTP/2 windows and frames, socket send buffer.
    pub http2: Http2Settings,
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
    let reader = ShardReaderServer::new(ReadService::new(HubSource(source), options.limits, stats))
        // Responses are bounded by --max-read; requests by the number of ranges.
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(server::MAX_REQUEST_BYTES);
    // Tokens are checked before a handler runs.
    let routes = Routes::new(InterceptedService::new(reader, options.security.auth.clone()));
    let serving = [shardcache_proto::v1::shard_reader_server::SERVICE_NAME];
    server::serve_grpc(
        listener,
        routes,
        &serving,
        options.http2,
        options.server,
        &options.security,
        shutdown,
    )
    .await?;
    Ok(())
}
