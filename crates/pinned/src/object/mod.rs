//! The object layer: what an application writes against. The [`Object`]
//! trait, the router state that ties routes to their object
//! ([`RouteState`], [`Routes`]), the [`This`] extractor, the per-request
//! [`Call`](call::Call), application [`State`](state::State) and
//! WebSockets ([`ws`]). It turns an object type into the namespace's
//! type-erased [`Lifecycle`] and reads what the request stack above
//! admitted; it never admits, routes or serves.
//!
//! An object's routes are built once per namespace; activation builds only
//! the instance's state. That is what lets one worker hold a million idle
//! instances: a two-route axum `Router` costs kilobytes, the state struct
//! of a counter eight bytes.
//!
//! Lifecycle code is trait methods with defaults, called with the instance
//! and its context. Nothing here stores a closure per instance: a closure
//! that captured the instance's `Context` would hold the instance record
//! alive from inside it, and an evicted instance would never be freed.

pub(crate) mod call;
pub(crate) mod error_response;
pub(crate) mod state;
pub mod ws;

use std::future::Future;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::Router;
use futures_util::future::BoxFuture;
use http::request::Parts;

use crate::instance::Instance;
use crate::namespace::context::Context;
use crate::namespace::sockets::SocketEvent;
use crate::namespace::{Idle, Lifecycle, Record};
use crate::object::call::{Admitted, NotAnInstanceRoute};
use crate::BoxError;

/// A durable object: state built per id on first request, routes built once
/// per namespace, lifecycle hooks as methods with defaults.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use axum::{routing::post, Json, Router};
/// use pinned::{BoxError, Context, Object, Routes, This};
///
/// struct Counter {
///     value: AtomicU64,
/// }
///
/// impl Object for Counter {
///     async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
///         Ok(Counter { value: AtomicU64::new(0) })
///     }
///
///     fn routes() -> Routes<Self> {
///         Router::new().route(
///             "/increment",
///             post(|this: This<Counter>| async move {
///                 Json(this.value.fetch_add(1, Ordering::SeqCst) + 1)
///             }),
///         )
///     }
///
///     // Optional: runs when the instance's alarm is due.
///     async fn alarm(&self, _ctx: &Context) -> Result<(), BoxError> {
///         self.value.store(0, Ordering::SeqCst);
///         Ok(())
///     }
/// }
/// ```
pub trait Object: Sized + Send + Sync + 'static {
    /// Builds the state of instance `ctx.id()`, on the first request for it.
    /// An error or a panic answers that request 500
    /// `{"detail":"Internal Server Error"}` and leaves nothing resident.
    fn activate(ctx: &Context) -> impl Future<Output = Result<Self, BoxError>> + Send;

    /// The routes of every instance, relative to `/<namespace>/<id>` (the
    /// bare instance URL matches `/`). Called once per hosted namespace.
    ///
    /// The router's state type ties its handlers to this object: a
    /// [`This`] naming another object type does not compile.
    fn routes() -> Routes<Self>;

    /// Decides whether a request may reach the instance: on every request
    /// (cold and warm alike) after the instance's record exists and, on a
    /// cold id, before [`activate`](Self::activate) runs, so it sees the
    /// context (id, epoch, store, [`state`](Context::state)) and the
    /// request's head, not the object. Not run for pinboard's `_wake` and
    /// `_alarm`.
    ///
    /// A [`Denial`](crate::Denial) answers 401/403 `{"message": ...}` (or
    /// its own payload or response); any other error answers 503
    /// `authorization failed`. A denied cold request discards the record and
    /// releases its placement. The default allows everything.
    ///
    /// ```
    /// use pinned::{AuthError, BoxError, Context, Denial, Object, Routes};
    ///
    /// struct Account;
    ///
    /// impl Object for Account {
    ///     async fn activate(_ctx: &Context) -> Result<Self, BoxError> { Ok(Account) }
    ///     fn routes() -> Routes<Self> { axum::Router::new() }
    ///
    ///     async fn authorize(ctx: &Context, request: &http::request::Parts) -> Result<(), AuthError> {
    ///         let owner = request.headers.get("x-user").and_then(|v| v.to_str().ok());
    ///         match owner {
    ///             None => Err(Denial::unauthorized("who are you?"))?,
    ///             Some(user) if user != ctx.id() => Err(Denial::forbidden("not your account"))?,
    ///             Some(_) => Ok(()),
    ///         }
    ///     }
    /// }
    /// ```
    fn authorize(
        ctx: &Context,
        request: &Parts,
    ) -> impl Future<Output = Result<(), crate::AuthError>> + Send {
        let _ = (ctx, request);
        async { Ok(()) }
    }

    /// Runs when the instance's alarm is due (set with
    /// [`Context::alarm`]), one run at a time, keeping the instance in
    /// flight; in exclusive mode it takes a turn like a request. An error or
    /// a panic leaves the alarm to fire again (at-least-once: make it
    /// idempotent).
    ///
    /// The default fails, so an alarm set on an object without this method
    /// is kept (and retried) rather than lost.
    fn alarm(&self, ctx: &Context) -> impl Future<Output = Result<(), BoxError>> + Send {
        let object = std::any::type_name::<Self>();
        let _ = ctx;
        async move { Err(BoxError::from(NoAlarmHandler(object))) }
    }

    /// Runs when the named schedule `name` is due (set with
    /// [`Context::schedule`]), like [`alarm`](Self::alarm): one run at a
    /// time, at least once. An error or a panic leaves that schedule to
    /// fire again; the default fails, so a schedule is never lost.
    fn scheduled(
        &self,
        ctx: &Context,
        name: &str,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let object = std::any::type_name::<Self>();
        let _ = ctx;
        let name = name.to_owned();
        async move { Err(BoxError::from(NoScheduleHandler(object, name))) }
    }

    /// Called when the idle sweep finds the instance idle (nothing in
    /// flight for the namespace's `idle_timeout`), instead of evicting it
    /// outright: [`Idle::Evict`] (the default) evicts it, [`Idle::Keep`]
    /// keeps it until its next activity goes idle again. An error evicts
    /// it and is counted in `pinned_callback_failures_total{hook="on_idle"}`.
    /// Not called while winding down: a winding-down instance closes when
    /// idle.
    fn on_idle(&self, ctx: &Context) -> impl Future<Output = Result<Idle, BoxError>> + Send {
        let _ = ctx;
        async { Ok(Idle::Evict) }
    }

    /// Called when the instance starts winding down (its own
    /// [`Context::wind_down`], pinboard's `wind_down`, or its worker's
    /// drain), and again when its deadline changes, with that deadline
    /// (`None`: no abort). [`Context::wind_down_started`] is the same news
    /// as a future. Errors are logged and counted in
    /// `pinned_callback_failures_total{hook="on_wind_down"}`.
    fn on_wind_down(
        &self,
        ctx: &Context,
        deadline: Option<tokio::time::Instant>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = (ctx, deadline);
        async { Ok(()) }
    }

    /// Called on every live instance when the worker's lease with pinboard
    /// turns unhealthy (no heartbeat ack in time): new activations are
    /// refused, and past the lease's expiry nothing is served, until an ack
    /// restores it. Never called in local mode. Errors are counted in
    /// `pinned_callback_failures_total{hook="on_unhealthy"}`.
    fn on_unhealthy(&self, ctx: &Context) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = ctx;
        async { Ok(()) }
    }

    /// The trays (durable work queues) of every instance: see
    /// [`tray`](crate::durable::tray). Called once per hosted namespace; the default
    /// declares none, and an object without trays pays nothing for them.
    fn trays() -> crate::durable::tray::Trays<Self> {
        crate::durable::tray::Trays::new()
    }

    /// Called on every live instance when an ack restores the worker's
    /// unhealthy lease. Errors are counted in
    /// `pinned_callback_failures_total{hook="on_restored"}`.
    fn on_restored(&self, ctx: &Context) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = ctx;
        async { Ok(()) }
    }

    /// Handles a message from one of the instance's hibernatable sockets
    /// (accepted with [`ws::WebSocketUpgrade::accept`]). Messages of one
    /// socket arrive one at a time, in order (`message.seq` counts them);
    /// those of different sockets may run concurrently, like requests (in
    /// exclusive mode each takes a turn). The instance is entered for it,
    /// so a hibernated (evicted) instance is activated first. An error or
    /// a panic is logged and counted in
    /// `pinned_callback_failures_total{hook="on_socket_message"}`; the
    /// socket stays open. The default ignores the message.
    ///
    /// ```
    /// use pinned::ws::{Socket, SocketMessage};
    /// use pinned::{BoxError, Context, Object, Routes};
    ///
    /// struct Room;
    ///
    /// impl Object for Room {
    ///     async fn activate(_ctx: &Context) -> Result<Self, BoxError> { Ok(Room) }
    ///     fn routes() -> Routes<Self> { axum::Router::new() }
    ///
    ///     async fn on_socket_message(
    ///         &self,
    ///         ctx: &Context,
    ///         _socket: &Socket,
    ///         message: SocketMessage,
    ///     ) -> Result<(), BoxError> {
    ///         // Every socket of the room hears it.
    ///         ctx.broadcast(None, message.message);
    ///         Ok(())
    ///     }
    /// }
    /// ```
    fn on_socket_message(
        &self,
        ctx: &Context,
        socket: &ws::Socket,
        message: ws::SocketMessage,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = (ctx, socket, message);
        async { Ok(()) }
    }

    /// Handles the end of one of the instance's hibernatable sockets, when
    /// its client closed it or the connection dropped (not for a close the
    /// object asked for, nor when the worker closes it), after every
    /// message before it. Like [`on_socket_message`](Self::on_socket_message),
    /// it activates a hibernated instance. Errors are counted in
    /// `pinned_callback_failures_total{hook="on_socket_close"}`.
    fn on_socket_close(
        &self,
        ctx: &Context,
        socket: &ws::Socket,
        close: ws::SocketClose,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = (ctx, socket, close);
        async { Ok(()) }
    }

    /// Runs once when the instance closes (idle eviction, wind-down, drain,
    /// abort, worker close), after its open work settled and before the
    /// handlers registered with [`Context::on_stop`]. The place for a final
    /// snapshot to the store. An error or a panic is logged and counted in
    /// `pinned_shutdown_failures_total`.
    fn on_stop(&self, ctx: &Context) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = ctx;
        async { Ok(()) }
    }
}

/// The error of the default [`Object::alarm`]: the alarm stays stored and
/// fires again.
#[derive(Debug, thiserror::Error)]
#[error("{0} has a due alarm but does not implement Object::alarm")]
pub struct NoAlarmHandler(&'static str);

/// The error of the default [`Object::scheduled`]: the schedule stays
/// stored and fires again.
#[derive(Debug, thiserror::Error)]
#[error("{0} has a due schedule {1:?} but does not implement Object::scheduled")]
pub struct NoScheduleHandler(&'static str, String);

/// The state type of an object's router. It carries nothing at run time;
/// it exists so that the extractors of `T`'s routes are checked against
/// `T` by the compiler.
pub struct RouteState<T>(PhantomData<fn() -> T>);

impl<T> RouteState<T> {
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Clone for RouteState<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for RouteState<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RouteState<{}>", std::any::type_name::<T>())
    }
}

/// The routes of object `T`: what [`Object::routes`] returns.
pub type Routes<T> = Router<RouteState<T>>;

/// Extracts the instance's state in a handler of an [`Object`]'s routes.
///
/// Only the object's own routes can extract it: `This<Other>` in a route of
/// another object is a compile-time error.
///
/// ```compile_fail
/// use axum::{routing::get, Router};
/// use pinned::{BoxError, Context, Object, Routes, This};
///
/// struct Room;
/// struct Lobby;
///
/// impl Object for Room {
///     async fn activate(_: &Context) -> Result<Self, BoxError> { Ok(Room) }
///     // A `Lobby` in `Room`'s routes: rejected by the compiler.
///     fn routes() -> Routes<Self> {
///         Router::new().route("/", get(|_lobby: This<Lobby>| async { "wrong object" }))
///     }
/// }
/// # impl Object for Lobby {
/// #     async fn activate(_: &Context) -> Result<Self, BoxError> { Ok(Lobby) }
/// #     fn routes() -> Routes<Self> { Router::new() }
/// # }
/// ```
pub struct This<T>(Arc<T>);

impl<T> This<T> {
    /// The shared state itself.
    pub fn into_inner(this: Self) -> Arc<T> {
        this.0
    }
}

impl<T> Clone for This<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Deref for This<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Object> FromRequestParts<RouteState<T>> for This<T> {
    type Rejection = NotAnInstanceRoute;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &RouteState<T>,
    ) -> Result<Self, Self::Rejection> {
        Admitted::of(&parts.extensions)
            .and_then(|admitted| admitted.instance.clone().downcast::<T>().ok())
            .map(This)
            .ok_or(NotAnInstanceRoute(std::any::type_name::<Self>()))
    }
}

/// The lifecycle of object type `T`, type-erased for its namespace.
pub(crate) fn lifecycle<T: Object>() -> Lifecycle {
    Lifecycle {
        activate: activate::<T>,
        alarm: alarm::<T>,
        scheduled: scheduled::<T>,
        on_stop: on_stop::<T>,
        on_idle: on_idle::<T>,
        on_wind_down: on_wind_down::<T>,
        on_unhealthy: on_unhealthy::<T>,
        on_restored: on_restored::<T>,
        on_socket: on_socket::<T>,
    }
}

fn on_socket<T: Object>(
    instance: Instance,
    record: Arc<Record>,
    socket: ws::Socket,
    event: SocketEvent,
) -> BoxFuture<'static, Result<(), BoxError>> {
    Box::pin(async move {
        let ctx = Context::new(record);
        let object = downcast::<T>(instance)?;
        match event {
            SocketEvent::Message(message) => object.on_socket_message(&ctx, &socket, message).await,
            SocketEvent::Close(close) => object.on_socket_close(&ctx, &socket, close).await,
        }
    })
}

fn activate<T: Object>(record: Arc<Record>) -> BoxFuture<'static, Result<Instance, BoxError>> {
    Box::pin(async move {
        let ctx = Context::new(record);
        let state = T::activate(&ctx).await?;
        Ok(Arc::new(state) as Instance)
    })
}

fn downcast<T: Object>(instance: Instance) -> Result<Arc<T>, BoxError> {
    instance
        .downcast::<T>()
        .map_err(|_| BoxError::from(format!("instance is not a {}", std::any::type_name::<T>())))
}

fn alarm<T: Object>(
    instance: Instance,
    record: Arc<Record>,
) -> BoxFuture<'static, Result<(), BoxError>> {
    Box::pin(async move {
        let ctx = Context::new(record);
        downcast::<T>(instance)?.alarm(&ctx).await
    })
}

fn scheduled<T: Object>(
    instance: Instance,
    record: Arc<Record>,
    name: String,
) -> BoxFuture<'static, Result<(), BoxError>> {
    Box::pin(async move {
        let ctx = Context::new(record);
        downcast::<T>(instance)?.scheduled(&ctx, &name).await
    })
}

fn on_stop<T: Object>(
    instance: Instance,
    record: Arc<Record>,
) -> BoxFuture<'static, Result<(), BoxError>> {
    Box::pin(async move {
        let ctx = Context::new(record);
        downcast::<T>(instance)?.on_stop(&ctx).await
    })
}

fn on_idle<T: Object>(
    instance: Instance,
    record: Arc<Record>,
) -> BoxFuture<'static, Result<Idle, BoxError>> {
    Box::pin(async move {
        let ctx = Context::new(record);
        downcast::<T>(instance)?.on_idle(&ctx).await
    })
}

fn on_wind_down<T: Object>(
    instance: Instance,
    record: Arc<Record>,
    deadline: Option<tokio::time::Instant>,
) -> BoxFuture<'static, Result<(), BoxError>> {
    Box::pin(async move {
        let ctx = Context::new(record);
        downcast::<T>(instance)?.on_wind_down(&ctx, deadline).await
    })
}

fn on_unhealthy<T: Object>(
    instance: Instance,
    record: Arc<Record>,
) -> BoxFuture<'static, Result<(), BoxError>> {
    Box::pin(async move {
        let ctx = Context::new(record);
        downcast::<T>(instance)?.on_unhealthy(&ctx).await
    })
}

fn on_restored<T: Object>(
    instance: Instance,
    record: Arc<Record>,
) -> BoxFuture<'static, Result<(), BoxError>> {
    Box::pin(async move {
        let ctx = Context::new(record);
        downcast::<T>(instance)?.on_restored(&ctx).await
    })
}
