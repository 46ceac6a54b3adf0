//! Load shedding for the hub and the spoke: a global cap on requests in flight,
//! answered with RESOURCE_EXHAUSTED.
//!
//! tonic's own `concurrency_limit_per_connection` + `load_shed` count per connection and
//! release the slot when the response *headers* are ready, so one client with many
//! connections, or many open `StreamShard` bodies, is not bounded. This layer counts
//! across all connections and holds the slot until the response *body* is finished or
//! dropped, so memory is bounded by `limit x (read-ahead + one message)`.
//!
//! Health and reflection are exempt: an overloaded server is still alive, and a
//! Kubernetes probe that fails under load would restart the pod that was doing the work.

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use futures::future::{BoxFuture, FutureExt};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tonic::body::Body;
use tower::{Layer, Service};

/// Paths never shed (prefixes of gRPC method paths).
const EXEMPT_PREFIXES: &[&str] = &["/grpc.health.v1.", "/grpc.reflection."];

/// Caps requests in flight across all connections; see the module docs.
#[derive(Debug, Clone)]
pub struct ShedLayer {
    permits: Arc<Semaphore>,
    limit: usize,
}

impl ShedLayer {
    pub fn new(limit: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(limit)), limit }
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed { inner, permits: self.permits.clone(), limit: self.limit }
    }
}

/// The service [`ShedLayer`] builds.
#[derive(Debug, Clone)]
pub struct Shed<S> {
    inner: S,
    permits: Arc<Semaphore>,
    limit: usize,
}

impl<S, ReqBody> Service<http::Request<ReqBody>> for Shed<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let path = request.uri().path();
        if EXEMPT_PREFIXES.iter().any(|prefix| path.starts_with(prefix)) {
            return self.inner.call(request).boxed();
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            tracing::warn!(limit = self.limit, path, "shedding request: concurrency limit reached");
            let status = tonic::Status::resource_exhausted(format!(
                "server is at its limit of {} requests in flight (--max-concurrency); retry with backoff",
                self.limit
            ));
            return futures::future::ready(Ok(status.into_http())).boxed();
        };
        self.inner
            .call(request)
            .map(|result| {
                result.map(|response| {
                    // The body owns the permit: it is released when the last chunk is sent
                    // or the client goes away.
                    response.map(|body| {
                        Body::new(body.map_frame(move |frame| {
                            let _held = &permit;
                            frame
                        }))
                    })
                })
            })
            .boxed()
    }
}
