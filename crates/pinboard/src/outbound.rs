//! Everything pinboard sends to workers goes through one [`Outbound`]:
//! proxied client requests, the sweeper's `_alarm` / `_wake`, and challenge
//! probes.
//!
//! Owns the choice of transport; never decides what to send or how to react
//! to an answer (that is `proxy`, `sweeper` and `challenge`). Production
//! uses [`Outbound::Http`]: the per-worker [`Pool`](crate::upstream::Pool)
//! for the proxy's hot path and the pooled client for the rest. Anything
//! else (the reference's simulation, tests) plugs in an [`Exchange`]: one
//! buffered request, one buffered answer.
//!
//! # Hot path
//!
//! `Outbound` is an enum, not a `dyn` object, so the proxy's send is an
//! ordinary `async fn` (no boxed future per request); the response body is
//! [`ResBody`], an enum over the pooled body and a buffered one.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::upstream::{
    self, BodyError, PooledBody, SendError, Stamp, Upstream, UpstreamBody, UpstreamTls, WorkerConn,
};

/// A boxed future, as [`Exchange`] returns it.
pub use futures_util::future::BoxFuture;

/// A transport that exchanges one buffered request for one buffered answer.
pub trait Exchange: Send + Sync + 'static {
    /// Send `request` (its URI is origin-form or absolute; only its path
    /// and query count) to the worker whose advertise URL is `origin`.
    ///
    /// # Errors
    ///
    /// [`SendError`]: nothing was sent ([`SendError::Connect`] style) or
    /// the connection died under the request ([`SendError::Dropped`]).
    fn exchange(
        &self,
        origin: &str,
        request: Request<Bytes>,
    ) -> BoxFuture<'_, Result<Response<Bytes>, SendError>>;
}

/// The outbound side of a pinboard node (see the module doc).
#[derive(Clone)]
pub enum Outbound {
    /// Real sockets: per-worker pools for the proxy, a pooled client for
    /// the sweeper and challenge probes, both speaking TLS to `https://`
    /// workers.
    Http(Box<Upstream>, UpstreamTls),
    /// Another transport (a simulation, a test double).
    Exchange(Arc<dyn Exchange>),
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Http(..) => f.write_str("Outbound::Http"),
            Self::Exchange(_) => f.write_str("Outbound::Exchange"),
        }
    }
}

impl Outbound {
    /// Real sockets with the default pool settings, trusting `tls`'s roots
    /// for `https://` workers.
    pub fn http(tls: UpstreamTls) -> Self {
        Self::Http(Box::new(upstream::client(&tls)), tls)
    }

    /// What the per-worker pools handshake with (`None` for a transport
    /// that is not sockets).
    pub fn tls(&self) -> Option<&UpstreamTls> {
        match self {
            Self::Http(_, tls) => Some(tls),
            Self::Exchange(_) => None,
        }
    }

    /// The proxy's send: `head` (an origin-form URI, the client's fields)
    /// with `stamp`'s fields (`Host` among them) goes to `worker` over its
    /// keep-alive pool; `upgrade`: it asks to switch protocols. The head is
    /// borrowed: a retry sends it again.
    ///
    /// # Errors
    ///
    /// [`SendError`], as [`Pool::send`](crate::upstream::Pool::send).
    pub async fn send(
        &self,
        worker: &WorkerConn,
        head: &http::request::Parts,
        stamp: &Stamp<'_>,
        upgrade: bool,
        body: UpstreamBody,
    ) -> Result<Response<ResBody>, SendError> {
        match self {
            Self::Http(..) => worker
                .pool
                .send(head, stamp, upgrade, body)
                .await
                .map(|res| res.map(|body| ResBody::Pooled { body })),
            Self::Exchange(x) => {
                let request = upstream::stamped(head, stamp, body);
                exchange(&**x, &worker.record.advertise_url, request).await
            }
        }
    }

    /// A call with an absolute URI below `origin` (sweeper, challenge).
    ///
    /// # Errors
    ///
    /// [`SendError`]: the worker could not be reached or the connection
    /// failed.
    pub async fn call(
        &self,
        origin: &str,
        request: Request<UpstreamBody>,
    ) -> Result<Response<ResBody>, SendError> {
        match self {
            Self::Http(client, _) => client
                .request(request)
                .await
                .map(|res| res.map(|body| ResBody::Incoming { body }))
                .map_err(SendError::Client),
            Self::Exchange(x) => exchange(&**x, origin, request).await,
        }
    }
}

async fn exchange(
    x: &dyn Exchange,
    origin: &str,
    request: Request<UpstreamBody>,
) -> Result<Response<ResBody>, SendError> {
    let (parts, body) = request.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(|e| SendError::Dropped(format!("request body: {e}")))?
        .to_bytes();
    let res = x
        .exchange(origin, Request::from_parts(parts, bytes))
        .await?;
    Ok(res.map(|body| ResBody::Buffered {
        body: Full::new(body),
    }))
}

pin_project_lite::pin_project! {
    /// A worker's response body: pooled (proxy), from the pooled client
    /// (sweeper, challenge), or buffered (an [`Exchange`]).
    /// Each variant holds its `body`.
    #[allow(missing_docs)]
    #[project = ResBodyProj]
    pub enum ResBody {
        /// From a per-worker pool.
        Pooled {
            #[pin]
            body: PooledBody,
        },
        /// From the generic pooled client.
        Incoming {
            #[pin]
            body: Incoming,
        },
        /// Buffered by an [`Exchange`].
        Buffered {
            #[pin]
            body: Full<Bytes>,
        },
    }
}

impl ResBody {
    /// The whole body is in memory already: reading it waits for nothing
    /// (so no pause of the worker's can hold it up).
    pub fn in_memory(&self) -> bool {
        match self {
            Self::Pooled { body } => body.in_memory(),
            Self::Incoming { .. } => false,
            Self::Buffered { .. } => true,
        }
    }
}

impl Body for ResBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.project() {
            ResBodyProj::Pooled { body } => body.poll_frame(cx),
            ResBodyProj::Incoming { body } => body.poll_frame(cx).map_err(Into::into),
            ResBodyProj::Buffered { body } => match body.poll_frame(cx) {
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Pooled { body } => body.is_end_stream(),
            Self::Incoming { body } => body.is_end_stream(),
            Self::Buffered { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Pooled { body } => body.size_hint(),
            Self::Incoming { body } => body.size_hint(),
            Self::Buffered { body } => body.size_hint(),
        }
    }
}
