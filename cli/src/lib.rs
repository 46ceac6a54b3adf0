//! What the `shardcache` command line needs beyond the SDK (`shardcache-client`), as a
//! library so that tests and benchmarks use the same code:
//!
//! - [`certs`]: a development CA and certificates for hubs, spokes and clients
//!   (`shardcache certs`);
//! - [`dataset_gen`]: the synthetic tokenised dataset generator (`shardcache gen`);
//! - [`mount`]: the read-only POSIX mount (`shardcache mount`, FUSE);
//! - [`timeline`]: a job's timeline as a PNG (`shardcache report JOB --png FILE`).

pub mod certs;
pub mod dataset_gen;
pub mod mount;
pub mod timeline;
