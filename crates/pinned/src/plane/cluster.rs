//! Instance-to-instance calls: `/<ns>/<id>/<rest>` from inside an
//! instance reaches the target's live instance wherever it is.
//!
//! In process when the target namespace is hosted here and the id is
//! resident (or there is no pinboard): the request goes through the
//! target's full route stack with a fresh attestation minted for the
//! target host's local audience. Otherwise through pinboard, with the
//! caller's identity headers, so the target sees the calling instance as
//! its attested caller. Outgoing `pinboard-*` and `Host` headers are always
//! dropped first, so user code that copies inbound headers can never
//! forward an attestation or a session.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Request};
use pinned_wire::headers;

use crate::plane::control::ControlPlane;
use crate::plane::pinboard::ClusterHost;
use crate::plane::switchboard::{Routed, Switchboard};

/// Why a cluster call could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The call would exceed the maximum subrequest depth (50).
    #[error("cluster call to {path:?} exceeds subrequest depth {max}")]
    TooDeep {
        /// The target path.
        path: String,
        /// The limit.
        max: u32,
    },
    /// The path is not `/<ns>/<id>/...`.
    #[error("cluster call path must be /<namespace>/<id>/..., got {0:?}")]
    BadPath(String),
    /// Local mode and the namespace is not hosted here.
    #[error("unknown cluster target {0:?}: no pinboard configured")]
    UnknownTarget(String),
    /// Control-plane mode without a live session.
    #[error("cluster call requires a live pinboard session")]
    NoSession,
    /// The worker is gone.
    #[error("the worker was dropped")]
    WorkerGone,
    /// The call through pinboard failed.
    #[error("cluster call through pinboard failed: {0}")]
    Transport(#[from] reqwest::Error),
    /// A request could not be built.
    #[error("invalid cluster request: {0}")]
    Request(#[from] http::Error),
}

/// A client for calls from one instance to others. Get one from
/// [`Context::cluster`](crate::Context::cluster) or, inside a handler,
/// [`Call::cluster`](crate::Call::cluster) (which carries the request's
/// subrequest depth).
#[derive(Clone)]
pub struct Cluster {
    /// Where in-process calls go first.
    switchboard: Switchboard,
    /// Where the rest go (behind pinboard).
    control: ControlPlane,
    caller: String,
    depth: i64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("caller", &self.caller)
            .field("depth", &self.depth)
            .finish()
    }
}

fn sanitized(headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if headers::is_pinboard_header(name) || name == http::header::HOST {
            continue;
        }
        kept.append(name.clone(), value.clone());
    }
    kept
}

impl Cluster {
    /// A client for instance `id` of namespace `ns`; `depth` is the depth
    /// of the call being made (caller depth + 1).
    pub(crate) fn new(
        switchboard: &Switchboard,
        control: &ControlPlane,
        ns: &str,
        id: &str,
        depth: i64,
    ) -> Self {
        Self {
            switchboard: switchboard.clone(),
            control: control.clone(),
            caller: format!("{ns}/{id}"),
            depth,
        }
    }

    /// `GET path`.
    ///
    /// # Errors
    ///
    /// See [`send`](Self::send).
    pub async fn get(&self, path: &str) -> Result<Response, ClusterError> {
        self.send(Request::get(path).body(Body::empty())?).await
    }

    /// `POST path` with `body`.
    ///
    /// # Errors
    ///
    /// See [`send`](Self::send).
    pub async fn post(&self, path: &str, body: impl Into<Body>) -> Result<Response, ClusterError> {
        self.send(Request::post(path).body(body.into())?).await
    }

    /// Sends `request`, whose URI is the data-plane path
    /// `/<ns>/<id>/<rest>[?query]`, and returns the target's response.
    ///
    /// # Errors
    ///
    /// A call deeper than 50, a malformed path, an unknown target without a
    /// pinboard, no live session, or a transport failure to pinboard.
    pub async fn send(&self, request: Request<Body>) -> Result<Response, ClusterError> {
        let path = request.uri().path().to_owned();
        if self.depth > i64::from(headers::MAX_SUBREQUEST_DEPTH) {
            // Not logged here: a handler that answers with it writes its
            // line once, naming the calling instance (`error_response`).
            return Err(ClusterError::TooDeep {
                path,
                max: headers::MAX_SUBREQUEST_DEPTH,
            });
        }
        let mut segments = path.strip_prefix('/').unwrap_or("").splitn(3, '/');
        let (Some(ns), Some(id)) = (segments.next(), segments.next()) else {
            return Err(ClusterError::BadPath(path));
        };
        let (ns, id) = (format!("/{ns}"), id.to_owned());
        let (mut parts, body) = request.into_parts();
        parts.headers = sanitized(&parts.headers);
        // The call's span, a child of the calling handler's: the target
        // (through pinboard or on this worker) continues its trace. Kept
        // until the response head is back; never entered across an await.
        let _call_span = {
            let span = tracing::debug_span!("cluster call", namespace = %ns, id = %id);
            pinned_edge::trace::inject(&span, &mut parts.headers);
            span
        };
        let request = Request::from_parts(parts, body);
        let request = match self
            .switchboard
            .call(ns, id, request, self.caller.clone(), self.depth)
            .await
        {
            Routed::Served(response) => return Ok(response),
            Routed::Elsewhere(request) => request,
            Routed::Gone => return Err(ClusterError::WorkerGone),
        };
        let Some(plane) = self.control.pinboard().cloned() else {
            return Err(ClusterError::UnknownTarget(path));
        };
        let session = plane.session().ok_or(ClusterError::NoSession)?;
        let (parts, body) = request.into_parts();
        let mut url = format!("{}{}", plane.config.pinboard_url, path);
        if let Some(query) = parts.uri.query() {
            url.push('?');
            url.push_str(query);
        }
        let mut outgoing = sanitized(&parts.headers);
        let pinboard_host = reqwest::Url::parse(&plane.config.pinboard_url)
            .ok()
            .and_then(|u| {
                u.host_str().map(|h| match u.port() {
                    Some(port) => format!("{h}:{port}"),
                    None => h.to_owned(),
                })
            })
            .unwrap_or_default();
        let host_header = match (&plane.config.hostname, plane.config.cluster_host) {
            (Some(hostname), ClusterHost::Hostname) => hostname.clone(),
            (Some(hostname), ClusterHost::Pinboard) => {
                if let Ok(value) = HeaderValue::from_str(hostname) {
                    outgoing.insert(headers::HOSTNAME, value);
                }
                pinboard_host
            }
            (None, _) => pinboard_host,
        };
        let identity = [
            (http::header::HOST, host_header),
            (headers::FROM, self.caller.clone()),
            (headers::SESSION, session.to_string()),
            (headers::SESSION_SECRET, plane.secret.to_string()),
            (headers::SUBREQUEST_DEPTH, self.depth.to_string()),
        ];
        for (name, value) in identity {
            if let Ok(value) = HeaderValue::from_str(&value) {
                outgoing.insert(name, value);
            }
        }
        let response = plane
            .http
            .request(parts.method, url)
            .headers(outgoing)
            .body(reqwest::Body::wrap_stream(body.into_data_stream()))
            .send()
            .await?;
        let mut builder = Response::builder().status(response.status());
        if let Some(headers) = builder.headers_mut() {
            headers.extend(response.headers().clone());
        }
        Ok(builder.body(Body::from_stream(response.bytes_stream()))?)
    }
}
