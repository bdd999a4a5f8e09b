//! An object type's lifecycle as its namespace holds it: the hooks of
//! [`Object`](crate::Object), type-erased (one set per namespace, fn
//! pointers: nothing is stored per instance), and what `on_idle` decides.
//!
//! The namespace calls them at its lifecycle points with the instance's
//! record; the object layer above builds them for each object type, each
//! handing the object a [`Context`](crate::Context) on that record.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::Record;
use crate::instance::Instance;
use crate::BoxError;

/// What [`Object::on_idle`](crate::Object::on_idle) decides for an idle instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Evict it now (the default).
    Evict,
    /// Keep it resident until it is busy and idle again.
    Keep,
}

/// A lifecycle hook of one object type, erased so the namespace can hold it.
pub(crate) type Hook = fn(Instance, Arc<Record>) -> BoxFuture<'static, Result<(), BoxError>>;

/// [`Object::scheduled`](crate::Object::scheduled), type-erased.
pub(crate) type ScheduleHook =
    fn(Instance, Arc<Record>, String) -> BoxFuture<'static, Result<(), BoxError>>;

/// [`Object::on_idle`](crate::Object::on_idle), type-erased.
pub(crate) type IdleHook = fn(Instance, Arc<Record>) -> BoxFuture<'static, Result<Idle, BoxError>>;

/// [`Object::on_wind_down`](crate::Object::on_wind_down), type-erased.
pub(crate) type WindDownHook = fn(
    Instance,
    Arc<Record>,
    Option<tokio::time::Instant>,
) -> BoxFuture<'static, Result<(), BoxError>>;

/// The socket events of [`Object`](crate::Object) (`on_socket_message`,
/// `on_socket_close`), type-erased.
pub(crate) type SocketHook = fn(
    Instance,
    Arc<Record>,
    super::sockets::Socket,
    super::sockets::SocketEvent,
) -> BoxFuture<'static, Result<(), BoxError>>;

/// An object type's lifecycle, type-erased: what one hosted namespace needs
/// to build and run its instances.
#[derive(Clone)]
pub(crate) struct Lifecycle {
    pub(crate) activate: fn(Arc<Record>) -> BoxFuture<'static, Result<Instance, BoxError>>,
    pub(crate) alarm: Hook,
    pub(crate) scheduled: ScheduleHook,
    pub(crate) on_stop: Hook,
    pub(crate) on_idle: IdleHook,
    pub(crate) on_wind_down: WindDownHook,
    pub(crate) on_unhealthy: Hook,
    pub(crate) on_restored: Hook,
    pub(crate) on_socket: SocketHook,
}
