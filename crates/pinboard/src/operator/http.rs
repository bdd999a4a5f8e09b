//! HTTP shell of the operator views: `GET /registry/placements`,
//! `/registry/sweeper`, `/registry/moves` and the storage inspector's
//! `/registry/state/{ids,show,audit}` and `POST /registry/state/act`, each
//! behind the operator credential (the same check as `/registry/workers`).
//!
//! Owns the query decoding (a bad query is a 400 with a JSON `detail`,
//! like every registry error); the answers come from the sibling modules.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::moves::MOVE_RING_CAPACITY;
use super::placements::PlacementQuery;
use super::sweeper_status::SweeperStatus;
use super::DEFAULT_MOVES_LIMIT;
use crate::app::App;
use crate::placement::PlacementStore;
use crate::registry::http::{fail, Operator, OperatorBody};
use crate::registry::RegistryError;

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, RegistryError> {
    q.map(|Query(q)| q)
        .map_err(|e| RegistryError::Malformed(format!("malformed query: {}", e.body_text())))
}

/// `GET /registry/placements?ns=&tag=&id=&owner=&after=&limit=` (operator).
pub async fn placements<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    _: Operator,
    q: Result<Query<PlacementQuery>, QueryRejection>,
) -> Response {
    let answer = async {
        let q = query(q)?;
        q.page_limit()?;
        let now = app.clock.now();
        let workers = app.store.list_workers(now).await?;
        let rows = app.store.list_placements(now).await?;
        q.page(rows, &workers)
    }
    .await;
    match answer {
        Ok(page) => Json(page).into_response(),
        Err(e) => fail(&app, e),
    }
}

/// `GET /registry/sweeper` (operator).
pub async fn sweeper<S: PlacementStore>(State(app): State<Arc<App<S>>>, _: Operator) -> Response {
    Json(SweeperStatus::read(
        app.sweeper_enabled,
        &app.metrics,
        app.clock.now().wall_ms,
    ))
    .into_response()
}

/// Query of `GET /registry/moves`.
#[derive(Debug, Deserialize)]
pub struct MovesQuery {
    /// Most moves (default [`DEFAULT_MOVES_LIMIT`], at most the ring's size).
    pub limit: Option<usize>,
}

/// `GET /registry/moves?limit=` (operator): newest first.
pub async fn moves<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    _: Operator,
    q: Result<Query<MovesQuery>, QueryRejection>,
) -> Response {
    let limit = query(q).and_then(|q| match q.limit {
        None => Ok(DEFAULT_MOVES_LIMIT),
        Some(n) if (1..=MOVE_RING_CAPACITY).contains(&n) => Ok(n),
        Some(n) => Err(RegistryError::Malformed(format!(
            "limit must be between 1 and {MOVE_RING_CAPACITY}, got {n}"
        ))),
    });
    match limit {
        Ok(limit) => Json(serde_json::json!({ "moves": app.moves.recent(limit) })).into_response(),
        Err(e) => fail(&app, e),
    }
}

/// Query of `GET /registry/state/ids`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateIdsQuery {
    /// The namespace, with its slash.
    pub ns: String,
    /// `all` (default), `marked`, `parked` or `alarm-due`.
    pub filter: Option<String>,
    /// The previous page's `next`.
    pub after: Option<String>,
    /// Ids scanned (the worker's default and bound apply).
    pub limit: Option<String>,
}

/// Query of `GET /registry/state/show`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateShowQuery {
    /// The namespace, with its slash.
    pub ns: String,
    /// The instance id.
    pub id: String,
}

fn state_answer((status, body): super::state::Answer) -> Response {
    (status, Json(body)).into_response()
}

/// A page of ids as the worker answers it, for the operator views.
pub async fn state_ids_answer<S: PlacementStore>(
    app: &App<S>,
    q: &StateIdsQuery,
) -> super::state::Answer {
    let mut query = vec![("ns", q.ns.as_str())];
    for (name, value) in [
        ("filter", &q.filter),
        ("after", &q.after),
        ("limit", &q.limit),
    ] {
        if let Some(value) = value {
            query.push((name, value.as_str()));
        }
    }
    super::state::view(app, "ids", &q.ns, &query).await
}

/// `GET /registry/state/ids?ns=&filter=&after=&limit=` (operator).
pub async fn state_ids<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    _: Operator,
    q: Result<Query<StateIdsQuery>, QueryRejection>,
) -> Response {
    match query(q) {
        Ok(q) => state_answer(state_ids_answer(&app, &q).await),
        Err(e) => fail(&app, e),
    }
}

/// `GET /registry/state/show?ns=&id=` (operator).
pub async fn state_show<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    _: Operator,
    q: Result<Query<StateShowQuery>, QueryRejection>,
) -> Response {
    match query(q) {
        Ok(q) => state_answer(super::state::show(&app, &q.ns, &q.id).await),
        Err(e) => fail(&app, e),
    }
}

/// `POST /registry/state/act` with an [`ActRequest`](super::state::ActRequest) (operator).
pub async fn state_act<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    OperatorBody(request): OperatorBody<super::state::ActRequest>,
) -> Response {
    state_answer(super::state::act(&app, request).await)
}

/// `GET /registry/state/audit?limit=` (operator): newest first.
pub async fn state_audit<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    _: Operator,
    q: Result<Query<MovesQuery>, QueryRejection>,
) -> Response {
    use super::state::{AUDIT_CAPACITY, DEFAULT_AUDIT_LIMIT};
    let limit = query(q).and_then(|q| match q.limit {
        None => Ok(DEFAULT_AUDIT_LIMIT),
        Some(n) if (1..=AUDIT_CAPACITY).contains(&n) => Ok(n),
        Some(n) => Err(RegistryError::Malformed(format!(
            "limit must be between 1 and {AUDIT_CAPACITY}, got {n}"
        ))),
    });
    match limit {
        Ok(limit) => {
            Json(serde_json::json!({ "actions": app.state_audit.recent(limit) })).into_response()
        }
        Err(e) => fail(&app, e),
    }
}
