//! shardcache spoke: a read-through cache of hub shards in RocksDB on local disk,
//! serving the hub's read API (`shardcache.v1.ShardReader`) plus cache control.
//!
//! Data flows one way (see `cache.rs` for the picture): a read asks the [`catalog`]; a
//! miss goes to the [`fetch`] owner, which asks the chain of [`suppliers`] and hands what
//! it got to the [`admission`] sink.
//!
//! - [`store`]: RocksDB layout: shard pages with CRC32C in one ingested SST file per
//!   chunk (written once, never compacted), shard records;
//! - [`entry`]: one cached shard version, its present chunks and write locks;
//! - [`catalog`]: which shard versions are cached, their records, LRU order;
//! - [`lookup`]: entries checked with the hubs, one `StatShard` per shard at a time;
//!   [`revalidation`]: cached data stays served when the hub cannot answer;
//! - [`fetch`]: the fetch owner: coalesced fetches, bounds on what is in flight, bytes
//!   counted by supplier; reads alongside a first stat;
//! - [`suppliers`]: the chain: peers ranked before this spoke, peers holding a chunk,
//!   hubs, asked with hedging ([`suppliers::peers`], [`suppliers::hubs`]);
//! - [`admission`]: chunks into the store, shards out of it, the capacity in step; and
//!   samples kept for a later epoch ([`kept`]: which, and where), many to a pack;
//! - [`capacity`]: bytes against the watermarks; [`evict`]: the evictor;
//! - [`plan`]: jobs' access plans and the eviction order they give (Belady);
//! - [`samples`]: plans followed sample by sample (orders whose blocks do not fit the
//!   cache): their next samples fetched ahead in batches and held until read;
//! - [`plan_fetch`]: prefetch that follows the plans, never evicting a nearer read;
//! - [`cache`]: the facade over the parts; [`cold_open`]: a shard's entry, a first
//!   read's chunks alongside its stat; [`read_path`]: stored, fetched or fetched-as-read
//!   parts; [`read_ahead`]: which misses are stored, read-ahead and whole-shard fetches;
//!   [`index_reads`]: a format's index reads kept in memory;
//! - [`source`]: the cache as the shared read service's source (the hub's API);
//! - [`control`]: prefetch, status, evict, pin, plans;
//! - [`metrics`]: counters and histograms, Prometheus text; [`jobs`]: per job and epoch;
//! - [`server`]: assembly and graceful shutdown; [`config`]: flags;
//!   [`shared`]: work shared by concurrent callers;
//! - `testing` (unit tests only): the parts over a real store with a fake supplier.

pub mod admission;
pub mod cache;
pub mod capacity;
pub mod catalog;
pub mod cold_open;
pub mod config;
pub mod control;
pub mod entry;
pub mod error;
pub mod evict;
pub mod fetch;
pub mod index_reads;
pub mod job_table;
pub mod jobs;
pub mod kept;
pub mod lookup;
pub mod metrics;
pub mod plan;
pub mod plan_fetch;
pub mod policy;
pub mod read_ahead;
pub mod read_path;
pub mod revalidation;
pub mod samples;
pub mod server;
pub mod shared;
pub mod source;
pub mod store;
pub mod suppliers;
#[cfg(test)]
pub mod testing;

pub use error::{Error, Result};
pub use server::{PeerGroup, SpokeOptions, open_cache, serve};
