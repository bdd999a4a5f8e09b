//! HTTP shell of the registry: `/registry/*` handlers, bearer-token check,
//! JSON decoding into typed requests.
//!
//! Owns status codes of malformed input (400 with the decoder's reason) and
//! the local cache upkeep after a call (route invalidation); every decision
//! is delegated to [`Registry`](super::Registry).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http::HeaderMap;
use pinned_wire::registry::{
    DeregisterRequest, HeartbeatRequest, PushRequest, RegisterRequest, ReleaseItem, TagRequest,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::RegistryError;
use crate::placement::PlacementStore;
use crate::server::App;

/// Check `Authorization: Bearer <token>` in constant time.
///
/// # Errors
///
/// [`RegistryError::Unauthorized`] when missing or wrong.
pub fn authorize(headers: &HeaderMap, token: &str) -> Result<(), RegistryError> {
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if bool::from(presented.as_bytes().ct_eq(token.as_bytes())) && !token.is_empty() {
        Ok(())
    } else {
        Err(RegistryError::Unauthorized)
    }
}

fn decode<T: DeserializeOwned>(body: &Bytes) -> Result<T, RegistryError> {
    serde_json::from_slice(body)
        .map_err(|e| RegistryError::Malformed(format!("malformed body: {e}")))
}

fn fail<S>(app: &App<S>, e: RegistryError) -> Response {
    app.metrics.registry_errors.inc();
    e.into_response()
}

/// `POST /registry/register`.
pub async fn register<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        authorize(&headers, &app.token)?;
        let req: RegisterRequest = decode(&body)?;
        app.registry.register(req).await
    }
    .await;
    match result {
        Ok((ack, effects)) => {
            app.metrics.registrations.inc();
            app.directory.forget_sessions(&effects.ended_sessions);
            app.directory.workers_changed();
            Json(ack).into_response()
        }
        Err(e) => fail(&app, e),
    }
}

/// `POST /registry/heartbeat`.
pub async fn heartbeat<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        authorize(&headers, &app.token)?;
        let req: HeartbeatRequest = decode(&body)?;
        app.registry.heartbeat(req).await
    }
    .await;
    match result {
        Ok((ack, _)) => {
            app.metrics.heartbeats.inc();
            Json(ack).into_response()
        }
        Err(e) => fail(&app, e),
    }
}

/// `POST /registry/release` (array body).
pub async fn release<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        authorize(&headers, &app.token)?;
        let items: Vec<ReleaseItem> = decode(&body)?;
        let keys: Vec<String> = items
            .iter()
            .map(|i| format!("{}/{}", i.namespace, i.id))
            .collect();
        let freed = app.registry.release(items).await?;
        for k in keys {
            app.directory.invalidate(&k);
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
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        authorize(&headers, &app.token)?;
        let req: DeregisterRequest = decode(&body)?;
        app.registry.deregister(req).await
    }
    .await;
    match result {
        Ok(effects) => {
            app.directory.forget_sessions(&effects.ended_sessions);
            Json(serde_json::json!({ "ok": true })).into_response()
        }
        Err(e) => fail(&app, e),
    }
}

/// `POST /registry/tag`.
pub async fn tag<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        authorize(&headers, &app.token)?;
        let req: TagRequest = decode(&body)?;
        app.registry.tag(req).await
    }
    .await;
    match result {
        Ok(tagged) => Json(serde_json::json!({ "tagged": tagged })).into_response(),
        Err(e) => fail(&app, e),
    }
}

/// `POST /registry/push` (operator).
pub async fn push<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        authorize(&headers, &app.token)?;
        let req: PushRequest = decode(&body)?;
        app.registry.push(req).await
    }
    .await;
    match result {
        Ok(msg_id) => {
            app.directory.workers_changed();
            let mut body = serde_json::json!({ "ok": true });
            if let Some(id) = msg_id {
                body["msgId"] = serde_json::Value::String(id);
            }
            Json(body).into_response()
        }
        Err(e) => fail(&app, e),
    }
}

/// `GET /registry/workers` (operator).
pub async fn workers<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        authorize(&headers, &app.token)?;
        app.registry.workers().await
    }
    .await;
    match result {
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
    headers: HeaderMap,
    Query(q): Query<OverviewQuery>,
) -> Response {
    let result = async {
        authorize(&headers, &app.token)?;
        app.registry.overview(q.tag.as_deref()).await
    }
    .await;
    match result {
        Ok((_, o)) => Json(o).into_response(),
        Err(e) => fail(&app, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_is_checked() {
        let mut h = HeaderMap::new();
        assert!(authorize(&h, "t").is_err());
        h.insert(http::header::AUTHORIZATION, "Bearer t".parse().expect("hv"));
        assert!(authorize(&h, "t").is_ok());
        assert!(authorize(&h, "u").is_err());
        assert!(authorize(&h, "").is_err());
    }
}
