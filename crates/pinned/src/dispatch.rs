//! The request path of the worker's namespaces: find the hosted namespace,
//! split `/<ns>/<id><rest>`, answer pinboard's `_alarm` and `_wake`, and
//! hand everything else to the object's routes with the path rewritten to
//! `<rest>` and the request's own extensions intact (an outer layer's
//! request id, tracing span or `Extension` reaches the handlers).
//!
//! Dispatch never decides lifecycle and never activates: the admission
//! layer around the object's matched routes ([`admit`](crate::admit)) does,
//! so an unknown path or method is answered before any instance exists.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, Uri};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::admit::{gate, Pending};
use crate::call::Routed;
use crate::directory::HostShared;
use crate::{durable, response};

/// The id segment and the path the object's routes see.
pub(crate) struct Target<'a> {
    pub(crate) raw_id: &'a str,
    pub(crate) rest: &'a str,
}

/// Splits `/<ns>/<id><rest>`; the route guarantees the `/<ns>/` prefix.
pub(crate) fn target<'a>(ns: &str, path: &'a str) -> Target<'a> {
    let after = path
        .strip_prefix(ns)
        .and_then(|after| after.strip_prefix('/'))
        .unwrap_or("");
    match after.find('/') {
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

fn rewrite(rest: &str, query: Option<&str>) -> Result<Uri, http::uri::InvalidUri> {
    match query {
        None => Uri::try_from(rest),
        Some(query) => Uri::try_from(format!("{rest}?{query}")),
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
pub(crate) async fn dispatch(hosts: &[Arc<HostShared>], request: Request) -> Response {
    let Some(host) = host_of(hosts, request.uri().path()) else {
        return not_found();
    };
    dispatch_to(host, request, Instant::now()).await
}

/// The hosted namespace `path` is under, if any.
pub(crate) fn host_of<'h>(hosts: &'h [Arc<HostShared>], path: &str) -> Option<&'h Arc<HostShared>> {
    hosts.iter().find(|host| {
        path.strip_prefix(&*host.ns)
            .is_some_and(|after| after.starts_with('/'))
    })
}

/// [`dispatch`] for a request already known to be under `host`'s namespace,
/// which arrived at `started` (its duration is measured from there, and
/// the instance's activity stamped with it).
pub(crate) async fn dispatch_to(
    host: &Arc<HostShared>,
    request: Request,
    started: Instant,
) -> Response {
    let mut response = serve(host, request, started).await;
    if host.leaving() {
        response
            .headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// 404 `{"detail":"Not Found"}`, the reference framework's answer.
pub(crate) fn not_found() -> Response {
    response::detail(StatusCode::NOT_FOUND, "Not Found")
}

/// 405 `{"detail":"Method Not Allowed"}`, the reference framework's answer.
pub(crate) fn method_not_allowed() -> Response {
    response::detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
}

async fn serve(host: &Arc<HostShared>, request: Request, started: Instant) -> Response {
    let (mut parts, body) = request.into_parts();
    let target = target(&host.ns, parts.uri.path());
    // pinboard's alarm delivery authenticates with the proxy secret, not a
    // token, so it is routed before the attestation gate.
    let durable = host.control.serves_durable_entry_points() && host.store.is_some();
    if durable && target.rest == "/_alarm" {
        return durable::alarm(host, &parts, target.raw_id).await;
    }
    if durable && target.rest == "/_wake" {
        let passed = match gate(host, &parts.headers, target.raw_id) {
            Ok(passed) => passed,
            Err(refused) => return refused.into_response(),
        };
        return durable::wake(host, &parts.method, passed.id.into_owned(), passed.epoch).await;
    }
    let uri = match rewrite(target.rest, parts.uri.query()) {
        Ok(uri) => uri,
        Err(_) => return response::detail(StatusCode::BAD_REQUEST, "invalid request path"),
    };
    // `target` split `/<ns>/<id><rest>`: the id starts after `/<ns>/`.
    let id_start = host.ns.len() + 1;
    let id_at = id_start..id_start + target.raw_id.len();
    let original = std::mem::replace(&mut parts.uri, uri);
    parts.extensions.insert(Routed::Pending(Pending {
        host: host.clone(),
        original,
        id_at,
        started,
    }));
    let request = Request::from_parts(parts, body);
    match host.router.clone().oneshot(request).await {
        Ok(response) => response,
        Err(infallible) => match infallible {},
    }
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
