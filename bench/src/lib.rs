//! shardcache's benchmarks and the seed demo, on the end-to-end test harness
//! (`shardcache_tests`: real hubs, spokes and WAN emulators, in-process or as processes).
//!
//! - `src/bin/`: `hub-bench`, `store-bench`, `spoke-bench`, `wan-bench`, `soak-bench`
//!   (tables recorded in BENCHMARKS.md) and `seed-demo` (`make demo`);
//! - [`formats`]: datasets in the formats the SDK reads (Megatron, .npy, MDS, tar);
//! - [`measure`]: raw TCP references, rates, percentiles, CPU time and peak RSS;
//! - [`orders`]: the orders a data loader reads in (uniform, block shuffles) and a reader
//!   that reads them as the SDK's datasets do, with their plans (`order-bench`);
//! - [`profile`]: CPU profiles (`perf record`) summarised by category;
//! - [`s3`]: S3 clients of the spoke's door and of the peer gateway, versitygw;
//! - [`demo`]: the seed demo's simulated trainer, readers, nginx peer and report.

#![allow(clippy::unwrap_used)] // benchmark support: a failed setup should fail the run loudly

pub mod demo;
pub mod formats;
pub mod measure;
pub mod orders;
pub mod profile;
pub mod s3;
