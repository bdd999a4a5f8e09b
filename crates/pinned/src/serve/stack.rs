//! Admission: the layer around every matched route of an object. It enters
//! the instance (activating it on a cold id), takes the exclusive turn,
//! runs the handler raced against the instance's abort and shielded from
//! panics, and keeps a streaming answer's instance in flight.
//!
//! It is applied with `Router::route_layer`, so it only ever runs for a
//! path and method the object has a route for: an unknown route answers
//! 404/405 without creating, activating or placing anything. Then come the
//! reference's checks in its order ([`gate`]: attestation 403, id 400,
//! `Pinboard-Epoch` 400), then the directory's admission.
//! [`dispatch`](crate::serve::dispatch) only split the path and left a [`Pending`]
//! (as [`Routed::Pending`])
//! in the request's extensions.

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use axum::body::Body;
use axum::extract::{OriginalUri, Request};
use axum::response::{IntoResponse, Response};
use axum::routing::Route;
use axum::Router;
use futures_util::FutureExt;
use http::request::Parts;
use http::{HeaderMap, StatusCode};
use http_body::Body as _;
use pinned_wire::attestation::Caller;
use pinned_wire::refusal::Refusal;
use pinned_wire::{attestation, epoch, headers, ids};
use tokio::time::Instant;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::auth::AuthError;
use crate::namespace::context::Context;
use crate::namespace::Record;
use crate::namespace::{panic_message, Admission, Attempt, Entered, Namespace};
use crate::object::call::NotAnInstanceRoute;
use crate::object::call::{Call, Pending, Routed, Scope};
use crate::object::{Object, RouteState};
use crate::response;
use crate::serve::body::TrackedBody;

/// A newer epoch was adopted: the owner tag goes with the placement.
fn retag(slot: &Arc<crate::namespace::Record>) {
    let Some(tag) = slot.tag() else { return };
    let ctx = Context::new(slot.clone());
    crate::namespace::spawn_detached(&slot.host.domain, async move {
        if let Err(error) = ctx.tag(&tag).await {
            tracing::warn!(namespace = %ctx.ns(), id = %ctx.id(), error = %pinned_edge::logging::Chain(&error), "cannot stamp the owner tag at the new epoch");
        }
    });
}

fn admission_refused(refused: Admission) -> Response {
    match refused {
        Admission::Refused(refusal) => response::refusal(refusal),
        Admission::ActivationFailed | Admission::ShutDown => response::internal_error(),
    }
}

/// A request that passed the gate: the decoded id, its placement epoch, and
/// the attested caller.
pub(crate) struct Passed<'a> {
    pub(crate) id: Cow<'a, str>,
    pub(crate) epoch: Option<u64>,
    pub(crate) caller: Option<Caller>,
    pub(crate) depth: i64,
}

/// Why a request did not pass the [`gate`].
#[derive(Debug)]
pub(crate) enum Refused {
    /// 403 `invalid attestation` (control-plane mode).
    Attestation,
    /// 400 with the id rule that failed.
    Id(ids::InvalidId),
    /// 400 `malformed placement epoch`.
    Epoch(epoch::MalformedEpoch),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Self::Attestation => response::detail(StatusCode::FORBIDDEN, "invalid attestation"),
            Self::Id(invalid) => response::detail(StatusCode::BAD_REQUEST, &invalid.to_string()),
            Self::Epoch(malformed) => {
                response::detail(StatusCode::BAD_REQUEST, &malformed.to_string())
            }
        }
    }
}

/// The reference's checks before admission, in its order: attestation
/// (required behind pinboard, read but optional in local mode), id,
/// `Pinboard-Epoch`.
pub(crate) fn gate<'a>(
    host: &Namespace,
    headers: &HeaderMap,
    raw_id: &'a str,
) -> Result<Passed<'a>, Refused> {
    // One pass over the (few) headers finds both of pinboard's: cheaper
    // than two hashed lookups of names that are not standard ones.
    let (mut attestation, mut epoch) = (None, None);
    for (name, value) in headers {
        if attestation.is_none() && name == headers::ATTESTATION {
            attestation = Some(value);
        } else if epoch.is_none() && name == headers::EPOCH {
            epoch = Some(value);
        }
    }
    let claims = attestation
        .and_then(|value| value.to_str().ok())
        .and_then(|token| {
            attestation::verify(
                token,
                &host.secret,
                |aud| aud == host.local_aud || host.control.is_session(aud),
                host.domain.unix_secs(),
            )
        });
    if host.control.requires_attestation() && claims.is_none() {
        return Err(Refused::Attestation);
    }
    let depth = claims.as_ref().and_then(|claims| claims.depth).unwrap_or(0);
    let caller = claims.as_ref().and_then(attestation::attested_caller);
    let id = ids::decode_id_segment(raw_id).map_err(Refused::Id)?;
    let epoch = match epoch {
        None => None,
        Some(value) => Some(epoch::parse_epoch(value.as_bytes()).map_err(Refused::Epoch)?),
    };
    Ok(Passed {
        id,
        epoch,
        caller,
        depth,
    })
}

/// The admission layer of an object's routes (see the module docs), made
/// from its admission function: `AdmitLayer(admit::<T>)` for object `T`.
///
/// It carries that function (a zero-sized fn item) rather than naming `T`:
/// the service's future is then the function's own return type, named
/// through `F`, so axum's route puts the admission coroutine in the one box
/// it allocates for every route future, not a second box of its own (an
/// allocation, a free and an indirect poll per request).
#[derive(Clone, Copy)]
pub(crate) struct AdmitLayer<F>(pub(crate) F);

impl<S, F: Clone> Layer<S> for AdmitLayer<F> {
    type Service = Admit<S, F>;

    fn layer(&self, inner: S) -> Admit<S, F> {
        Admit {
            inner,
            admit: self.0.clone(),
        }
    }
}

/// One matched route of an object, wrapped by [`AdmitLayer`].
#[derive(Clone)]
pub(crate) struct Admit<S, F> {
    inner: S,
    admit: F,
}

impl<S, F, Fut> Service<Request> for Admit<S, F>
where
    S: Clone,
    F: Fn(S, Parts, Body) -> Fut,
    Fut: Future<Output = Result<Response, Infallible>>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Fut;

    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Fut {
        let (parts, body) = request.into_parts();
        (self.admit)(self.inner.clone(), parts, body)
    }
}

/// The answer to a request whose handler panicked, logged in its span.
fn panicked(
    host: &Namespace,
    slot: &Record,
    span: Option<&tracing::Span>,
    panic: &(dyn std::any::Any + Send),
) -> Response {
    let log = || {
        tracing::error!(
            namespace = %host.ns,
            id = %slot.id,
            error = %panic_message(panic),
            "handler panicked"
        );
    };
    match span {
        Some(span) => span.in_scope(log),
        None => log(),
    }
    response::internal_error()
}

/// What dispatch left in the request's extensions, taken (the entry stays,
/// as [`Routed::Taken`], for the admitted scope to replace).
fn take_pending(parts: &mut Parts) -> Option<Pending> {
    let routed = parts.extensions.get_mut::<Routed>()?;
    match std::mem::replace(routed, Routed::Taken) {
        Routed::Pending(pending) => Some(pending),
        Routed::Taken | Routed::Admitted(_) => None,
    }
}

/// The request span (see [`admit`]): at debug, as tower-http's, so at the
/// usual `info` a handler's lines carry the instance span alone. With
/// nothing listening at `info` there is none, not even a disabled one: no
/// span is cloned, entered on every poll, or dropped.
fn request_span(slot: &Record, parts: &Parts) -> Option<tracing::Span> {
    if tracing::enabled!(tracing::Level::DEBUG) {
        let instance_span = slot.span();
        Some(
            tracing::debug_span!(parent: &instance_span, "request", method = %parts.method, path = %parts.uri.path()),
        )
    } else if tracing::enabled!(tracing::Level::INFO) {
        Some(slot.span())
    } else {
        None
    }
}

/// One request through admission: the checks in the reference's order,
/// the directory's admission, the object's authorization, then (in the
/// request's span) the activation when needed, the exclusive turn, and the
/// handler raced against the instance's abort and shielded from panics.
///
/// One coroutine with the request's parts captured in place, no future
/// nested in another: the state (in the box axum's route allocates, see
/// [`AdmitLayer`]) is the request once plus the handler's future, `inner`'s
/// own (a nested future would carry a second copy of the
/// request, every byte of it copied as it is moved in, and push the box
/// past the allocator's per-thread cache). The request's parts are lent
/// to authorization where they lie and moved out only into the handler.
#[allow(clippy::manual_async_fn)] // an `async fn` would copy its arguments into the coroutine again
pub(crate) fn admit<T: Object>(
    mut inner: Route,
    mut parts: Parts,
    body: Body,
) -> impl Future<Output = Result<Response, Infallible>> + Send {
    // The phases are blocks: a local's storage stays reserved until its
    // scope ends, also once moved from, so what a phase needs is scoped to
    // it and only its results are kept beside the handler's future.
    async move {
        let (host, started, slot, span, entry) = {
            let (host, started, entered, epoch, caller, depth) = {
                let Some(Pending {
                    host,
                    id_at,
                    started,
                }) = take_pending(&mut parts)
                else {
                    return Ok(NotAnInstanceRoute("an object's routes").into_response());
                };
                // The arrival on the host's clock: the entry's activity
                // stamp.
                let arrived = host.ms_at(started);
                let raw_id = parts
                    .extensions
                    .get::<OriginalUri>()
                    .and_then(|OriginalUri(original)| original.path().get(id_at))
                    .unwrap_or_default();
                let Passed {
                    id,
                    epoch,
                    caller,
                    depth,
                } = match gate(&host, &parts.headers, raw_id) {
                    Ok(passed) => passed,
                    Err(refused) => return Ok(refused.into_response()),
                };
                // A resident or new id is entered without waiting; only a
                // record that is closing is waited out (boxed: that rare
                // wait would otherwise size every request's state).
                let entered = match host.try_admit(&id, epoch, arrived) {
                    Ok(Attempt::Entered(entered)) => entered,
                    Ok(Attempt::Closing(slot)) => {
                        match Box::pin(host.enter_after(slot, &id, epoch)).await {
                            Ok(entered) => entered,
                            Err(refused) => return Ok(admission_refused(refused)),
                        }
                    }
                    Err(refused) => return Ok(admission_refused(refused)),
                };
                (host, started, entered, epoch, caller, depth)
            };
            let slot = entered.slot().clone();
            if let Some(epoch) = epoch {
                if slot.adopt_epoch(epoch) {
                    retag(&slot);
                }
            }
            // App authorization: on the constructed record, before a cold
            // instance activates, on every request.
            let ctx = Context::new(slot.clone());
            if let Err(refusal) = T::authorize(&ctx, &parts).await {
                if let Entered::Activating(busy) = entered {
                    Namespace::discard(busy);
                }
                return Ok(match refusal {
                    AuthError::Denied(denial) => {
                        host.metrics.auth_denials.inc();
                        denial.into_response()
                    }
                    AuthError::Failed(error) => {
                        tracing::error!(namespace = %host.ns, id = %slot.id, error = %pinned_edge::logging::Chain(&*error), "authorization failed");
                        host.metrics.request_failed("auth", "http");
                        response::detail(StatusCode::SERVICE_UNAVAILABLE, "authorization failed")
                    }
                });
            }
            let call = Call {
                ctx,
                attestation: caller,
                epoch,
                depth,
            };
            let span = request_span(&slot, &parts);
            // From here on in the request's span.
            let (entry, instance) = match entered {
                Entered::Live(busy, instance) => (busy, instance),
                Entered::Activating(busy) => {
                    let in_span = span.clone().unwrap_or_else(tracing::Span::none);
                    match Namespace::activation(busy).instrument(in_span).await {
                        Ok(activated) => activated,
                        Err(refused) => return Ok(admission_refused(refused)),
                    }
                }
            };
            // The entry was found above and left `Taken`; nothing between
            // could remove it (authorization sees the parts by reference).
            if let Some(routed) = parts.extensions.get_mut::<Routed>() {
                *routed = Routed::Admitted(Scope { call, instance });
            }
            (host, started, slot, span, entry)
        };

        let mut cancelled = pin!(slot.cancelled());
        let _turn = match &slot.turn {
            None => None,
            Some(turn) => {
                let mut acquire = pin!(turn.acquire());
                let permit = poll_fn(|cx| {
                    let _in_span = span.as_ref().map(tracing::Span::enter);
                    if cancelled.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(None);
                    }
                    acquire.as_mut().poll(cx).map(Result::ok)
                })
                .await;
                match permit {
                    Some(permit) => Some(permit),
                    None => return Ok(response::refusal(Refusal::Aborted)),
                }
            }
        };
        // The handler is polled first: one that answers at once never
        // registers with the abort's notifier (a lock and a list insert per
        // request). An abort signalled before it starts is caught here.
        if slot.is_cancelled() {
            return Ok(response::refusal(Refusal::Aborted));
        }
        let request = Request::from_parts(parts, body);
        // Called here, not through `oneshot`: a `Route` is always ready
        // (its `poll_ready` answers at once), and no `Oneshot` state then
        // sits around the handler's future. A route that is a service of
        // the application's own may panic in `call` too: caught as in the
        // handler's future.
        let handler = match std::panic::catch_unwind(AssertUnwindSafe(|| inner.call(request))) {
            Ok(handler) => handler,
            Err(panic) => return Ok(panicked(&host, &slot, span.as_ref(), panic.as_ref())),
        };
        let mut handler = pin!(AssertUnwindSafe(handler).catch_unwind());
        let outcome = poll_fn(|cx| {
            let _in_span = span.as_ref().map(tracing::Span::enter);
            if let Poll::Ready(outcome) = handler.as_mut().poll(cx) {
                return Poll::Ready(Some(outcome));
            }
            cancelled.as_mut().poll(cx).map(|()| None)
        })
        .await;
        let Some(outcome) = outcome else {
            return Ok(response::refusal(Refusal::Aborted));
        };
        // The request's one clock read after its start: its duration and
        // the instance's last activity.
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(started);
        host.duration.observe(elapsed.as_secs_f64());
        let response = match outcome {
            Ok(Ok(response)) => response.into_response(),
            Ok(Err(infallible)) => match infallible {},
            Err(panic) => return Ok(panicked(&host, &slot, span.as_ref(), panic.as_ref())),
        };
        let body = response.body();
        if body.is_end_stream() || body.size_hint().exact().is_some() {
            entry.leave_at(host.ms_at(now));
            return Ok(response);
        }
        // A streaming body: the instance stays in flight while it is pulled.
        let stream = slot.hold_stream();
        drop(entry);
        Ok(response.map(|body| Body::new(TrackedBody::new(body, stream))))
    }
}

/// `T`'s routes as the worker serves them: every matched route behind the
/// admission layer; an unknown path or method answered by the reference's
/// 404/405 without reaching it (so nothing is activated for it).
pub(crate) fn routes<T: Object>() -> Router {
    let routes = T::routes();
    let routes = if routes.has_routes() {
        routes.route_layer(AdmitLayer(admit::<T>))
    } else {
        routes
    };
    routes
        .method_not_allowed_fallback(|| async { crate::response::method_not_allowed() })
        .fallback(|| async { crate::response::not_found() })
        .with_state(RouteState::new())
}
