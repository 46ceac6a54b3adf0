//! shardcache spoke: a read-through cache of hub shards in RocksDB on local disk,
//! serving the hub's read API (`shardcache.v1.ShardReader`) plus cache control.
//!
//! - [`store`]: RocksDB layout: shard pages with CRC32C in one ingested SST file per
//!   chunk (written once, never compacted), shard records;
//! - [`cache`]: the cached source's parts put together: entries, revalidation, reads,
//!   admission and removal of chunks;
//! - [`index`]: which shard versions are cached, their records, LRU order;
//! - [`entry`]: one cached shard version, its present chunks and write locks;
//! - [`fetch`]: upstream fetches, request coalescing, bounds on what is in flight;
//! - [`upstream`]: the hubs, through the verifying client SDK;
//! - [`peers`]: the spoke's group: chunks from the members ranked before it;
//! - [`evict`]: capacity, watermarks, the evictor;
//! - [`plan`]: jobs' access plans and the eviction order they give (Belady);
//! - [`plan_fetch`]: prefetch that follows the plans, never evicting a nearer read;
//! - [`revalidation`]: cached data stays served when the hub cannot answer; backoff;
//! - [`source`]: the cache as the shared read service's source (the hub's API);
//! - [`control`]: prefetch, status, evict, pin;
//! - [`metrics`]: counters and histograms, Prometheus text; [`jobs`]: per job and epoch;
//! - [`server`]: assembly and graceful shutdown; [`config`]: flags.

pub mod cache;
pub mod config;
pub mod control;
pub mod entry;
pub mod error;
pub mod evict;
pub mod fetch;
pub mod index;
pub mod jobs;
pub mod metrics;
pub mod peers;
pub mod plan;
pub mod plan_fetch;
pub mod revalidation;
pub mod server;
pub mod source;
pub mod store;
pub mod upstream;

pub use error::{Error, Result};
pub use server::{PeerGroup, SpokeOptions, open_cache, serve};
