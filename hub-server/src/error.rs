//! Everything that can go wrong serving a read, and the one place that picks the gRPC
//! status code for each.

use shardcache_reader::ReadError;

/// Errors of the hub's sources and services.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad names and ranges, versions that changed, page tokens: the read service's
    /// own words, shared with the spoke.
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("dataset {dataset:?} not found")]
    DatasetNotFound { dataset: String },
    #[error("shard {shard:?} not found in dataset {dataset:?}")]
    ShardNotFound { dataset: String, shard: String },
    #[error("shard {shard:?} in dataset {dataset:?} is not a regular file")]
    NotAFile { dataset: String, shard: String },
    #[error("{what} resolves outside the served root (a symlink leading out of it); it is not served")]
    OutsideRoot { what: String },
    #[error(
        "{what} resolves outside its dataset {dataset:?} (a symlink leading out of it); it is not served: \
         a grant for one dataset must not read another"
    )]
    OutsideDataset { what: String, dataset: String },
    /// The source refused the hub's own credentials (S3 AccessDenied, a bad key).
    #[error("{store} refused the hub: {message}")]
    SourceDenied { store: String, message: String },
    /// The source cannot be used now (throttled past the retries, down, no bucket).
    #[error("{store} is unavailable: {message}")]
    SourceUnavailable { store: String, message: String },
    #[error("cannot read {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Serve(#[from] shardcache_serving::server::ServeError),
    #[error("invalid configuration: {0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

shardcache_reader::from_read_errors!(Error);

impl Error {
    /// The shard is no longer at the version it was opened at (`found` says what it is).
    pub fn version_changed(dataset: &str, shard: &str, expected: &str, found: impl Into<String>) -> Self {
        Error::Read(ReadError::VersionChanged {
            dataset: dataset.to_owned(),
            shard: shard.to_owned(),
            expected: expected.to_owned(),
            found: found.into(),
        })
    }

    /// An I/O error while working on `what` (a dataset or `dataset/shard`, never a host path).
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { what: what.into(), source }
    }
}

impl Error {
    /// The gRPC code a client gets for it.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::Read(e) => e.code(),
            Error::OutsideRoot { .. } | Error::OutsideDataset { .. } => Code::InvalidArgument,
            Error::DatasetNotFound { .. } | Error::ShardNotFound { .. } | Error::NotAFile { .. } => {
                Code::NotFound
            }
            Error::SourceDenied { .. } => Code::PermissionDenied,
            Error::SourceUnavailable { .. } => Code::Unavailable,
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
                Code::PermissionDenied
            }
            Error::Io { .. } | Error::Internal(_) | Error::Serve(_) | Error::Config(_) => Code::Internal,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        shardcache_reader::status(err.code(), err.to_string())
    }
}
