//! Errors of the client SDK. Every byte the SDK hands out has been verified; anything
//! that could not be verified is one of these.

use shardcache_proto::checksum::ChecksumMismatch;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Settings that cannot work (TLS files, a token), with what to change.
    #[error("{0}")]
    Config(String),
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
    /// The server's status, or tonic's for a connection that failed under a request
    /// (then the cause, e.g. a TLS alert or a reset, follows in parentheses).
    #[error("{endpoint} answered {:?}: {}{}", status.code(), status.message(), causes(status))]
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

/// The source chain of a status (set for transport failures), as ` (a: b)`.
fn causes(status: &tonic::Status) -> String {
    let mut chain = Vec::new();
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        chain.push(cause.to_string());
        source = cause.source();
    }
    if chain.is_empty() { String::new() } else { format!(" ({})", chain.join(": ")) }
}

impl Error {
    /// The gRPC status code: the server's, when it answered with an error status;
    /// ABORTED when the SDK itself saw a version change (what a server says for one).
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Status { status, .. } => Some(status.code()),
            Error::VersionChanged { .. } => Some(tonic::Code::Aborted),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
