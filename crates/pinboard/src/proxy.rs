//! The data plane: forward `/<ns>/<id><rest>` to the worker that owns the id.
//!
//! Owns the request lifecycle, read top to bottom in [`handle`]: split the
//! path, validate the id, verify cluster credentials, prepare the body,
//! resolve (cached), forward, classify the answer, maybe retry, respond.
//! Never forwards a client's `pinboard-*` header or the worker's raw secret;
//! adds `Pinboard-Attestation` (minted with the owner's secret, `aud` = its
//! session id, plus `caller`/`depth` for cluster calls) and `Pinboard-Epoch`.
//!
//! # Retries
//!
//! At most `--proxy-retries` re-sends, decided by [`classify()`]. A request is
//! only re-sent when resending is safe: its body is buffered (known length up
//! to `--retry-body-limit`) or empty. Streaming bodies get exactly one
//! attempt, and the worker's answer is relayed as is. A refusal that stays
//! refused after the last retry is relayed to the client (with its
//! `Retry-After`); a connect failure that persists answers 503 + `Retry-After`.

pub mod classify;
pub mod cluster;
pub mod path;
pub mod resolve;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{self, HeaderName};
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Request, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::{BodyExt, Either, Full};
use hyper_util::rt::TokioIo;
use pinned_wire::headers::{is_pinboard_header, ATTESTATION, EPOCH, REFUSAL};
use pinned_wire::ids::decode_id_segment;

use self::classify::{classify, classify_transport, worth_reading, RetryAction, Verdict};
use self::cluster::{Caller, ClusterError};
use self::resolve::{Avoid, ResolveError, WorkerConn};
use crate::placement::PlacementStore;
use crate::server::App;
use crate::upstream::{PooledBody, UpstreamBody};

/// Largest refusal body read to classify it.
pub(crate) const MAX_REFUSAL_BODY: u64 = 4096;

/// Proxy settings.
#[derive(Debug, Clone, Copy)]
pub struct ProxySettings {
    /// Re-sends after a retryable answer.
    pub retries: u32,
    /// Largest request body buffered for re-sending.
    pub retry_body_limit: usize,
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

/// Hop-by-hop headers never forwarded (RFC 9110 §7.6.1), plus `host`.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::HOST,
];

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get(header::CONNECTION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Remove client-supplied `pinboard-*` and hop-by-hop headers in place.
fn sanitize(headers: &mut HeaderMap, upgrade: bool) {
    if headers.keys().any(is_pinboard_header) {
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|n| is_pinboard_header(n))
            .cloned()
            .collect();
        for n in names {
            headers.remove(n);
        }
    }
    for h in &HOP_BY_HOP {
        headers.remove(h);
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// The request body across attempts.
enum ReqBody {
    /// Buffered: can be sent again.
    Replay(Bytes),
    /// Streamed: one attempt only.
    Once(Option<Body>),
}

impl ReqBody {
    fn replayable(&self) -> bool {
        matches!(self, ReqBody::Replay(_))
    }

    fn for_attempt(&mut self) -> UpstreamBody {
        match self {
            ReqBody::Replay(b) => Either::Left(Full::new(b.clone())),
            ReqBody::Once(b) => match b.take() {
                Some(b) => Either::Right(b),
                None => crate::upstream::empty(),
            },
        }
    }
}

async fn prepare_body(body: Body, limit: usize) -> Result<ReqBody, Response> {
    match body.size_hint().exact() {
        Some(0) => Ok(ReqBody::Replay(Bytes::new())),
        Some(n) if n <= limit as u64 => match body.collect().await {
            Ok(c) => Ok(ReqBody::Replay(c.to_bytes())),
            Err(_) => Err(detail_response(
                StatusCode::BAD_REQUEST,
                "request body could not be read",
            )),
        },
        _ => Ok(ReqBody::Once(Some(body))),
    }
}

fn cluster_refusal(e: ClusterError) -> Response {
    match e {
        ClusterError::Credentials => detail_response(StatusCode::FORBIDDEN, &e.to_string()),
        ClusterError::MalformedDepth | ClusterError::TooDeep => {
            detail_response(StatusCode::BAD_REQUEST, &e.to_string())
        }
        ClusterError::Store(_) => detail_response(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

fn relay(res: http::Response<PooledBody>) -> Response {
    let (mut parts, body) = res.into_parts();
    for h in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::TRANSFER_ENCODING,
    ] {
        parts.headers.remove(h);
    }
    Response::from_parts(parts, Body::new(body))
}

fn relay_buffered(parts: http::response::Parts, body: Bytes) -> Response {
    let mut parts = parts;
    for h in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::TRANSFER_ENCODING,
    ] {
        parts.headers.remove(h);
    }
    Response::from_parts(parts, Body::from(body))
}

/// Switch protocols: answer 101 and splice the two upgraded connections.
fn switch(
    mut res: http::Response<PooledBody>,
    client: Option<hyper::upgrade::OnUpgrade>,
    app: &App<impl PlacementStore>,
) -> Response {
    let upstream = hyper::upgrade::on(&mut res);
    let Some(client) = client else {
        return detail_response(StatusCode::BAD_REQUEST, "connection cannot be upgraded");
    };
    app.metrics.proxy_upgrades.inc();
    tokio::spawn(async move {
        let (client, upstream) = tokio::join!(client, upstream);
        if let (Ok(client), Ok(upstream)) = (client, upstream) {
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
    });
    let (parts, _) = res.into_parts();
    Response::from_parts(parts, Body::empty())
}

/// The proxy handler: every path no other route claims.
pub async fn handle<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    req: Request<Body>,
) -> Response {
    app.metrics.proxy_requests.inc();
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path();
    let Some(target) = path::split(path) else {
        return detail_response(StatusCode::NOT_FOUND, "Not Found");
    };
    let id = match decode_id_segment(target.raw_id) {
        Ok(id) => id,
        Err(e) => return detail_response(StatusCode::BAD_REQUEST, e.detail()),
    };
    let key: Cow<'_, str> = match &id {
        Cow::Borrowed(_) => Cow::Borrowed(target.key),
        Cow::Owned(id) => Cow::Owned(format!("{}/{id}", target.ns)),
    };
    let caller = match cluster::verify(&parts.headers, &app.directory).await {
        Ok(c) => c,
        Err(e) => return cluster_refusal(e),
    };
    let upgrade = is_upgrade(&parts.headers);
    let on_upgrade = if upgrade {
        parts.extensions.remove::<hyper::upgrade::OnUpgrade>()
    } else {
        None
    };
    let mut body = match prepare_body(body, app.proxy.retry_body_limit).await {
        Ok(b) => b,
        Err(res) => return res,
    };
    sanitize(&mut parts.headers, upgrade);
    let path_and_query = match parts.uri.path_and_query() {
        Some(pq) => pq.clone(),
        None => PathAndQuery::from_static("/"),
    };
    forward(
        &app,
        &parts,
        &path_and_query,
        (&key, target.ns, &id),
        caller.as_ref(),
        &mut body,
        on_upgrade,
    )
    .await
}

/// Resolve, send, classify, retry.
async fn forward<S: PlacementStore>(
    app: &App<S>,
    parts: &http::request::Parts,
    path_and_query: &PathAndQuery,
    (key, ns, id): (&str, &str, &str),
    caller: Option<&Caller>,
    body: &mut ReqBody,
    mut on_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Response {
    let retries = if body.replayable() {
        app.proxy.retries
    } else {
        0
    };
    let mut avoid_stale: Option<(String, u64)> = None;
    let mut exclude: Vec<String> = Vec::new();
    let mut refresh = false;
    let mut attempt = 0;
    loop {
        let avoid = Avoid {
            stale: avoid_stale.as_ref().map(|(s, e)| (s.as_str(), *e)),
            exclude: &exclude,
            refresh,
        };
        let route = match app.directory.resolve(key, ns, id, avoid).await {
            Ok(r) => r,
            Err(e) => {
                app.metrics.proxy_unavailable.inc();
                if let ResolveError::Store(err) = &e {
                    tracing::warn!(target: "pinboard::proxy", error = %err, "placement store failed");
                }
                return detail_response(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
            }
        };
        let now = app.clock.now();
        let worker = &route.worker;
        let Ok(uri) = upstream_target(worker, path_and_query) else {
            return detail_response(StatusCode::BAD_GATEWAY, "worker address is not a valid URL");
        };
        let mut headers = parts.headers.clone();
        headers.insert(header::HOST, worker.host.clone());
        headers.insert(
            ATTESTATION,
            worker.attestation(now.wall_secs(), caller.map(|c| (c.from.as_str(), c.depth))),
        );
        headers.insert(EPOCH, route.epoch_header.clone());
        let mut builder = Request::builder()
            .method(parts.method.clone())
            .uri(uri)
            .version(Version::HTTP_11);
        if let Some(h) = builder.headers_mut() {
            *h = headers;
        }
        let upstream_req = match builder.body(body.for_attempt()) {
            Ok(r) => r,
            Err(_) => {
                return detail_response(
                    StatusCode::BAD_GATEWAY,
                    "worker address is not a valid URL",
                )
            }
        };
        let verdict = match worker.pool.send(upstream_req).await {
            Err(e) => {
                app.metrics.proxy_upstream_errors.inc();
                let v =
                    classify_transport(e.before_send() || parts.method.is_idempotent(), attempt);
                if v == Verdict::Relay || attempt >= retries {
                    app.directory.invalidate(key);
                    tracing::debug!(target: "pinboard::proxy", error = %e, "worker unreachable");
                    return if e.before_send() {
                        detail_response(StatusCode::SERVICE_UNAVAILABLE, "owner unreachable; retry")
                    } else {
                        detail_response(
                            StatusCode::BAD_GATEWAY,
                            "worker connection failed mid-request",
                        )
                    };
                }
                v
            }
            Ok(res) => {
                if upgrade_ok(&res) {
                    return switch(res, on_upgrade.take(), app);
                }
                let refusal_header = res.headers().contains_key(REFUSAL);
                let small = res
                    .body()
                    .size_hint()
                    .exact()
                    .is_some_and(|n| n <= MAX_REFUSAL_BODY);
                if !small || !worth_reading(res.status(), refusal_header) {
                    return relay(res);
                }
                let (res_parts, res_body) = res.into_parts();
                let bytes = match res_body.collect().await {
                    Ok(c) => c.to_bytes(),
                    Err(_) => {
                        return detail_response(
                            StatusCode::BAD_GATEWAY,
                            "worker connection failed mid-response",
                        )
                    }
                };
                let detail = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_owned));
                let v = classify(res_parts.status, refusal_header, detail.as_deref(), attempt);
                if v == Verdict::Relay {
                    return relay_buffered(res_parts, bytes);
                }
                if attempt >= retries {
                    app.directory.invalidate(key);
                    // A worker that does not know our session is pinboard's
                    // problem, not the client's: a retryable 503, not a 403.
                    if res_parts.status == StatusCode::FORBIDDEN {
                        return detail_response(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "owner session changed; retry",
                        );
                    }
                    return relay_buffered(res_parts, bytes);
                }
                v
            }
        };
        let Verdict::Retry { action, delay_ms } = verdict else {
            return detail_response(StatusCode::BAD_GATEWAY, "unreachable");
        };
        app.metrics.proxy_retries.inc();
        app.directory.invalidate(key);
        refresh = false;
        avoid_stale = None;
        match action {
            RetryAction::Reread => {}
            RetryAction::RefreshWorkers => refresh = true,
            RetryAction::Replace => {
                avoid_stale = Some((worker.record.session_id.clone(), route.epoch));
            }
            RetryAction::MoveAway => {
                avoid_stale = Some((worker.record.session_id.clone(), route.epoch));
                exclude.push(worker.record.session_id.clone());
            }
        }
        tracing::debug!(target: "pinboard::proxy", key, attempt, ?action, "retrying");
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        attempt += 1;
    }
}

/// The origin-form request target for `worker`: `<path>?<query>` (shared
/// bytes, no allocation), behind the advertise URL's base path if it has one.
pub(crate) fn upstream_target(
    worker: &WorkerConn,
    path_and_query: &PathAndQuery,
) -> Result<Uri, http::Error> {
    let base = &*worker.base_path;
    if base.is_empty() {
        return Ok(Uri::from(path_and_query.clone()));
    }
    let mut target = String::with_capacity(base.len() + path_and_query.as_str().len());
    target.push_str(base);
    target.push_str(path_and_query.as_str());
    Ok(Uri::try_from(target)?)
}

/// `<advertiseUrl><path>?<query>`: shared bytes, no allocation, unless the
/// advertise URL carries a base path.
pub(crate) fn upstream_uri(
    worker: &WorkerConn,
    path_and_query: &PathAndQuery,
) -> Result<Uri, http::Error> {
    match &worker.origin {
        Some((scheme, authority)) => Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query(path_and_query.clone())
            .build(),
        None => {
            let base = &worker.record.advertise_url;
            let mut uri = String::with_capacity(base.len() + path_and_query.as_str().len());
            uri.push_str(base);
            uri.push_str(path_and_query.as_str());
            Ok(Uri::try_from(uri)?)
        }
    }
}

fn upgrade_ok(res: &http::Response<PooledBody>) -> bool {
    res.status() == StatusCode::SWITCHING_PROTOCOLS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::WorkerRecord;

    fn conn(url: &str) -> WorkerConn {
        WorkerConn::new(WorkerRecord {
            session_id: "s".into(),
            client_id: "c".into(),
            secret: "k".into(),
            advertise_url: url.into(),
            namespaces: vec!["/c".into()],
            headroom: 1,
            draining: false,
            server_drain: None,
            hostname: None,
            env: None,
            epoch: 0,
            takeover: None,
        })
        .expect("valid advertise URL")
    }

    #[test]
    fn upstream_uri_appends_path_and_query() {
        let pq = PathAndQuery::from_static("/c/a/hit?x=1");
        let u = upstream_uri(&conn("http://127.0.0.1:9"), &pq).expect("uri");
        assert_eq!(u.to_string(), "http://127.0.0.1:9/c/a/hit?x=1");
        let u = upstream_uri(&conn("http://10.0.0.1:9/base"), &pq).expect("uri");
        assert_eq!(u.to_string(), "http://10.0.0.1:9/base/c/a/hit?x=1");
    }

    #[test]
    fn upstream_target_is_origin_form_behind_any_base_path() {
        let pq = PathAndQuery::from_static("/c/a/hit?x=1");
        let u = upstream_target(&conn("http://127.0.0.1:9"), &pq).expect("uri");
        assert_eq!(u.to_string(), "/c/a/hit?x=1");
        let u = upstream_target(&conn("http://10.0.0.1:9/base/"), &pq).expect("uri");
        assert_eq!(u.to_string(), "/base/c/a/hit?x=1");
    }

    #[test]
    fn sanitize_strips_client_pinboard_and_hop_by_hop_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("pinboard-attestation", "forged"),
            ("Pinboard-Epoch", "9"),
            ("connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("host", "evil"),
            ("upgrade", "h2c"),
            ("x-keep", "1"),
        ] {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        sanitize(&mut h, false);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-keep"], "1");

        let mut ws = HeaderMap::new();
        ws.insert(header::CONNECTION, "Upgrade".parse().expect("value"));
        ws.insert(header::UPGRADE, "websocket".parse().expect("value"));
        assert!(is_upgrade(&ws));
        sanitize(&mut ws, true);
        assert_eq!(ws[header::CONNECTION], "upgrade");
        assert_eq!(ws[header::UPGRADE], "websocket");
    }
}
