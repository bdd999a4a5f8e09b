//! The data plane: forward `/<ns>/<id><rest>` to the worker that owns the id.
//!
//! Owns the request lifecycle, read top to bottom in [`serve`]: split the
//! path, validate the id, verify cluster credentials, read the world,
//! prepare the body ([`body`]), clean the headers ([`headers`]), resolve
//! (cached), forward, classify the answer, maybe retry, respond. The
//! request's world (`crate::world`: `Pinboard-Hostname`/`Pinboard-Env`, or
//! a cluster caller's registration) limits which workers it reaches: a
//! malformed name answers 400, a cluster call naming another world 403, an
//! id owned in another world 409, a hostname world with no live worker
//! 503. Never forwards a client's `pinboard-*` header, a hop-by-hop header
//! or the worker's raw secret; adds `Pinboard-Attestation` (minted with
//! the owner's secret, `aud` = its session id, plus `caller`/`depth` for
//! cluster calls), `Pinboard-Epoch` and the forwarding headers
//! (`X-Forwarded-For`, `X-Forwarded-Proto`, `Forwarded`).
//!
//! # Deadlines and whose fault
//!
//! A worker has `--upstream-timeout-ms` to answer with a response head,
//! counted from the send, or from the last chunk of a streamed body it
//! took; past it the client gets 504 `{"detail": "worker did not answer in
//! time"}` and the cached route is dropped (a frozen worker is then found
//! out by its lapsing lease and its ids re-placed). A timed-out request is
//! never re-sent: the worker may still be working on it. A body the
//! *client* broke (malformed chunked encoding, closed early) answers 400
//! `request body could not be read`, one it stopped sending answers 408
//! `request body not received in time`, both with `Connection: close`;
//! neither drops the route nor counts as a worker failure. Once the head
//! came, the worker's body may pause at most `--upstream-body-timeout-ms`
//! between two reads ([`pause`]); past it the client's answer is cut
//! short. An HTTP/1.1 request without `Host`, or one with two, answers 400
//! before anything else (RFC 9112 §3.2).
//!
//! # Retries
//!
//! At most `--proxy-retries` re-sends, decided by [`classify()`]. A request is
//! only re-sent when resending is safe: its body is buffered (known length up
//! to `--retry-body-limit`) or empty, and a transport failure is retried
//! here only when nothing of the request reached the worker. One that
//! reached it and met a closed connection before any answer byte was
//! already sent once more by the pool when its method is idempotent
//! (`upstream::Pool::send`); a malformed answer is never re-sent. Streaming bodies get exactly one
//! attempt, and the worker's answer is relayed as is. A refusal that stays
//! refused after the last retry is relayed to the client (with its
//! `Retry-After`); a connect failure that persists answers 503 + `Retry-After`.

pub mod body;
pub mod classify;
pub mod cluster;
pub mod headers;
pub mod path;
pub mod pause;
pub mod resolve;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header;
use http::uri::PathAndQuery;
use http::{HeaderValue, Request, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use pinned_wire::headers::{HOSTNAME, REFUSAL};
use pinned_wire::ids::decode_id_segment;
use pinned_wire::refusal::Refusal;
use tokio::time::Instant;

use self::body::{BodyEnd, BodyFault, BodyWatch, ReqBody};
use self::classify::{
    classify, classify_transport, never_activated, worth_reading, RetryAction, Verdict,
};
use self::cluster::{Caller, ClusterError};
pub use self::headers::ClientAddr;
use self::headers::{
    add_forwarded, sanitize_request, sanitize_response, single_host, HostError, Scan,
};
use self::pause::PauseBound;
use self::resolve::{Avoid, ResolveError, View, WorkerConn};
use crate::outbound::ResBody;
use crate::placement::{Placement, PlacementStore};
use crate::server::App;
use crate::upstream::Stamp;
use crate::world::{cluster_world, host_names, Scope, World, ENV_HEADER};

/// Largest refusal body read to classify it.
pub(crate) const MAX_REFUSAL_BODY: u64 = 4096;

/// The `detail` of the 504 answered when a worker did not answer in time.
pub const UPSTREAM_TIMEOUT_DETAIL: &str = "worker did not answer in time";

/// Proxy settings.
#[derive(Debug, Clone, Copy)]
pub struct ProxySettings {
    /// Re-sends after a retryable answer.
    pub retries: u32,
    /// Largest request body buffered for re-sending.
    pub retry_body_limit: usize,
    /// Time a worker has to answer with a response head (see the module doc).
    pub upstream_timeout: Duration,
    /// Time to read a buffered body whole; longest pause in a streamed one.
    pub body_timeout: Duration,
    /// Longest pause in a worker's answer body once its head came ([`pause`]).
    pub upstream_body_timeout: Duration,
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

/// The answer to a body the client broke: its fault's status and detail,
/// and `Connection: close` (the rest of that request cannot be told from
/// the next one).
pub(crate) fn client_fault(fault: BodyFault) -> Response {
    let mut res = detail_response(fault.status(), &fault.to_string());
    res.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
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

/// The worker's answer as the client gets it: its headers cleaned, its
/// body relayed as it comes, with no pause longer than
/// `--upstream-body-timeout-ms` ([`pause`]).
fn relay<S: PlacementStore>(app: &App<S>, res: http::Response<ResBody>) -> Response {
    let (mut parts, body) = res.into_parts();
    sanitize_response(&mut parts.headers);
    // Most answers came whole with their head: nothing to bound.
    if body.in_memory() {
        return Response::from_parts(parts, Body::new(body));
    }
    let stalls = app.metrics.proxy_upstream_body_stalls.clone();
    let body = PauseBound::new(body, app.proxy.upstream_body_timeout, stalls);
    Response::from_parts(parts, Body::new(body))
}

fn relay_buffered(parts: http::response::Parts, body: Bytes) -> Response {
    let mut parts = parts;
    sanitize_response(&mut parts.headers);
    Response::from_parts(parts, Body::from(body))
}

/// No response head within the upstream deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{UPSTREAM_TIMEOUT_DETAIL}")]
pub struct UpstreamTimeout;

/// Waits for `send` (a worker's response head) for `timeout`, counted from
/// now or, for a streamed body, from the last chunk the worker side took.
/// While the worker side waits on the *client* for the next chunk the
/// deadline does not run: the body's own pause deadline settles that.
///
/// `send` comes pinned by the caller: taken by value it would be stored
/// twice in this future's state (as the argument and as the pinned local).
async fn await_head<F: Future>(
    mut send: std::pin::Pin<&mut F>,
    body: Option<&BodyWatch>,
    timeout: Duration,
) -> Result<F::Output, UpstreamTimeout> {
    let mut deadline = Instant::now() + timeout;
    loop {
        tokio::select! {
            biased;
            out = send.as_mut() => return Ok(out),
            () = tokio::time::sleep_until(deadline) => {
                let next = match body.map(BodyWatch::state) {
                    Some(s) if s.end == BodyEnd::Sending && s.awaiting_client => {
                        Instant::now() + timeout
                    }
                    Some(s) => s.moved + timeout,
                    None => deadline,
                };
                if next <= Instant::now() {
                    return Err(UpstreamTimeout);
                }
                deadline = next;
            }
        }
    }
}

/// Something the server wants kept alive for as long as a connection it
/// handed over in an upgrade (a WebSocket) is spliced: its slot under the
/// connection cap. The accept loop puts it in the extensions of requests
/// that ask to upgrade; the splice holds it until it ends.
#[derive(Clone)]
pub struct UpgradeHold(pub Arc<dyn Send + Sync>);

impl std::fmt::Debug for UpgradeHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpgradeHold")
    }
}

/// The client side of an upgrade request.
struct ClientUpgrade {
    on: hyper::upgrade::OnUpgrade,
    hold: Option<UpgradeHold>,
}

/// Switch protocols: answer 101 and splice the two upgraded connections.
fn switch(
    mut res: http::Response<ResBody>,
    client: Option<ClientUpgrade>,
    app: &App<impl PlacementStore>,
) -> Response {
    let upstream = hyper::upgrade::on(&mut res);
    let Some(ClientUpgrade { on: client, hold }) = client else {
        return detail_response(StatusCode::BAD_REQUEST, "connection cannot be upgraded");
    };
    app.metrics.proxy_upgrades.inc();
    tokio::spawn(async move {
        let _hold = hold;
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

/// The proxy as an axum handler (the router's fallback): [`serve`], with
/// the client address from `ConnectInfo` when the server recorded one.
pub async fn handle<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    req: Request<Body>,
) -> Response {
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| ClientAddr::new(*addr));
    serve(&app, client.as_ref(), req).await
}

/// Proxies one client request (see the module doc); `client` is the
/// connection's peer, for the forwarding headers (none are added without
/// it).
pub async fn serve<S: PlacementStore>(
    app: &App<S>,
    client: Option<&ClientAddr>,
    req: Request<Body>,
) -> Response {
    if let Err(e) = single_host(req.version(), req.headers()) {
        app.metrics.proxy_requests.inc();
        return host_refusal(e);
    }
    serve_checked(app, client, req).await
}

/// The 400 of a request whose `Host` lines are wrong ([`HostError`]).
pub fn host_refusal(e: HostError) -> Response {
    detail_response(StatusCode::BAD_REQUEST, &e.to_string())
}

/// [`serve`] for a request whose `Host` lines the caller checked already
/// (the front does, in the pass over the fields it makes anyway).
pub(crate) async fn serve_checked<S: PlacementStore>(
    app: &App<S>,
    client: Option<&ClientAddr>,
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
    let scan = Scan::of(&parts.headers);
    // Cluster credentials and worlds are `pinboard-*` headers: a request
    // without any has neither.
    let caller = match scan.pinboard {
        false => None,
        true => match cluster::verify(&parts.headers, &app.directory).await {
            Ok(c) => c,
            Err(e) => return cluster_refusal(e),
        },
    };
    // The world is read before the `pinboard-*` headers are stripped. The
    // values are refcounted: a hostless request copies nothing.
    let named = match caller {
        Some(_) => (None, None),
        None if !scan.pinboard => (None, None),
        None => (
            parts.headers.get(HOSTNAME).cloned(),
            parts.headers.get(ENV_HEADER).cloned(),
        ),
    };
    // Without a `Pinboard-Hostname`, `Host` may name a bound hostname's
    // world (`crate::world`). The worker view read for it is the first
    // resolution's too: one read of it per request, as without.
    let (by_host, view) = match (&caller, &named.0) {
        (None, None) => match app.directory.view().await {
            Ok(view) => (bound_host(&view, &parts), Some(view)),
            Err(e) => {
                let e = ResolveError::Store(e);
                return detail_response(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
            }
        },
        _ => (None, None),
    };
    let world = match &caller {
        Some(c) => cluster_world(&parts.headers, &c.worker.record, target.ns),
        None => World::from_values(named.0.as_ref(), named.1.as_ref(), by_host.as_deref()),
    };
    let world = match world {
        Ok(w) => w,
        Err(e) => return detail_response(e.status(), &e.to_string()),
    };
    let upgrade = scan.is_upgrade(&parts.headers);
    let on_upgrade = if upgrade {
        parts
            .extensions
            .remove::<hyper::upgrade::OnUpgrade>()
            .map(|on| ClientUpgrade {
                on,
                hold: parts.extensions.remove::<UpgradeHold>(),
            })
    } else {
        None
    };
    let (mut body, watch) =
        match body::prepare(body, app.proxy.retry_body_limit, app.proxy.body_timeout).await {
            Ok(b) => b,
            Err(fault) => {
                app.metrics.proxy_client_body_errors.inc();
                return client_fault(fault);
            }
        };
    // The worker's request head is built once, from the client's headers
    // moved (not copied): each attempt sets its target in place and
    // stamps pinboard's fields on the way out (`upstream::Stamp`).
    let (mut upstream, ()) = Request::new(()).into_parts();
    upstream.method = parts.method.clone();
    upstream.version = Version::HTTP_11;
    upstream.headers = std::mem::take(&mut parts.headers);
    sanitize_request(&mut upstream.headers, &scan, upgrade);
    let forwarding = client.and_then(|c| add_forwarded(&mut upstream.headers, &scan, c));
    let path_and_query = match parts.uri.path_and_query() {
        Some(pq) => pq.clone(),
        None => PathAndQuery::from_static("/"),
    };
    let started = Instant::now();
    let res = forward(
        app,
        &mut upstream,
        &path_and_query,
        forwarding,
        (&key, target.ns, &id),
        (caller.as_ref(), Scope::World(world), view),
        (&mut body, watch.as_ref()),
        (upgrade, on_upgrade),
    )
    .await;
    app.traffic
        .record(target.ns, res.status().as_u16(), started.elapsed());
    res
}

/// The bound hostname (see `crate::world`) the request's target authority
/// or `Host` names in `view`, if any: the name with its port stripped, else
/// with its port (a hostname registered with one).
fn bound_host(view: &View, parts: &http::request::Parts) -> Option<String> {
    if view.binds_none() {
        return None;
    }
    let host = parts.headers.get(header::HOST);
    let (bare, with_port) = host_names(&parts.uri, host)?;
    [Some(bare), with_port]
        .into_iter()
        .flatten()
        .find(|name| view.binds(name))
        .map(str::to_owned)
}

/// The client's own forwarding values, for a request that arrived with
/// none (see [`add_forwarded`]).
type Forwarding<'a> = Option<(&'a HeaderValue, &'a HeaderValue)>;

/// Resolve, send, classify, retry; then, if a placement this request
/// claimed was refused and no worker answered the request, hand the claim
/// back (`resolve`'s "Refused claims").
#[allow(clippy::too_many_arguments)]
async fn forward<S: PlacementStore>(
    app: &App<S>,
    head: &mut http::request::Parts,
    path_and_query: &PathAndQuery,
    forwarding: Forwarding<'_>,
    (key, ns, id): (&str, &str, &str),
    (caller, scope, view): (Option<&Caller>, Scope<'_>, Option<View>),
    body: (&mut ReqBody, Option<&BodyWatch>),
    upgrade: (bool, Option<ClientUpgrade>),
) -> Response {
    let mut refused = None;
    let res = attempts(
        app,
        head,
        path_and_query,
        forwarding,
        (key, ns, id),
        (caller, scope, view),
        body,
        upgrade,
        &mut refused,
    )
    .await;
    if let Some(claim) = refused {
        if !res.status().is_success() && res.status() != StatusCode::SWITCHING_PROTOCOLS {
            if let Err(error) = app.directory.roll_back(key, ns, id, &claim).await {
                tracing::debug!(target: "pinboard::proxy", key, error = %pinned_edge::logging::Chain(&error), "could not hand a refused claim back");
            }
        }
    }
    res
}

/// The attempts of [`forward`]; `upgrade`: whether the request asks to
/// switch protocols, and the client side of the switch. `refused` is set
/// to a placement claimed here that its worker refused to activate.
#[allow(clippy::too_many_arguments)]
async fn attempts<S: PlacementStore>(
    app: &App<S>,
    head: &mut http::request::Parts,
    path_and_query: &PathAndQuery,
    forwarding: Forwarding<'_>,
    (key, ns, id): (&str, &str, &str),
    (caller, scope, mut view): (Option<&Caller>, Scope<'_>, Option<View>),
    (body, watch): (&mut ReqBody, Option<&BodyWatch>),
    (upgrade, mut on_upgrade): (bool, Option<ClientUpgrade>),
    refused: &mut Option<Placement>,
) -> Response {
    let retries = if body.replayable() {
        app.proxy.retries
    } else {
        0
    };
    let mut avoid_stale: Option<(String, u64)> = None;
    let mut exclude: Vec<String> = Vec::new();
    // A worker refused for capacity: if no other worker can take the id,
    // the client hears that the fleet is full, not that it is gone.
    let mut full = false;
    let mut refresh = false;
    let mut attempt = 0;
    loop {
        let avoid = Avoid {
            stale: avoid_stale.as_ref().map(|(s, e)| (s.as_str(), *e)),
            exclude: &exclude,
            refresh,
        };
        let (route, claimed) = match app
            .directory
            .resolve_claiming_in(view.take(), key, ns, id, scope, avoid)
            .await
        {
            Ok(r) => r,
            Err(e @ ResolveError::OtherWorld) => {
                return detail_response(StatusCode::CONFLICT, &e.to_string());
            }
            Err(e) => {
                app.metrics.proxy_unavailable.inc();
                if full && matches!(e, ResolveError::NoWorker) {
                    return detail_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        Refusal::Capacity.detail(),
                    );
                }
                if let ResolveError::Store(err) = &e {
                    if let Some(seen) = pinned_edge::logging::repeats().failed(
                        "pinboard proxy",
                        "store",
                        pinned_edge::logging::Chain(&err),
                    ) {
                        tracing::warn!(target: "pinboard::proxy", error = %seen, failures = seen.failures, "placement store failed");
                    }
                }
                return detail_response(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
            }
        };
        let wall_secs = app.clock.wall_ms() as f64 / 1000.0;
        let worker = &route.worker;
        let Ok(uri) = upstream_target(worker, path_and_query) else {
            return detail_response(StatusCode::BAD_GATEWAY, "worker address is not a valid URL");
        };
        head.uri = uri;
        let stamp = Stamp {
            host: &worker.host,
            attestation: worker.attestation(wall_secs, caller.map(|c| (c.from.as_str(), c.depth))),
            epoch: &route.epoch_header,
            forwarded: forwarding,
        };
        let sent_body = body.for_attempt();
        let send = std::pin::pin!(app.outbound.send(worker, head, &stamp, upgrade, sent_body));
        let sent = await_head(send, watch, app.proxy.upstream_timeout).await;
        let Ok(sent) = sent else {
            return upstream_timed_out(app, key);
        };
        let verdict = match sent {
            Err(e) => {
                if let Some(fault) = watch.and_then(BodyWatch::fault) {
                    // The client broke its body: nothing to hold against
                    // the worker or the route.
                    app.metrics.proxy_client_body_errors.inc();
                    tracing::debug!(target: "pinboard::proxy", %fault, "client body failed");
                    return client_fault(fault);
                }
                app.metrics.proxy_upstream_errors.inc();
                // What reached the worker was already re-sent once if that
                // was safe (`upstream::Pool::send`); only what never did is
                // retried here.
                let v = classify_transport(e.before_send(), attempt);
                if v == Verdict::Relay || attempt >= retries {
                    app.directory.invalidate(key);
                    tracing::debug!(target: "pinboard::proxy", error = %pinned_edge::logging::Chain(&e), "worker unreachable");
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
                if res.status().is_success() {
                    app.directory.settle(ns, id, &route).await;
                }
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
                    return relay(app, res);
                }
                let (res_parts, res_body) = res.into_parts();
                let read = tokio::time::timeout(app.proxy.upstream_timeout, res_body.collect());
                let bytes = match read.await {
                    Ok(Ok(c)) => c.to_bytes(),
                    Ok(Err(_)) => {
                        return detail_response(
                            StatusCode::BAD_GATEWAY,
                            "worker connection failed mid-response",
                        )
                    }
                    Err(_) => return upstream_timed_out(app, key),
                };
                let detail = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_owned));
                full |= detail.as_deref() == Some(Refusal::Capacity.detail());
                if claimed && never_activated(res_parts.status, refusal_header, detail.as_deref()) {
                    *refused = Some(Placement {
                        session_id: worker.record.session_id.clone(),
                        epoch: route.epoch,
                    });
                }
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

/// 504 for a worker that did not answer in time; its route is dropped, as
/// for a failed connection, and the request is not re-sent.
fn upstream_timed_out<S: PlacementStore>(app: &App<S>, key: &str) -> Response {
    app.metrics.proxy_upstream_timeouts.inc();
    app.directory.invalidate(key);
    tracing::debug!(target: "pinboard::proxy", key, "worker did not answer in time");
    detail_response(StatusCode::GATEWAY_TIMEOUT, UPSTREAM_TIMEOUT_DETAIL)
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

fn upgrade_ok(res: &http::Response<ResBody>) -> bool {
    res.status() == StatusCode::SWITCHING_PROTOCOLS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::WorkerRecord;

    fn conn(url: &str) -> WorkerConn {
        WorkerConn::new(
            WorkerRecord {
                session_id: "s".into(),
                client_id: "c".into(),
                secret: "k".into(),
                advertise_url: url.into(),
                namespaces: vec!["/c".into()],
                headroom: 1,
                ..Default::default()
            },
            None,
        )
        .expect("valid advertise URL")
    }

    /// hyper moves every request's future into its connection state once,
    /// whole: each byte of it is copied per request (this future was 11.9
    /// KB, a third of pinboard's instructions per request, until dialling
    /// was boxed and `await_head` took its future pinned). A bound with room
    /// for compiler versions; a cold path inlined again breaks it.
    #[tokio::test]
    async fn the_per_request_future_stays_small() {
        use clap::Parser;
        let config =
            crate::config::Config::try_parse_from(["pinboard", "--token", "t"]).expect("config");
        let app = App::new(
            &config,
            crate::placement::MemoryStore::new(),
            Arc::new(crate::clock::SystemClock::new()),
            Arc::new(crate::clock::SeededEntropy::seeded(1)),
        )
        .expect("app");
        let req = Request::builder()
            .uri("/c/a/x")
            .body(Body::empty())
            .expect("request");
        let serve = serve(&app, None, req);
        assert!(
            std::mem::size_of_val(&serve) <= 6 * 1024,
            "the proxy's per-request future grew to {} bytes",
            std::mem::size_of_val(&serve)
        );
        let worker = conn("http://127.0.0.1:9");
        let (upstream, ()) = Request::builder()
            .uri("/c/a/x")
            .body(())
            .expect("request")
            .into_parts();
        let body = crate::upstream::UpstreamBody::Left(Default::default());
        let stamp = Stamp {
            host: &worker.host,
            attestation: HeaderValue::from_static("t"),
            epoch: &worker.host,
            forwarded: None,
        };
        let mut send = std::pin::pin!(app.outbound.send(&worker, &upstream, &stamp, false, body));
        let head = await_head(send.as_mut(), None, Duration::from_secs(1));
        assert!(
            std::mem::size_of_val(&head) <= 512,
            "await_head holds its future again: {} bytes",
            std::mem::size_of_val(&head)
        );
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
}
