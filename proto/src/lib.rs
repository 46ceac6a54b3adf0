//! The shardcache wire contract, shared by the hub, the spoke cache and the client SDK.
//!
//! Everything both ends of a connection must agree on lives here, so that the hub and
//! the spoke answer a bad request with the same status and the same words:
//! - [`v1`]: the generated `shardcache.v1` messages, clients and servers;
//! - [`names`]: which dataset and shard names are acceptable, checked before a name
//!   touches a filesystem path or a cache key;
//! - [`range`]: which byte ranges a read may ask for;
//! - [`checksum`]: the CRC32C every data message carries;
//! - [`codec`]: prost's gRPC codec, each message encoded into room reserved for it;
//! - [`encoding`]: compression on the link, negotiated per request, chosen per message;
//! - [`job`]: the job and epoch headers reads carry, and job names;
//! - [`hedge`]: the header of a read sent on to another member of a group;
//! - [`units`]: byte sizes with `KiB/MiB/GiB` suffixes, as flags accept them.
//!
//! How servers and clients carry the contract (TLS, tokens, HTTP/2 tuning, load
//! shedding, server assembly) is `shardcache-serving`'s.

pub mod checksum;
pub mod codec;
pub mod encoding;
pub mod hedge;
pub mod job_headers;
pub mod names;
pub mod range;
pub mod units;

/// Generated code for package `shardcache.v1`.
#[allow(missing_debug_implementations, clippy::all, clippy::too_many_lines)]
pub mod v1 {
    tonic::include_proto!("shardcache.v1");
}

/// Response metadata (a gRPC header) on a listing or stat that the server answered from
/// what it had seen because its own source could not answer (a spoke whose hub is
/// away): it may be out of date, and a listing may miss shards never read through it.
pub const STALE_METADATA: &str = "shardcache-stale";

/// Response metadata (a gRPC header) of a spoke with a same-node door: the door's
/// socket path and the spoke's instance, separated by a space (the last space: a path
/// may hold spaces). A reader that opens that socket and hears the same instance from it
/// reads through it (`shardcache_client::local`; the spoke's `serve/local_door.rs`).
pub const LOCAL_DOOR_HEADER: &str = "shardcache-local-door";

/// Encoded `FileDescriptorSet` of `shardcache.v1`, for gRPC server reflection, so that
/// grpcurl and ghz work against a server without the `.proto` files.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("shardcache_descriptor");
