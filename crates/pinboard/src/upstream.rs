//! The pooled HTTP/1 client pinboard uses to reach workers (data plane and
//! challenge probes).
//!
//! Owns connection pooling and keep-alive settings; never decides what to
//! send or how to react (that is `proxy` and `challenge`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Request body sent upstream: buffered (replayable) or streamed through.
pub type UpstreamBody = Either<Full<Bytes>, axum::body::Body>;

/// The pooled client.
pub type Upstream = Client<HttpConnector, UpstreamBody>;

/// Idle pooled connections kept per worker.
const POOL_MAX_IDLE_PER_HOST: usize = 1024;
/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connect timeout to a worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A client with keep-alive pooling, `TCP_NODELAY` and a connect timeout.
pub fn client() -> Upstream {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(connector)
}

/// An empty replayable body.
pub fn empty() -> UpstreamBody {
    Either::Left(Full::new(Bytes::new()))
}
