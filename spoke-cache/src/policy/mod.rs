//! The cache's policies, each a part with no I/O of its own, so that it is tested alone
//! over traces (`simulate.rs`, against Belady's optimum) and used by the read path and
//! the evictor as it is tested:
//!
//! - [`admit`]: which missed chunks are stored, and which are fetched as read;
//! - [`evict`]: the order in which the cache gives up what it holds (plan distance,
//!   tenant shares, packs of kept samples, recency), for the evictor and the simulator;
//! - [`frequency`]: how much of each chunk has been read lately (the filter's sketch);
//! - [`keep`]: the keep rule, what the cache holds on to (shards by their next planned
//!   read, samples read again first come up to a limit), which eviction orders by;
//! - [`shares`]: each tenant's share of the capacity, which eviction keeps;
//! - [`window`]: how many bytes the plans fetch ahead of the reads (shards and samples);
//! - [`speculation`]: read-ahead and whole-shard fetches, sized by what they brought that
//!   was read;
//! - [`simulate`]: the model of the cache these run in, the traces, Belady's MIN (over
//!   chunks, and over samples).
//!
//! Owns: decisions, never I/O: each is a pure function or a small state machine fed by
//! its caller. May import nothing else of the spoke: `store`, `fetch`, `plans` and
//! `read` call it, never the other way.

pub mod admit;
pub mod evict;
pub mod frequency;
pub mod keep;
pub mod shares;
pub mod simulate;
pub mod speculation;
pub mod window;
