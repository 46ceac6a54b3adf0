//! What shardcache's clients and servers both need of a connection, and nothing of a
//! server (no hyper server, no reflection, no flags): the SDK, the CLI and the spoke's
//! connections to its hubs and peers take this crate, the servers take it through
//! `shardcache-serving`.
//!
//! - [`http2`]: the HTTP/2 windows, frames and sockets of the long link, and the client
//!   connector that applies them;
//! - [`tls`]: client TLS (reloaded), what a server's TLS shares with it (certificate and
//!   key files, the handshake timeout, the byte stream of either), and [`tls::check_private`];
//! - [`liveness`]: a client channel whose calls cannot wait forever on a connection
//!   that is gone (hyper can lose a request taken while its connection fails);
//! - [`reload`]: values built from files that are rotated without a restart;
//! - [`credentials`]: the bearer token file a client reads;
//! - [`telemetry`]: distributed traces (OpenTelemetry, W3C context in the metadata),
//!   exported only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set;
//! - [`report`]: errors as one line for a person (the SDK's and the servers' exits);
//! - [`local_socket`]: the same-node door's messages and the files passed beside them.
//!
//! The wire contract itself (messages, names, ranges, checksums) is `shardcache-proto`.

pub mod credentials;
pub mod http2;
pub mod liveness;
pub mod local_socket;
pub mod reload;
pub mod report;
pub mod telemetry;
pub mod tls;
