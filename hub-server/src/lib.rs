//! shardcache hub: serves the shards of datasets from a [`source::Storage`] over the
//! `shardcache.v1.ShardReader` gRPC API (the read service of [`shardcache_reader`]).
//!
//! - [`source`]: where bytes come from (a local directory or an S3 prefix),
//!   version-checked, and how the shared read service sees them;
//! - [`server`]: assembly of health, reflection, layers and graceful shutdown;
//! - [`stats`]: counters of what was served;
//! - [`config`]: flags and environment variables;
//! - [`error`]: the crate's errors and their gRPC status codes.

pub mod config;
pub mod error;
pub mod server;
pub mod source;
pub mod stats;

pub use error::{Error, Result};
pub use server::{ServeOptions, serve};
