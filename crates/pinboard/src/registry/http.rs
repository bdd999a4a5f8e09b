//! HTTP shell of the registry: `/registry/*` handlers, bearer-token check
//! (the worker or the operator credential, see [`super::auth`]), JSON
//! decoding into typed requests.
//!
//! Owns status codes of malformed input (400 with the decoder's reason), the
//! bounds of a call's body (at most `--max-registry-body-bytes`, else 413;
//! all of it within `--body-timeout-ms`, else 408) and the local cache
//! upkeep after a call (route invalidation); every decision is delegated to
//! [`Registry`](super::Registry).

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Query, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::BodyExt;
use pinned_wire::registry::{
    DeregisterRequest, HeartbeatRequest, PushRequest, RegisterRequest, ReleaseItem, TagRequest,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::auth::Tokens;
use super::RegistryError;
use crate::app::App;
use crate::config::BodyLimits;
use crate::operator::moves::MoveReason;
use crate::placement::PlacementStore;

/// Check `Authorization: Bearer <token>` against `tokens` (constant time).
///
/// # Errors
///
/// [`RegistryError::Unauthorized`] when missing or wrong.
pub fn authorize(headers: &HeaderMap, tokens: &Tokens) -> Result<(), RegistryError> {
    if tokens.authorize(headers) {
        Ok(())
    } else {
        Err(RegistryError::Unauthorized)
    }
}

/// Read `req`'s body within `limits`.
///
/// A body over the limit is still read, and thrown away, up to twice the
/// limit, so that the 413 reaches a client that is still sending (closing a
/// socket with unread data resets it, and the client may lose the answer);
/// a larger one, or one declared larger by `Content-Length`, is refused at
/// once and its connection closed after the answer.
///
/// # Errors
///
/// [`RegistryError::BodyTooLarge`], [`RegistryError::BodyTimeout`], or
/// [`RegistryError::Malformed`] when the body breaks off.
pub async fn read_body(req: Request, limits: BodyLimits) -> Result<Bytes, RegistryError> {
    let max = limits.max_bytes as u64;
    let drain_max = max.saturating_mul(2);
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = |drained| RegistryError::BodyTooLarge {
        limit: limits.max_bytes,
        drained,
    };
    if declared.is_some_and(|n| n > drain_max) {
        return Err(too_large(false));
    }
    let mut body = req.into_body();
    let read = async {
        let mut kept = BytesMut::new();
        let mut seen: u64 = 0;
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|_| RegistryError::Malformed("unreadable body".to_owned()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            seen += data.len() as u64;
            if seen > drain_max {
                return Err(too_large(false));
            }
            if seen <= max {
                kept.extend_from_slice(&data);
            }
        }
        if seen > max {
            return Err(too_large(true));
        }
        Ok(kept.freeze())
    };
    match tokio::time::timeout(limits.timeout, read).await {
        Ok(read) => read,
        Err(_) => Err(RegistryError::BodyTimeout),
    }
}

fn decode<T: DeserializeOwned>(body: &Bytes) -> Result<T, RegistryError> {
    serde_json::from_slice(body)
        .map_err(|e| RegistryError::Malformed(format!("malformed body: {e}")))
}

/// Count a failed call and answer it.
pub(crate) fn fail<S>(app: &App<S>, e: RegistryError) -> Response {
    app.metrics.registry_errors.inc();
    e.into_response()
}

/// The body of a call checked against `tokens`: the bearer token first,
/// then the body's size, time and JSON; every failure counted and answered.
async fn checked_body<S, T>(req: Request, app: &App<S>, tokens: &Tokens) -> Result<T, Response>
where
    T: DeserializeOwned,
{
    authorize(req.headers(), tokens).map_err(|e| fail(app, e))?;
    let body = read_body(req, app.registry_body)
        .await
        .map_err(|e| fail(app, e))?;
    decode(&body).map_err(|e| fail(app, e))
}

/// A worker call's body, extracted only after the *worker* token checked
/// out, in that order; either failure is counted and answered here, so
/// handlers see nothing but well-formed, authorized requests.
pub struct Authorized<T>(pub T);

impl<S, T> FromRequest<Arc<App<S>>> for Authorized<T>
where
    S: PlacementStore,
    T: DeserializeOwned,
{
    type Rejection = Response;

    async fn from_request(req: Request, app: &Arc<App<S>>) -> Result<Self, Self::Rejection> {
        checked_body(req, app, &app.credentials.worker)
            .await
            .map(Authorized)
    }
}

/// An operator call's body, as [`Authorized`] but checked against the
/// *operator* token.
pub struct OperatorBody<T>(pub T);

impl<S, T> FromRequest<Arc<App<S>>> for OperatorBody<T>
where
    S: PlacementStore,
    T: DeserializeOwned,
{
    type Rejection = Response;

    async fn from_request(req: Request, app: &Arc<App<S>>) -> Result<Self, Self::Rejection> {
        checked_body(req, app, &app.credentials.operator)
            .await
            .map(OperatorBody)
    }
}

/// An operator call without a body: the operator token checked.
pub struct Operator;

impl<S: PlacementStore> FromRequestParts<Arc<App<S>>> for Operator {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        app: &Arc<App<S>>,
    ) -> Result<Self, Self::Rejection> {
        authorize(&parts.headers, &app.credentials.operator)
            .map(|()| Operator)
            .map_err(|e| fail(app, e))
    }
}

/// `POST /registry/register`.
pub async fn register<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    Authorized(req): Authorized<RegisterRequest>,
) -> Response {
    match app.registry.register(req).await {
        Ok((ack, effects)) => {
            app.metrics.registrations.inc();
            app.routes.forget_sessions(&effects.ended_sessions);
            app.routes
                .forget_gone(&effects.replaced_sessions, MoveReason::Replaced);
            app.routes
                .forget_gone(&effects.taken_over_sessions, MoveReason::Takeover);
            app.routes.workers_changed();
            Json(ack).into_response()
        }
        Err(e) => fail(&app, e),
    }
}

/// `POST /registry/heartbeat`.
pub async fn heartbeat<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    Authorized(req): Authorized<HeartbeatRequest>,
) -> Response {
    let session = req.session_id.clone();
    match app.registry.heartbeat(req).await {
        Ok((ack, _)) => {
            app.metrics.heartbeats.inc();
            Json(ack).into_response()
        }
        Err(e) => {
            if let RegistryError::Superseded(reason) = &e {
                // Wound down to its deadline (or superseded through
                // another node): its ids' next claims here say why.
                let why = MoveReason::of_gone_session(Some(reason));
                app.routes.forget_gone(std::slice::from_ref(&session), why);
            }
            fail(&app, e)
        }
    }
}

/// `POST /registry/release` (array body).
pub async fn release<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    Authorized(items): Authorized<Vec<ReleaseItem>>,
) -> Response {
    let result = async {
        let keys: Vec<String> = items
            .iter()
            .map(|i| format!("{}/{}", i.namespace, i.id))
            .collect();
        app.routes
            .note_released(
                keys.iter()
                    .zip(&items)
                    .map(|(k, i)| (k.as_str(), i.session_id.as_str())),
            )
            .await;
        let freed = app.registry.release(items).await?;
        for k in keys {
            app.routes.invalidate(&k);
        }
        Ok::<_, RegistryError>(freed)
    }
    .await;
    match result {
        Ok(freed) => Json(serde_json::json!({ "released": freed })).into_response(),
        Err(e) => fail(&app, e),
    }
}

/// `POST /registry/deregister`.
pub async fn deregister<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    Authorized(req): Authorized<DeregisterRequest>,
) -> Response {
    match app.registry.deregister(req).await {
        Ok(effects) => {
            app.routes.forget_sessions(&effects.ended_sessions);
            Json(serde_json::json!({ "ok": true })).into_response()
        }
        Err(e) => fail(&app, e),
    }
}

/// `POST /registry/tag`.
pub async fn tag<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    Authorized(req): Authorized<TagRequest>,
) -> Response {
    match app.registry.tag(req).await {
        Ok(tagged) => Json(serde_json::json!({ "tagged": tagged })).into_response(),
        Err(e) => fail(&app, e),
    }
}

/// `POST /registry/sockets/send`: a worker's sends to the sockets pinboard
/// holds (`pinned_wire::held::Sends`), checked whole, then handed to this
/// node's sockets in order. Answers `{"delivered": n}`; a bad send answers
/// 400 naming it, and nothing of the call is delivered.
pub async fn sockets_send<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    Authorized(sends): Authorized<pinned_wire::held::Sends>,
) -> Response {
    if let Err(e) = crate::held::fanout::check(&sends) {
        return fail(&app, RegistryError::Malformed(e.to_string()));
    }
    let delivered = crate::held::fanout::deliver(&app.held, &sends);
    Json(pinned_wire::held::Delivered { delivered }).into_response()
}

/// `POST /registry/push` (operator).
pub async fn push<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    OperatorBody(req): OperatorBody<PushRequest>,
) -> Response {
    match apply_push(&app, req).await {
        Ok(msg_id) => {
            let mut body = serde_json::json!({ "ok": true });
            if let Some(id) = msg_id {
                body["msgId"] = serde_json::Value::String(id);
            }
            Json(body).into_response()
        }
        Err(e) => fail(&app, e),
    }
}

/// An operator push, from `/registry/push` or the dashboard: the registry
/// applies it; this node re-reads the workers next and remembers a
/// wind-down it asked for (the id's release through this node is then a
/// `wind_down` move). Returns the control message's id, if one was queued.
///
/// # Errors
///
/// As [`Registry::push`](crate::registry::Registry::push).
pub async fn apply_push<S: PlacementStore>(
    app: &App<S>,
    req: PushRequest,
) -> Result<Option<String>, RegistryError> {
    let winding = match &req {
        PushRequest::WindDown {
            session_id, ns, id, ..
        } => Some((format!("{ns}/{id}"), session_id.clone())),
        _ => None,
    };
    let msg_id = app.registry.push(req).await?;
    if let Some((key, session)) = winding {
        app.moves.winding_down(&key, &session);
    }
    app.routes.workers_changed();
    Ok(msg_id)
}

/// `GET /registry/workers` (operator).
pub async fn workers<S: PlacementStore>(State(app): State<Arc<App<S>>>, _: Operator) -> Response {
    match app.registry.workers().await {
        Ok(w) => Json(w).into_response(),
        Err(e) => fail(&app, e),
    }
}

/// Query of `GET /registry/overview`.
#[derive(Debug, Deserialize)]
pub struct OverviewQuery {
    /// Only placements stamped with this tag.
    pub tag: Option<String>,
}

/// `GET /registry/overview[?tag=]` (operator).
pub async fn overview<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    _: Operator,
    Query(q): Query<OverviewQuery>,
) -> Response {
    match app.registry.overview(q.tag.as_deref()).await {
        Ok((_, o)) => Json(o).into_response(),
        Err(e) => fail(&app, e),
    }
}
