//! shardcache hub: serves the shards of datasets from a [`source::Source`] over the
//! `shardcache.v1.ShardReader` gRPC API.
//!
//! - [`source`]: where bytes come from (a local directory; S3 later), version-checked;
//! - [`service`]: the gRPC read service: validation, limits, CRC32C on every chunk;
//! - [`server`]: assembly of health, reflection, layers and graceful shutdown;
//! - [`stats`]: counters of what was served;
//! - [`config`]: flags and environment variables;
//! - [`error`]: the crate's errors and their gRPC status codes.

pub mod config;
pub mod error;
pub mod server;
pub mod service;
pub mod source;
pub mod stats;

pub use error::{Error, Result};
pub use server::{ServeOptions, serve};
