//! The classify phase: what a worker's answer means for the request,
//! decided by `classify`'s table.
//!
//! Owns reading a small refusal's body (within the upstream deadline) to
//! find its `detail`, noting a placement claimed for this request that its
//! worker refused to activate, and turning the table's verdict into a
//! response or a [`ProxyError`] with its retry. Never retries or answers an
//! error itself.

use axum::response::Response;
use http::StatusCode;
use http_body::Body as _;
use http_body_util::BodyExt;
use pinned_wire::headers::REFUSAL;
use pinned_wire::held::SOCKET_HELD;
use pinned_wire::refusal::Refusal;

use super::classify::{
    classify as table, never_activated, worth_reading, Verdict, MAX_REFUSAL_BODY,
};
use super::context::RequestCtx;
use super::error::{ErrorKind, ProxyError, ProxyResult};
use super::hold::take;
use super::respond::{relay, relay_buffered, switch, Buffered};
use crate::app::App;
use crate::outbound::ResBody;
use crate::placement::{Placement, PlacementStore};
use crate::routes::Route;

/// The client's answer when the worker's is to be relayed (or switched
/// to), else the refusal as an error with the table's retry.
///
/// # Errors
///
/// [`ErrorKind::Refused`] or [`ErrorKind::SessionChanged`] with a retry;
/// [`ErrorKind::BrokeMidResponse`], [`ErrorKind::UpstreamTimeout`] while
/// reading a refusal; [`ErrorKind::NoUpgrade`].
pub async fn classify<S: PlacementStore>(
    app: &App<S>,
    ctx: &mut RequestCtx<'_>,
    route: &Route,
    res: http::Response<ResBody>,
) -> ProxyResult<Response> {
    if res.status().is_success() && !route.is_settled() {
        app.routes
            .settle(ctx.target.ns(), ctx.target.id(), route)
            .await;
    }
    if ctx.held_offer.is_some()
        && res.status() == StatusCode::OK
        && res.headers().contains_key(SOCKET_HELD)
    {
        return take(app, ctx, res).await;
    }
    if res.status() == StatusCode::SWITCHING_PROTOCOLS {
        return switch(app, res, ctx.client_upgrade.take())
            .ok_or_else(|| ErrorKind::NoUpgrade.into());
    }
    // A pass over the answer's few names, not a lookup (`proxy-bench`:
    // hashing this custom name was 168 instructions a proxied request).
    let refusal_header = res.headers().keys().any(|name| *name == REFUSAL);
    let small = res
        .body()
        .size_hint()
        .exact()
        .is_some_and(|n| n <= MAX_REFUSAL_BODY);
    if !small || !worth_reading(res.status(), refusal_header) {
        return Ok(relay(app, res));
    }
    let (head, body) = res.into_parts();
    let body = match tokio::time::timeout(app.proxy.upstream_timeout, body.collect()).await {
        Ok(Ok(c)) => c.to_bytes(),
        Ok(Err(_)) => return Err(ErrorKind::BrokeMidResponse.into()),
        Err(_) => return Err(ErrorKind::UpstreamTimeout.into()),
    };
    let detail = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_owned));
    let detail = detail.as_deref();
    let attempts = &mut ctx.attempts;
    attempts.full |= detail == Some(Refusal::Capacity.detail());
    if attempts.claimed && never_activated(head.status, refusal_header, detail) {
        attempts.refused = Some(Placement {
            session_id: route.worker.record.session_id.clone(),
            epoch: route.epoch,
        });
    }
    let verdict = table(head.status, refusal_header, detail, attempts.attempt);
    let answer = Buffered { head, body };
    if verdict == Verdict::Relay {
        return Ok(relay_buffered(answer));
    }
    // A worker that does not know our session is pinboard's problem, not
    // the client's: once retries run out, a retryable 503, not a 403.
    let kind = match answer.head.status {
        StatusCode::FORBIDDEN => ErrorKind::SessionChanged,
        _ => ErrorKind::Refused(answer),
    };
    Err(ProxyError::retried(kind, verdict))
}
