//! The S3 operations the door answers, each as the read service's gRPC call it is
//! (`ReadService`, the same instance type the gRPC port serves): the same grants, name
//! rules, limits, hits and misses, fetches, hedges, group routing and per-job counters.
//! Nothing of the cache is bypassed: a `GetObject` is a `StreamShard` pinned to the
//! version its stat found, streamed as the SDK's stream is (a message at a time, so an
//! object of any size holds a few messages of memory).
//!
//! Every operation not here answers `NotImplemented` (s3s' defaults): writes, ACLs,
//! policies, versioning, tagging, lifecycle, SSE.

use std::sync::Arc;

use futures::StreamExt;
use s3s::{
    S3, S3Request, S3Response, S3Result,
    auth::{Credentials, S3Auth, SecretKey},
    dto::{self, StreamingBlob},
};
use shardcache_proto::{
    job_headers::JOB_HEADER,
    names::{DatasetName, ShardName},
    v1::{
        Chunk, ListDatasetsRequest, ListShardsRequest, ShardInfo, StatShardRequest, StreamShardRequest,
        shard_reader_server::ShardReader,
    },
};
use shardcache_reader::ReadService;
use shardcache_serving::{
    auth::{Authenticator, Grant},
    s3_keys::S3KeyBook,
};
use shardcache_transport::reload::Reloading;
use tonic::metadata::MetadataValue;

use super::{
    conditions::{Conditional, etag, last_modified},
    errors::{Subject, bad_bucket, bad_key, s3_error},
    listing::{self, HUB_PAGE, Listed, MAX_KEYS, Query},
};
use crate::serve::source::CachedSource;

/// The HTTP headers an S3 request may name its job and epoch by (the SDK's gRPC
/// headers); without them a signed request reads as the job named by its access key.
const JOB_HEADERS: [&str; 2] = [JOB_HEADER, shardcache_proto::job_headers::EPOCH_HEADER];

/// The read service behind the S3 door, and who may read what through it.
pub struct Objects {
    pub(super) reads: Arc<ReadService<CachedSource>>,
    pub(super) auth: Authenticator,
    /// The S3 keys (`--s3-keys`): requests must be signed with one of them. `None` on an
    /// open spoke, where every request reads everything.
    pub(super) keys: Option<Reloading<S3KeyBook>>,
    /// Requests being answered (a `GetObject` until its body is sent): more are shed.
    pub(super) in_flight: Arc<tokio::sync::Semaphore>,
}

/// Signatures are checked against the keys file's secrets.
pub struct KeyAuth(pub Reloading<S3KeyBook>);

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects").field("signed", &self.keys.is_some()).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for KeyAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyAuth").finish_non_exhaustive()
    }
}

#[tonic::async_trait]
impl S3Auth for KeyAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        if let Some(failure) = self.0.failure() {
            return Err(s3s::s3_error!(
                ServiceUnavailable,
                "the spoke's S3 keys file cannot be used: {failure}"
            ));
        }
        let book = self.0.get();
        // S3's own words (clients and test suites compare them).
        let key = book.get(access_key).ok_or_else(|| {
            s3s::s3_error!(
                InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records."
            )
        })?;
        Ok(SecretKey::from(key.secret.as_str()))
    }
}

impl Objects {
    /// A place among the requests answered at once, or `SlowDown` (S3 clients back off
    /// and retry it).
    fn admit(&self) -> S3Result<tokio::sync::OwnedSemaphorePermit> {
        self.in_flight.clone().try_acquire_owned().map_err(|_| {
            s3s::s3_error!(SlowDown, "the spoke answers {} requests at once; retry", super::MAX_IN_FLIGHT)
        })
    }

    /// What a request signed with `credentials` may read.
    fn grant(&self, credentials: Option<&Credentials>) -> S3Result<Grant> {
        let Some(keys) = &self.keys else { return Ok(Grant::Everything) };
        let credentials = credentials
            .ok_or_else(|| s3s::s3_error!(AccessDenied, "this spoke reads signed requests only"))?;
        let principal = keys
            .get()
            .get(&credentials.access_key)
            .map(|key| key.principal.clone())
            .ok_or_else(|| s3s::s3_error!(InvalidAccessKeyId))?;
        match self.auth.grant_of_principal(&principal) {
            Ok(Some(grant)) => Ok(grant),
            Ok(None) => Err(s3s::s3_error!(
                AccessDenied,
                "access key {} belongs to {principal:?}, who has no line in the spoke's token file",
                credentials.access_key
            )),
            Err(status) => Err(s3_error(&status, Subject::Bucket)),
        }
    }

    /// `message` as a gRPC request of the S3 request `req`: its grant, and its job (a
    /// `shardcache-job` header, or the access key it was signed with).
    fn call<I, T>(&self, req: &S3Request<I>, message: T) -> S3Result<tonic::Request<T>> {
        let grant = self.grant(req.credentials.as_ref())?;
        let mut call = tonic::Request::new(message);
        for name in JOB_HEADERS {
            if let Some(value) = req.headers.get(name) {
                let value =
                    value.to_str().ok().and_then(|v| MetadataValue::try_from(v).ok()).ok_or_else(|| {
                        s3s::s3_error!(InvalidArgument, "the {name} header must be printable ASCII")
                    })?;
                call.metadata_mut().insert(name, value);
            }
        }
        if let Some(credentials) = &req.credentials
            && !call.metadata().contains_key(JOB_HEADER)
            && let Ok(job) = MetadataValue::try_from(credentials.access_key.as_str())
        {
            call.metadata_mut().insert(JOB_HEADER, job);
        }
        call.extensions_mut().insert(grant);
        Ok(call)
    }

    /// The bucket's shard `key`, as the read service states it; a bucket that is not
    /// there is `NoSuchBucket`, a key that is not, `NoSuchKey`.
    async fn stat<I>(&self, req: &S3Request<I>, bucket: &str, key: &str) -> S3Result<ShardInfo> {
        let dataset = DatasetName::new(bucket).map_err(|e| bad_bucket(bucket, &e))?;
        let shard = ShardName::new(key).map_err(|e| bad_key(key, &e))?;
        let stat = StatShardRequest { dataset: dataset.to_string(), shard: shard.to_string() };
        match self.reads.stat_shard(self.call(req, stat)?).await {
            Ok(info) => Ok(info.into_inner()),
            Err(status) if status.code() == tonic::Code::NotFound => {
                self.bucket_exists(req, bucket).await?;
                Err(s3_error(&status, Subject::Object))
            }
            Err(status) => Err(s3_error(&status, Subject::Object)),
        }
    }

    /// The messages of `stream`, read for the S3 request `req`.
    async fn stream<I>(&self, req: &S3Request<I>, stream: StreamShardRequest) -> S3Result<Messages> {
        let messages = self
            .reads
            .stream_shard(self.call(req, stream)?)
            .await
            .map_err(|status| s3_error(&status, Subject::Object))?
            .into_inner();
        Ok(Box::pin(messages))
    }

    /// `NoSuchBucket` (or `AccessDenied`) unless `bucket` is a dataset the request may read.
    async fn bucket_exists<I>(&self, req: &S3Request<I>, bucket: &str) -> S3Result<()> {
        self.page(req, bucket, None, 1).await.map(drop)
    }

    /// One page of the hub's listing of `bucket`: the names after `after`.
    async fn page<I>(
        &self,
        req: &S3Request<I>,
        bucket: &str,
        after: Option<String>,
        size: u32,
    ) -> S3Result<(Vec<Listed>, bool)> {
        DatasetName::new(bucket).map_err(|e| bad_bucket(bucket, &e))?;
        let list = ListShardsRequest {
            dataset: bucket.to_owned(),
            page_size: size,
            page_token: after.unwrap_or_default(),
        };
        let page = self
            .reads
            .list_shards(self.call(req, list)?)
            .await
            .map_err(|status| s3_error(&status, Subject::Bucket))?
            .into_inner();
        let more = !page.next_page_token.is_empty();
        let listed = page
            .shards
            .into_iter()
            .map(|s| Listed { key: s.shard, size: s.size, version: s.version, modified_ms: s.modified_ms })
            .collect();
        Ok((listed, more))
    }

    async fn list<I>(&self, req: &S3Request<I>, bucket: &str, query: &Query) -> S3Result<listing::Page> {
        listing::walk(query, |after| self.page(req, bucket, after, HUB_PAGE)).await
    }
}

/// `max-keys` as asked, at most S3's 1,000.
fn max_keys(asked: Option<i32>) -> usize {
    asked.map_or(MAX_KEYS, |n| usize::try_from(n).unwrap_or(0).min(MAX_KEYS))
}

fn url_encoding(encoding: Option<&dto::EncodingType>) -> impl Fn(String) -> String {
    let encode = encoding.is_some_and(|e| e.as_str() == dto::EncodingType::URL);
    move |text: String| if encode { listing::url_encoded(&text) } else { text }
}

fn objects(
    page: &listing::Page,
    encode: &impl Fn(String) -> String,
) -> (Vec<dto::Object>, Vec<dto::CommonPrefix>) {
    let objects = page
        .objects
        .iter()
        .map(|o| dto::Object {
            key: Some(encode(o.key.clone())),
            size: Some(i64::try_from(o.size).unwrap_or(i64::MAX)),
            e_tag: Some(etag(&o.version)),
            last_modified: Some(last_modified(o.modified_ms)),
            storage_class: Some(dto::ObjectStorageClass::from_static(dto::ObjectStorageClass::STANDARD)),
            ..Default::default()
        })
        .collect();
    let prefixes =
        page.prefixes.iter().map(|p| dto::CommonPrefix { prefix: Some(encode(p.clone())) }).collect();
    (objects, prefixes)
}

/// A `StreamShard`'s messages.
/// (`Sync`, as a body must be).
type Messages = std::pin::Pin<Box<dyn futures::Stream<Item = Result<Chunk, tonic::Status>> + Send + Sync>>;

/// `messages`, a whole object's stream opened alongside its stat, if they are of the
/// version `info` states (its first message says; an empty object has none): the
/// headers the stat gave describe them. `None` (asked again at the stat's version) when
/// the object changed between the two, or the stream failed before its first bytes.
async fn at_version(mut messages: Messages, info: &ShardInfo) -> Option<Messages> {
    match messages.next().await {
        None if info.size == 0 => Some(Box::pin(futures::stream::empty())),
        Some(Ok(first)) if first.version == info.version && first.offset == 0 => {
            Some(Box::pin(futures::stream::once(async { Ok(first) }).chain(messages)))
        }
        _ => None,
    }
}

#[tonic::async_trait]
impl S3 for Objects {
    async fn get_object(
        &self,
        req: S3Request<dto::GetObjectInput>,
    ) -> S3Result<S3Response<dto::GetObjectOutput>> {
        let admitted = self.admit()?;
        let (bucket, key) = (req.input.bucket.clone(), req.input.key.clone());
        // A whole object's stream starts alongside its stat: a spoke that has never seen
        // the shard reads its head with the stat (`ColdOpen`), so a cold GET costs one
        // round trip to the hub before its first byte, not two (MosaicML Streaming's
        // first epoch through the door took 0.63-0.75x versitygw's time with two). Not
        // for a conditional GET: a revalidation answered 304 would read the head for nothing.
        let conditions = req.input.conditions();
        let whole = req.input.range.is_none() && !conditions.any();
        let (info, early) = if whole {
            let stream = StreamShardRequest {
                dataset: bucket.clone(),
                shard: key.clone(),
                offset: 0,
                length: None,
                expected_version: String::new(),
            };
            let (info, stream) = tokio::join!(self.stat(&req, &bucket, &key), self.stream(&req, stream));
            (info?, stream.ok())
        } else {
            (self.stat(&req, &bucket, &key).await?, None)
        };
        let tag = etag(&info.version);
        conditions.check(&tag, info.modified_ms)?;
        let range = match &req.input.range {
            Some(range) => Some(range.check(info.size).map_err(|_| {
                s3s::s3_error!(InvalidRange, "the range is not within the object's {} bytes", info.size)
            })?),
            None => None,
        };
        let (offset, length) = range.as_ref().map_or((0, info.size), |r| (r.start, r.end - r.start));
        let early = match early {
            Some(messages) => at_version(messages, &info).await,
            None => None,
        };
        let messages = match early {
            Some(messages) => messages,
            None => {
                let stream = StreamShardRequest {
                    dataset: bucket,
                    shard: key,
                    offset,
                    length: Some(length),
                    expected_version: info.version.clone(),
                };
                self.stream(&req, stream).await?
            }
        };
        // A read that fails mid-stream ends the body short: the client sees a broken
        // response and reads again, as from S3.
        // The request holds its place until its body is sent.
        let body = messages.map(move |message| {
            let _admitted = &admitted;
            message
                .map(|chunk| chunk.data)
                .map_err(|status| std::io::Error::other(status.message().to_owned()))
        });
        let output = dto::GetObjectOutput {
            body: Some(StreamingBlob::wrap(body)),
            content_length: Some(i64::try_from(length).unwrap_or(i64::MAX)),
            content_range: range
                .map(|r| format!("bytes {}-{}/{}", r.start, r.end.saturating_sub(1), info.size)),
            content_type: Some("application/octet-stream".into()),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(tag),
            last_modified: Some(last_modified(info.modified_ms)),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    async fn head_object(
        &self,
        req: S3Request<dto::HeadObjectInput>,
    ) -> S3Result<S3Response<dto::HeadObjectOutput>> {
        let _admitted = self.admit()?;
        let info = self.stat(&req, &req.input.bucket, &req.input.key).await?;
        let tag = etag(&info.version);
        req.input.conditions().check(&tag, info.modified_ms)?;
        Ok(S3Response::new(dto::HeadObjectOutput {
            content_length: Some(i64::try_from(info.size).unwrap_or(i64::MAX)),
            content_type: Some("application/octet-stream".into()),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(tag),
            last_modified: Some(last_modified(info.modified_ms)),
            ..Default::default()
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<dto::HeadBucketInput>,
    ) -> S3Result<S3Response<dto::HeadBucketOutput>> {
        let _admitted = self.admit()?;
        self.bucket_exists(&req, &req.input.bucket).await?;
        Ok(S3Response::new(dto::HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<dto::GetBucketLocationInput>,
    ) -> S3Result<S3Response<dto::GetBucketLocationOutput>> {
        let _admitted = self.admit()?;
        self.bucket_exists(&req, &req.input.bucket).await?;
        // No constraint: S3's answer for us-east-1, the region clients sign for by default.
        Ok(S3Response::new(dto::GetBucketLocationOutput::default()))
    }

    async fn list_buckets(
        &self,
        req: S3Request<dto::ListBucketsInput>,
    ) -> S3Result<S3Response<dto::ListBucketsOutput>> {
        let _admitted = self.admit()?;
        let datasets = self
            .reads
            .list_datasets(self.call(&req, ListDatasetsRequest::default())?)
            .await
            .map_err(|status| s3_error(&status, Subject::Bucket))?
            .into_inner()
            .datasets;
        let buckets = datasets
            .into_iter()
            .map(|d| dto::Bucket {
                name: Some(d.name),
                // No hub says when a dataset was made.
                creation_date: Some(last_modified(0)),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(dto::ListBucketsOutput { buckets: Some(buckets), ..Default::default() }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<dto::ListObjectsV2Input>,
    ) -> S3Result<S3Response<dto::ListObjectsV2Output>> {
        let _admitted = self.admit()?;
        let input = &req.input;
        let after = match (&input.continuation_token, &input.start_after) {
            (Some(token), _) => Some(listing::entry_of(token)?),
            (None, after) => after.clone().filter(|a| !a.is_empty()),
        };
        let query = Query {
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: input.delimiter.clone().filter(|d| !d.is_empty()),
            after,
            max_keys: max_keys(input.max_keys),
        };
        let page = self.list(&req, &input.bucket, &query).await?;
        let encode = url_encoding(input.encoding_type.as_ref());
        let (contents, common_prefixes) = objects(&page, &encode);
        let key_count = i32::try_from(contents.len() + common_prefixes.len()).unwrap_or(i32::MAX);
        Ok(S3Response::new(dto::ListObjectsV2Output {
            name: Some(input.bucket.clone()),
            prefix: Some(encode(query.prefix.clone())),
            delimiter: query.delimiter.clone().map(&encode),
            max_keys: Some(i32::try_from(query.max_keys).unwrap_or(i32::MAX)),
            key_count: Some(key_count),
            continuation_token: input.continuation_token.clone(),
            start_after: input.start_after.clone().map(&encode),
            is_truncated: Some(page.truncated),
            next_continuation_token: page.last.as_deref().filter(|_| page.truncated).map(listing::token),
            contents: Some(contents),
            common_prefixes: Some(common_prefixes),
            encoding_type: input.encoding_type.clone(),
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<dto::ListObjectsInput>,
    ) -> S3Result<S3Response<dto::ListObjectsOutput>> {
        let _admitted = self.admit()?;
        let input = &req.input;
        let query = Query {
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: input.delimiter.clone().filter(|d| !d.is_empty()),
            after: input.marker.clone().filter(|m| !m.is_empty()),
            max_keys: max_keys(input.max_keys),
        };
        let page = self.list(&req, &input.bucket, &query).await?;
        let encode = url_encoding(input.encoding_type.as_ref());
        let (contents, common_prefixes) = objects(&page, &encode);
        Ok(S3Response::new(dto::ListObjectsOutput {
            name: Some(input.bucket.clone()),
            prefix: Some(encode(query.prefix.clone())),
            delimiter: query.delimiter.clone().map(&encode),
            marker: input.marker.clone().map(&encode),
            max_keys: Some(i32::try_from(query.max_keys).unwrap_or(i32::MAX)),
            is_truncated: Some(page.truncated),
            // v1 clients go on after the last key, or this marker where the last entry
            // was a folder.
            next_marker: page.last.clone().filter(|_| page.truncated).map(&encode),
            contents: Some(contents),
            common_prefixes: Some(common_prefixes),
            encoding_type: input.encoding_type.clone(),
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_keys_is_at_most_a_thousand() {
        assert_eq!(max_keys(None), 1000);
        assert_eq!(max_keys(Some(1_000_000_000)), 1000);
        assert_eq!(max_keys(Some(-5)), 0);
        assert_eq!(max_keys(Some(7)), 7);
    }
}
