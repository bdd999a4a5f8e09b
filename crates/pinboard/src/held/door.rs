//! How a held socket's events enter the proxy: the [`Door`] (the proxy's
//! own entry, as a trait object, so this module stays below the proxy) and
//! the mark an event request carries through it ([`EventMark`]).
//!
//! Owns nothing but the two types; never proxies.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request};

/// The proxy's entry for requests this node makes itself: a held socket's
/// events go through it as any client request (resolved, placed, retried).
pub trait Door: Send + Sync + 'static {
    /// Proxies `request` to its id's owner.
    fn serve(&self, request: Request<Body>) -> BoxFuture<'_, Response>;
}

/// The door of the node a WebSocket handshake arrived at, in the
/// handshake's extensions: a handshake without one (the simulation) is
/// never offered for holding.
#[derive(Clone)]
pub struct HeldDoor(pub Arc<dyn Door>);

impl std::fmt::Debug for HeldDoor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldDoor")
    }
}

/// In an event request's extensions: the socket's id, which the proxy
/// puts in `pinboard-socket-event` after it strips every `pinboard-*`
/// field (a client cannot set extensions, so only this node's events carry
/// it).
#[derive(Clone, Debug)]
pub struct EventMark(pub HeaderValue);
