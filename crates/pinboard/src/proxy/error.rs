//! Every way the proxy answers other than with a worker's answer as it
//! came: one [`ProxyError`] (what went wrong, whose side it was on, whether
//! another attempt may fix it), each kind mapped once to its status, its
//! `detail` and its headers ([`ProxyError::into_response`]), as
//! `registry::error` does for `/registry/*`.
//!
//! Owns that mapping and the counters and log lines of a final answer
//! ([`ProxyError::observe`]); never decides whether to retry (the phase
//! that failed sets [`ProxyError::retry`] from `classify`'s table, and
//! the retry-or-respond phase reads it).
//!
//! | kind | status | `detail` |
//! | --- | --- | --- |
//! | [`BadHost`](ErrorKind::BadHost) | 400 | `missing Host header` / `more than one Host header` |
//! | [`NotAnId`](ErrorKind::NotAnId) | 404 | `Not Found` |
//! | [`BadId`](ErrorKind::BadId) | 400 | the id's fault (`pinned_wire::ids`) |
//! | [`Cluster`](ErrorKind::Cluster) | 403 credentials, 400 depth, 503 store | its text |
//! | [`World`](ErrorKind::World) | 400, 403 another world | its text |
//! | [`ClientBody`](ErrorKind::ClientBody) | 400 / 408, `Connection: close` | `request body could not be read` / `request body not received in time` |
//! | [`Unresolved`](ErrorKind::Unresolved) | 409 another world, else 503 | its text |
//! | [`FleetFull`](ErrorKind::FleetFull) | 503 | `instance capacity reached; retry` |
//! | [`BadWorkerAddress`](ErrorKind::BadWorkerAddress) | 502 | `worker address is not a valid URL` |
//! | [`UpstreamTimeout`](ErrorKind::UpstreamTimeout) | 504 | `worker did not answer in time` |
//! | [`Unreachable`](ErrorKind::Unreachable) | 503 | `owner unreachable; retry` |
//! | [`BrokeMidRequest`](ErrorKind::BrokeMidRequest) | 502 | `worker connection failed mid-request` |
//! | [`BrokeMidResponse`](ErrorKind::BrokeMidResponse) | 502 | `worker connection failed mid-response` |
//! | [`SessionChanged`](ErrorKind::SessionChanged) | 503 | `owner session changed; retry` |
//! | [`Refused`](ErrorKind::Refused) | the worker's | the worker's answer, relayed |
//! | [`NoUpgrade`](ErrorKind::NoUpgrade) | 400 | `connection cannot be upgraded` |
//! | [`BadHold`](ErrorKind::BadHold) | 502 | `worker's answer to a socket offer is not a hold` |
//!
//! Every 503 carries `Retry-After: 1`.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use pinned_wire::refusal::Refusal;

use super::body::BodyFault;
use super::classify::{RetryAction, Verdict};
use super::cluster::ClusterError;
use super::headers::HostError;
use super::respond::{relay_buffered, Buffered};
use crate::metrics::Metrics;
use crate::routes::ResolveError;
use crate::upstream::SendError;
use crate::world::WorldError;

/// The `detail` of the 504 answered when a worker did not answer in time.
pub const UPSTREAM_TIMEOUT_DETAIL: &str = "worker did not answer in time";

/// Whose side a failure was on (pingora's error source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The client: its request or its body.
    Client,
    /// pinboard itself: its placement store, its view of the fleet.
    Pinboard,
    /// The worker: its connection, its answer, its refusal.
    Worker,
}

/// What a retry changes first, and how long it waits (from `classify`'s
/// table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// What to change before the next attempt.
    pub action: RetryAction,
    /// Backoff before it, milliseconds.
    pub delay_ms: u64,
}

/// What went wrong (see the module doc's table for each one's answer).
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    /// An HTTP/1.1 request without `Host`, or one with two (RFC 9112 §3.2).
    #[error("{0}")]
    BadHost(HostError),
    /// The path names no id (`/`, `/counter`).
    #[error("Not Found")]
    NotAnId,
    /// The id segment is not an id.
    #[error("{0}")]
    BadId(&'static str),
    /// Cluster credentials refused (or the store failed checking them).
    #[error("{0}")]
    Cluster(ClusterError),
    /// A world header the client (or a cluster caller) got wrong.
    #[error("{0}")]
    World(WorldError),
    /// The client's body broke off or stalled.
    #[error("{0}")]
    ClientBody(BodyFault),
    /// No route: no worker, quarantine, another world's id, the store.
    #[error("{0}")]
    Unresolved(ResolveError),
    /// No worker can take the id after one refused it for capacity: the
    /// fleet is full, not gone.
    #[error("{}", Refusal::Capacity.detail())]
    FleetFull,
    /// The owner's advertise URL makes no request target.
    #[error("worker address is not a valid URL")]
    BadWorkerAddress,
    /// No response head within `--upstream-timeout-ms` (or a refusal's
    /// body not read within it). Never re-sent.
    #[error("{UPSTREAM_TIMEOUT_DETAIL}")]
    UpstreamTimeout,
    /// Nothing of the request reached the worker.
    #[error("owner unreachable; retry")]
    Unreachable(SendError),
    /// The connection failed after the request went out.
    #[error("worker connection failed mid-request")]
    BrokeMidRequest(SendError),
    /// The connection failed while a refusal's body was read.
    #[error("worker connection failed mid-response")]
    BrokeMidResponse,
    /// The worker does not know our session (it re-registered) and kept
    /// saying so: pinboard's problem, not the client's.
    #[error("owner session changed; retry")]
    SessionChanged,
    /// The worker refused; relayed as it came once no retry is left.
    #[error("the worker refused ({})", .0.head.status)]
    Refused(Buffered),
    /// The worker switched protocols for a client connection that cannot.
    #[error("connection cannot be upgraded")]
    NoUpgrade,
    /// The worker answered a socket offer with `pinboard-socket-held` but
    /// no valid hold (`pinned_wire::held::Hold`), or a handshake pinboard
    /// cannot complete.
    #[error("worker's answer to a socket offer is not a hold")]
    BadHold,
}

impl ErrorKind {
    /// Whose side it is on.
    pub fn side(&self) -> Source {
        match self {
            Self::BadHost(_)
            | Self::NotAnId
            | Self::BadId(_)
            | Self::Cluster(ClusterError::Credentials)
            | Self::Cluster(ClusterError::MalformedDepth | ClusterError::TooDeep)
            | Self::World(_)
            | Self::ClientBody(_)
            | Self::NoUpgrade => Source::Client,
            Self::Cluster(ClusterError::Store(_)) | Self::Unresolved(_) | Self::FleetFull => {
                Source::Pinboard
            }
            Self::BadWorkerAddress
            | Self::UpstreamTimeout
            | Self::Unreachable(_)
            | Self::BrokeMidRequest(_)
            | Self::BrokeMidResponse
            | Self::SessionChanged
            | Self::BadHold
            | Self::Refused(_) => Source::Worker,
        }
    }

    /// The status the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadHost(_) | Self::BadId(_) | Self::NoUpgrade => StatusCode::BAD_REQUEST,
            Self::NotAnId => StatusCode::NOT_FOUND,
            Self::Cluster(ClusterError::Credentials) => StatusCode::FORBIDDEN,
            Self::Cluster(ClusterError::MalformedDepth | ClusterError::TooDeep) => {
                StatusCode::BAD_REQUEST
            }
            Self::Cluster(ClusterError::Store(_)) => StatusCode::SERVICE_UNAVAILABLE,
            Self::World(e) => e.status(),
            Self::ClientBody(fault) => fault.status(),
            Self::Unresolved(ResolveError::OtherWorld) => StatusCode::CONFLICT,
            Self::Unresolved(_) | Self::FleetFull | Self::Unreachable(_) | Self::SessionChanged => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::BadWorkerAddress
            | Self::BrokeMidRequest(_)
            | Self::BrokeMidResponse
            | Self::BadHold => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::Refused(answer) => answer.head.status,
        }
    }

    /// Whether the route this attempt used is dropped when the request
    /// ends on it: the worker failed or refused for the id, so the next
    /// request resolves afresh.
    pub fn drops_route(&self) -> bool {
        matches!(
            self,
            Self::UpstreamTimeout
                | Self::Unreachable(_)
                | Self::BrokeMidRequest(_)
                | Self::SessionChanged
                | Self::Refused(_)
        )
    }
}

/// What a phase returns: its output, or the request's error, boxed (as
/// pingora's `BError`) so that the success path moves one word for it, not
/// the largest kind (`proxy-bench`: boxing it and the context's rare parts
/// took about 450 instructions off a proxied request).
pub type ProxyResult<T> = Result<T, Box<ProxyError>>;

/// A failed proxied request (see the module doc).
#[derive(Debug)]
pub struct ProxyError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Whose side it was on ([`ErrorKind::side`]).
    pub source: Source,
    /// Whether another attempt may fix it, and how; `None`: answer now.
    pub retry: Option<Retry>,
}

impl std::fmt::Display for ProxyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.kind.fmt(f)
    }
}

impl std::error::Error for ProxyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.kind)
    }
}

impl From<ErrorKind> for ProxyError {
    fn from(kind: ErrorKind) -> Self {
        Self {
            source: kind.side(),
            kind,
            retry: None,
        }
    }
}

impl From<ErrorKind> for Box<ProxyError> {
    fn from(kind: ErrorKind) -> Self {
        Box::new(ProxyError::from(kind))
    }
}

impl ProxyError {
    /// `kind`, retried as `verdict` says (`Relay`: not retried).
    pub fn retried(kind: ErrorKind, verdict: Verdict) -> Box<Self> {
        let mut e = Box::<Self>::from(kind);
        if let Verdict::Retry { action, delay_ms } = verdict {
            e.retry = Some(Retry { action, delay_ms });
        }
        e
    }

    /// A request refused for its `Host` lines.
    pub fn bad_host(e: HostError) -> Box<Self> {
        ErrorKind::BadHost(e).into()
    }

    /// A request whose body the client broke.
    pub fn client_body(fault: BodyFault) -> Box<Self> {
        ErrorKind::ClientBody(fault).into()
    }

    /// Count and log a request that ends on this error: once per request,
    /// whatever phase failed. `key`: the id's cache key, once known.
    pub fn observe(&self, metrics: &Metrics, key: Option<&str>) {
        match &self.kind {
            ErrorKind::ClientBody(_) => {
                metrics.proxy_client_body_errors.inc();
            }
            ErrorKind::Unresolved(ResolveError::OtherWorld) => {}
            ErrorKind::Unresolved(e) => {
                metrics.proxy_unavailable.inc();
                if let ResolveError::Store(err) = e {
                    if let Some(seen) = pinned_edge::logging::repeats().failed(
                        "pinboard proxy",
                        "store",
                        pinned_edge::logging::Chain(&err),
                    ) {
                        tracing::warn!(target: "pinboard::proxy", error = %seen, failures = seen.failures, "placement store failed");
                    }
                }
            }
            ErrorKind::FleetFull => {
                metrics.proxy_unavailable.inc();
            }
            ErrorKind::UpstreamTimeout => {
                metrics.proxy_upstream_timeouts.inc();
                tracing::debug!(target: "pinboard::proxy", key, "worker did not answer in time");
            }
            ErrorKind::Unreachable(error) | ErrorKind::BrokeMidRequest(error) => {
                tracing::debug!(target: "pinboard::proxy", error = %pinned_edge::logging::Chain(error), "worker unreachable");
            }
            _ => {}
        }
    }
}

impl IntoResponse for ProxyError {
    /// The one mapping from a failure to what the client gets.
    fn into_response(self) -> Response {
        let status = self.kind.status();
        // The rest of a broken body cannot be told from a next request.
        let close = matches!(self.kind, ErrorKind::ClientBody(_));
        let detail = match self.kind {
            ErrorKind::Refused(answer) => return relay_buffered(answer),
            kind => kind.to_string(),
        };
        let mut res = detail_response(status, &detail);
        if close {
            res.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        res
    }
}

/// `{"detail": …}` with `status` (and `Retry-After: 1` on 503).
pub fn detail_response(status: StatusCode, detail: &str) -> Response {
    let mut res = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        pinned_wire::refusal::detail_body(detail),
    )
        .into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        res.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    res
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// Status, `detail`, `Retry-After` and `Connection` of `kind`'s answer.
    async fn answer(kind: ErrorKind) -> (u16, String, bool, bool) {
        let res = ProxyError::from(kind).into_response();
        let retry_after = res.headers().get(header::RETRY_AFTER).is_some();
        let close = res.headers().get(header::CONNECTION).is_some();
        let status = res.status().as_u16();
        let body = res.into_body().collect().await.expect("body").to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let detail = json["detail"].as_str().expect("detail").to_owned();
        (status, detail, retry_after, close)
    }

    /// The client-visible answers the proxy gave before it had one error
    /// type, byte for byte.
    #[tokio::test]
    async fn every_kind_answers_as_the_wire_says() {
        let cases = [
            (
                ErrorKind::BadHost(HostError::Missing),
                400,
                "missing Host header",
            ),
            (
                ErrorKind::BadHost(HostError::Repeated),
                400,
                "more than one Host header",
            ),
            (ErrorKind::NotAnId, 404, "Not Found"),
            (
                ErrorKind::Cluster(ClusterError::Credentials),
                403,
                "invalid cluster credentials",
            ),
            (
                ErrorKind::Cluster(ClusterError::MalformedDepth),
                400,
                "malformed subrequest depth",
            ),
            (
                ErrorKind::World(WorldError::EnvWithoutHostname),
                400,
                "Pinboard-Env requires Pinboard-Hostname (the hostless world has no environments)",
            ),
            (
                ErrorKind::World(WorldError::OtherWorld),
                403,
                "a cluster call stays in its caller's world (hostname and env of its registration)",
            ),
            (
                ErrorKind::Unresolved(ResolveError::OtherWorld),
                409,
                "this id is placed in another hostname or env world",
            ),
            (
                ErrorKind::Unresolved(ResolveError::NoWorker),
                503,
                "no live worker hosts this namespace",
            ),
            (
                ErrorKind::Unresolved(ResolveError::Quarantined),
                503,
                "pinboard is starting; retry",
            ),
            (
                ErrorKind::FleetFull,
                503,
                "instance capacity reached; retry",
            ),
            (
                ErrorKind::BadWorkerAddress,
                502,
                "worker address is not a valid URL",
            ),
            (
                ErrorKind::UpstreamTimeout,
                504,
                "worker did not answer in time",
            ),
            (
                ErrorKind::Unreachable(SendError::Dropped("x".into())),
                503,
                "owner unreachable; retry",
            ),
            (
                ErrorKind::BrokeMidRequest(SendError::Dropped("x".into())),
                502,
                "worker connection failed mid-request",
            ),
            (
                ErrorKind::BrokeMidResponse,
                502,
                "worker connection failed mid-response",
            ),
            (
                ErrorKind::SessionChanged,
                503,
                "owner session changed; retry",
            ),
            (ErrorKind::NoUpgrade, 400, "connection cannot be upgraded"),
            (
                ErrorKind::BadHold,
                502,
                "worker's answer to a socket offer is not a hold",
            ),
        ];
        for (kind, status, detail) in cases {
            let (got_status, got_detail, retry_after, close) = answer(kind).await;
            assert_eq!((got_status, got_detail.as_str()), (status, detail));
            assert_eq!(
                retry_after,
                status == 503,
                "{detail}: Retry-After on 503 only"
            );
            assert!(!close, "{detail}: the connection stays open");
        }
        for (fault, status, detail) in [
            (BodyFault::Unreadable, 400, "request body could not be read"),
            (
                BodyFault::TimedOut,
                408,
                "request body not received in time",
            ),
        ] {
            let got = answer(ErrorKind::ClientBody(fault)).await;
            assert_eq!(got, (status, detail.to_owned(), false, true));
        }
    }

    #[test]
    fn only_a_worker_failure_drops_the_route() {
        assert!(ErrorKind::UpstreamTimeout.drops_route());
        assert!(ErrorKind::SessionChanged.drops_route());
        assert!(!ErrorKind::BrokeMidResponse.drops_route());
        assert!(!ErrorKind::ClientBody(BodyFault::TimedOut).drops_route());
        assert!(!ErrorKind::Unresolved(ResolveError::NoWorker).drops_route());
        assert_eq!(
            ErrorKind::ClientBody(BodyFault::TimedOut).side(),
            Source::Client
        );
        assert_eq!(ErrorKind::UpstreamTimeout.side(), Source::Worker);
        assert_eq!(ErrorKind::FleetFull.side(), Source::Pinboard);
    }
}
