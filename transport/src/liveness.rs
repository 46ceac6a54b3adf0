//! A client channel whose calls cannot wait forever once it has no connection left.
//!
//! hyper's HTTP/2 client can lose a request it takes while its connection is failing:
//! the connection task ends with the I/O error and the request's future is not woken.
//! Seen with `shardcache ls` over `http://` to a hub that serves TLS (the hub resets a
//! plaintext client at once): about 1 run in 1,000 of a debug build (`lost-call-bench`),
//! more on a busier machine, hung until killed with no socket left; the
//! `first_hour_errors` test held CI so for 85 minutes. The others fail at once with the
//! reset, as they should. The lost request waits in the dead connection's dispatch queue:
//! the next call on the channel makes tonic's `Reconnect` drop that connection's sender,
//! and with it the request, which fails the lost call ("connection closed") within
//! about 2 ms (BENCHMARKS.md, "Calls that outlived their connection"). So a client that
//! makes another call recovers by itself; the call that is nobody's next (the CLI's one
//! call, a client's last) waits forever.
//!
//! A tonic channel has one connection at a time and opens another only when a call asks
//! for one, so a call that is still waiting while the channel has no connection open,
//! and none being opened, has nothing left that could answer it. [`LiveChannel`] counts
//! its connections, from the connector's call to the drop of the socket (hyper drops it
//! when the connection ends), and fails a call that has waited [`ORPHAN_GRACE`] with
//! none, with `UNAVAILABLE` and how the last one ended: what the call should have
//! answered. Calls answered in the usual way are untouched: the check only watches a
//! counter. (A response body is not watched: hyper fails its stream when the connection
//! ends.)

use std::{
    fmt,
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::watch,
};
use tonic::{
    body::Body,
    transport::{Channel, Endpoint},
};
use tower::{BoxError, Service, ServiceExt};

use crate::{http2::Http2Settings, tls::ClientTls};

/// How long a call may wait with no connection open or being opened before it is
/// failed. Between a call and its connector being asked there is only the hand-off to
/// the channel's worker task (microseconds), so this is slack for a starved machine, not
/// a deadline on the server: a call on an open connection waits as long as it needs.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(5);

/// The message of an orphaned call's status (its source, [`Orphaned`], says how the
/// connection ended).
pub const ORPHANED: &str = "the connection closed before the server answered";

/// The connections of one channel: how many are open or being opened, and how the last
/// one ended.
#[derive(Debug)]
struct Links {
    open: watch::Sender<usize>,
    last_end: Mutex<Option<String>>,
    /// Bytes read from the channel's sockets so far, every connection's (what the peer
    /// sent: answers whatever became of them, HTTP/2's framing, TLS's records).
    received: AtomicU64,
}

impl Links {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            open: watch::Sender::new(0),
            last_end: Mutex::new(None),
            received: AtomicU64::new(0),
        })
    }

    /// How many connections are open or being opened.
    #[cfg(test)]
    fn open(&self) -> usize {
        *self.open.borrow()
    }

    /// One more connection, counted until the returned guard is dropped. What an earlier
    /// one ended with is forgotten: a call orphaned later is told about this one.
    fn opening(self: &Arc<Self>) -> LinkGuard {
        *self.last_end.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.open.send_modify(|n| *n += 1);
        LinkGuard(self.clone())
    }

    fn ended(&self, how: String) {
        *self.last_end.lock().unwrap_or_else(|e| e.into_inner()) = Some(how);
    }

    fn how_last_ended(&self) -> String {
        self.last_end.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_else(|| CLOSED.into())
    }

    /// Resolves once no connection has been open or opening for `grace` (a connection
    /// opened meanwhile starts the wait again; one opened and gone between two looks may
    /// go unseen, which only shortens the wait by its lifetime), with how the last one
    /// ended; pending for as long as one is open.
    async fn orphaned(&self, grace: Duration) -> String {
        let mut open = self.open.subscribe();
        loop {
            // A `Ref` from `wait_for` holds the value's lock, which `send_modify` takes:
            // each is dropped at once, never kept across an await.
            drop(open.wait_for(|n| *n == 0).await);
            match tokio::time::timeout(grace, open.wait_for(|n| *n > 0)).await {
                Err(_) => return self.how_last_ended(),
                Ok(changed) => drop(changed),
            }
        }
    }

    /// `inner`, a connector, with each connection it makes counted here: from its call
    /// (so a connection being opened counts; a connect given up drops its guard) to the
    /// drop of the socket, and each socket's first error, end of stream or drop kept as
    /// how it ended.
    fn connector<C, IO>(
        self: &Arc<Self>,
        inner: C,
    ) -> impl Service<
        http::Uri,
        Response = TokioIo<Tracked<IO>>,
        Error = C::Error,
        Future = impl Send + use<C, IO>,
    >
    + Clone
    + Send
    + 'static
    + use<C, IO>
    where
        C: Service<http::Uri, Response = TokioIo<IO>> + Clone + Send + 'static,
        C::Future: Send,
        IO: Send,
    {
        let links = self.clone();
        tower::service_fn(move |uri: http::Uri| {
            let guard = links.opening();
            let inner = inner.clone();
            async move {
                let io = inner.oneshot(uri).await?;
                Ok(TokioIo::new(Tracked { io: io.into_inner(), guard, ended: false }))
            }
        })
    }
}

/// How a connection that ended without an error reads in an orphaned call's status
/// (hyper dropped it: a GOAWAY, a protocol error, the client itself).
const CLOSED: &str = "the connection closed";

/// Counts a connection (or its opening) for as long as it lives.
#[derive(Debug)]
struct LinkGuard(Arc<Links>);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        self.0.open.send_modify(|n| *n -= 1);
    }
}

/// A connection's socket, counted in its channel's [`Links`] until dropped.
#[derive(Debug)]
struct Tracked<IO> {
    io: IO,
    guard: LinkGuard,
    ended: bool,
}

impl<IO> Tracked<IO> {
    fn note<T>(&mut self, result: &Poll<io::Result<T>>) {
        if let Poll::Ready(Err(e)) = result {
            self.end(e.to_string());
        }
    }

    /// Keeps the socket's first end: what follows it (a write after a reset) is its echo.
    fn end(&mut self, how: String) {
        if !self.ended {
            self.ended = true;
            self.guard.0.ended(how);
        }
    }
}

impl<IO> Drop for Tracked<IO> {
    fn drop(&mut self) {
        self.end(CLOSED.into());
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.io).poll_read(cx, buf);
        self.note(&result);
        let read = buf.filled().len() - before;
        self.guard.0.received.fetch_add(read as u64, Ordering::Relaxed);
        // Nothing read into room for something is the end of the stream (a read into a
        // full buffer reads nothing too, and is not).
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() == before && buf.remaining() > 0 {
            self.end("the server closed the connection".into());
        }
        result
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note(&result);
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.note(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_flush(cx);
        self.note(&result);
        result
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_shutdown(cx);
        self.note(&result);
        result
    }
}

/// A tonic [`Channel`] whose calls fail with `UNAVAILABLE` once they have waited
/// [`ORPHAN_GRACE`] with no connection open or being opened (see the module's doc).
/// Made by [`LiveChannel::connect`] or [`LiveChannel::lazy`], which count the channel's
/// connections; one made from a tonic `Channel` (a channel the caller connected) is that
/// channel alone, with no check.
#[derive(Debug, Clone)]
pub struct LiveChannel {
    channel: Channel,
    links: Option<Arc<Links>>,
}

impl LiveChannel {
    /// `endpoint` with `http2`'s windows, connected now through `http2`'s connector
    /// (TLS when `tls` is set), its connections counted.
    pub async fn connect(
        endpoint: Endpoint,
        http2: Http2Settings,
        tls: Option<ClientTls>,
    ) -> Result<Self, tonic::transport::Error> {
        let links = Links::new();
        let channel =
            http2.endpoint(endpoint).connect_with_connector(links.connector(http2.connector(tls))).await?;
        Ok(Self { channel, links: Some(links) })
    }

    /// [`LiveChannel::connect`], connected on first use and again after a failure.
    pub fn lazy(endpoint: Endpoint, http2: Http2Settings, tls: Option<ClientTls>) -> Self {
        let links = Links::new();
        let channel =
            http2.endpoint(endpoint).connect_with_connector_lazy(links.connector(http2.connector(tls)));
        Self { channel, links: Some(links) }
    }
}

impl LiveChannel {
    /// Bytes read from this channel's connections so far (0 for a channel made from a
    /// tonic `Channel`, whose connections are not counted).
    pub fn bytes_received(&self) -> u64 {
        self.links.as_ref().map_or(0, |links| links.received.load(Ordering::Relaxed))
    }
}

impl From<Channel> for LiveChannel {
    fn from(channel: Channel) -> Self {
        Self { channel, links: None }
    }
}

/// Why an orphaned call failed: how its channel's last connection ended (the source of
/// its status, so that the SDK's advice for a reset or a closed connection applies).
#[derive(Debug)]
pub struct Orphaned {
    pub how: String,
}

impl fmt::Display for Orphaned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.how)
    }
}

impl std::error::Error for Orphaned {}

/// What an orphaned call fails with: `UNAVAILABLE` (another member may answer), with how
/// the connection ended as its source (tonic keeps a `Status` a service returns whole).
pub fn orphaned_status(how: &str) -> tonic::Status {
    let mut status = tonic::Status::unavailable(ORPHANED);
    status.set_source(Arc::new(Orphaned { how: how.to_owned() }));
    status
}

impl Service<http::Request<Body>> for LiveChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.channel.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let answer = self.channel.call(request);
        let Some(links) = self.links.clone() else {
            return Box::pin(async move { answer.await.map_err(Into::into) });
        };
        Box::pin(async move {
            tokio::select! {
                // An answer ready at the same moment as the check wins: it is the truth.
                biased;
                answer = answer => answer.map_err(Into::into),
                how = links.orphaned(ORPHAN_GRACE) => Err(orphaned_status(&how).into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_is_orphaned_only_after_the_grace_with_no_connection() {
        let links = Links::new();
        let grace = Duration::from_secs(5);
        // Nothing open from the start: orphaned after the grace, with a generic reason.
        let started = tokio::time::Instant::now();
        assert_eq!(links.orphaned(grace).await, CLOSED);
        assert_eq!(started.elapsed(), grace);

        // A connection open: never orphaned while it lives.
        let guard = links.opening();
        assert_eq!(links.open(), 1);
        assert!(tokio::time::timeout(grace * 10, links.orphaned(grace)).await.is_err());

        // It ends with an error: orphaned one grace after it is dropped, with the error.
        links.ended("connection reset by peer".into());
        let watching = tokio::spawn({
            let links = links.clone();
            async move { (links.orphaned(grace).await, tokio::time::Instant::now()) }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        let dropped_at = tokio::time::Instant::now();
        drop(guard);
        assert_eq!(links.open(), 0);
        let (how, at) = watching.await.unwrap();
        assert_eq!((how.as_str(), at - dropped_at), ("connection reset by peer", grace));

        // A reconnect within the grace starts the wait again.
        let watching = tokio::spawn({
            let links = links.clone();
            async move { (links.orphaned(grace).await, tokio::time::Instant::now()) }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        let again = links.opening();
        tokio::time::sleep(Duration::from_secs(4)).await;
        let dropped_at = tokio::time::Instant::now();
        drop(again);
        let (_, at) = watching.await.unwrap();
        assert_eq!(at - dropped_at, grace);
    }

    #[tokio::test]
    async fn a_socket_counts_from_its_connector_call_to_its_drop_and_keeps_how_it_first_ended() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let links = Links::new();
        let tcp = tower::service_fn(move |_uri: http::Uri| async move {
            tokio::net::TcpStream::connect(addr).await.map(TokioIo::new)
        });
        let connector = links.connector(tcp);
        let uri: http::Uri = format!("http://{addr}").parse().unwrap();
        let (io, accepted) = tokio::join!(connector.oneshot(uri), listener.accept());
        let mut io = io.unwrap().into_inner();
        assert_eq!(links.open(), 1);
        // What the server sends is counted as the client reads it.
        let (mut accepted, _) = accepted.unwrap();
        accepted.write_all(b"seven b").await.unwrap();
        let mut seven = [0u8; 7];
        io.read_exact(&mut seven).await.unwrap();
        assert_eq!(links.received.load(Ordering::Relaxed), 7);
        // The server closes: the client's read sees the end, which is kept; a write
        // after it (failing or not) and the drop change nothing of it.
        drop(accepted);
        let mut byte = [0u8; 1];
        assert_eq!(io.read(&mut byte).await.unwrap(), 0);
        assert_eq!(links.how_last_ended(), "the server closed the connection");
        let _ = io.write_all(b"x").await;
        drop(io);
        assert_eq!((links.open(), links.how_last_ended().as_str()), (0, "the server closed the connection"));

        // A connection being opened counts until its connect ends.
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let held = Arc::new(Mutex::new(Some(held)));
        let slow = links.connector(tower::service_fn(move |_uri: http::Uri| {
            let held = held.lock().unwrap().take().unwrap();
            async move {
                let _ = held.await;
                Err::<TokioIo<tokio::net::TcpStream>, _>(io::Error::from(io::ErrorKind::ConnectionRefused))
            }
        }));
        let connecting = tokio::spawn(slow.oneshot("http://127.0.0.1:1".parse().unwrap()));
        for _ in 0..1000 {
            if links.open() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(links.open(), 1, "a connect under way counts");
        release.send(()).unwrap();
        assert!(connecting.await.unwrap().is_err());
        assert_eq!(links.open(), 0, "a failed connect counts no more");
    }
}
