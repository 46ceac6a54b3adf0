//! shardcache spoke: a read-through cache of hub shards in RocksDB on local disk,
//! serving the hub's read API (`shardcache.v1.ShardReader`) plus cache control.
//!
//! The folders are the architecture, each importing only those below it (held by
//! `tests/tests/architecture.rs`):
//!
//! ```text
//! serve/    the front doors: the read service over the cache, cache control, flags, the server
//! cache/    the facade: the parts assembled (open.rs), through which the services reach them
//! read/     where a read is answered from: stored, fetched, fetched as read, held by a plan
//! plans/    what jobs will read (shards, samples), what each read is to them, and the
//!           one follower that fetches what they read next
//! fetch/    the fetch owner (one fetch per missing chunk), shard lookups, the suppliers
//!           (peers, hubs) asked in order with hedging
//! store/    RocksDB (pages, records, packs), the catalog, chunk admission, capacity,
//!           and eviction's I/O
//! policy/   pure decisions (admission, speculation, shares, eviction order), each
//!           beside its model
//! observe/  metrics, per-job counters, job tables
//! error.rs  errors and the one place that picks their gRPC codes
//! ```
//!
//! Data flows one way (see `cache/mod.rs` for the picture): a read asks the catalog; a miss
//! goes to the fetch owner, which asks the chain of suppliers and hands what it got to
//! the admission sink. `testing` (unit tests only): the parts over a real store with a
//! fake supplier.

pub mod cache;
pub mod error;
pub mod fetch;
pub mod observe;
pub mod plans;
pub mod policy;
pub mod read;
pub mod serve;
pub mod store;
#[cfg(test)]
pub mod testing;

pub use error::{Error, Result};
pub use serve::server::{PeerGroup, SpokeOptions, open_cache, serve};
