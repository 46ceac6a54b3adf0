//! The `shardcache.v1.ShardReader` service, written once.
//!
//! The hub and the spoke answer the same API with the same statuses and the same words,
//! by construction: both serve a [`ReadService`] over a [`Source`]. The hub's sources
//! are storage (a local directory, an S3 prefix); the spoke's is its cache, which reads
//! through to the hub. The service owns everything that is about the API rather than
//! about where bytes come from:
//!
//! - [`source`]: the [`Source`] and [`ShardHandle`] traits and what they return;
//! - [`service`]: validation of names and ranges, grants, read limits, paging,
//!   `ReadRanges` and `StreamShard` shaping, a CRC32C and version on every data message;
//! - [`job`]: the job and epoch a read says it is for ([`JobTag`], from request headers);
//! - [`error`]: the errors the service itself finds ([`ReadError`]) and their statuses.

pub mod error;
pub mod read_context;
pub mod service;
pub mod source;

pub use error::{ReadError, status};
pub use read_context::{JobTag, ReadContext, Relayed};
pub use service::{Observer, ReadLimits, ReadService};
pub use source::{DatasetListing, STALE_METADATA, ShardHandle, ShardMeta, ShardPage, ShardStat, Source};
