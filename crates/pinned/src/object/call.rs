//! The per-request [`Call`]: which instance serves it, who called, and at
//! which placement epoch it was admitted.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::StatusCode;
use pinned_wire::attestation::Caller;
use tokio::time::Instant;

use crate::instance::Instance;
use crate::namespace::context::Context;
use crate::namespace::Namespace;
use crate::plane::cluster::Cluster;
use crate::response::detail;

/// What admission attaches to every request it hands to an instance's
/// handler.
#[derive(Clone)]
pub(crate) struct Scope {
    pub(crate) call: Call,
    pub(crate) instance: Instance,
}

impl Scope {
    /// The scope a request was admitted with.
    pub(crate) fn of(extensions: &http::Extensions) -> Option<&Scope> {
        match extensions.get::<Routed>()? {
            Routed::Admitted(scope) => Some(scope),
            Routed::Pending(_) | Routed::Taken => None,
        }
    }
}

/// What dispatch established about a request before routing it: which
/// namespace and which (still unchecked) id segment it is for.
#[derive(Clone)]
pub(crate) struct Pending {
    pub(crate) host: Arc<Namespace>,
    /// Where the raw id segment lies in the path of the request's
    /// [`OriginalUri`] (set by dispatch, which axum's router leaves as it
    /// is), so no id is copied before the gate decodes it.
    pub(crate) id_at: std::ops::Range<usize>,
    pub(crate) started: Instant,
}

/// The one extension a request under a namespace carries into the
/// instance's routes: what dispatch found until admission takes it, then
/// the admitted [`Scope`]. One entry, changed in place: each extension
/// inserted on the hot path is an allocation and a hash insert.
#[derive(Clone)]
pub(crate) enum Routed {
    /// Split by dispatch, not yet admitted.
    Pending(Pending),
    /// Taken by admission, which is deciding.
    Taken,
    /// Admitted.
    Admitted(Scope),
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
        Scope::of(&parts.extensions)
            .map(|scope| scope.call.clone())
            .ok_or(NotAnInstanceRoute("pinned::Call"))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Context {
    type Rejection = NotAnInstanceRoute;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Scope::of(&parts.extensions)
            .map(|scope| scope.call.ctx.clone())
            .ok_or(NotAnInstanceRoute("pinned::Context"))
    }
}

/// The rejection of [`This`], [`Call`](crate::Call) and
/// [`WebSocketUpgrade`](crate::object::ws::WebSocketUpgrade) outside an instance
/// route (a router served on its own): a programming error, answered 500.
#[derive(Debug, thiserror::Error)]
#[error("{0} used outside a pinned instance route of that object")]
pub struct NotAnInstanceRoute(pub(crate) &'static str);

impl IntoResponse for NotAnInstanceRoute {
    fn into_response(self) -> Response {
        tracing::error!(error = %self, "extractor misuse");
        detail(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error")
    }
}
