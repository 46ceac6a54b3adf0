//! shardcache client SDK: verified reads from a hub or a spoke cache.
//!
//! ```no_run
//! # async fn demo() -> shardcache_client::Result<()> {
//! use shardcache_client::{Client, Range};
//! let client = Client::connect("http://127.0.0.1:7070").await?;
//! let sample = client.read_range(&Range::new("c4", "shard-00000.bin", 0, 16384)).await?;
//! assert_eq!(sample.data.len(), 16384); // CRC32C, offset and length already checked
//! # Ok(()) }
//! ```
//!
//! - [`client`]: the [`Client`] and its verified [`ShardStream`];
//! - [`stream`]: the verified [`ShardStream`], which carries on from another member;
//! - [`routing`]: whom to ask and when to ask the next: rendezvous ownership, members'
//!   health, one table of failures, hedged calls (for groups, a spoke's peers and hubs);
//! - [`members`]: who is in a group (a list, a file, DNS) and keeping that current;
//! - [`connect`]: TLS (`https://` URLs), client certificates and bearer tokens;
//! - [`control`]: the spoke's cache control ([`CacheClient`]: prefetch, status, evict, pin);
//! - [`samples`]: datasets as samples of any size, indexed from their own format
//!   (records, Megatron indexed datasets, token arrays);
//! - [`error`]: what can go wrong, with the gRPC code where the server gave one.

pub mod client;
pub mod connect;
pub mod control;
pub mod error;
pub mod members;
pub mod range;
pub mod routing;
pub mod samples;
pub mod stream;

pub use client::{Client, Listed, Range, ShardStream, Verified};
pub use connect::{ConnectOptions, Credentials};
pub use control::{CacheClient, PlannedEpoch, PrefetchStream};
pub use error::{Error, Result};
