//! An S3 bucket (or any S3-compatible store) as a source: `s3://bucket/prefix`, each
//! first-level "folder" under the prefix is a dataset, each object below it a shard.
//!
//! - Versions are ETags. Every ranged GET sends `If-Match` with the ETag the shard was
//!   opened at, so an object replaced mid-read answers 412 and the read fails with
//!   `VersionChanged` (ABORTED): never bytes of two versions.
//! - Reads larger than [`PART_SIZE`] are split into ranged GETs run [`READ_PARALLELISM`]
//!   at a time (one GET stream from S3 gives ~50-100 MB/s; several fill the NIC).
//!   `StreamShard` keeps the same number of chunk reads in flight
//!   ([`Storage::READ_PARALLELISM`]), so memory per stream stays a few chunks.
//! - Listings are paginated and cached for [`LISTING_TTL`]: `ListDatasets` lists every
//!   dataset's shards, and a spoke's prefetch plan asks for them right after.
//! - Credentials and region come from `aws-config`'s default chain (environment, profile,
//!   SSO, web identity, IMDS); `--s3-endpoint` and path-style addressing serve
//!   S3-compatible stores (MinIO, Ceph, moto).
//! - Errors: NoSuchKey -> NOT_FOUND; AccessDenied and bad credentials -> PERMISSION_DENIED
//!   naming the bucket; throttling and 5xx are retried by the SDK with backoff
//!   ([`MAX_ATTEMPTS`]), then UNAVAILABLE.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aws_sdk_s3::{
    Client,
    config::{BehaviorVersion, Credentials, Region, retry::RetryConfig, timeout::TimeoutConfig},
    error::{ProvideErrorMetadata, SdkError},
};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use shardcache_proto::{
    checksum::Checked,
    names::{DATASET_META_FILE, DatasetName, ShardName},
};

use shardcache_reader::ReadError;

use super::{DatasetMeta, ShardHandle, ShardMeta, Storage};
use crate::{Error, Result};

/// Largest single ranged GET. AWS's guidance for parallel GETs is 8-16 MB parts: large
/// enough that the request cost (~20-50 ms first byte) is amortised.
pub const PART_SIZE: u64 = 8 << 20;

/// Ranged GETs in flight for one large read, and chunk reads in flight for one stream.
pub const READ_PARALLELISM: usize = 4;

/// How long a listing is reused. Short: a new shard shows up within seconds, while a
/// burst of `ListDatasets`/`ListShards`/prefetch plans costs one listing.
pub const LISTING_TTL: Duration = Duration::from_secs(5);

/// Attempts per S3 request (the SDK's standard retry mode: exponential backoff with
/// jitter, throttling-aware); the SDK's default of 3 gives up on a short SlowDown burst.
pub const MAX_ATTEMPTS: u32 = 5;

/// Where the data is: `s3://bucket/prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    /// Empty, or ends with `/`.
    pub prefix: String,
}

impl S3Location {
    /// Parses `s3://bucket[/prefix]`.
    pub fn parse(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| Error::Config(format!("{url:?} is not an s3://bucket/prefix URL")))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::Config(format!("{url:?} names no bucket")));
        }
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
        Ok(Self { bucket: bucket.to_owned(), prefix })
    }

    fn url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

/// How to reach the store (flags `--s3-endpoint`, `--s3-region`, `--s3-path-style`).
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// An S3-compatible endpoint (e.g. `http://127.0.0.1:9000`); AWS when `None`.
    pub endpoint: Option<String>,
    /// Region; the default chain's (AWS_REGION, profile), else `us-east-1`.
    pub region: Option<String>,
    /// `http://endpoint/bucket/key` instead of `http://bucket.endpoint/key`.
    pub path_style: bool,
    /// Fixed credentials (tests); the default chain when `None`.
    pub static_credentials: Option<(String, String)>,
}

/// One dataset as last listed: its shards and its record size (from `.shardcache.json`).
#[derive(Debug)]
struct Listing {
    at: Instant,
    shards: Arc<Vec<ShardMeta>>,
    record_size: u32,
}

/// Listings by dataset.
type Listings = HashMap<String, Arc<Listing>>;

/// Serves the datasets under one S3 prefix.
#[derive(Debug)]
pub struct S3Source {
    client: Client,
    location: S3Location,
    listings: Mutex<Listings>,
}

/// A shard opened at one ETag; cheap to clone.
#[derive(Debug, Clone)]
pub struct S3Shard(Arc<OpenObject>);

#[derive(Debug)]
struct OpenObject {
    client: Client,
    bucket: String,
    key: String,
    dataset: String,
    meta: ShardMeta,
}

/// An S3 client for `options`: rustls on ring, standard retries, bounded timeouts.
pub async fn client(options: &S3Options) -> Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(Duration::from_secs(60))
                .build(),
        );
    if let Some(region) = &options.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some((id, secret)) = &options.static_credentials {
        loader = loader.credentials_provider(Credentials::new(id, secret, None, None, "static"));
    }
    let shared = loader.load().await;
    let mut config = aws_sdk_s3::config::Builder::from(&shared).force_path_style(options.path_style);
    if shared.region().is_none() {
        config = config.region(Region::new("us-east-1"));
    }
    if let Some(endpoint) = &options.endpoint {
        config = config.endpoint_url(endpoint);
    }
    Client::from_conf(config.build())
}

impl S3Source {
    /// Builds the client and checks that the bucket can be listed with these
    /// credentials, so a wrong bucket or key fails at start, not on the first read.
    pub async fn connect(location: S3Location, options: &S3Options) -> Result<Self> {
        let source = Self { client: client(options).await, location, listings: Mutex::default() };
        source
            .client
            .list_objects_v2()
            .bucket(&source.location.bucket)
            .prefix(&source.location.prefix)
            .max_keys(1)
            .send()
            .await
            .map_err(|e| {
                let url = source.location.url();
                classify(&source.location.bucket, e, &url, || Error::SourceUnavailable {
                    store: url.clone(),
                    message: "the endpoint answered 404 Not Found to a bucket listing: is it an S3 server \
                              (--s3-endpoint), and does the bucket exist?"
                        .into(),
                })
            })?;
        Ok(source)
    }

    pub fn location(&self) -> &S3Location {
        &self.location
    }

    fn dataset_prefix(&self, dataset: &str) -> String {
        format!("{}{dataset}/", self.location.prefix)
    }

    /// Maps an S3 error about `what` (a dataset, a shard, the prefix).
    fn error<E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static>(
        &self,
        err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
        what: &str,
    ) -> Error {
        classify(&self.location.bucket, err, what, || Error::DatasetNotFound { dataset: what.to_owned() })
    }

    /// `dataset`'s shards and record size, from the cache when fresh: StatShard and
    /// ListDatasets ask for the record size on every call, and it costs a GET.
    async fn listing(&self, dataset: &DatasetName) -> Result<Arc<Listing>> {
        if let Some(listing) = self.lock_listings().get(dataset.as_str())
            && listing.at.elapsed() < LISTING_TTL
        {
            return Ok(listing.clone());
        }
        let prefix = self.dataset_prefix(dataset.as_str());
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.location.bucket)
            .prefix(&prefix)
            .into_paginator()
            .send();
        let mut shards = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.error(e, dataset.as_str()))?;
            for object in page.contents() {
                let Some(name) = object.key().and_then(|k| k.strip_prefix(&prefix)) else { continue };
                if ShardName::new(name).is_err() {
                    continue; // hidden (metadata), or a key no client could ask for
                }
                shards.push(ShardMeta {
                    name: name.to_owned(),
                    size: object.size().unwrap_or_default().max(0) as u64,
                    version: etag_version(object.e_tag()),
                    modified_ms: modified_ms(object.last_modified()),
                });
            }
        }
        shards.sort_by(|a, b| a.name.cmp(&b.name));
        let record_size = if shards.is_empty() { 0 } else { self.record_size(dataset.as_str()).await };
        let listing = Arc::new(Listing { at: Instant::now(), shards: Arc::new(shards), record_size });
        self.lock_listings().insert(dataset.to_string(), listing.clone());
        Ok(listing)
    }

    fn lock_listings(&self) -> std::sync::MutexGuard<'_, Listings> {
        self.listings.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `record_size` from the dataset's metadata object; 0 when absent or unreadable.
    async fn record_size(&self, dataset: &str) -> u32 {
        let key = format!("{}{DATASET_META_FILE}", self.dataset_prefix(dataset));
        let Ok(object) = self.client.get_object().bucket(&self.location.bucket).key(key).send().await else {
            return 0;
        };
        // Not read at all past the bound: a metadata object is a few bytes of JSON.
        if object.content_length().is_none_or(|n| n < 0 || n as u64 > super::MAX_META_BYTES) {
            return 0;
        }
        let Ok(body) = object.body.collect().await else { return 0 };
        super::parse_record_size(&body.into_bytes())
    }
}

/// An object's LastModified in milliseconds since the Unix epoch, 0 when not given.
fn modified_ms(at: Option<&aws_sdk_s3::primitives::DateTime>) -> u64 {
    at.and_then(|at| u64::try_from(at.to_millis().ok()?).ok()).unwrap_or(0)
}

/// The version of an object: its ETag without the quotes.
fn etag_version(etag: Option<&str>) -> String {
    etag.unwrap_or_default().trim_matches('"').to_owned()
}

/// S3 errors to the hub's: `not_found` for 404s (which "not found" depends on the call).
fn classify<E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static>(
    bucket: &str,
    err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
    what: &str,
    not_found: impl FnOnce() -> Error,
) -> Error {
    let status = err.raw_response().map(|r| r.status().as_u16());
    let code = err.code().unwrap_or_default().to_owned();
    // Each cause's words, never the SDK's Debug output (raw HTTP headers and bodies).
    let detail = shardcache_transport::report::chain(&err);
    let advice = if detail.contains("credentials") {
        ": give the hub credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a role)"
    } else {
        ""
    };
    match (status, code.as_str()) {
        (_, "NoSuchBucket") => Error::SourceUnavailable {
            store: format!("s3://{bucket}"),
            message: format!("bucket {bucket} does not exist (NoSuchBucket)"),
        },
        (Some(404), _) | (_, "NoSuchKey" | "NotFound") => not_found(),
        (Some(412), _) | (_, "PreconditionFailed") => Error::version_changed("", what, "", "a newer object"),
        (Some(403), _) | (_, "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch") => {
            Error::SourceDenied {
                store: format!("s3://{bucket}"),
                message: format!(
                    "{} while reading {what}: the hub's credentials need s3:ListBucket and s3:GetObject",
                    if code.is_empty() { "403 Forbidden".to_owned() } else { code }
                ),
            }
        }
        _ => Error::SourceUnavailable {
            store: format!("s3://{bucket}"),
            message: format!("{what}: {detail} (after {MAX_ATTEMPTS} attempts){advice}"),
        },
    }
}

impl Storage for Arc<S3Source> {
    type Shard = S3Shard;
    const READ_PARALLELISM: usize = READ_PARALLELISM;

    async fn list_datasets(&self) -> Result<Vec<DatasetMeta>> {
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.location.bucket)
            .prefix(&self.location.prefix)
            .delimiter("/")
            .into_paginator()
            .send();
        let mut names = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.error(e, &self.location.url()))?;
            for common in page.common_prefixes() {
                let name = common
                    .prefix()
                    .and_then(|p| p.strip_prefix(&self.location.prefix))
                    .map(|p| p.trim_end_matches('/'));
                if let Some(name) = name.and_then(|n| DatasetName::new(n).ok()) {
                    names.push(name.to_string());
                }
            }
        }
        names.sort();
        // The service lists each dataset's shards next anyway: the same cached listing.
        futures::stream::iter(names)
            .map(|name| async move {
                let listing = self.listing(&DatasetName::new(&name)?).await?;
                Ok(DatasetMeta { record_size: listing.record_size, name })
            })
            .buffered(READ_PARALLELISM)
            .try_collect()
            .await
    }

    async fn dataset(&self, dataset: &DatasetName) -> Result<DatasetMeta> {
        let listing = self.listing(dataset).await?;
        if listing.shards.is_empty() {
            return Err(Error::DatasetNotFound { dataset: dataset.to_string() });
        }
        Ok(DatasetMeta { name: dataset.to_string(), record_size: listing.record_size })
    }

    async fn list_shards(&self, dataset: &DatasetName) -> Result<Vec<ShardMeta>> {
        let listing = self.listing(dataset).await?;
        if listing.shards.is_empty() {
            return Err(Error::DatasetNotFound { dataset: dataset.to_string() });
        }
        Ok(listing.shards.to_vec())
    }

    async fn open(&self, dataset: &DatasetName, shard: &ShardName) -> Result<S3Shard> {
        let key = format!("{}{shard}", self.dataset_prefix(dataset.as_str()));
        let head =
            self.client.head_object().bucket(&self.location.bucket).key(&key).send().await.map_err(|e| {
                classify(&self.location.bucket, e, &format!("{dataset}/{shard}"), || Error::ShardNotFound {
                    dataset: dataset.to_string(),
                    shard: shard.to_string(),
                })
            })?;
        let meta = ShardMeta {
            name: shard.to_string(),
            size: head.content_length().unwrap_or_default().max(0) as u64,
            version: etag_version(head.e_tag()),
            modified_ms: modified_ms(head.last_modified()),
        };
        Ok(S3Shard(Arc::new(OpenObject {
            client: self.client.clone(),
            bucket: self.location.bucket.clone(),
            key,
            dataset: dataset.to_string(),
            meta,
        })))
    }
}

impl OpenObject {
    /// One ranged GET of `[offset, offset + len)`, held to the opened ETag.
    async fn get(&self, offset: u64, len: u64) -> Result<Bytes> {
        let what = format!("{}/{}", self.dataset, self.meta.name);
        let object = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .range(format!("bytes={offset}-{}", offset + len - 1))
            .if_match(format!("\"{}\"", self.meta.version))
            .send()
            .await
            .map_err(|e| {
                let err = classify(&self.bucket, e, &what, || Error::ShardNotFound {
                    dataset: self.dataset.clone(),
                    shard: self.meta.name.clone(),
                });
                self.with_context(err)
            })?;
        let data = object
            .body
            .collect()
            .await
            .map_err(|e| Error::SourceUnavailable {
                store: format!("s3://{}", self.bucket),
                message: format!("{what}: {e}"),
            })?
            .into_bytes();
        if data.len() as u64 != len {
            // A shorter object than the ETag we hold said: it changed.
            return Err(self.with_context(Error::version_changed("", "", "", "a shorter object")));
        }
        Ok(data)
    }

    /// Fills in which shard a `VersionChanged` is about.
    fn with_context(&self, err: Error) -> Error {
        match err {
            Error::Read(ReadError::VersionChanged { found, .. }) => {
                Error::version_changed(&self.dataset, &self.meta.name, &self.meta.version, found)
            }
            other => other,
        }
    }
}

impl ShardHandle for S3Shard {
    type Error = Error;

    fn meta(&self) -> &ShardMeta {
        &self.0.meta
    }

    async fn read_at(&self, offset: u64, len: usize) -> Result<Checked> {
        let len = len as u64;
        if len == 0 {
            return Ok(Checked::default());
        }
        if len <= PART_SIZE {
            return Ok(Checked::new(self.0.get(offset, len).await?));
        }
        let parts: Vec<(u64, u64)> = (offset..offset + len)
            .step_by(PART_SIZE as usize)
            .map(|start| (start, PART_SIZE.min(offset + len - start)))
            .collect();
        let object = &self.0;
        let pieces: Vec<Checked> = futures::stream::iter(parts)
            .map(|(start, part)| async move { Ok::<_, Error>(Checked::new(object.get(start, part).await?)) })
            .buffered(READ_PARALLELISM)
            .try_collect()
            .await?;
        Ok(Checked::concat(pieces))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_with_or_without_a_prefix() {
        assert_eq!(
            S3Location::parse("s3://b").unwrap(),
            S3Location { bucket: "b".into(), prefix: String::new() }
        );
        assert_eq!(
            S3Location::parse("s3://b/some/prefix/").unwrap(),
            S3Location { bucket: "b".into(), prefix: "some/prefix/".into() }
        );
        assert!(S3Location::parse("http://b").unwrap_err().to_string().contains("not an s3://"));
        assert!(S3Location::parse("s3:///x").unwrap_err().to_string().contains("names no bucket"));
    }
}
