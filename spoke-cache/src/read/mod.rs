//! Where a read is answered from: the read path (`path/`: stored parts from the store,
//! missing chunks from the fetch owner, parts fetched as read, samples the plans hold),
//! the cold open of a shard no one has read (`cold_open.rs`), what the cache bets on
//! beyond a read (`ahead.rs`: which misses are stored, read-ahead, whole-shard fetches)
//! and a format's index reads held in memory (`index_reads.rs`).
//!
//! Owns: the answer to one call. May import `plans`, `fetch`, `store`, `policy`,
//! `observe`; never the facade (`cache`) or the services (`serve`).

pub mod ahead;
pub mod cold_open;
pub mod index_reads;
pub mod path;
