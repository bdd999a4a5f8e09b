//! HTTP shell of the operator views: `GET /registry/placements`,
//! `/registry/sweeper` and `/registry/moves`, each behind the operator
//! credential (the same check as `/registry/workers`).
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
use crate::registry::http::{fail, Operator};
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
