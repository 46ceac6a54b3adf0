//! The errors the read service finds on its own, whatever the source: a bad name or
//! range, a version that is not the one the client holds, a page token it did not issue.
//! A source's error type converts from [`ReadError`] (so the service can return it) and
//! into a `Status` (so the client gets a code); sources raise `VersionChanged` with these
//! same words.

use shardcache_proto::{names::NameError, range::RangeError};
use tonic::Status;

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

impl From<ReadError> for Status {
    fn from(err: ReadError) -> Self {
        match err {
            ReadError::Name(e) => e.into(),
            ReadError::Range(e) => e.into(),
            e @ ReadError::VersionChanged { .. } => Status::aborted(e.to_string()),
            e @ ReadError::BadPageToken { .. } => Status::invalid_argument(e.to_string()),
        }
    }
}
