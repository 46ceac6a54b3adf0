//! The metrics listener: `GET /metrics` over HTTP/1.1 (hyper), over TLS when the server
//! serves TLS, optionally behind a bearer token (`--metrics-token-file`, as Prometheus'
//! `authorization.credentials_file` sends it).
//!
//! Bounded like the gRPC listeners: at most [`MAX_CONNECTIONS`] connections at once
//! (TLS handshakes included; more are closed on accept), a TLS handshake and a request
//! head each within their deadlines, request heads of at most [`MAX_HEAD_BYTES`], one
//! request per connection.

use std::{convert::Infallible, sync::Arc, time::Duration};

use crate::tls::ServerTls;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Semaphore,
};

/// Connections served at once. A scraper needs one; a few dozen covers several
/// Prometheus replicas and a person with curl, and caps what a flood can hold.
pub const MAX_CONNECTIONS: usize = 64;

/// Time a client has to send its request head once connected (and past TLS).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest request head read: a scrape's is a few hundred bytes.
pub const MAX_HEAD_BYTES: usize = 16 << 10;

/// Who may scrape.
#[derive(Clone)]
pub struct ScrapeAccess {
    /// The bearer token scrapes must carry, or `None` for anyone who can connect.
    pub token: Option<Arc<str>>,
}

impl std::fmt::Debug for ScrapeAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.debug_struct("ScrapeAccess").field("token", &self.token.as_ref().map(|_| "<redacted>")).finish()
    }
}

/// Serves `GET /metrics` on `listener` (TLS when `tls` is set, with the gRPC listener's
/// certificate) until `shutdown` resolves; `render` makes the page.
pub async fn serve_metrics<F>(
    listener: TcpListener,
    tls: Option<ServerTls>,
    access: ScrapeAccess,
    render: F,
    shutdown: impl std::future::Future<Output = ()>,
) where
    F: Fn() -> String + Send + Sync + 'static,
{
    let render = Arc::new(render);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let (socket, remote) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%remote, "metrics: too many connections; closed");
            continue;
        };
        let (render, tls, access) = (render.clone(), tls.clone(), access.clone());
        tokio::spawn(async move {
            let _slot = slot;
            match tls {
                None => serve_connection(socket, render, access).await,
                Some(tls) => match tls.accept_http1(socket).await {
                    Ok(socket) => serve_connection(socket, render, access).await,
                    Err(error) => tracing::info!(%remote, %error, "metrics: TLS handshake failed"),
                },
            }
        });
    }
}

async fn serve_connection<S, F>(socket: S, render: Arc<F>, access: ScrapeAccess)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn() -> String + Send + Sync + 'static,
{
    let service = service_fn(move |request: Request<Incoming>| {
        let response = answer(&request, &access, &*render);
        async move { Ok::<_, Infallible>(response) }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        .serve_connection(TokioIo::new(socket), service)
        .await;
    if let Err(error) = served {
        tracing::debug!(%error, "metrics connection ended with an error");
    }
}

fn answer(
    request: &Request<Incoming>,
    access: &ScrapeAccess,
    render: &(dyn Fn() -> String + Send + Sync),
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; version=0.0.4"));
        response
    };
    if !matches!(request.uri().path(), "/metrics" | "/") {
        return reply(StatusCode::NOT_FOUND, "try GET /metrics\n".into());
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "only GET /metrics\n".into());
    }
    if let Some(token) = &access.token {
        let sent = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !sent.is_some_and(|sent| same_secret(sent.as_bytes(), token.as_bytes())) {
            let mut response =
                reply(StatusCode::UNAUTHORIZED, "metrics need `Authorization: Bearer <token>`\n".into());
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    reply(StatusCode::OK, render())
}

/// Compares two secrets in time that depends only on their lengths.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"sct_abc", b"sct_abc"));
        assert!(!same_secret(b"sct_abc", b"sct_abd"));
        assert!(!same_secret(b"sct_ab", b"sct_abc"));
    }
}
