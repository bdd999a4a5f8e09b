//! pinboard's two durable entry points on an instance, behind a control
//! plane with a state store:
//!
//! - `POST /<ns>/<id>/_wake` (attested like any instance request): 200
//!   `{"ok": true}` once the instance is resident, 202 `{"activating":
//!   true}` while its activation is under way, the usual refusals otherwise;
//! - `POST /<ns>/<id>/_alarm` (proxy secret): runs the instance's due alarm
//!   at the `Pinboard-Epoch`: 200 `{"fired": bool}`, 202 `{"fired": false,
//!   "running": true}`, 409 on a lost store fence, 500 when the handler
//!   failed, 503 refusals as for requests.

use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{Method, StatusCode};
use pinned_wire::{epoch, headers, ids};
use serde_json::json;
use subtle::ConstantTimeEq;

use crate::durable::alarm::{self, Run, RunError};
use crate::namespace::{Admission, Namespace};
use crate::response;

/// How long a wake waits for a quick activation before answering 202.
const WAKE_PATIENCE: Duration = Duration::from_millis(50);

fn not_allowed() -> Response {
    response::detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
}

fn admission(refused: Admission) -> Response {
    match refused {
        Admission::Refused(refusal) => response::refusal(refusal),
        Admission::ActivationFailed | Admission::ShutDown => response::internal_error(),
        Admission::Paused => crate::durable::inspect::paused_response(),
    }
}

/// `POST /<ns>/<id>/_wake`.
pub(crate) async fn wake(
    host: &Arc<Namespace>,
    method: &Method,
    id: String,
    epoch: Option<u64>,
) -> Response {
    if method != Method::POST {
        return not_allowed();
    }
    let activation = host.domain.spawn({
        let host = host.clone();
        async move { host.enter(&id, epoch).await.map(|(entry, _)| drop(entry)) }
    });
    tokio::pin!(activation);
    tokio::select! {
        joined = &mut activation => match joined {
            Ok(Ok(())) => axum::Json(json!({ "ok": true })).into_response(),
            Ok(Err(refused)) => admission(refused),
            Err(_) => response::internal_error(),
        },
        () = tokio::time::sleep(WAKE_PATIENCE) => {
            (StatusCode::ACCEPTED, axum::Json(json!({ "activating": true }))).into_response()
        }
    }
}

/// `POST /<ns>/<id>/_alarm`.
pub(crate) async fn alarm(host: &Arc<Namespace>, parts: &Parts, raw_id: &str) -> Response {
    if parts.method != Method::POST {
        return not_allowed();
    }
    let secret_ok = parts
        .headers
        .get(headers::PROXY_SECRET)
        .is_some_and(|given| bool::from(given.as_bytes().ct_eq(host.secret.as_bytes())));
    if !secret_ok {
        return response::detail(StatusCode::FORBIDDEN, "invalid proxy secret");
    }
    let id = match ids::decode_id_segment(raw_id) {
        Ok(id) => id.into_owned(),
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
    let (entry, _) = match host.enter(&id, epoch).await {
        Ok(entered) => entered,
        Err(refused) => return admission(refused),
    };
    let slot = entry.slot().clone();
    if let Some(epoch) = epoch {
        let _ = slot.adopt_epoch(epoch);
    }
    drop(entry);
    // The sweeper's delivery: the run continues its trace when it sent one.
    let span = tracing::debug_span!("alarm delivery");
    pinned_edge::trace::continue_from(&span, &parts.headers);
    match tracing::Instrument::instrument(alarm::run(&slot, false), span).await {
        Ok(Run::Fired(fired)) => axum::Json(json!({ "fired": fired })).into_response(),
        Ok(Run::Running) => (
            StatusCode::ACCEPTED,
            axum::Json(json!({ "fired": false, "running": true })),
        )
            .into_response(),
        Err(RunError::Store(error)) if error.is_fence_lost() => {
            response::detail(StatusCode::CONFLICT, &error.to_string())
        }
        Err(error) => {
            tracing::error!(namespace = %host.ns, %id, error = %pinned_edge::logging::Chain(&error), "alarm run failed");
            response::internal_error()
        }
    }
}
