//! The stamp and send phases: one attempt's request goes to the route's
//! worker, and its response head comes back within the upstream deadline.
//!
//! Owns the attempt's request target and pinboard's fields on it
//! (`Host`, `Pinboard-Attestation` minted with the owner's secret,
//! `Pinboard-Epoch`, the forwarding fields: [`Stamp`]), the head deadline,
//! and what a transport failure means (counted, and retried only when
//! nothing reached the worker, per `classify`'s table). Never reads an
//! answer's body.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::body::{BodyEnd, BodyWatch};
use super::classify::classify_transport;
use super::context::RequestCtx;
use super::error::{ErrorKind, ProxyError, ProxyResult};
use crate::app::App;
use crate::outbound::ResBody;
use crate::placement::PlacementStore;
use crate::routes::Route;
use crate::upstream::Stamp;

/// Set the attempt's request target and mint its fields.
///
/// # Errors
///
/// [`ErrorKind::BadWorkerAddress`] when the owner's advertise URL makes no
/// target. Never retried.
pub fn stamp<'a, 'c: 'a, S: PlacementStore>(
    app: &App<S>,
    ctx: &mut RequestCtx<'c>,
    route: &'a Route,
) -> ProxyResult<Stamp<'a>> {
    let worker = &route.worker;
    ctx.head.uri = worker
        .target(&ctx.target.path_and_query)
        .map_err(|_| ErrorKind::BadWorkerAddress)?;
    // The first attempt's clock reading is the request's own.
    let mono_ms = match ctx.attempts.attempt {
        0 => ctx.arrived_mono_ms,
        _ => app.clock.mono_ms(),
    };
    let caller = ctx.caller().map(|c| (c.from.as_str(), c.depth));
    Ok(Stamp {
        host: &worker.host,
        attestation: worker.attestation(&*app.clock, mono_ms, caller),
        epoch: &route.epoch_header,
        forwarded: ctx.forwarding,
    })
}

/// Send the attempt and wait for the worker's response head.
///
/// # Errors
///
/// [`ErrorKind::UpstreamTimeout`] (never retried: the worker may still be
/// working on it), [`ErrorKind::ClientBody`] when the client broke its
/// body, else [`ErrorKind::Unreachable`] (retried) or
/// [`ErrorKind::BrokeMidRequest`] (not).
pub async fn send<S: PlacementStore>(
    app: &App<S>,
    ctx: &mut RequestCtx<'_>,
    route: &Route,
    stamp: Stamp<'_>,
) -> ProxyResult<http::Response<ResBody>> {
    let body = ctx.body.for_attempt();
    let send =
        std::pin::pin!(app
            .outbound
            .send(&route.worker, &ctx.head, &stamp, ctx.upgrade, body));
    let watch = ctx.watch.as_ref();
    let timer = ctx.head_timer.as_mut().map(Pin::as_mut);
    let sent = await_head(send, watch, app.proxy.upstream_timeout, timer)
        .await
        .map_err(|UpstreamTimeout| ErrorKind::UpstreamTimeout)?;
    let error = match sent {
        Ok(res) => return Ok(res),
        Err(error) => error,
    };
    if let Some(fault) = watch.and_then(BodyWatch::fault) {
        // The client broke its body: nothing to hold against the worker or
        // the route.
        tracing::debug!(target: "pinboard::proxy", %fault, "client body failed");
        return Err(ProxyError::client_body(fault));
    }
    app.metrics.proxy_upstream_errors.inc();
    // What reached the worker was already re-sent once if that was safe
    // (`upstream::Pool::send`); only what never did is retried here.
    let before_send = error.before_send();
    let verdict = classify_transport(before_send, ctx.attempts.attempt);
    let kind = match before_send {
        true => ErrorKind::Unreachable(error),
        false => ErrorKind::BrokeMidRequest(error),
    };
    Err(ProxyError::retried(kind, verdict))
}

/// No response head within the upstream deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamTimeout;

/// Waits for `send` (a worker's response head) for `timeout`, counted from
/// now or, for a streamed body, from the last chunk the worker side took.
/// While the worker side waits on the *client* for the next chunk the
/// deadline does not run: the body's own pause deadline settles that.
///
/// `send` comes pinned by the caller: hyper moves each request's future
/// whole, so a future stored twice (as the argument and as the pinned
/// local) costs its size in copies per request.
///
/// `timer` is the connection's own, reset for each request (the front's:
/// [`RequestCtx::head_timer`]); without one a timer is made here. Pushing
/// a registered timer later is one atomic operation, where a fresh one is
/// registered with the runtime's timer wheel and removed again: about 300
/// instructions per proxied request against about 160 for the reset
/// (callgrind's function counts under `proxy-bench`).
pub async fn await_head<F: Future>(
    mut send: Pin<&mut F>,
    body: Option<&BodyWatch>,
    timeout: Duration,
    timer: Option<Pin<&mut Sleep>>,
) -> Result<F::Output, UpstreamTimeout> {
    let mut deadline = Instant::now() + timeout;
    let mut own = None;
    let mut timer = match timer {
        Some(mut timer) => {
            timer.as_mut().reset(deadline);
            timer
        }
        None => own
            .insert(Box::pin(tokio::time::sleep_until(deadline)))
            .as_mut(),
    };
    loop {
        tokio::select! {
            biased;
            out = send.as_mut() => return Ok(out),
            () = timer.as_mut() => {
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
                timer.as_mut().reset(deadline);
            }
        }
    }
}
