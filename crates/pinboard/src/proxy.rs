//! The data plane: forward `/<ns>/<id><rest>` to the worker that owns the id.
//!
//! One entry, [`serve`], whatever door a request came through (the front's
//! own HTTP/1 loop, hyper's connection, the simulation), and one
//! per-request context ([`RequestCtx`]) that named phases read and write,
//! in the spirit of pingora's `ProxyHttp`. [`serve`] reads like the
//! lifecycle; each phase is a function in its own file with one error
//! exit, a [`ProxyError`] that says what went wrong, whose side it was on
//! and whether another attempt may fix it:
//!
//! | phase | file | does |
//! | --- | --- | --- |
//! | prepare | [`prepare`](mod@prepare) | `Host` lines, path and id, cluster credentials, world, body, the worker's request head |
//! | resolve | [`resolve`](mod@resolve) | the route of this attempt (`crate::routes`: cached, else the store, else a claim) |
//! | stamp | [`send`](mod@send) | the attempt's target, attestation, epoch and forwarding fields |
//! | send | [`send`](mod@send) | the request out, its response head back within the deadline |
//! | classify | [`answer`](mod@answer) | the answer read through [`classify`](mod@classify)'s table: relayed, switched, held ([`hold`](mod@hold)), or a refusal to retry |
//! | retry-or-respond | [`retry`](mod@retry) | the next attempt set up, or the request ended on its error |
//!
//! Then every request, answered or not, ends in the same place: a refused
//! claim is handed back, traffic is counted, and an error becomes its one
//! answer ([`error`](mod@error)).
//!
//! The request's world (`crate::world`: `Pinboard-Hostname`/`Pinboard-Env`,
//! or a cluster caller's registration) limits which workers it reaches: a
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
//! At most `--proxy-retries` re-sends, decided by [`classify`](mod@classify)'s table. A request is
//! only re-sent when resending is safe: its body is buffered (known length up
//! to `--retry-body-limit`) or empty, and a transport failure is retried
//! here only when nothing of the request reached the worker. One that
//! reached it and met a closed connection before any answer byte was
//! already sent once more by the pool when its method is idempotent
//! (`upstream::Pool::send`); a malformed answer is never re-sent. Streaming bodies get exactly one
//! attempt, and the worker's answer is relayed as is. A refusal that stays
//! refused after the last retry is relayed to the client (with its
//! `Retry-After`); a connect failure that persists answers 503 + `Retry-After`.

pub mod answer;
pub mod body;
pub mod classify;
pub mod cluster;
pub mod context;
pub mod error;
pub mod headers;
pub mod hold;
pub mod path;
pub mod pause;
pub mod prepare;
pub mod resolve;
pub mod respond;
pub mod retry;
pub mod send;
pub mod spans;

use std::pin::Pin;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{Request, StatusCode};
use tokio::time::{Instant, Sleep};

use self::answer::classify;
pub use self::context::RequestCtx;
pub use self::error::{ErrorKind, ProxyError, ProxyResult, Source, UPSTREAM_TIMEOUT_DETAIL};
pub use self::headers::ClientAddr;
use self::prepare::prepare;
use self::resolve::resolve;
pub use self::respond::UpgradeHold;
use self::retry::retry_or_respond;
use self::send::{send, stamp};
use self::spans::RequestSpans;
use crate::app::App;
use crate::placement::PlacementStore;

/// A client request as a door hands it to [`serve`].
#[derive(Debug)]
pub enum Inbound {
    /// A request nobody checked yet (hyper's connection, the simulation).
    Request(Request<Body>),
    /// A request whose `Host` lines the door checked already (the front
    /// does, in the pass over the fields it makes anyway).
    HostChecked(Request<Body>),
    /// A request the door refused before its body was whole: its `Host`
    /// lines ([`ProxyError::bad_host`]) or its body
    /// ([`ProxyError::client_body`]).
    Refused(Box<ProxyError>),
}

/// Proxies one client request (see the module doc); `client` is the
/// connection's peer, for the forwarding headers (none are added without
/// it); `head_timer` the connection's timer for the worker's answer, when
/// it keeps one ([`RequestCtx::head_timer`]).
pub async fn serve<'c, S: PlacementStore>(
    app: &App<S>,
    client: Option<&'c ClientAddr>,
    inbound: Inbound,
    head_timer: Option<Pin<&'c mut Sleep>>,
) -> Response {
    app.metrics.proxy_requests.inc();
    let mut spans = RequestSpans::open(&inbound);
    let mut ctx = match prepare(app, client, inbound).await {
        Ok(ctx) => ctx,
        Err(e) => return respond(app, None, *e),
    };
    if let Some(spans) = &spans {
        spans.target(ctx.target.ns(), ctx.target.id());
    }
    ctx.head_timer = head_timer;
    let started = Instant::now();
    let res = match forward(app, &mut ctx, spans.as_deref_mut()).await {
        Ok(res) => res,
        Err(e) => respond(app, Some(ctx.target.key()), *e),
    };
    if ctx.attempts.refused.is_some() {
        hand_back(app, &mut ctx, res.status()).await;
    }
    app.traffic
        .record(ctx.target.ns(), res.status().as_u16(), started.elapsed());
    if let Some(spans) = &spans {
        spans.answered(res.status().as_u16());
    }
    res
}

/// The attempts: resolve, stamp, send, classify; then retry or respond.
/// (One function, not one per attempt: each `async fn` layer moved the
/// answer once more; `proxy-bench`: about 70 instructions a request.)
///
/// Each resolution and each attempt has its span ([`RequestSpans`], when
/// debug spans are wanted); the worker gets the attempt's trace context in
/// its `traceparent` while traces are exported.
async fn forward<S: PlacementStore>(
    app: &App<S>,
    ctx: &mut RequestCtx<'_>,
    mut spans: Option<&mut RequestSpans>,
) -> ProxyResult<Response> {
    loop {
        if let Some(spans) = spans.as_deref_mut() {
            spans.resolving();
        }
        let route = resolve(app, ctx).await?;
        if let Some(spans) = spans.as_deref_mut() {
            let session = &route.worker.record.session_id;
            spans.attempt(ctx.attempts.attempt, session, &mut ctx.head.headers);
        }
        let error = match stamp(app, ctx, &route) {
            Ok(stamp) => match send(app, ctx, &route, stamp).await {
                Ok(res) => match classify(app, ctx, &route, res).await {
                    Ok(res) => return Ok(res),
                    Err(error) => error,
                },
                Err(error) => error,
            },
            Err(error) => error,
        };
        if let Some(spans) = spans.as_deref_mut() {
            spans.step_done();
        }
        retry_or_respond(app, ctx, &route, error).await?;
    }
}

/// The request ends on `error`: counted, logged, answered.
fn respond<S: PlacementStore>(app: &App<S>, key: Option<&str>, error: ProxyError) -> Response {
    error.observe(&app.metrics, key);
    error.into_response()
}

/// A placement this request claimed and its worker refused is handed back
/// when no worker answered the request (`routes::claim`'s "Refused
/// claims").
async fn hand_back<S: PlacementStore>(app: &App<S>, ctx: &mut RequestCtx<'_>, status: StatusCode) {
    let Some(claim) = ctx.attempts.refused.take() else {
        return;
    };
    if status.is_success() || status == StatusCode::SWITCHING_PROTOCOLS {
        return;
    }
    let target = &ctx.target;
    let key = target.key();
    if let Err(error) = app
        .routes
        .roll_back(key, target.ns(), target.id(), &claim)
        .await
    {
        tracing::debug!(target: "pinboard::proxy", key, error = %pinned_edge::logging::Chain(&error), "could not hand a refused claim back");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use http::HeaderValue;

    use super::*;
    use crate::placement::WorkerRecord;
    use crate::upstream::{Stamp, WorkerConn};

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
        let serve = serve(&app, None, Inbound::Request(req), None);
        assert!(
            std::mem::size_of_val(&serve) <= 6 * 1024,
            "the proxy's per-request future grew to {} bytes",
            std::mem::size_of_val(&serve)
        );
        let worker = WorkerConn::new(
            WorkerRecord {
                session_id: "s".into(),
                client_id: "c".into(),
                secret: "k".into(),
                advertise_url: "http://127.0.0.1:9".into(),
                namespaces: vec!["/c".into()],
                headroom: 1,
                ..Default::default()
            },
            None,
        )
        .expect("valid advertise URL");
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
        let head = send::await_head(send.as_mut(), None, Duration::from_secs(1), None);
        assert!(
            std::mem::size_of_val(&head) <= 512,
            "await_head holds its future again: {} bytes",
            std::mem::size_of_val(&head)
        );
    }
}
