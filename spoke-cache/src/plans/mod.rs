//! What jobs say they will read, and the work that follows it: shard plans (`shards/`:
//! the plans, each job's cursor, how far each shard's next planned read is, for
//! eviction), the prefetch that follows them (`prefetch.rs`), and plans followed sample
//! by sample (`samples/`: their next samples fetched ahead and held until read, and the
//! samples kept for a later epoch live in `store/kept/`).
//!
//! Owns: the plans and what they fetch ahead. May import `fetch`, `store`, `policy`,
//! `observe`; never `read`, the facade or the services.

pub mod prefetch;
pub mod samples;
pub mod shards;
