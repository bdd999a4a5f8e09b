//! The request path of the worker's namespaces: find the hosted namespace,
//! split `/<ns>/<id><rest>`, answer pinboard's `_alarm` and `_wake`, and
//! hand everything else to the object's routes with the path rewritten to
//! `<rest>` and the request's own extensions intact (an outer layer's
//! request id, tracing span or `Extension` reaches the handlers).
//!
//! Dispatch never decides lifecycle and never activates: the admission
//! layer around the object's matched routes ([`stack`](crate::serve::stack)) does,
//! so an unknown path or method is answered before any instance exists.

use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context as TaskContext, Poll};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::future::RouteFuture;
use futures_util::future::BoxFuture;
use http::uri::PathAndQuery;
use http::{HeaderValue, StatusCode, Uri};
use tower::Service;

use crate::durable::entry;
use crate::namespace::Namespace;
use crate::response;
use crate::serve::stack::{gate, target};

fn rewrite(rest: &str, query: Option<&str>) -> Result<Uri, http::uri::InvalidUri> {
    match query {
        None => Uri::try_from(rest),
        Some(query) => Uri::try_from(format!("{rest}?{query}")),
    }
}

/// How many rewritten paths a connection keeps.
const RECENT_REWRITES: usize = 4;

/// The paths one connection's requests were last rewritten to (without a
/// query), so a repeated one is a refcount on the bytes parsed before, not
/// a copy and a parse (`worker-bench`: 22 258 instructions a warm request
/// without, 21 886 with). An object has few routes, so a connection's
/// requests mostly repeat a handful of paths; a path with a query is
/// rewritten afresh every time.
///
/// One per connection ([`edge`](crate::serve::edge)), never shared: no lock.
#[derive(Default)]
pub(crate) struct Rewrites {
    recent: RefCell<[Option<PathAndQuery>; RECENT_REWRITES]>,
    /// The entry the next new path replaces (round robin).
    next: Cell<usize>,
}

impl Rewrites {
    /// [`rewrite`], from the recent paths when `rest` is one of them.
    fn rewrite(&self, rest: &str, query: Option<&str>) -> Result<Uri, http::uri::InvalidUri> {
        if query.is_some() {
            return rewrite(rest, query);
        }
        let mut recent = self.recent.borrow_mut();
        if let Some(path) = recent.iter().flatten().find(|path| path.as_str() == rest) {
            return Ok(Uri::from(path.clone()));
        }
        let uri = rewrite(rest, None)?;
        let next = self.next.get();
        recent[next] = uri.path_and_query().cloned();
        self.next.set((next + 1) % RECENT_REWRITES);
        Ok(uri)
    }
}

/// Serves one request for a path under a hosted namespace, or answers 404
/// `{"detail":"Not Found"}` for any other path.
///
/// During the worker's own drain every answer carries `Connection: close`:
/// the process is about to exit, and a keep-alive connection it closes then
/// could race a request pinboard is sending on it. Closing after each
/// answer leaves no idle connection to race. (A control-plane drain keeps
/// connections: that process stays.)
pub(crate) async fn dispatch(hosts: &[Arc<Namespace>], request: Request) -> Response {
    let Some(host) = host_of(hosts, request.uri().path()) else {
        return response::not_found();
    };
    route(host, request, None).await
}

/// The hosted namespace `path` is under, if any.
pub(crate) fn host_of<'h>(hosts: &'h [Arc<Namespace>], path: &str) -> Option<&'h Arc<Namespace>> {
    hosts.iter().find(|host| {
        path.strip_prefix(&*host.ns)
            .is_some_and(|after| after.starts_with('/'))
    })
}

pin_project_lite::pin_project! {
    /// One request on its way through [`route`]: the object's routes
    /// running, or an answer that did not need them; or, for a path under
    /// no namespace, the application's router
    /// ([`Requests`](crate::serve::requests::Requests) routes there).
    ///
    /// A named future rather than an `async fn`: the routing itself is
    /// synchronous, so the state kept while the object's routes run is
    /// their future alone, not the request again in every caller's frame
    /// (each copy of which is copied again whenever the future moves).
    /// One enum for both destinations, not an `Either` around it, so the
    /// routed future is not copied into a wrapper on its way to the
    /// connection (`proxy-bench instructions`: 17 371 -> 17 329 a warm
    /// request).
    #[project = RoutingProj]
    pub(crate) enum Routing {
        /// The object's routes (admission around each) are running.
        Routed {
            #[pin]
            future: RouteFuture<Infallible>,
            host: Arc<Namespace>,
        },
        /// pinboard's entry points (`_alarm`, `_wake`): rare, boxed.
        Durable {
            future: BoxFuture<'static, Response>,
            host: Arc<Namespace>,
        },
        /// Answered at once (taken when polled).
        Ready { response: Option<Response> },
        /// The application's router, for a path under no namespace.
        App {
            #[pin]
            future: AppFuture,
        },
    }
}

/// The application's router answering one request.
pub(crate) type AppFuture = futures_util::future::Map<
    tower::util::Oneshot<axum::Router, Request>,
    fn(Result<Response, Infallible>) -> Response,
>;

impl Future for Routing {
    type Output = Response;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Response> {
        Poll::Ready(match self.project() {
            RoutingProj::Routed { future, host } => match ready!(future.poll(cx)) {
                Ok(response) => closing(host, response),
                Err(infallible) => match infallible {},
            },
            RoutingProj::Durable { future, host } => {
                closing(host, ready!(future.as_mut().poll(cx)))
            }
            // Polled again after its answer: never by hyper or tower.
            RoutingProj::Ready { response } => {
                response.take().unwrap_or_else(response::internal_error)
            }
            RoutingProj::App { future } => ready!(future.poll(cx)),
        })
    }
}

/// `response`, with `Connection: close` during the worker's own drain (see
/// [`dispatch`]).
fn closing(host: &Namespace, mut response: Response) -> Response {
    if host.leaving() {
        response
            .headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// [`dispatch`] for a request already known to be under `host`'s namespace:
/// the path split and rewritten
/// (with the connection's `rewrites`, if any) and the object's router
/// called here, synchronously; the returned future only runs what that
/// router started. Inlined into its callers: the routing it answers is
/// then built where they keep it, not copied out of a call.
#[inline]
pub(crate) fn route(
    host: &Arc<Namespace>,
    mut request: Request,
    rewrites: Option<&Rewrites>,
) -> Routing {
    // The request is edited where it lies, not split into its parts and
    // joined again (each a copy of the head: `worker-bench`).
    let target = target(&host.ns, request.uri().path());
    // pinboard's alarm delivery authenticates with the proxy secret, not a
    // token, so it is routed before the attestation gate.
    let durable = host.control.serves_durable_entry_points() && host.store.is_some();
    if durable && (target.rest == "/_alarm" || target.rest == "/_wake") {
        return Routing::Durable {
            future: Box::pin(durable_entry(host.clone(), request.into_parts().0)),
            host: host.clone(),
        };
    }
    let rewritten = match rewrites {
        Some(rewrites) => rewrites.rewrite(target.rest, request.uri().query()),
        None => rewrite(target.rest, request.uri().query()),
    };
    let uri = match rewritten {
        Ok(uri) => uri,
        Err(_) => {
            let response = response::detail(StatusCode::BAD_REQUEST, "invalid request path");
            return Routing::Ready {
                response: Some(closing(host, response)),
            };
        }
    };
    let original = std::mem::replace(request.uri_mut(), uri);
    // axum's `OriginalUri` is the URI the client sent, `/<ns>/<id>…`, as
    // through `Worker::router()`. Set here, it is a refcount on the bytes
    // hyper parsed; left to axum, a copy of the rewritten one. The stack
    // reads the id from it.
    request
        .extensions_mut()
        .insert(axum::extract::OriginalUri(original));
    // The router is always ready (axum's `poll_ready` answers at once).
    Routing::Routed {
        future: host.router.clone().call(request),
        host: host.clone(),
    }
}

/// pinboard's `_alarm` and `_wake` for the request whose head is `parts`.
async fn durable_entry(host: Arc<Namespace>, parts: http::request::Parts) -> Response {
    let target = target(&host.ns, parts.uri.path());
    if target.rest == "/_alarm" {
        return entry::alarm(&host, &parts, target.raw_id).await;
    }
    let passed = match gate(&host, &parts.headers, target.raw_id) {
        Ok(passed) => passed,
        Err(refused) => return refused.into_response(),
    };
    entry::wake(&host, &parts.method, passed.id.into_owned(), passed.epoch).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_id_and_rest() {
        let t = target("/counter", "/counter/abc/increment/x");
        assert_eq!((t.raw_id, t.rest), ("abc", "/increment/x"));
        let t = target("/counter", "/counter/abc");
        assert_eq!((t.raw_id, t.rest), ("abc", "/"));
        let t = target("/counter", "/counter/abc/");
        assert_eq!((t.raw_id, t.rest), ("abc", "/"));
        let t = target("/counter", "/counter//x");
        assert_eq!((t.raw_id, t.rest), ("", "/x"));
        let t = target("/counter", "/counter/");
        assert_eq!((t.raw_id, t.rest), ("", "/"));
    }

    #[test]
    fn recent_rewrites_answer_as_a_fresh_rewrite() {
        let rewrites = Rewrites::default();
        let paths = ["/a", "/b/c", "/", "/d", "/e", "/a", "/b/c", "/a"];
        for rest in paths {
            for query in [None, Some("x=1")] {
                let fresh = rewrite(rest, query).map(|uri| uri.to_string()).ok();
                let recent = rewrites
                    .rewrite(rest, query)
                    .map(|uri| uri.to_string())
                    .ok();
                assert_eq!(recent, fresh, "{rest} {query:?}");
            }
        }
        assert!(rewrites.rewrite("/a b", None).is_err());
    }

    #[test]
    fn rewrites_query() {
        assert_eq!(
            rewrite("/a", Some("x=1")).map(|u| u.to_string()).ok(),
            Some("/a?x=1".to_owned())
        );
        assert_eq!(
            rewrite("/", None).map(|u| u.to_string()).ok(),
            Some("/".to_owned())
        );
    }
}
