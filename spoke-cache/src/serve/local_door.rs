//! The same-node door (`--local-socket`): readers on the spoke's node read warm bytes
//! from the store's own files, so that no byte crosses a socket and the spoke spends
//! almost nothing per byte (issue 59; HDFS's and Alluxio's short-circuit reads).
//!
//! A reader asks over a Unix socket (`shardcache_transport::local_socket`, messages of
//! `proto/shardcache/v1/local.proto`) for the ranges of one call, with the headers its
//! gRPC call would carry. The door checks them as the gRPC port does (the same
//! [`Authenticator`], the same grants, names and range rules), reads the call through
//! the same read path (`ReadPath::locate_many`: counted as any read, a hit as a hit),
//! and answers where each stored page lies, passing the files it lies in (read-only
//! descriptors). The reader reads them and checks every page against the CRC32C stored
//! in front of it before it hands a byte on (`shardcache_client::local`).
//!
//! What it keeps:
//! - Only what the token allows: a descriptor is of one page file, and a page file holds
//!   pages of one shard only (`store/ingest.rs`, `store/merge.rs`).
//! - Nothing under a reader changes: a file's bytes are written once, and an evicted
//!   file stays readable through a descriptor until its reader closes it. The SDK closes
//!   them when the call is read, so an evicted file outlives eviction by one read (the
//!   disk space, not the capacity's count), and a reader killed mid-read holds nothing:
//!   the kernel closes its descriptors as it dies. The spoke keeps no state per reader.
//! - A call that reads anything not stored (or stale: past `--revalidate-after`) is
//!   answered `not_stored`, with nothing read or counted; the reader reads it over gRPC,
//!   which fetches it.
//! - No door where readers are known by client certificates alone (`--client-ca`
//!   without `--token-file`: a Unix socket carries no certificate; `server.rs`).
//! - Bounded: [`MAX_CONNECTIONS`] readers at once, [`READER_TIMEOUT`] for a question to
//!   arrive or an answer to be taken, `MAX_FILES` files per answer.

use std::{
    fs::File,
    future::Future,
    os::fd::AsFd,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, atomic::Ordering::Relaxed},
    task::{Context, Poll},
    time::Instant,
};

use prost::Message;
use shardcache_proto::{
    checksum::Checked,
    names::{DatasetName, ShardName},
    range,
    v1::{LocalAnswer, LocalPiece, LocalQuestion, LocalRange, ReadRangeRequest},
};
use shardcache_reader::{Observer, ReadContext, ReadError};
use shardcache_serving::auth::{Authenticator, Grant};
use shardcache_transport::local_socket::{self, MAX_FILES, MAX_QUESTION_BYTES};
use tokio::net::{UnixListener, UnixStream};
use tonic::{Status, service::Interceptor};

use crate::{
    cache::Cache,
    read::path::Piece,
    serve::source::reader_for,
    store::{entry::Entry, locate::PageSpan},
};

/// The response header of the spoke's gRPC answers that names its door.
pub use shardcache_proto::LOCAL_DOOR_HEADER as DOOR_HEADER;

/// The door of one spoke.
#[derive(Debug)]
pub struct LocalDoor {
    cache: Arc<Cache>,
    auth: Authenticator,
    max_read: u64,
    /// Random per start: the socket a reader finds is this spoke's only if it says so.
    instance: String,
    path: PathBuf,
    /// The socket file this door made (device, inode): removed at the end only if it is
    /// still this one (a spoke started meanwhile on the same path has its own).
    made: (u64, u64),
    /// Readers connected at once, at most [`MAX_CONNECTIONS`].
    connections: Arc<tokio::sync::Semaphore>,
}

/// Readers connected to the door at once: more are closed at once (a reader keeps a few,
/// one per call in flight). Each holds at most one question and its answer.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may wait for its reader's next question (idle, or one sent
/// byte by byte), and for its reader to take an answer.
const READER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

impl LocalDoor {
    /// Binds `path` (a socket left there by an earlier run is replaced; one another
    /// process still answers on is left alone: an error), readable and writable by every
    /// user of the node: a token is checked on every call, as on the gRPC port, and
    /// containers of other users mount the socket.
    pub fn bind(
        path: &Path,
        cache: Arc<Cache>,
        auth: Authenticator,
        max_read: u64,
    ) -> std::io::Result<(Self, UnixListener)> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another process answers on this socket (another spoke on the same --cache-dir?)",
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        let made = std::fs::metadata(path).map(|m| (m.dev(), m.ino()))?;
        let door = Self {
            cache,
            auth,
            max_read,
            instance: random_instance()?,
            path: path.to_owned(),
            made,
            connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
        };
        Ok((door, listener))
    }

    /// The [`DOOR_HEADER`] value.
    pub fn announcement(&self) -> String {
        format!("{} {}", self.path.display(), self.instance)
    }

    /// Serves connections until `shutdown`.
    pub async fn serve(self: Arc<Self>, listener: UnixListener, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => match self.connections.clone().try_acquire_owned() {
                        Ok(held) => {
                            tokio::spawn(self.clone().serve_connection(stream, held));
                        }
                        Err(_) => tracing::warn!(
                            limit = MAX_CONNECTIONS,
                            "the same-node door has as many readers as it takes; one more was closed (it reads over gRPC)"
                        ),
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "the same-node door could not accept a reader");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
            }
        }
        use std::os::unix::fs::MetadataExt;
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.made) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Answers one reader's questions, in order, until it goes away (or sends what is
    /// not a question: then the connection is closed, after its answer).
    async fn serve_connection(self: Arc<Self>, stream: UnixStream, _held: tokio::sync::OwnedSemaphorePermit) {
        loop {
            // Descriptors a reader sends are closed at once (they are dropped here).
            let question =
                tokio::time::timeout(READER_TIMEOUT, local_socket::recv(&stream, MAX_QUESTION_BYTES));
            let question = match question.await {
                Ok(Ok(Some((question, _)))) => question,
                Ok(Ok(None)) | Err(_) => return,
                Ok(Err(e)) => {
                    let status =
                        Status::invalid_argument(format!("not a question of the same-node door: {e}"));
                    let _ = self.send(&stream, self.failed(&status), &[]).await;
                    return;
                }
            };
            let (answer, files) = match self.answer(&question).await {
                Ok(answered) => answered,
                Err(status) => (self.failed(&status), Vec::new()),
            };
            if self.send(&stream, answer, &files).await.is_err() {
                return;
            }
        }
    }

    /// Sends `answer` and its files, if the reader takes them within [`READER_TIMEOUT`].
    async fn send(
        &self,
        stream: &UnixStream,
        answer: LocalAnswer,
        files: &[Arc<File>],
    ) -> std::io::Result<()> {
        let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
        let message = answer.encode_to_vec();
        let sent = local_socket::send(stream, &message, &fds);
        tokio::time::timeout(READER_TIMEOUT, sent)
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
    }

    fn failed(&self, status: &Status) -> LocalAnswer {
        LocalAnswer {
            spoke: self.instance.clone(),
            code: status.code() as u32,
            message: status.message().to_owned(),
            ..Default::default()
        }
    }

    /// The answer to one question, with the files it names.
    async fn answer(&self, question: &[u8]) -> Result<(LocalAnswer, Vec<Arc<File>>), Status> {
        let started = Instant::now();
        let question = LocalQuestion::decode(question)
            .map_err(|e| Status::invalid_argument(format!("not a LocalQuestion: {e}")))?;
        let request = self.auth.clone().call(request_of(&question)?)?;
        let (grant, context) = (Grant::of(&request)?, ReadContext::of(&request)?);
        let hello = LocalAnswer { spoke: self.instance.clone(), ..Default::default() };
        if question.ranges.is_empty() {
            return Ok((LocalAnswer { max_read: self.max_read, ..hello }, Vec::new()));
        }
        let ranges = &question.ranges;
        let wants = self.checked_wants(ranges, &grant)?;
        let Some(wants) = wants else { return Ok(self.not_stored(hello)) };
        let metrics = self.cache.metrics();
        let reader = reader_for(&self.cache, &context);
        let asked: Vec<(&Arc<Entry>, u64, u64)> = wants.iter().map(|(e, o, l)| (e, *o, *l)).collect();
        let Some(read) = self.cache.locate_many(&asked, &reader).await.map_err(Status::from)? else {
            return Ok(self.not_stored(hello));
        };
        // (Counted once read: a call sent back to gRPC is counted there.)
        metrics.read_request();
        let mut files = Files::default();
        let mut answer = LocalAnswer { ranges: Vec::with_capacity(read.len()), ..hello };
        for ((entry, ..), pieces) in wants.iter().zip(read) {
            let pieces = pieces.into_iter().map(|piece| files.piece(piece)).collect::<Result<Vec<_>, _>>()?;
            answer.ranges.push(LocalRange { version: entry.version.clone(), pieces: pieces.concat() });
        }
        let total: u64 = wants.iter().map(|w| w.2).sum();
        metrics.served(total as usize);
        metrics.sent(files.carried as usize);
        metrics.door_calls.fetch_add(1, Relaxed);
        metrics.door_placed_bytes.fetch_add(total - files.carried, Relaxed);
        metrics.door_carried_bytes.fetch_add(files.carried, Relaxed);
        metrics.read_latency(started.elapsed(), &context);
        Ok((answer, files.open))
    }

    fn not_stored(&self, hello: LocalAnswer) -> (LocalAnswer, Vec<Arc<File>>) {
        self.cache.metrics().door_not_stored.fetch_add(1, Relaxed);
        (LocalAnswer { not_stored: true, ..hello }, Vec::new())
    }

    /// The call's ranges checked as `ReadRanges` checks them (count, grants, total,
    /// names, versions, within each shard), each with its shard's fresh entry; `None`
    /// when a shard is not in the catalog or not fresh (the gRPC port looks it up).
    fn checked_wants(&self, ranges: &[ReadRangeRequest], grant: &Grant) -> Result<Option<Vec<Want>>, Status> {
        range::check_count(ranges.len()).map_err(ReadError::from)?;
        for r in ranges {
            grant.check(&r.dataset)?;
        }
        let total = ranges.iter().fold(0u64, |sum, r| sum.saturating_add(r.length));
        range::check_total(total, self.max_read).map_err(ReadError::from)?;
        let mut wants = Vec::with_capacity(ranges.len());
        for r in ranges {
            let (dataset, shard) = (
                DatasetName::new(&r.dataset).map_err(ReadError::from)?,
                ShardName::new(&r.shard).map_err(ReadError::from)?,
            );
            let Some(entry) = self.cache.fresh_entry(dataset.as_str(), shard.as_str()) else {
                return Ok(None);
            };
            if !r.expected_version.is_empty() && r.expected_version != entry.version {
                return Err(ReadError::VersionChanged {
                    dataset: r.dataset.clone(),
                    shard: r.shard.clone(),
                    expected: r.expected_version.clone(),
                    found: entry.version.clone(),
                }
                .into());
            }
            range::check_within(r.offset, r.length, entry.size).map_err(ReadError::from)?;
            wants.push((entry, r.offset, r.length));
        }
        Ok(Some(wants))
    }
}

/// A range of a call, with its shard's entry: (entry, offset, length).
type Want = (Arc<Entry>, u64, u64);

/// The question's headers as a gRPC request's metadata, for the [`Authenticator`] and
/// [`ReadContext`] to read as they read a gRPC call's.
fn request_of(question: &LocalQuestion) -> Result<tonic::Request<()>, Status> {
    let mut request = tonic::Request::new(());
    for (name, value) in &question.headers {
        let key = tonic::metadata::MetadataKey::from_bytes(name.as_bytes()).map_err(|_| {
            Status::invalid_argument(format!("header name {name:?} is not a valid gRPC metadata key"))
        })?;
        let value = value.parse().map_err(|_| {
            Status::invalid_argument(format!("header {name:?} has a value that is not printable ASCII"))
        })?;
        request.metadata_mut().insert(key, value);
    }
    Ok(request)
}

/// The files an answer names, each once, in the order the reader receives them.
#[derive(Default)]
struct Files {
    open: Vec<Arc<File>>,
    /// Bytes carried in the answer rather than placed.
    carried: u64,
}

impl Files {
    /// `piece` as the answer's pieces: bytes as they are, pages in files; a page in a file
    /// beyond the [`MAX_FILES`] one answer may pass is never placed (`store::locate`).
    fn piece(&mut self, piece: Piece) -> Result<Vec<LocalPiece>, Status> {
        let spans = match piece {
            Piece::Bytes(bytes) => return Ok(vec![self.carry(bytes)]),
            Piece::Pages(spans) => spans,
        };
        spans.into_iter().map(|span| self.page(span)).collect()
    }

    fn page(&mut self, span: PageSpan) -> Result<LocalPiece, Status> {
        let file = match self.open.iter().position(|f| Arc::ptr_eq(f, &span.file)) {
            Some(file) => file,
            // (`store::locate::Opened` opens at most MAX_FILES per call.)
            None if self.open.len() < MAX_FILES => {
                self.open.push(span.file.clone());
                self.open.len() - 1
            }
            None => return Err(Status::internal(format!("a call placed in more than {MAX_FILES} files"))),
        };
        Ok(LocalPiece {
            page: true,
            file: file as u32,
            at: span.at,
            page_len: span.page_len,
            from: span.from,
            to: span.to,
            ..Default::default()
        })
    }

    fn carry(&mut self, bytes: Checked) -> LocalPiece {
        self.carried += bytes.data.len() as u64;
        LocalPiece { data: bytes.data, crc32c: bytes.crc32c, ..Default::default() }
    }
}

/// 128 random bits, in hex: a spoke's instance.
fn random_instance() -> std::io::Result<String> {
    let mut random = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut random)?;
    Ok(random.iter().map(|b| format!("{b:02x}")).collect())
}

/// The spoke's gRPC service with [`DOOR_HEADER`] on every response.
#[derive(Debug, Clone)]
pub struct Announced<S> {
    inner: S,
    value: http::HeaderValue,
}

impl<S> Announced<S> {
    /// `inner`, announcing `announcement` ([`LocalDoor::announcement`]); nothing when
    /// the spoke has no door.
    pub fn new(inner: S, announcement: Option<String>) -> Self {
        let value = announcement
            .and_then(|a| http::HeaderValue::from_str(&a).ok())
            .unwrap_or_else(|| http::HeaderValue::from_static(""));
        Self { inner, value }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Announced<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> tower::Service<http::Request<B>> for Announced<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (called, value) = (self.inner.call(request), self.value.clone());
        Box::pin(async move {
            let mut response = called.await?;
            if !value.is_empty() {
                response.headers_mut().insert(DOOR_HEADER, value);
            }
            Ok(response)
        })
    }
}
