//! How one connection's requests are routed, whichever stage of the
//! connection read them (the shared front, or hyper after it): a
//! namespace's path straight to its dispatch, anything else to the
//! application's router, every request starting from the connection's
//! extensions (the peer's [`ConnectInfo`]).
//!
//! Owns a connection's per-request state (its recent rewritten paths, its
//! extensions); never reads or writes the socket (the front and hyper do)
//! and never looks at a request beyond its path (the application's
//! [`Router`] and the namespace's dispatch do).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::Response;
use axum::Router;
use futures_util::FutureExt;
use http::{Extensions, Request};
use pinned_edge::front::{self, Arrived};
use tower::ServiceExt;

use crate::response;
use crate::serve::dispatch;
use crate::serve::namespaces::Namespaces;

/// The extensions every request of the connection from `peer` starts with
/// (each request a clone): the peer's [`ConnectInfo`], in a map with room
/// for the entries a namespace request gathers on its way (the worker's
/// own, then axum's `OriginalUri`, `MatchedPath` and path parameters).
/// An empty map is created for three and would be regrown, rehashed and
/// freed at the fourth insert of every request; `http::Extensions` has no
/// `with_capacity`, so placeholders size it once per connection
/// (`proxy-bench instructions`: 17 668 instructions a warm request
/// without them, 17 232 with).
fn request_extensions(peer: std::net::SocketAddr) -> Extensions {
    /// Placeholder entries that size the map, removed again.
    #[derive(Clone)]
    struct Room<const N: usize>;
    let mut extensions = Extensions::new();
    extensions.insert(Room::<0>);
    extensions.insert(Room::<1>);
    extensions.insert(Room::<2>);
    extensions.insert(Room::<3>);
    extensions.remove::<Room<0>>();
    extensions.remove::<Room<1>>();
    extensions.remove::<Room<2>>();
    extensions.remove::<Room<3>>();
    extensions.insert(ConnectInfo(peer));
    extensions
}

/// How one connection's requests are routed, by either stage: a
/// namespace's path straight to its dispatch, anything else to the
/// application's router (the routes served beside the worker's never
/// overlap a namespace, so `app` would only have matched nothing there and
/// fallen back to the same dispatch).
pub(crate) struct Requests {
    app: Router,
    hosts: Namespaces,
    /// The connection's recent rewritten paths.
    rewrites: dispatch::Rewrites,
    /// What every request of the connection starts with (see
    /// [`request_extensions`]).
    extensions: Extensions,
}

impl Requests {
    /// The routing of the connection from `peer`.
    pub(crate) fn new(app: Router, hosts: Namespaces, peer: SocketAddr) -> Self {
        Self {
            app,
            hosts,
            rewrites: dispatch::Rewrites::default(),
            extensions: request_extensions(peer),
        }
    }

    /// Routes `request`, whose extensions so far are `own` (kept beside
    /// the connection's). Its routing runs here; the future returned is
    /// only what the object's routes started (no copy of the request held
    /// beside).
    #[inline]
    pub(crate) fn route(&self, mut request: Request<Body>, own: Extensions) -> dispatch::Routing {
        let mut extensions = self.extensions.clone();
        extensions.extend(own);
        *request.extensions_mut() = extensions;
        match dispatch::host_of(&self.hosts, request.uri().path()) {
            Some(host) => dispatch::route(host, request, Some(&self.rewrites)),
            None => dispatch::Routing::App {
                future: self.app.clone().oneshot(request).map(answered),
            },
        }
    }
}

/// The application's router never fails.
fn answered(result: Result<Response, Infallible>) -> Response {
    match result {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

impl front::Service for Requests {
    type Body = Body;

    #[inline]
    fn call(&mut self, request: Arrived) -> impl Future<Output = Response> + Send {
        let Arrived { head, body, .. } = request;
        let body = match body {
            Ok(Some(bytes)) => Body::from(bytes),
            Ok(None) => Body::empty(),
            // Not with `BrokenBody::HandOff` (hyper serves such a request),
            // answered as pinboard's front answers it should it come.
            Err(fault) => {
                let answer = response::detail(fault.status(), &fault.to_string());
                return dispatch::Routing::Ready {
                    response: Some(answer),
                };
            }
        };
        self.route(Request::from_parts(head, body), Extensions::new())
    }
}
