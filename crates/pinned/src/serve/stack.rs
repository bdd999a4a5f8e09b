//! The request stack: what stands between a matched route of an object and
//! its handler, assembled in one place ([`routes`]) and run as one
//! coroutine ([`serve`]), in this order, each step for one reason:
//!
//! 1. **gate**: the reference's checks in its order (attestation 403, id
//!    400, `Pinboard-Epoch` 400), before any instance exists for a request
//!    that would be refused anyway;
//! 2. **admission guard**: the namespace enters (or creates) the instance's
//!    record, and the entry keeps it in flight until the answer leaves,
//!    so nothing evicts an instance under a request;
//! 3. **authorization**: the object's `authorize` on every request, before
//!    a cold instance activates (a denied cold request leaves nothing
//!    behind); then the activation, once per id, awaited by every request
//!    that needs it;
//! 4. **turn**: an exclusive object serves one request at a time;
//! 5. **shield**: the handler raced against the instance's abort (an
//!    evicted instance answers 503, never a handler that runs on) and its
//!    panics caught (500, the worker lives on);
//! 6. the **handler**, with the typed [`Admitted`] value its extractors read.
//!
//! The stack runs only around a route the object has (`route_layer`): an
//! unknown path or method answers 404/405 without creating, activating or
//! placing anything. [`dispatch`](crate::serve::dispatch) only split the
//! path.
//!
//! Two fusions, for speed: the gate and the admission guard are one
//! synchronous step, and the rare waits (a closing record, a cold
//! activation) are boxed (`worker-bench`: a separate future per step cost
//! about 500 instructions a warm request).

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::panic::AssertUnwindSafe;
use std::pin::{pin, Pin};
use std::sync::{Arc, Weak};
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

use crate::auth::AuthError;
use crate::instance::abort::Cancelled;
use crate::namespace::context::Context;
use crate::namespace::work_span::WorkSpan;
use crate::namespace::Record;
use crate::namespace::{panic_message, Admission, Attempt, Entered, Namespace};
use crate::object::call::{Admitted, Call};
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
        Admission::Paused => crate::durable::inspect::paused_response(),
    }
}

/// The id segment and the path the object's routes see.
pub(crate) struct Target<'a> {
    pub(crate) raw_id: &'a str,
    pub(crate) rest: &'a str,
}

/// Splits `/<ns>/<id><rest>`; the route guarantees the `/<ns>/` prefix,
/// so it is skipped, not compared again.
#[inline]
pub(crate) fn target<'a>(ns: &str, path: &'a str) -> Target<'a> {
    let after = path
        .get(ns.len()..)
        .and_then(|after| after.strip_prefix('/'))
        .unwrap_or("");
    // A byte search: the id is a few bytes, shorter than `find`'s set-up.
    match after.bytes().position(|b| b == b'/') {
        Some(slash) => Target {
            raw_id: &after[..slash],
            rest: &after[slash..],
        },
        None => Target {
            raw_id: after,
            rest: "/",
        },
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
#[inline]
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

/// The stack as a tower layer over each of an object's routes, made from
/// the namespace it serves (held weakly: the namespace holds its router)
/// and the stack's coroutine: `StackLayer { ns, serve: serve::<T> }`.
///
/// It carries that function (a zero-sized fn item) rather than naming `T`:
/// the service's future is then the function's own return type, named
/// through `F`, so axum's route puts the coroutine in the one box it
/// allocates for every route future, not a second box of its own.
#[derive(Clone)]
pub(crate) struct StackLayer<F> {
    ns: Weak<Namespace>,
    serve: F,
}

impl<S, F: Clone> Layer<S> for StackLayer<F> {
    type Service = Stack<S, F>;

    fn layer(&self, inner: S) -> Stack<S, F> {
        Stack {
            inner: Some(inner),
            ns: self.ns.clone(),
            serve: self.serve.clone(),
        }
    }
}

/// One matched route of an object behind the stack.
///
/// axum clones the route's service for every request and calls the clone
/// once, so [`call`](Service::call) moves the inner route out of it
/// rather than cloning it a second time (a boxed service's clone: an
/// allocation and its free, `worker-bench`).
#[derive(Clone)]
pub(crate) struct Stack<S, F> {
    inner: Option<S>,
    ns: Weak<Namespace>,
    serve: F,
}

impl<S, F, Fut> Service<Request> for Stack<S, F>
where
    S: Clone,
    F: Fn(Option<Arc<Namespace>>, Option<S>, Parts, Body) -> Fut,
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
        // A service called a second time (never by axum's routes, which
        // call a fresh clone each request) answers 500.
        (self.serve)(self.ns.upgrade(), self.inner.take(), parts, body)
    }
}

/// What the fused gate and admission guard let through: the instance
/// entered, and what the gate learnt.
struct Entry<'a> {
    entered: Attempt,
    id: Cow<'a, str>,
    epoch: Option<u64>,
    caller: Option<Caller>,
    depth: i64,
}

/// Why steps 1 and 2 turned a request away.
enum TurnedAway {
    /// The gate's 403 or 400.
    Gate(Refused),
    /// The namespace's refusal (503s, or 500 for a closed worker).
    Admission(Admission),
}

impl IntoResponse for TurnedAway {
    fn into_response(self) -> Response {
        match self {
            Self::Gate(refused) => refused.into_response(),
            Self::Admission(refused) => admission_refused(refused),
        }
    }
}

/// Steps 1 and 2, fused (one synchronous step, see the module docs): the
/// gate on the request's head, then one attempt to enter instance `id` at
/// `arrived` (the namespace's milliseconds). Inlined, as [`gate`],
/// [`target`] and `dispatch::route` are: what each answers is then built
/// in place, not copied out of a call (`worker-bench`: the four, about 90
/// instructions of a warm request).
#[inline]
fn gate_and_enter<'a>(
    ns: &Arc<Namespace>,
    headers: &HeaderMap,
    raw_id: &'a str,
    arrived: u64,
) -> Result<Entry<'a>, TurnedAway> {
    let Passed {
        id,
        epoch,
        caller,
        depth,
    } = gate(ns, headers, raw_id).map_err(TurnedAway::Gate)?;
    let entered = ns
        .try_admit(&id, epoch, arrived)
        .map_err(TurnedAway::Admission)?;
    Ok(Entry {
        entered,
        id,
        epoch,
        caller,
        depth,
    })
}

/// The answer to a request whose handler panicked, logged in its span.
fn panicked(
    host: &Namespace,
    slot: &Record,
    span: Option<&WorkSpan>,
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

/// The request span (see [`serve`]): at debug, as tower-http's, inside
/// the instance span (debug too, the one the record keeps, shared, see
/// `Record::shared_span`). With nothing listening at `debug` there is
/// none, not even a disabled one: no span is cloned, entered on every
/// poll, or dropped.
///
/// While traces are exported the request span continues the trace of the
/// request's `traceparent` (pinboard's attempt span, or a client's).
#[inline]
fn request_span(slot: &Record, parts: &Parts) -> Option<WorkSpan> {
    // The global level hint first: a load and a compare when nothing
    // listens at `debug` (the examples' default `info` included).
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return None;
    }
    let instance = slot.shared_span();
    let none = tracing::Span::none();
    let parent = instance.as_deref().unwrap_or(&none);
    let span = tracing::debug_span!(parent: parent, "request", method = %parts.method, path = %parts.uri.path());
    if span.is_disabled() && instance.is_none() {
        return None;
    }
    pinned_edge::trace::continue_from(&span, &parts.headers);
    Some(WorkSpan::new(instance, span))
}

/// Polls `slot`'s abort, making its future in `abort` on the first poll.
fn poll_abort<'a>(
    slot: &'a Record,
    mut abort: Pin<&mut Option<Cancelled<'a>>>,
    cx: &mut TaskContext<'_>,
) -> Poll<()> {
    if abort.is_none() {
        abort.set(Some(slot.cancelled()));
    }
    match abort.as_pin_mut() {
        Some(cancelled) => cancelled.poll(cx),
        None => Poll::Pending,
    }
}

/// One request through the stack (see the module docs for its steps).
///
/// One coroutine, no future nested in another (a nested one would carry a
/// second copy of the request): its state, in the box axum's route
/// allocates ([`StackLayer`]), is the request once plus the handler's
/// future. The request's parts are lent to authorization where they lie
/// and moved out only into the handler.
#[allow(clippy::manual_async_fn)] // an `async fn` would copy its arguments into the coroutine again
pub(crate) fn serve<T: Object>(
    ns: Option<Arc<Namespace>>,
    inner: Option<Route>,
    mut parts: Parts,
    body: Body,
) -> impl Future<Output = Result<Response, Infallible>> + Send {
    // The steps are blocks: a local's storage stays reserved until its
    // scope ends, also once moved from, so what a step needs is scoped to
    // it and only its results are kept beside the handler's future.
    async move {
        // The request's start: its duration and the instance's activity.
        let started = Instant::now();
        // `None`: the worker was dropped while a connection still routed
        // here, or the stack was called twice (see [`Stack`]).
        let (Some(host), Some(mut inner)) = (ns, inner) else {
            return Ok(response::internal_error());
        };
        let arrived = host.ms_at(started);
        let (slot, span, entry) = {
            // 1 and 2: the gate, then the admission guard.
            let (entered, epoch, caller, depth) = {
                let raw_id = parts
                    .extensions
                    .get::<OriginalUri>()
                    .map_or("", |OriginalUri(original)| {
                        target(&host.ns, original.path()).raw_id
                    });
                let Entry {
                    entered,
                    id,
                    epoch,
                    caller,
                    depth,
                } = match gate_and_enter(&host, &parts.headers, raw_id, arrived) {
                    Ok(entry) => entry,
                    Err(refused) => return Ok(refused.into_response()),
                };
                // Only a record that is closing is waited out (boxed: that
                // rare wait would otherwise size every request's state).
                let entered = match entered {
                    Attempt::Entered(entered) => entered,
                    Attempt::Closing(slot) => {
                        match Box::pin(host.enter_after(slot, &id, epoch)).await {
                            Ok(entered) => entered,
                            Err(refused) => return Ok(admission_refused(refused)),
                        }
                    }
                };
                (entered, epoch, caller, depth)
            };
            let slot = entered.slot().clone();
            if let Some(epoch) = epoch {
                if slot.adopt_epoch(epoch) {
                    retag(&slot);
                }
            }
            // 3: authorization, on the constructed record, before a cold
            // instance activates, on every request.
            let ctx = Context::new(slot.clone());
            // A held socket's event was authorized with its handshake.
            let authorize = !crate::serve::held_event::is_event(&host, &parts);
            if let Err(refusal) = match authorize {
                true => T::authorize(&ctx, &parts).await,
                false => Ok(()),
            } {
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
            // Then the activation, boxed: only a cold request waits for it.
            let (entry, instance) = match entered {
                Entered::Live(busy, instance) => (busy, instance),
                Entered::Activating(busy) => {
                    let in_span = span
                        .clone()
                        .unwrap_or_else(|| WorkSpan::new(None, tracing::Span::none()));
                    match Box::pin(in_span.instrument(Namespace::activation(busy))).await {
                        Ok(activated) => activated,
                        Err(refused) => return Ok(admission_refused(refused)),
                    }
                }
            };
            // What the handler's extractors read: one typed value.
            parts.extensions.insert(Admitted { call, instance });
            (slot, span, entry)
        };

        // The abort's future, made when first polled: a handler that
        // answers in its first poll never needs one.
        let mut cancelled = pin!(None);
        // 4: the turn of an exclusive object, raced against the abort.
        let _turn = match &slot.turn {
            None => None,
            Some(turn) => {
                let mut acquire = pin!(turn.acquire());
                let permit = poll_fn(|cx| {
                    let _in_span = span.as_ref().map(WorkSpan::enter);
                    if poll_abort(&slot, cancelled.as_mut(), cx).is_ready() {
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
        // 5: the shield. The handler is polled first: one that answers at once never
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
            let _in_span = span.as_ref().map(WorkSpan::enter);
            if let Poll::Ready(outcome) = handler.as_mut().poll(cx) {
                return Poll::Ready(Some(outcome));
            }
            poll_abort(&slot, cancelled.as_mut(), cx).map(|()| None)
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
        let mut response = match outcome {
            Ok(Ok(response)) => response.into_response(),
            Ok(Err(infallible)) => match infallible {},
            Err(panic) => return Ok(panicked(&host, &slot, span.as_ref(), panic.as_ref())),
        };
        // A library error's line, named here (a status compare on success).
        if response.status().is_server_error() {
            let _in_span = span.as_ref().map(WorkSpan::enter);
            crate::object::error_response::log_failure(&mut response, &host.ns, &slot.id);
        }
        let body = response.body();
        if body.is_end_stream() || body.size_hint().exact().is_some() {
            // The namespace's milliseconds of `now`, from the arrival's
            // and the duration already measured (no second conversion).
            let elapsed_ms = elapsed
                .as_secs()
                .saturating_mul(1000)
                .saturating_add(u64::from(elapsed.subsec_millis()));
            entry.leave_at(arrived.saturating_add(elapsed_ms));
            return Ok(response);
        }
        // A streaming body: the instance stays in flight while it is pulled.
        let stream = slot.hold_stream();
        drop(entry);
        Ok(response.map(|body| Body::new(TrackedBody::new(body, stream))))
    }
}

/// The route messages between objects arrive on, for an object whose
/// trays `receivers` take them.
fn message_route<S: Clone + Send + Sync + 'static>(
    receivers: Arc<[crate::durable::tray::Receiver]>,
) -> Router<S> {
    Router::new().route(
        crate::durable::tray::MESSAGE_PATH,
        axum::routing::post(move |call: Call, body: axum::body::Bytes| async move {
            crate::durable::tray::admit_message(receivers, call.attestation(), call.ctx(), body)
                .await
        }),
    )
}

/// `T`'s routes as the worker serves them, for namespace `ns` (with the
/// events of the sockets pinboard holds when its sockets survive moves,
/// `held`): the one place the request stack is assembled.
pub(crate) fn routes<T: Object>(ns: Weak<Namespace>, held: bool) -> Router {
    let routes = T::routes();
    // Messages between objects: the worker's own route, behind the same
    // stack, for an object whose trays receive them.
    let receivers = T::trays().receivers();
    let routes = if receivers.is_empty() {
        routes
    } else {
        routes.merge(message_route(receivers))
    };
    // Events of the sockets pinboard holds, for a namespace whose sockets
    // survive moves.
    let routes = match held {
        true => routes.merge(crate::serve::held_event::route()),
        false => routes,
    };
    let routes = if routes.has_routes() {
        // Around each matched route only (see the module docs): the
        // stack's steps run in `serve`, in order.
        routes.route_layer(StackLayer {
            ns,
            serve: serve::<T>,
        })
    } else {
        routes
    };
    // An unknown method or path: the reference framework's 405 and 404,
    // before any instance exists.
    routes
        .method_not_allowed_fallback(|| async { crate::response::method_not_allowed() })
        .fallback(|| async { crate::response::not_found() })
        .with_state(RouteState::new())
}
