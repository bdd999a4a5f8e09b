//! The [`Object`] trait and the [`This`] extractor.
//!
//! An object's routes are built once per namespace; activation builds only
//! the instance's state. That is what lets one worker hold a million idle
//! instances: a two-route axum `Router` costs kilobytes, the state struct
//! of a counter eight bytes.

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::request::Parts;
use http::StatusCode;

use crate::call::Scope;
use crate::context::Context;
use crate::response::detail;
use crate::BoxError;

/// A durable object: state built per id on first request, routes built once
/// per namespace.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use axum::{routing::post, Json, Router};
/// use pinned::{BoxError, Context, Object, This};
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
///     fn routes() -> Router {
///         Router::new().route(
///             "/increment",
///             post(|this: This<Counter>| async move {
///                 Json(this.value.fetch_add(1, Ordering::SeqCst) + 1)
///             }),
///         )
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
    fn routes() -> Router;
}

/// Extracts the instance's state in a handler of an [`Object`]'s routes.
///
/// Used outside such a route, or naming another object's type, it answers
/// 500 and logs why.
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

/// The rejection of [`This`] and [`Call`](crate::Call) outside an instance
/// route: a programming error, answered 500.
#[derive(Debug, thiserror::Error)]
#[error("{0} used outside a pinned instance route of that object")]
pub struct NotAnInstanceRoute(pub(crate) &'static str);

impl IntoResponse for NotAnInstanceRoute {
    fn into_response(self) -> Response {
        tracing::error!(error = %self, "extractor misuse");
        detail(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error")
    }
}

impl<T, S> FromRequestParts<S> for This<T>
where
    T: Send + Sync + 'static,
    S: Send + Sync,
{
    type Rejection = NotAnInstanceRoute;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let scope = parts
            .extensions
            .get::<Scope>()
            .ok_or(NotAnInstanceRoute(std::any::type_name::<Self>()))?;
        scope
            .instance
            .clone()
            .downcast::<T>()
            .map(This)
            .map_err(|_| NotAnInstanceRoute(std::any::type_name::<Self>()))
    }
}

/// Turns an object type into the directory's type-erased activator.
pub(crate) fn activator<T: Object>() -> crate::directory::Activator {
    Arc::new(|ctx: Context| {
        Box::pin(async move {
            let state = T::activate(&ctx).await?;
            Ok(Arc::new(state) as crate::slot::Instance)
        })
            as futures_util::future::BoxFuture<'static, Result<crate::slot::Instance, BoxError>>
    })
}
