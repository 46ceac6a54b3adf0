//! The read service's gRPC statuses as S3's errors, so that S3 clients retry what S3
//! would have them retry (`SlowDown`, `ServiceUnavailable`, `InternalError`) and give up
//! on the rest with S3's own codes.

use s3s::{S3Error, S3ErrorCode};
use shardcache_proto::names::NameError;
use tonic::{Code, Status};

/// What was being read, for the code a `NOT_FOUND` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Bucket,
    Object,
}

/// `status` (from the read service, for `subject`) as S3's error.
pub fn s3_error(status: &Status, subject: Subject) -> S3Error {
    let code = match status.code() {
        Code::NotFound => match subject {
            Subject::Bucket => S3ErrorCode::NoSuchBucket,
            Subject::Object => S3ErrorCode::NoSuchKey,
        },
        Code::PermissionDenied | Code::Unauthenticated => S3ErrorCode::AccessDenied,
        Code::InvalidArgument => S3ErrorCode::InvalidArgument,
        Code::OutOfRange => S3ErrorCode::InvalidRange,
        // The version a request was pinned to changed under it (between its stat and its
        // bytes): the client reads again, as after S3's 412.
        Code::FailedPrecondition | Code::Aborted => S3ErrorCode::PreconditionFailed,
        // Shed or over a limit: S3 clients back off and retry on SlowDown.
        Code::ResourceExhausted => S3ErrorCode::SlowDown,
        Code::Unavailable | Code::DeadlineExceeded => S3ErrorCode::ServiceUnavailable,
        _ => S3ErrorCode::InternalError,
    };
    S3Error::with_message(code, status.message().to_owned())
}

/// A key that is not a shard name: one the hub hides (a leading `.`) is absent, as it
/// is from listings; any other (`..`, a NUL, a backslash, too long) is refused, naming
/// the rule.
pub fn bad_key(key: &str, err: &NameError) -> S3Error {
    match err {
        NameError::Hidden { .. } => S3Error::with_message(
            S3ErrorCode::NoSuchKey,
            format!("no key {key:?}: keys with a component starting with '.' are not served"),
        ),
        _ => S3Error::with_message(S3ErrorCode::InvalidArgument, format!("key {key:?}: {err}")),
    }
}

/// A bucket that is not a dataset name.
pub fn bad_bucket(bucket: &str, err: &NameError) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidBucketName, format!("bucket {bucket:?}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_become_the_s3_codes_clients_retry_or_give_up_on() {
        let code = |status: Status, subject| s3_error(&status, subject).code().clone();
        assert_eq!(code(Status::not_found("x"), Subject::Object), S3ErrorCode::NoSuchKey);
        assert_eq!(code(Status::not_found("x"), Subject::Bucket), S3ErrorCode::NoSuchBucket);
        assert_eq!(code(Status::permission_denied("x"), Subject::Object), S3ErrorCode::AccessDenied);
        assert_eq!(code(Status::resource_exhausted("x"), Subject::Object), S3ErrorCode::SlowDown);
        assert_eq!(code(Status::unavailable("x"), Subject::Object), S3ErrorCode::ServiceUnavailable);
        assert_eq!(code(Status::out_of_range("x"), Subject::Object), S3ErrorCode::InvalidRange);
        let err = s3_error(&Status::invalid_argument("past the end"), Subject::Object);
        assert_eq!(err.message(), Some("past the end"));
        let hidden = shardcache_proto::names::ShardName::new("a/.hidden").unwrap_err();
        assert_eq!(bad_key("a/.hidden", &hidden).code(), &S3ErrorCode::NoSuchKey);
        let parent = shardcache_proto::names::ShardName::new("a/../b").unwrap_err();
        assert_eq!(bad_key("a/../b", &parent).code(), &S3ErrorCode::InvalidArgument);
    }
}
