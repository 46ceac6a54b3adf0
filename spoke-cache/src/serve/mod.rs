//! The spoke's front doors and its assembly: the gRPC services (the hub's read API over
//! the cache, `source.rs`; cache control, `control/`), the same-node door for readers on
//! the spoke's node (`local_door.rs`), the S3 door for S3 clients (`s3/`), the flags (`config.rs`) and the
//! server that opens the cache and serves them until shutdown (`server.rs`).
//!
//! Owns: everything a caller outside the process sees. May import every other part of
//! the spoke (the [`cache`](crate::cache) facade above all); nothing imports it but the
//! binary (`main.rs`).

pub mod config;
pub mod control;
pub mod local_door;
pub mod s3;
pub mod server;
pub mod source;
