//! Who a read is for: the job and epoch it belongs to (the SDK's datasets send
//! `shardcache-job` and `shardcache-epoch` request headers, see [`JobTag`]; a source
//! that reports per job, the spoke, counts the read and what it fetched under them), and
//! the members of a group its client already asked (`shardcache-avoid`: a spoke does not
//! ask them again for what it lacks).

use tonic::{Request, Status};

pub use shardcache_proto::job_headers::{
    EPOCH_HEADER, INDEX_READ_HEADER, JOB_HEADER, MAX_JOB_NAME, check_job_name,
};
use shardcache_proto::{
    encoding,
    hedge::{AVOID_HEADER, RELAYED_HEADER, parse_avoided},
};
use shardcache_serving::auth::Grant;

/// What a read request says about itself beyond what it reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadContext {
    /// The job and epoch it reads for, when it names one.
    pub job: Option<JobTag>,
    /// Group members its client asked before (a hedge or a failover).
    pub avoid: Vec<String>,
    /// Who sent it ([`Grant::principal`]): the job it names is that principal's job.
    pub principal: String,
    /// A read of a format's index (`INDEX_READ_HEADER`): nothing to read ahead for.
    pub index_read: bool,
    /// The reader decodes zstd (`shardcache_proto::encoding::ACCEPT_ENCODING_HEADER`).
    pub accepts_zstd: bool,
    /// Set by the source when what it answered came from the owner a hedge joined: the
    /// answer says so (`shardcache_proto::hedge::RELAYED_HEADER`).
    pub relayed: Relayed,
}

/// Whether a read's answer came, relayed, from the member its client asked first
/// (shared by the request and the source that reads for it).
#[derive(Debug, Clone, Default)]
pub struct Relayed(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Relayed {
    /// Some of the answer came from the owner the client asked first.
    pub fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `response`, with `RELAYED_HEADER` when it is set.
    pub fn mark<T>(&self, mut response: tonic::Response<T>) -> tonic::Response<T> {
        if self.is_set() {
            response.metadata_mut().insert(RELAYED_HEADER, tonic::metadata::MetadataValue::from_static("1"));
        }
        response
    }
}

/// Two contexts are alike whatever their answers relayed.
impl PartialEq for Relayed {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Relayed {}

impl ReadContext {
    /// The context `request`'s headers carry (a malformed job header is refused).
    pub fn of<T>(request: &Request<T>) -> Result<Self, Status> {
        let avoid = request.metadata().get(AVOID_HEADER).and_then(|v| v.to_str().ok()).map(parse_avoided);
        let principal = Grant::of(request).map(|grant| grant.principal().to_owned()).unwrap_or_default();
        let index_read = request.metadata().get(INDEX_READ_HEADER).is_some();
        let accepts_zstd = request
            .metadata()
            .get(encoding::ACCEPT_ENCODING_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(encoding::accepts_zstd);
        Ok(Self {
            job: JobTag::of(request)?,
            avoid: avoid.unwrap_or_default(),
            principal,
            index_read,
            accepts_zstd,
            relayed: Relayed::default(),
        })
    }
}

/// The job and epoch a request says it reads for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobTag {
    pub job: String,
    pub epoch: u64,
}

impl JobTag {
    /// The tag `request`'s headers carry; `None` without a job header. A header that is
    /// present but malformed is refused rather than counted under the wrong job.
    pub fn of<T>(request: &Request<T>) -> Result<Option<Self>, Status> {
        let metadata = request.metadata();
        let Some(job) = metadata.get(JOB_HEADER) else { return Ok(None) };
        let job = job
            .to_str()
            .ok()
            .filter(|j| check_job_name(j).is_ok())
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "the {JOB_HEADER} header must be 1 to {MAX_JOB_NAME} printable ASCII characters"
                ))
            })?
            .to_owned();
        let epoch = match metadata.get(EPOCH_HEADER) {
            None => 0,
            Some(value) => value.to_str().ok().and_then(|e| e.parse().ok()).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "the {EPOCH_HEADER} header must be a decimal epoch number, got {value:?}"
                ))
            })?,
        };
        Ok(Some(Self { job, epoch }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(headers: &[(&'static str, &str)]) -> Result<Option<JobTag>, Status> {
        let mut request = Request::new(());
        for (name, value) in headers {
            request.metadata_mut().insert(*name, value.parse().unwrap());
        }
        JobTag::of(&request)
    }

    #[test]
    fn tags_come_from_headers_and_bad_ones_are_refused() {
        assert_eq!(tagged(&[]).unwrap(), None);
        assert_eq!(tagged(&[(JOB_HEADER, "c4:0")]).unwrap(), Some(JobTag { job: "c4:0".into(), epoch: 0 }));
        let tag = tagged(&[(JOB_HEADER, "c4:0"), (EPOCH_HEADER, "3")]).unwrap();
        assert_eq!(tag, Some(JobTag { job: "c4:0".into(), epoch: 3 }));
        let bad = tagged(&[(JOB_HEADER, "c4"), (EPOCH_HEADER, "three")]).unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert!(bad.message().contains("decimal epoch"), "{}", bad.message());
        assert!(tagged(&[(JOB_HEADER, "")]).is_err());
        assert!(check_job_name(&"x".repeat(MAX_JOB_NAME + 1)).is_err());
        assert!(check_job_name("tab\there").is_err());
    }
}
