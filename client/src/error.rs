//! Errors of the client SDK. Every byte the SDK hands out has been verified; anything
//! that could not be verified is one of these.

use shardcache_proto::checksum::ChecksumMismatch;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid endpoint {endpoint:?}: {source}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{endpoint} answered {:?}: {}", status.code(), status.message())]
    Status { endpoint: String, status: tonic::Status },
    /// The bytes do not match their CRC32C: corrupted on the way. Never returned as data.
    #[error("corrupt data from {endpoint}: {source}")]
    Checksum {
        endpoint: String,
        #[source]
        source: ChecksumMismatch,
    },
    /// The server answered something other than what was asked (wrong offset, length,
    /// number of chunks, a stream that ended early).
    #[error("{endpoint} broke the protocol: {detail}")]
    Protocol { endpoint: String, detail: String },
    /// The shard changed between two messages of one read.
    #[error("shard {shard:?} changed during the read: version {expected} then {found}; read it again")]
    VersionChanged { shard: String, expected: String, found: String },
}

impl Error {
    /// The gRPC status code, when the server answered with an error status.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Status { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
