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
//! One way through, each module using only those listed after it:
//! - [`stream`]: the client's streams, a verified [`ShardStream`] of any size that
//!   carries on from another member of a group;
//! - [`control`]: the spoke's cache control ([`CacheClient`]: prefetch, status, evict,
//!   pin, plans of shards and of samples);
//! - [`client`]: the [`Client`]: listings, stats and verified reads of ranges and batches,
//!   from one server or a group's members (routed by `shardcache_routing`);
//! - [`local`]: a spoke's same-node door, used by itself where the spoke is on the
//!   reader's node (the stored pages read from the spoke's files, each checked);
//! - [`discovery`]: the one way a client connects, to one server or a group, and who is
//!   in a group (a list, a file, DNS) kept current;
//! - [`verify`]: what makes bytes [`Verified`] (decoding, offsets, CRC32C, one version);
//! - [`connect`]: TLS (`https://` URLs), client certificates and bearer tokens;
//! - [`range`]: what a read asks for;
//! - [`error`]: what can go wrong, with the gRPC code where the server gave one;
//! - [`order`]: orders of samples computed a position at a time (keyed permutations, a
//!   map-style sampler over ranks) and where a sample is read next, for plans.
//!
//! Datasets read as samples in their own formats are `shardcache-formats`, on top of this.

pub mod client;
pub mod connect;
pub mod control;
pub mod discovery;
pub mod error;
pub mod local;
pub mod order;
pub mod range;
pub mod report;
pub mod steps;
pub mod stream;
pub mod verify;

pub use client::{Client, Listed};
pub use connect::{ConnectOptions, Credentials};
pub use control::{CacheClient, PlannedEpoch, PlannedSample, PrefetchStream};
pub use error::{Error, Result};
pub use range::Range;
pub use steps::StepTimer;
pub use stream::ShardStream;
pub use verify::Verified;
