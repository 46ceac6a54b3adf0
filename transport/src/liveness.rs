//! A client channel whose calls cannot wait forever on a connection that is gone.
//!
//! hyper's HTTP/2 client can lose a request it takes while its connection is failing:
//! the connection task ends with the I/O error and the request's future is never woken
//! (seen with `shardcache ls` over `http://` to a hub that serves TLS, which resets the
//! connection: about 1 run in 100 hung until killed, with no socket left open; the
//! `first_hour_errors` test hung CI so for 85 minutes). The other 99 fail at once with
//! the reset, as they should.
//!
//! A tonic channel has one connection at a time and opens another only when a call asks
//! for one (its `Reconnect`), so a call that is still waiting while the channel has no
//! connection open, and none being opened, has nothing left that could answer it.
//! [`Links`] counts a channel's connections, from the connector's call to the drop of
//! the socket (hyper drops it when the connection ends), and [`LiveChannel`] fails a
//! call that has waited [`ORPHAN_GRACE`] with none, with `UNAVAILABLE` and how the last
//! one ended, which is what the call should have answered. Calls answered in the usual
//! way are untouched: the check only watches a counter.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::watch,
};
use tonic::{body::Body, transport::Channel};
use tower::{BoxError, Service, ServiceExt};

/// How long a call may wait with no connection open or being opened before it is
/// failed. Between a call and its connector being asked there is only the hand-off to
/// the channel's worker task (microseconds), so this is slack for a starved machine, not
/// a deadline on the server: a call on an open connection waits as long as it needs.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(5);

/// The connections of one channel: how many are open or being opened, and how the last
/// one to fail ended.
#[derive(Debug)]
pub struct Links {
    open: watch::Sender<usize>,
    last_end: Mutex<Option<String>>,
}

impl Links {
    pub fn new() -> Arc<Self> {
        Arc::new(Self { open: watch::Sender::new(0), last_end: Mutex::new(None) })
    }

    /// How many connections are open or being opened.
    pub fn open(&self) -> usize {
        *self.open.borrow()
    }

    /// One more connection, counted until the returned guard is dropped.
    fn opening(self: &Arc<Self>) -> LinkGuard {
        self.open.send_modify(|n| *n += 1);
        LinkGuard(self.clone())
    }

    fn ended(&self, how: String) {
        *self.last_end.lock().unwrap_or_else(|e| e.into_inner()) = Some(how);
    }

    fn how_last_ended(&self) -> String {
        self.last_end.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_else(|| "it closed".into())
    }

    /// Resolves once no connection has been open or opening for `grace` at a stretch,
    /// with how the last one ended; pending for as long as one is.
    pub async fn orphaned(&self, grace: Duration) -> String {
        let mut open = self.open.subscribe();
        loop {
            // (A `Ref` from `wait_for` holds the value's lock: none is kept across an await.)
            let _ = open.wait_for(|n| *n == 0).await.is_ok();
            match tokio::time::timeout(grace, open.wait_for(|n| *n > 0)).await {
                Err(_) => return self.how_last_ended(),
                Ok(changed) => drop(changed),
            }
        }
    }

    /// `inner`, a connector, with each connection it makes counted here: from its call
    /// (so a connection being opened counts) to the drop of the socket, and each
    /// socket's first error or end of stream kept as how it ended.
    pub fn connector<C, IO>(
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
pub struct Tracked<IO> {
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

    fn end(&mut self, how: String) {
        if !self.ended {
            self.ended = true;
            self.guard.0.ended(how);
        }
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
/// Made from a channel whose connector was [`Links::connector`]; one made
/// [`LiveChannel::untracked`] (a channel the SDK did not connect) is the channel alone.
#[derive(Debug, Clone)]
pub struct LiveChannel {
    channel: Channel,
    links: Option<Arc<Links>>,
}

impl LiveChannel {
    /// `channel`, whose connector counts its connections in `links`.
    pub fn new(channel: Channel, links: Arc<Links>) -> Self {
        Self { channel, links: Some(links) }
    }

    /// A channel connected elsewhere, whose connections nothing counts: no check.
    pub fn untracked(channel: Channel) -> Self {
        Self { channel, links: None }
    }

    /// The channel itself (for clients of other services, such as health checks).
    pub fn channel(&self) -> &Channel {
        &self.channel
    }
}

impl From<Channel> for LiveChannel {
    fn from(channel: Channel) -> Self {
        Self::untracked(channel)
    }
}

/// How the message of an orphaned call's status begins.
pub const ORPHANED: &str = "the connection closed before the server answered";

/// What an orphaned call fails with: `UNAVAILABLE` (another member may answer), and
/// words that say how the connection ended, so that the SDK's advice for a refused or
/// reset connection applies to it too.
pub fn orphaned_status(how: &str) -> tonic::Status {
    tonic::Status::unavailable(format!("{ORPHANED} ({how})"))
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
        assert_eq!(links.orphaned(grace).await, "it closed");
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
    async fn a_socket_counts_from_its_connector_call_to_its_drop_and_keeps_how_it_ended() {
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
        // The server closes: the client's read sees the end, which is kept.
        drop(accepted.unwrap());
        let mut byte = [0u8; 1];
        assert_eq!(io.read(&mut byte).await.unwrap(), 0);
        assert_eq!(links.how_last_ended(), "the server closed the connection");
        let _ = io.write_all(b"x").await;
        drop(io);
        assert_eq!(links.open(), 0);

        // A connector that fails counts nothing afterwards.
        let refused = links.connector(tower::service_fn(|_uri: http::Uri| async {
            Err::<TokioIo<tokio::net::TcpStream>, _>(io::Error::from(io::ErrorKind::ConnectionRefused))
        }));
        assert!(refused.oneshot("http://127.0.0.1:1".parse().unwrap()).await.is_err());
        assert_eq!(links.open(), 0);
    }
}
