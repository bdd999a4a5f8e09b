//! The control router: pinboard's own paths ([`paths`]) and their axum
//! handlers (`/registry/*`, `/dashboard*`, `/healthz`, `/readyz`,
//! `/metrics`).
//!
//! Owns which control path goes where; never decides anything itself and
//! never proxies: every other path is data-plane traffic, which the accept
//! loop (and the simulation) hand to `proxy::serve` instead (so a namespace
//! named `/registry`, `/dashboard`, `/healthz`, `/readyz` or `/metrics`
//! cannot be proxied).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http::{header, HeaderValue, StatusCode};

use crate::app::App;
use crate::config::READY_STORE_TIMEOUT_MS;
use crate::placement::PlacementStore;
use crate::routes::Readiness;
use crate::{dashboard, operator, registry};

/// Liveness: the process serves HTTP. Never looks at the store.
async fn healthz() -> Response {
    axum::Json(serde_json::json!({ "ok": true })).into_response()
}

/// Readiness: 200 `{"ok": true}` when the placement store answers within
/// [`READY_STORE_TIMEOUT_MS`] and new ids are placed; else 503 (with
/// `Retry-After: 1`) and a JSON `detail`, plus `store` (whether the store
/// answered) and `quarantineMs` (what is left of a quarantine).
async fn readyz<S: PlacementStore>(State(app): State<Arc<App<S>>>) -> Response {
    let readiness = app
        .routes
        .readiness(Duration::from_millis(READY_STORE_TIMEOUT_MS))
        .await;
    let body = match readiness {
        Readiness::Ready => {
            return axum::Json(serde_json::json!({ "ok": true })).into_response();
        }
        Readiness::StoreUnreachable(error) => serde_json::json!({
            "ok": false,
            "store": false,
            "detail": format!("placement store unreachable: {error}"),
        }),
        Readiness::Quarantined { left_ms } => serde_json::json!({
            "ok": false,
            "store": true,
            "quarantineMs": left_ms,
            "detail": format!(
                "quarantine: no new placements for {left_ms} ms while workers re-register"
            ),
        }),
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, HeaderValue::from_static("1"))],
        axum::Json(body),
    )
        .into_response()
}

async fn metrics<S: PlacementStore>(State(app): State<Arc<App<S>>>) -> Response {
    if let Ok(n) = app.routes.live_workers().await {
        app.metrics.live_workers.set(n as i64);
    }
    app.metrics
        .cached_routes
        .set(app.routes.cached_routes() as i64);
    app.metrics
        .quarantined
        .set(i64::from(app.routes.quarantine_left_ms() > 0));
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        app.metrics.encode(),
    )
        .into_response()
}

/// pinboard's own paths; every other path is `/<ns>/<id>/…` for the proxy.
/// [`router`] serves these, and the accept loop hands exactly these to it.
pub mod paths {
    /// `POST`: a worker registers.
    pub const REGISTER: &str = "/registry/register";
    /// `POST`: a worker renews its lease.
    pub const HEARTBEAT: &str = "/registry/heartbeat";
    /// `POST`: a worker releases placements.
    pub const RELEASE: &str = "/registry/release";
    /// `POST`: a worker leaves.
    pub const DEREGISTER: &str = "/registry/deregister";
    /// `POST`: a worker tags an instance.
    pub const TAG: &str = "/registry/tag";
    /// `POST` (operator): a control message for a worker.
    pub const PUSH: &str = "/registry/push";
    /// `GET` (operator): live workers.
    pub const WORKERS: &str = "/registry/workers";
    /// `GET` (operator): placements.
    pub const OVERVIEW: &str = "/registry/overview";
    /// `GET` (operator): placements filtered and paged.
    pub const PLACEMENTS: &str = "/registry/placements";
    /// `GET` (operator): the sweeper on this node.
    pub const SWEEPER: &str = "/registry/sweeper";
    /// `GET` (operator): recent re-placements seen by this node.
    pub const MOVES: &str = "/registry/moves";
    /// `GET` (operator): a page of a namespace's ids with durable state.
    pub const STATE_IDS: &str = "/registry/state/ids";
    /// `GET` (operator): one id's rows decoded.
    pub const STATE_SHOW: &str = "/registry/state/show";
    /// `POST` (operator): a per-key control through the id's owner.
    pub const STATE_ACT: &str = "/registry/state/act";
    /// `GET` (operator): the state controls asked for on this node.
    pub const STATE_AUDIT: &str = "/registry/state/audit";
    /// `GET`: the dashboard page (or its login form).
    pub const DASHBOARD: &str = "/dashboard";
    /// `GET`: the dashboard's script.
    pub const DASHBOARD_JS: &str = "/dashboard/app.js";
    /// `GET`: the dashboard's style sheet.
    pub const DASHBOARD_CSS: &str = "/dashboard/app.css";
    /// `POST` (form): operator token for a session cookie.
    pub const DASHBOARD_LOGIN: &str = "/dashboard/login";
    /// `POST` (session, CSRF header): end the session.
    pub const DASHBOARD_LOGOUT: &str = "/dashboard/logout";
    /// `GET` (session): the dashboard's feed.
    pub const DASHBOARD_STATE: &str = "/dashboard/api/state";
    /// `POST` (session, CSRF header): drain, undrain, wind down.
    pub const DASHBOARD_PUSH: &str = "/dashboard/api/push";
    /// `GET` (session): [`STATE_IDS`] for the dashboard.
    pub const DASHBOARD_STATE_IDS: &str = "/dashboard/api/inspect/ids";
    /// `GET` (session): [`STATE_SHOW`] for the dashboard.
    pub const DASHBOARD_STATE_SHOW: &str = "/dashboard/api/inspect/show";
    /// `POST` (session, CSRF header): [`STATE_ACT`] for the dashboard.
    pub const DASHBOARD_STATE_ACT: &str = "/dashboard/api/inspect/act";
    /// `POST` (worker token): sends to the sockets pinboard holds
    /// (`pinned_wire::held::SEND_PATH`).
    pub const SOCKETS_SEND: &str = pinned_wire::held::SEND_PATH;
    /// `GET`: liveness.
    pub const HEALTHZ: &str = "/healthz";
    /// `GET`: readiness (store reachable, no quarantine).
    pub const READYZ: &str = "/readyz";
    /// `GET`: Prometheus metrics.
    pub const METRICS: &str = "/metrics";
    /// Every path above.
    pub const ALL: [&str; 29] = [
        REGISTER,
        SOCKETS_SEND,
        HEARTBEAT,
        RELEASE,
        DEREGISTER,
        TAG,
        PUSH,
        WORKERS,
        OVERVIEW,
        PLACEMENTS,
        SWEEPER,
        MOVES,
        STATE_IDS,
        STATE_SHOW,
        STATE_ACT,
        STATE_AUDIT,
        DASHBOARD,
        DASHBOARD_JS,
        DASHBOARD_CSS,
        DASHBOARD_LOGIN,
        DASHBOARD_LOGOUT,
        DASHBOARD_STATE,
        DASHBOARD_PUSH,
        DASHBOARD_STATE_IDS,
        DASHBOARD_STATE_SHOW,
        DASHBOARD_STATE_ACT,
        HEALTHZ,
        READYZ,
        METRICS,
    ];

    /// Whether `path` is one of pinboard's own routes rather than
    /// `/<ns>/<id>/…`. Exact paths only: a namespace may be called
    /// `/registry` and keep every other path below it.
    pub fn is_control(path: &str) -> bool {
        ALL.contains(&path)
    }
}

/// The control router: registry, dashboard, health and metrics. Paths it
/// does not serve answer axum's empty 404; data-plane paths never reach it.
pub fn router<S: PlacementStore>(app: Arc<App<S>>) -> Router {
    Router::new()
        .route(paths::REGISTER, post(registry::http::register::<S>))
        .route(paths::HEARTBEAT, post(registry::http::heartbeat::<S>))
        .route(paths::RELEASE, post(registry::http::release::<S>))
        .route(paths::DEREGISTER, post(registry::http::deregister::<S>))
        .route(paths::TAG, post(registry::http::tag::<S>))
        .route(paths::SOCKETS_SEND, post(registry::http::sockets_send::<S>))
        .route(paths::PUSH, post(registry::http::push::<S>))
        .route(paths::WORKERS, get(registry::http::workers::<S>))
        .route(paths::OVERVIEW, get(registry::http::overview::<S>))
        .route(paths::PLACEMENTS, get(operator::http::placements::<S>))
        .route(paths::SWEEPER, get(operator::http::sweeper::<S>))
        .route(paths::MOVES, get(operator::http::moves::<S>))
        .route(paths::STATE_IDS, get(operator::http::state_ids::<S>))
        .route(paths::STATE_SHOW, get(operator::http::state_show::<S>))
        .route(paths::STATE_ACT, post(operator::http::state_act::<S>))
        .route(paths::STATE_AUDIT, get(operator::http::state_audit::<S>))
        .route(paths::DASHBOARD, get(dashboard::http::page::<S>))
        .route(paths::DASHBOARD_JS, get(dashboard::http::script))
        .route(paths::DASHBOARD_CSS, get(dashboard::http::style))
        .route(paths::DASHBOARD_LOGIN, post(dashboard::http::login::<S>))
        .route(paths::DASHBOARD_LOGOUT, post(dashboard::http::logout::<S>))
        .route(paths::DASHBOARD_STATE, get(dashboard::http::state::<S>))
        .route(paths::DASHBOARD_PUSH, post(dashboard::http::push::<S>))
        .route(
            paths::DASHBOARD_STATE_IDS,
            get(dashboard::http::inspect_ids::<S>),
        )
        .route(
            paths::DASHBOARD_STATE_SHOW,
            get(dashboard::http::inspect_show::<S>),
        )
        .route(
            paths::DASHBOARD_STATE_ACT,
            post(dashboard::http::inspect_act::<S>),
        )
        .route(paths::HEALTHZ, get(healthz))
        .route(paths::READYZ, get(readyz::<S>))
        .route(paths::METRICS, get(metrics::<S>))
        .with_state(app)
}
