//! Application state shared by every instance: a database pool, an HTTP
//! client, a configuration. Given once with [`Options::state`], reached from
//! handlers with the [`State`] extractor and from lifecycle code with
//! [`Context::state`].
//!
//! States are keyed by type, one value per type, set before the worker is
//! built and read-only afterwards (put interior mutability inside the value
//! when it needs some). Nothing here is per instance: instance memory is the
//! object itself.
//!
//! [`Options::state`]: crate::Options::state
//! [`Context::state`]: crate::Context::state

use std::ops::Deref;

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use crate::object::call::Admitted;
use crate::object::error_response::with_failure;
use crate::response::internal_error;

/// Extracts application state `S` (given with
/// [`Options::state`](crate::Options::state)) in a handler of an object's
/// routes.
///
/// ```
/// use axum::{routing::get, Router};
/// use pinned::{BoxError, Context, Object, Options, Routes, State};
///
/// #[derive(Clone)]
/// struct Config {
///     greeting: &'static str,
/// }
///
/// struct Greeter;
///
/// impl Object for Greeter {
///     async fn activate(ctx: &Context) -> Result<Self, BoxError> {
///         let _config: Config = ctx.state().ok_or("no Config")?;
///         Ok(Greeter)
///     }
///
///     fn routes() -> Routes<Self> {
///         Router::new().route("/", get(|State(config): State<Config>| async move {
///             config.greeting
///         }))
///     }
/// }
///
/// let options = Options::new()
///     .host::<Greeter>("/greeter")
///     .state(Config { greeting: "hello" });
/// ```
///
/// A state of a type that was never given answers 500 and logs the type.
#[derive(Clone, Debug)]
pub struct State<S>(pub S);

impl<S> Deref for State<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.0
    }
}

/// The rejection of [`State`]: no state of that type was given to the
/// worker (or the extractor ran outside an instance route).
#[derive(Debug, thiserror::Error)]
#[error("no application state of type {0}; give one with Options::state")]
pub struct MissingState(&'static str);

impl IntoResponse for MissingState {
    fn into_response(self) -> Response {
        // Written by the request stack, naming the instance.
        with_failure(
            internal_error(),
            tracing::Level::ERROR,
            "State extractor",
            &self,
        )
    }
}

impl<S, R> FromRequestParts<R> for State<S>
where
    S: Clone + Send + Sync + 'static,
    R: Send + Sync,
{
    type Rejection = MissingState;

    async fn from_request_parts(parts: &mut Parts, _state: &R) -> Result<Self, Self::Rejection> {
        Admitted::of(&parts.extensions)
            .and_then(|admitted| admitted.call.ctx.state::<S>())
            .map(State)
            .ok_or(MissingState(std::any::type_name::<S>()))
    }
}
