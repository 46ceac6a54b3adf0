//! The serving machinery both servers and the SDK share, so that the hub and the spoke
//! are assembled, secured and tuned alike:
//!
//! - [`server`]: server assembly (one function for both servers: health, reflection,
//!   TLS, the tower layers, graceful shutdown), `TCP_NODELAY` on accepted sockets,
//!   HTTP/2 and request limits, logging, shutdown signals, and [`server::Security`];
//! - [`flags`]: the flags both servers take (TLS, tokens, limits) and their environment
//!   variables;
//! - [`shed`]: load shedding to RESOURCE_EXHAUSTED;
//! - [`transport`]: the HTTP/2 windows, frames and connections of the long link;
//! - [`tls`], [`auth`] and [`reload`]: TLS on every connection, bearer tokens mapped to
//!   datasets, and the rotation of both without a restart;
//! - [`report`]: errors as one line for a person (the SDK's and the servers' exits);
//! - [`scrape`] and [`prom`]: the metrics listener (`GET /metrics`) and the Prometheus
//!   text helpers (histograms, label escaping) both servers render with.
//!
//! The wire contract itself (messages, names, ranges, checksums) is `shardcache-proto`.

pub mod auth;
pub mod flags;
pub mod prom;
pub mod reload;
pub mod report;
pub mod scrape;
pub mod server;
pub mod shed;
pub mod tls;
pub mod transport;
