//! The S3 door (`--s3-listen ADDR`, issue 60): the loaders and tools trainers already
//! use (boto3, s3fs, the aws CLI, MosaicML Streaming, anything that honours
//! `AWS_ENDPOINT_URL`) read through the cache without a change, a bucket per dataset
//! and a key per shard path.
//!
//! The protocol and AWS Signature Version 4 are `s3s`' (0.14.1: the newest that builds
//! with this workspace's toolchain); the operations (`objects.rs`) are the read
//! service's gRPC calls, made in process, so a request through this door is checked,
//! read, fetched and counted as the same request over gRPC. Listings: `listing.rs`;
//! ETags, Last-Modified and conditional headers: `conditions.rs`; errors: `errors.rs`.
//!
//! Who may read:
//! - A spoke with `--token-file` needs `--s3-keys FILE` (`shardcache_serving::s3_keys`):
//!   every request is signed (headers or a presigned URL) with a key of that file, and
//!   reads what its principal's token line allows. An unsigned request is
//!   `AccessDenied`, a bad signature `SignatureDoesNotMatch`.
//! - An open spoke (no `--token-file`, no client certificates) serves every request,
//!   unsigned or signed with any key (clients such as the AWS CRT always sign): its
//!   signature is dropped before s3s sees it. The gRPC port is as open.
//! - A spoke that knows its readers by client certificates alone (`--client-ca` without
//!   `--token-file`) opens no S3 door: S3 has no way to name a certificate's grant.
//!
//! Bounded: [`MAX_CONNECTIONS`] connections (TLS handshakes included), request heads of
//! at most [`MAX_HEAD_BYTES`] within [`HEAD_TIMEOUT`], and [`MAX_IN_FLIGHT`] requests
//! at once; more get `SlowDown` (503), which S3 clients back off and retry.

pub mod conditions;
pub mod errors;
pub mod listing;
pub mod objects;

use std::{future::Future, path::Path, sync::Arc, time::Duration};

use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use s3s::{
    S3Error, S3ErrorCode, S3Result,
    host::{MultiDomain, S3Host, VirtualHost},
    service::S3ServiceBuilder,
};
use shardcache_reader::ReadService;
use shardcache_serving::{auth::Authenticator, s3_keys::S3KeyBook, tls::ServerTls};
use shardcache_transport::reload::Reloading;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Semaphore,
};

use crate::{Error, Result, serve::source::CachedSource};
use objects::{KeyAuth, Objects};

/// Connections served at once (a loader opens one per worker thread or so).
pub const MAX_CONNECTIONS: usize = 1024;
/// Requests answered at once; more get `SlowDown`.
pub const MAX_IN_FLIGHT: usize = 512;
/// Time a client has to send a request head (after TLS).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head: a presigned URL with its signature and headers is a few KiB.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// How the door is set up (`--s3-keys`, `--s3-domain`).
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// The keys file; required where the spoke has a token file.
    pub keys: Option<std::path::PathBuf>,
    /// Domains for virtual-hosted-style addressing (`BUCKET.DOMAIN`); path style
    /// (`DOMAIN/BUCKET/KEY`) always works.
    pub domains: Vec<String>,
}

/// The S3 door of one spoke.
pub struct S3Door {
    service: s3s::service::S3Service,
    /// The door is open: signatures are dropped, not checked.
    open: bool,
}

impl std::fmt::Debug for S3Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Door").field("open", &self.open).finish_non_exhaustive()
    }
}

impl S3Door {
    /// The door over `reads`, for the spoke's `auth` (and `tls`: whether it knows its
    /// readers by client certificates).
    pub fn new(
        reads: ReadService<CachedSource>,
        auth: Authenticator,
        verifies_client_certs: bool,
        options: &S3Options,
    ) -> Result<Self> {
        let open = !auth.requires_credentials();
        if open && verifies_client_certs {
            return Err(Error::Config(
                "--s3-listen: this spoke knows its readers by client certificates alone (--client-ca without \
                 --token-file), which S3 cannot name; give it a --token-file and --s3-keys"
                    .into(),
            ));
        }
        let keys = match (&options.keys, open) {
            (Some(path), false) => Some(load_keys(path)?),
            (None, false) => {
                return Err(Error::Config(
                    "--s3-listen on a spoke with --token-file needs --s3-keys FILE (make a key with `shardcache \
                     token s3-key`)"
                        .into(),
                ));
            }
            (Some(path), true) => {
                tracing::warn!(
                    keys = %path.display(),
                    "--s3-keys is not used: this spoke is open (no --token-file), so its S3 door reads every request, \
                     signed with any key or not at all"
                );
                None
            }
            (None, true) => None,
        };
        let objects = Objects {
            reads: Arc::new(reads),
            auth,
            keys: keys.clone(),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        };
        let mut builder = S3ServiceBuilder::new(objects);
        builder.set_validation(DatasetNames);
        if let Some(keys) = keys {
            builder.set_auth(KeyAuth(keys));
        }
        if !options.domains.is_empty() {
            // Checked as s3s checks domains (valid, none inside another), kept as our own.
            MultiDomain::new(options.domains.iter().map(String::as_str))
                .map_err(|e| Error::Config(format!("--s3-domain: {e}")))?;
            builder.set_host(Domains(options.domains.iter().map(|d| d.to_ascii_lowercase()).collect()));
        }
        Ok(Self { service: builder.build(), open })
    }

    /// Serves connections on `listener` (TLS when `tls` is set, with the gRPC port's
    /// certificate) until `shutdown`.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: Option<ServerTls>,
        shutdown: impl Future<Output = ()>,
    ) {
        let door = Arc::new(self);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        tokio::pin!(shutdown);
        loop {
            let (socket, remote) = tokio::select! {
                () = &mut shutdown => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "S3 door: accept failed");
                        continue;
                    }
                },
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::warn!(%remote, limit = MAX_CONNECTIONS, "S3 door: too many connections; closed");
                continue;
            };
            let (door, tls) = (door.clone(), tls.clone());
            tokio::spawn(async move {
                let _slot = slot;
                match tls {
                    None => door.serve_connection(socket).await,
                    Some(tls) => match tls.accept_http1(socket).await {
                        Ok(socket) => door.serve_connection(socket).await,
                        Err(error) => tracing::info!(%remote, %error, "S3 door: TLS handshake failed"),
                    },
                }
            });
        }
    }

    async fn serve_connection<S>(self: Arc<Self>, socket: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = service_fn(move |mut request: http::Request<Incoming>| {
            let door = self.clone();
            async move {
                if let Some(refused) = payload_hash_mismatch(&request) {
                    return refused.to_http_response().map_err(|e| s3s::HttpError::new(Box::new(e)));
                }
                if door.open {
                    unsigned(&mut request);
                }
                door.service.call(request.map(s3s::Body::from)).await
            }
        });
        let served = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .max_buf_size(MAX_HEAD_BYTES)
            .serve_connection(TokioIo::new(socket), service)
            .await;
        if let Err(error) = served {
            tracing::debug!(%error, "S3 door: connection ended with an error");
        }
    }
}

/// `--s3-domain`: a request whose host (its port aside) is `BUCKET.DOMAIN` names its bucket
/// there; any other host (a domain itself, the spoke's address, a Service's name) is path
/// style. s3s's own `MultiDomain` compares the host with its port, so behind `:9000` no
/// bucket was ever found by its name, and it takes an unknown host for a bucket (a CNAME),
/// so a client reaching the spoke at its address found its bucket to be that address.
struct Domains(Vec<String>);

impl S3Host for Domains {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        let name = match host.rsplit_once(':') {
            // `[::1]:9000`, `host:9000`; not the colons inside a bare IPv6 address.
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => name,
            _ => host,
        };
        // Host names are case-insensitive; the domains are kept in lower case.
        let name = name.to_ascii_lowercase();
        for domain in &self.0 {
            if let Some(bucket) =
                name.strip_suffix(domain.as_str()).and_then(|b| b.strip_suffix('.')).filter(|b| !b.is_empty())
            {
                return Ok(VirtualHost::new(domain.as_str()).with_bucket(bucket.to_owned()));
            }
        }
        Ok(VirtualHost::new(name))
    }
}

/// A bucket is a dataset: its name follows the dataset rules (`c4` is one), not S3's
/// (at least 3 characters, lowercase).
struct DatasetNames;

impl s3s::validation::NameValidation for DatasetNames {
    fn validate_bucket_name(&self, name: &str) -> bool {
        shardcache_proto::names::DatasetName::new(name).is_ok()
    }
}

fn load_keys(path: &Path) -> Result<Reloading<S3KeyBook>> {
    let file = path.to_owned();
    Reloading::watch("S3 keys file", vec![file.clone()], move || S3KeyBook::load(&file))
        .map_err(|e| Error::Config(format!("--s3-keys: {e}")))
}

/// SHA-256 of no bytes: the `x-amz-content-sha256` of a request without a body.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// S3's `XAmzContentSHA256Mismatch` (400) for a request without a body whose
/// `x-amz-content-sha256` names another body's hash. s3s answers it `InternalError` (500),
/// which clients retry as the server's fault. A request with a body (a write, answered
/// `NotImplemented`) is left to s3s, which checks its hash as it reads it; the writes'
/// issue owns that path.
fn payload_hash_mismatch(request: &http::Request<Incoming>) -> Option<S3Error> {
    let headers = request.headers();
    let declared = headers.get("x-amz-content-sha256")?.to_str().ok()?;
    let is_hash = declared.len() == 64 && declared.bytes().all(|b| b.is_ascii_hexdigit());
    let bodiless = !headers.contains_key(http::header::TRANSFER_ENCODING)
        && headers.get(http::header::CONTENT_LENGTH).is_none_or(|length| length.as_bytes() == b"0");
    if !is_hash || !bodiless || declared.eq_ignore_ascii_case(EMPTY_SHA256) {
        return None;
    }
    // S3's own words (clients and test suites compare them).
    let mut error = S3Error::with_message(
        S3ErrorCode::Custom("XAmzContentSHA256Mismatch".into()),
        "The provided 'x-amz-content-sha256' header does not match what was computed.",
    );
    error.set_status_code(http::StatusCode::BAD_REQUEST);
    Some(error)
}

/// An open door's request without its signature (header, or a presigned URL's query of
/// SigV4 or SigV2, which boto3 still makes by default), so that s3s reads it as
/// unsigned: an open spoke takes requests signed with any key.
fn unsigned(request: &mut http::Request<Incoming>) {
    request.headers_mut().remove(http::header::AUTHORIZATION);
    let uri = request.uri();
    let Some(query) = uri.query() else { return };
    let has = |name: &str| query.split('&').any(|pair| pair.split('=').next() == Some(name));
    let signature: &[&str] = if has("X-Amz-Signature") {
        &[
            "X-Amz-Algorithm",
            "X-Amz-Credential",
            "X-Amz-Date",
            "X-Amz-Expires",
            "X-Amz-SignedHeaders",
            "X-Amz-Signature",
            "X-Amz-Security-Token",
        ]
    } else if has("Signature") {
        &["AWSAccessKeyId", "Signature", "Expires", "x-amz-security-token"]
    } else {
        return;
    };
    let kept: Vec<&str> =
        query.split('&').filter(|pair| !signature.contains(&pair.split('=').next().unwrap_or(""))).collect();
    let path_and_query =
        if kept.is_empty() { uri.path().to_owned() } else { format!("{}?{}", uri.path(), kept.join("&")) };
    let mut parts = uri.clone().into_parts();
    if let Ok(rebuilt) = path_and_query.parse() {
        parts.path_and_query = Some(rebuilt);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
    }
}
