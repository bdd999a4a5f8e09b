//! The per-request [`Call`]: which instance serves it, who called, and at
//! which placement epoch it was admitted.

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use pinned_wire::attestation::Caller;

use crate::instance::Instance;
use crate::namespace::context::Context;
use crate::object::error_response::with_failure;
use crate::plane::cluster::Cluster;
use crate::response::internal_error;

/// What the request stack hands a request it admitted: the request's
/// [`Call`] and the object's state, the one value an instance route's
/// extractors ([`Call`], [`Context`], [`This`](crate::This),
/// [`State`](crate::State), the WebSocket upgrade) read.
#[derive(Clone)]
pub(crate) struct Admitted {
    pub(crate) call: Call,
    pub(crate) instance: Instance,
}

impl Admitted {
    /// What the request was admitted with, if it was.
    pub(crate) fn of(extensions: &http::Extensions) -> Option<&Admitted> {
        extensions.get::<Admitted>()
    }
}

/// The request's view of its instance, extracted in handlers:
///
/// ```
/// async fn whoami(call: pinned::Call) -> String {
///     format!("{}{} at epoch {:?}", call.ctx().ns(), call.ctx().id(), call.epoch())
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Call {
    pub(crate) ctx: Context,
    pub(crate) attestation: Option<Caller>,
    pub(crate) epoch: Option<u64>,
    /// The verified subrequest depth of this request (0 for clients).
    pub(crate) depth: i64,
}

impl Call {
    /// The instance's context.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The verified caller: another instance, an account, or `None` for an
    /// anonymous client (always `None` in local mode).
    pub fn attestation(&self) -> Option<&Caller> {
        self.attestation.as_ref()
    }

    /// The placement epoch the request was admitted at; `None` without a
    /// control plane.
    pub fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// The subrequest depth of this request: 0 for a client, `n` for the
    /// n-th nested cluster call.
    pub fn depth(&self) -> i64 {
        self.depth
    }

    /// A cluster client whose calls are one level deeper than this request.
    pub fn cluster(&self) -> Cluster {
        let host = &self.ctx.slot().host;
        Cluster::new(
            &host.switchboard,
            &host.control,
            &host.ns,
            self.ctx.id(),
            self.depth.saturating_add(1),
        )
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Call {
    type Rejection = NotAnInstanceRoute;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Admitted::of(&parts.extensions)
            .map(|admitted| admitted.call.clone())
            .ok_or(NotAnInstanceRoute("pinned::Call"))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Context {
    type Rejection = NotAnInstanceRoute;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Admitted::of(&parts.extensions)
            .map(|admitted| admitted.call.ctx.clone())
            .ok_or(NotAnInstanceRoute("pinned::Context"))
    }
}

/// The rejection of [`This`](crate::This), [`Call`](crate::Call) and
/// [`WebSocketUpgrade`](crate::object::ws::WebSocketUpgrade) outside an instance
/// route (a router served on its own): a programming error, answered 500.
#[derive(Debug, thiserror::Error)]
#[error("{0} used outside a pinned instance route of that object")]
pub struct NotAnInstanceRoute(pub(crate) &'static str);

impl IntoResponse for NotAnInstanceRoute {
    fn into_response(self) -> Response {
        // Written by the request stack, naming the instance.
        with_failure(
            internal_error(),
            tracing::Level::ERROR,
            "extractor misuse",
            &self,
        )
    }
}
