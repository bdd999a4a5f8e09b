//! The request path of one hosted namespace, in the reference's order:
//! id validation (400), placement epoch (400), admission (refusals, 500 on
//! a failed activation), then the object's routes, raced against the
//! instance's abort and shielded from handler panics.
//!
//! Dispatch never decides lifecycle; it asks the directory and maps every
//! answer to a response in one place.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::extract::Request;
use axum::response::Response;
use futures_util::FutureExt;
use http::{Extensions, HeaderValue, StatusCode, Uri};
use http_body::Body as _;
use pinned_wire::refusal::Refusal;
use pinned_wire::{attestation, epoch, headers, ids};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::body::TrackedBody;
use crate::call::{Call, Scope};
use crate::context::Context;
use crate::directory::{panic_message, Admission, HostShared};
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

fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_secs_f64())
        .unwrap_or(0.0)
}

/// Serves one request for the namespace of `host`.
///
/// During the worker's own drain every answer carries `Connection: close`:
/// the process is about to exit, and a keep-alive connection it closes then
/// could race a request pinboard is sending on it. Closing after each
/// answer leaves no idle connection to race. (A control-plane drain keeps
/// connections: that process stays.)
pub(crate) async fn dispatch(host: Arc<HostShared>, request: Request) -> Response {
    let mut response = serve(&host, request).await;
    if host.leaving() {
        response
            .headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

async fn serve(host: &Arc<HostShared>, request: Request) -> Response {
    let started = Instant::now();
    let (mut parts, body) = request.into_parts();
    let target = target(&host.ns, parts.uri.path());
    // pinboard's alarm delivery authenticates with the proxy secret, not a
    // token, so it is routed before the attestation gate.
    if host.plane.is_some() && host.store.is_some() && target.rest == "/_alarm" {
        return durable::alarm(host, &parts, target.raw_id).await;
    }
    // Attestation first (before id validation, as the reference orders
    // it): required behind pinboard, read but optional in local mode.
    let claims = parts
        .headers
        .get(headers::ATTESTATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|token| {
            attestation::verify(
                token,
                &host.secret,
                |aud| {
                    aud == host.local_aud
                        || host
                            .plane
                            .as_ref()
                            .is_some_and(|plane| plane.is_session(aud))
                },
                wall_now(),
            )
        });
    if host.plane.is_some() && claims.is_none() {
        return response::detail(StatusCode::FORBIDDEN, "invalid attestation");
    }
    let depth = claims.as_ref().and_then(|claims| claims.depth).unwrap_or(0);
    let caller = claims.as_ref().and_then(attestation::attested_caller);
    // Decoded and validated in one pass.
    let id: Cow<'_, str> = match ids::decode_id_segment(target.raw_id) {
        Ok(id) => id,
        Err(invalid) => return response::detail(StatusCode::BAD_REQUEST, &invalid.to_string()),
    };
    let epoch = match parts.headers.get(headers::EPOCH) {
        None => None,
        Some(value) => match epoch::parse_epoch(value.as_bytes()) {
            Ok(epoch) => Some(epoch),
            Err(malformed) => {
                return response::detail(StatusCode::BAD_REQUEST, &malformed.to_string())
            }
        },
    };
    if host.plane.is_some() && host.store.is_some() && target.rest == "/_wake" {
        return durable::wake(host, &parts.method, id.into_owned(), epoch).await;
    }
    let uri = match rewrite(target.rest, parts.uri.query()) {
        Ok(uri) => uri,
        Err(_) => return response::detail(StatusCode::BAD_REQUEST, "invalid request path"),
    };

    let (entry, instance) = match host.enter(&id, epoch).await {
        Ok(entered) => entered,
        Err(Admission::Refused(refusal)) => return response::refusal(refusal),
        Err(Admission::ActivationFailed | Admission::ShutDown) => {
            return response::internal_error()
        }
    };
    let slot = entry.slot().clone();
    if let Some(epoch) = epoch {
        slot.adopt_epoch(epoch);
    }

    // A fresh extension map: the worker's own router left its path params
    // here, and the object's routes must not see them. The upgrade handle
    // and the peer address are the two things worth carrying over.
    let mut extensions = Extensions::new();
    if let Some(upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() {
        extensions.insert(upgrade);
    }
    if let Some(peer) = parts.extensions.remove::<ConnectInfo<SocketAddr>>() {
        extensions.insert(peer);
    }
    extensions.insert(Scope {
        call: Call {
            ctx: Context::new(slot.clone()),
            attestation: caller,
            epoch,
            depth,
        },
        instance,
    });
    parts.extensions = extensions;
    parts.uri = uri;
    let request = Request::from_parts(parts, body);

    let cancelled = slot.cancel.cancelled();
    tokio::pin!(cancelled);
    let _turn = match &slot.turn {
        None => None,
        Some(turn) => tokio::select! {
            biased;
            () = &mut cancelled => return response::refusal(Refusal::Aborted),
            permit = turn.acquire() => match permit {
                Ok(permit) => Some(permit),
                Err(_) => return response::refusal(Refusal::Aborted),
            },
        },
    };
    let handler = AssertUnwindSafe(host.router.clone().oneshot(request)).catch_unwind();
    let outcome = tokio::select! {
        biased;
        () = &mut cancelled => return response::refusal(Refusal::Aborted),
        outcome = handler => outcome,
    };
    host.duration.observe(started.elapsed().as_secs_f64());
    let response = match outcome {
        Ok(Ok(response)) => response,
        Ok(Err(infallible)) => match infallible {},
        Err(panic) => {
            tracing::error!(
                namespace = %host.ns,
                id = %slot.id,
                error = %panic_message(panic.as_ref()),
                "handler panicked"
            );
            return response::internal_error();
        }
    };
    let body = response.body();
    if body.is_end_stream() || body.size_hint().exact().is_some() {
        return response;
    }
    // A streaming body: the instance stays in flight while it is pulled.
    let stream = slot.hold_stream();
    drop(entry);
    response.map(|body| Body::new(TrackedBody::new(body, stream)))
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
