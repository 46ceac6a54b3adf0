//! The errors the read service finds on its own, whatever the source: a bad name or
//! range, a version that is not the one the client holds, a page token it did not issue.
//! A source's error type converts from [`ReadError`] (so the service can return it) and
//! into a `Status` (so the client gets a code); sources raise `VersionChanged` with these
//! same words.

use shardcache_proto::{names::NameError, range::RangeError};
use tonic::{Code, Status};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Range(#[from] RangeError),
    #[error(
        "shard {shard:?} in dataset {dataset:?} is at version {found}, not {expected}: it changed \
         since it was stat'ed or while it was read; stat it again and restart the read"
    )]
    VersionChanged { dataset: String, shard: String, expected: String, found: String },
    #[error("page token {token:?} is not one this server issued; start listing again without a token")]
    BadPageToken { token: String },
}

impl ReadError {
    /// The gRPC code a client gets for it.
    pub fn code(&self) -> Code {
        match self {
            ReadError::Name(_) | ReadError::Range(_) | ReadError::BadPageToken { .. } => {
                Code::InvalidArgument
            }
            ReadError::VersionChanged { .. } => Code::Aborted,
        }
    }
}

impl From<ReadError> for Status {
    fn from(err: ReadError) -> Self {
        status(err.code(), err.to_string())
    }
}

/// The status a server answers with: `code` and `message`, which is logged as an error
/// when the code is INTERNAL (a fault of the server's, not the client's). The one place
/// both servers' error conversions end.
pub fn status(code: Code, message: String) -> Status {
    if code == Code::Internal {
        tracing::error!(error = %message, "internal error");
    }
    Status::new(code, message)
}

/// Implements `From<NameError>` and `From<RangeError>` for a server's error type whose
/// `Read` variant holds a [`ReadError`]: a bad name or range found by the server's own
/// code reads as the read service's.
#[macro_export]
macro_rules! from_read_errors {
    ($error:ty) => {
        impl From<shardcache_proto::names::NameError> for $error {
            fn from(err: shardcache_proto::names::NameError) -> Self {
                Self::Read(err.into())
            }
        }

        impl From<shardcache_proto::range::RangeError> for $error {
            fn from(err: shardcache_proto::range::RangeError) -> Self {
                Self::Read(err.into())
            }
        }
    };
}
