//! An object's ETag and Last-Modified, and the conditional headers of `GetObject` and
//! `HeadObject` (`If-Match`, `If-None-Match`, `If-Modified-Since`, `If-Unmodified-Since`)
//! evaluated against them as S3 and RFC 9110 do.

use s3s::{
    S3Error, S3ErrorCode, S3Result,
    dto::{self, ETag, ETagCondition, Timestamp},
};

/// The conditional headers of an input that has them.
pub trait Conditional {
    fn conditions(&self) -> Conditions<'_>;
}

/// `GetObject`'s and `HeadObject`'s inputs: the same four fields in each.
macro_rules! conditional {
    ($($input:ty),*) => {$(
        impl Conditional for $input {
            fn conditions(&self) -> Conditions<'_> {
                Conditions {
                    if_match: self.if_match.as_ref(),
                    if_none_match: self.if_none_match.as_ref(),
                    if_modified_since: self.if_modified_since.as_ref(),
                    if_unmodified_since: self.if_unmodified_since.as_ref(),
                }
            }
        }
    )*};
}
conditional!(dto::GetObjectInput, dto::HeadObjectInput);

/// A shard's version as its ETag (stable across spokes and restarts: the hub's). The
/// quotes HTTP puts around it cannot be inside it.
pub fn etag(version: &str) -> ETag {
    ETag::Strong(version.replace('"', ""))
}

/// An object's Last-Modified: when its storage says its bytes last changed (the hub's
/// `modified_ms`), in whole seconds as HTTP dates are; the epoch when it does not say
/// (a hub or a cached record older than the field).
pub fn last_modified(modified_ms: u64) -> Timestamp {
    let seconds = std::time::Duration::from_secs(modified_ms / 1000);
    Timestamp::from(std::time::SystemTime::UNIX_EPOCH + seconds)
}

/// A request's conditional headers, as S3 and RFC 9110 evaluate them.
#[derive(Debug, Default)]
pub struct Conditions<'a> {
    if_match: Option<&'a ETagCondition>,
    if_none_match: Option<&'a ETagCondition>,
    if_modified_since: Option<&'a Timestamp>,
    if_unmodified_since: Option<&'a Timestamp>,
}

impl Conditions<'_> {
    /// Whether the request names any condition.
    pub fn any(&self) -> bool {
        self.if_match.is_some()
            || self.if_none_match.is_some()
            || self.if_modified_since.is_some()
            || self.if_unmodified_since.is_some()
    }

    /// `If-Match` (412 unless the ETag matches; without it, `If-Unmodified-Since`: 412
    /// when modified since) and `If-None-Match` (304 when the ETag matches; without it,
    /// `If-Modified-Since`: 304 unless modified since). A time is compared only where the
    /// hub said when the object changed: an unknown time never answers 304 (a client
    /// would keep bytes that may be old) nor 412.
    pub fn check(&self, etag: &ETag, modified_ms: u64) -> S3Result<()> {
        let matches = |condition: &ETagCondition| match condition {
            ETagCondition::Any => true,
            ETagCondition::ETag(tag) => tag.value() == etag.value(),
        };
        let modified = (modified_ms > 0).then(|| last_modified(modified_ms));
        let modified_after = |since: &Timestamp| modified.as_ref().map(|m| m > since);
        let failed = match self.if_match {
            Some(condition) => !matches(condition),
            None => self.if_unmodified_since.and_then(modified_after).unwrap_or(false),
        };
        if failed {
            return Err(s3s::s3_error!(
                PreconditionFailed,
                "the object's ETag is {:?}, last modified {} ms after the Unix epoch",
                etag.value(),
                modified_ms
            ));
        }
        let not_modified = match self.if_none_match {
            Some(condition) => matches(condition),
            None => self.if_modified_since.and_then(modified_after).is_some_and(|after| !after),
        };
        if not_modified {
            return Err(S3Error::new(S3ErrorCode::NotModified));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_match_and_if_none_match_compare_the_version() {
        let tag = etag("1f-abc");
        let cond = |text: &str| ETagCondition::parse_http_header(text.as_bytes()).unwrap();
        let check = |if_match: Option<&str>, if_none_match: Option<&str>| {
            let (if_match, if_none_match) = (if_match.map(cond), if_none_match.map(cond));
            let conditions = Conditions {
                if_match: if_match.as_ref(),
                if_none_match: if_none_match.as_ref(),
                ..Default::default()
            };
            conditions.check(&tag, 0).map_err(|e| e.code().clone())
        };
        assert!(check(Some("\"1f-abc\""), None).is_ok());
        assert_eq!(check(Some("\"other\""), None).unwrap_err(), S3ErrorCode::PreconditionFailed);
        assert_eq!(check(None, Some("\"1f-abc\"")).unwrap_err(), S3ErrorCode::NotModified);
        assert!(check(None, Some("\"other\"")).is_ok());
        assert_eq!(check(None, Some("*")).unwrap_err(), S3ErrorCode::NotModified);
        assert_eq!(etag("\"quoted\"").value(), "quoted");
    }

    #[test]
    fn modified_since_compares_whole_seconds_and_yields_to_the_etag() {
        let tag = etag("v");
        let at = |secs: u64| Timestamp::from(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
        // Changed at 1000.5 s: HTTP dates say 1000 s.
        let modified_ms = 1_000_500;
        let check = |conditions: Conditions<'_>, modified_ms: u64| {
            conditions.check(&tag, modified_ms).map_err(|e| e.code().clone())
        };
        fn since(t: &Timestamp) -> Conditions<'_> {
            Conditions { if_modified_since: Some(t), ..Default::default() }
        }
        fn unmodified(t: &Timestamp) -> Conditions<'_> {
            Conditions { if_unmodified_since: Some(t), ..Default::default() }
        }
        assert_eq!(check(since(&at(1000)), modified_ms).unwrap_err(), S3ErrorCode::NotModified);
        assert!(check(since(&at(999)), modified_ms).is_ok());
        assert!(check(unmodified(&at(1000)), modified_ms).is_ok());
        assert_eq!(check(unmodified(&at(999)), modified_ms).unwrap_err(), S3ErrorCode::PreconditionFailed);
        // Unknown (0): served, never 304 or 412.
        assert!(check(since(&at(5_000_000_000)), 0).is_ok());
        assert!(check(unmodified(&at(0)), 0).is_ok());
        // An ETag condition decides over its time partner (RFC 9110 13.2.2; S3 alike).
        let (other, same) = (
            ETagCondition::parse_http_header(b"\"other\"").unwrap(),
            ETagCondition::parse_http_header(b"\"v\"").unwrap(),
        );
        let newer = at(2000);
        let none_match_other =
            Conditions { if_none_match: Some(&other), if_modified_since: Some(&newer), ..Default::default() };
        assert!(check(none_match_other, modified_ms).is_ok());
        let older = at(10);
        let match_same =
            Conditions { if_match: Some(&same), if_unmodified_since: Some(&older), ..Default::default() };
        assert!(check(match_same, modified_ms).is_ok());
        assert_eq!(last_modified(modified_ms), at(1000));
    }
}
