//! Errors of the spoke cache and the one place that picks their gRPC status codes.
//!
//! Errors are `Clone`: one upstream fetch is shared by every reader waiting on the same
//! chunk, and each of them gets the fetch's error.

use shardcache_reader::ReadError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Bad names and ranges, versions that changed, page tokens: the read service's
    /// own words, shared with the hub.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The hub answered with an error status; passed on with its code.
    #[error("hub {hub}: {message}")]
    Hub { hub: String, code: tonic::Code, message: String },
    /// No hub could be reached, and the bytes are not cached.
    #[error("hub {hub} is unreachable and the data is not cached: {message}")]
    HubUnavailable { hub: String, message: String },
    /// The hub refused the spoke's own credentials: a misconfigured spoke, not the
    /// client's fault, so the client sees UNAVAILABLE rather than the hub's code.
    #[error(
        "hub {hub} refused this spoke's credentials ({message}); check the spoke's --hub-token-file \
         or --hub-cert"
    )]
    HubRefused { hub: String, message: String },
    /// The hub sent bytes that failed verification (checksum, offsets).
    #[error("hub {hub} sent data that failed verification: {message}")]
    HubCorrupt { hub: String, message: String },
    /// A member of the spoke's group could not supply a chunk (the next supplier is
    /// asked; a client sees this only if no hub follows).
    #[error("group member {peer}: {message}")]
    Peer { peer: String, message: String },
    #[error("cache storage failed while {what}: {message}")]
    Store { what: String, message: String },
    /// Storage found its own files damaged (RocksDB's `Corruption` status): the cache
    /// can be rebuilt from the hub.
    #[error("cache files are damaged ({what}): {message}")]
    Damaged { what: String, message: String },
    /// Pinning would keep more of the cache than it may hold below its high watermark.
    #[error(
        "pinning {requested} more bytes would pin {would_pin} bytes, over the {limit} bytes the cache \
         may hold (--capacity x its high watermark); unpin or evict first, or raise --capacity"
    )]
    PinLimit { requested: u64, would_pin: u64, limit: u64 },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("gRPC server failed: {0}")]
    Transport(String),
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

shardcache_reader::from_read_errors!(Error);

impl Error {
    /// Storage reported damaged files (as opposed to, say, a permission problem or a
    /// bad option): decided by RocksDB's status code, never by its message's text.
    pub fn is_damage(&self) -> bool {
        matches!(self, Error::Damaged { .. })
    }

    /// Storage failed for lack of space (ENOSPC). By its message: RocksDB's Rust binding
    /// gives the status code (IOError) but not its NoSpace subcode, and the message is
    /// the OS's `strerror(ENOSPC)`.
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::Store { message, .. } if message.contains("No space left on device"))
    }

    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::Read(e) => e.code(),
            Error::PinLimit { .. } => Code::ResourceExhausted,
            Error::Hub { code, .. } => *code,
            Error::HubUnavailable { .. }
            | Error::HubRefused { .. }
            | Error::HubCorrupt { .. }
            | Error::Peer { .. } => Code::Unavailable,
            Error::Store { .. }
            | Error::Damaged { .. }
            | Error::Config(_)
            | Error::Transport(_)
            | Error::Internal(_) => Code::Internal,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        let code = err.code();
        let message = match err {
            // The hub's own words: a client cannot tell a spoke from a hub by its errors.
            Error::Hub { message, .. } => message,
            other => other.to_string(),
        };
        shardcache_reader::status(code, message)
    }
}
