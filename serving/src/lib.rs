//! The serving machinery the hub and the spoke share, so that they are assembled,
//! secured and tuned alike (clients take none of it: what they share with the servers
//! is `shardcache-transport`):
//!
//! - [`server`]: server assembly (one function for both servers: health, reflection,
//!   TLS, the tower layers, graceful shutdown), accepted sockets with `TCP_NODELAY` and
//!   the link's HTTP/2 settings, request limits, logging, shutdown signals, and
//!   [`server::Security`];
//! - [`flags`]: the flags both servers take (TLS, tokens, limits) and their environment
//!   variables;
//! - [`shed`]: load shedding to RESOURCE_EXHAUSTED;
//! - [`tls`] and [`auth`]: TLS on every listener and bearer tokens mapped to datasets,
//!   both reloaded without a restart;
//! - [`scrape`] and [`prom`]: the metrics listener (`GET /metrics`) and the Prometheus
//!   text helpers (histograms, label escaping) both servers render with;
//! - [`allocator`]: glibc's allocator settings the spoke and the mount run again with.
//!
//! The wire contract itself (messages, names, ranges, checksums) is `shardcache-proto`.

pub mod allocator;
pub mod auth;
pub mod flags;
pub mod prom;
pub mod s3_keys;
pub mod scrape;
pub mod server;
pub mod shed;
pub mod tls;
