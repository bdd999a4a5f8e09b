//! Wiring: the shared [`App`] state and the axum [`router`].
//!
//! Owns which path goes where and the runtime handles (store, client,
//! metrics); never decides anything itself.
//!
//! Route order: `/registry/*`, `/dashboard*`, `/healthz`, `/readyz`,
//! `/metrics` are matched first; every other path is data-plane traffic for
//! the proxy (so a namespace named `/registry`, `/dashboard`, `/healthz`,
//! `/readyz` or `/metrics` cannot be proxied).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http::{header, HeaderValue, StatusCode};
use pinned_edge::tls::TlsError;

use crate::challenge::HttpProver;
use crate::clock::{Clock, Entropy, EpochFloor};
use crate::config::{Config, READY_STORE_TIMEOUT_MS};
use crate::dashboard::{Dashboard, DashboardSettings};
use crate::metrics::Metrics;
use crate::operator::moves::MoveLog;
use crate::operator::traffic::{Traffic, TrafficMetrics};
use crate::outbound::Outbound;
use crate::placement::PlacementStore;
use crate::proxy::resolve::{Directory, DirectoryCounters, DirectorySettings, Readiness};
use crate::proxy::{self, ProxySettings};
use crate::registry::auth::Credentials;
use crate::registry::http::BodyLimits;
use crate::registry::{self, Registry, RegistryConfig};
use crate::{dashboard, operator};

/// Everything a request handler needs.
pub struct App<S> {
    /// The placement store (the sweeper's lease lives there too).
    pub store: Arc<S>,
    /// Registry core.
    pub registry: Registry<S, HttpProver>,
    /// Route cache and worker view.
    pub directory: Directory<S>,
    /// Everything sent to workers goes through here.
    pub outbound: Outbound,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// Metrics.
    pub metrics: Metrics,
    /// Bearer tokens of the worker and operator endpoints.
    pub credentials: Credentials,
    /// Proxy settings.
    pub proxy: ProxySettings,
    /// Bounds of `/registry/*` request bodies.
    pub registry_body: BodyLimits,
    /// What moved recently (shared with the directory, which records).
    pub moves: Arc<MoveLog>,
    /// Whether this node runs the sweeper (`--database-url`).
    pub sweeper_enabled: bool,
    /// Per-namespace request, error and latency counters of the proxy
    /// (exported on `/metrics` too).
    pub traffic: Arc<Traffic>,
    /// The dashboard's login sessions and settings.
    pub dashboard: Dashboard,
}

impl<S> std::fmt::Debug for App<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

/// The injected parts of an [`App`]: what differs between production, tests
/// and the simulation. Two apps built over one `store` are two pinboard nodes
/// sharing one placement store.
pub struct AppParts<S> {
    /// The placement store (shared by every node that holds a clone).
    pub store: Arc<S>,
    /// The transport to workers (proxy, sweeper, challenge probes).
    pub outbound: Outbound,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// Randomness (session ids, candidate choice).
    pub entropy: Arc<dyn Entropy>,
    /// This node's epoch floor (with the durable high-water mark, if any).
    pub floor: Arc<EpochFloor>,
}

impl<S> std::fmt::Debug for AppParts<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppParts").finish_non_exhaustive()
    }
}

impl<S: PlacementStore> App<S> {
    /// Build the app over `store` with real sockets, the given time and
    /// randomness, and a floor kept in this process only.
    ///
    /// # Errors
    ///
    /// `--upstream-ca` cannot be read or used.
    pub fn new(
        config: &Config,
        store: S,
        clock: Arc<dyn Clock>,
        entropy: Arc<dyn Entropy>,
    ) -> Result<Self, TlsError> {
        Ok(Self::from_parts(
            config,
            AppParts {
                store: Arc::new(store),
                outbound: Outbound::http(config.upstream_tls()?),
                clock,
                entropy,
                floor: Arc::new(EpochFloor::default()),
            },
        ))
    }

    /// Build the app from injected parts (see [`AppParts`]).
    pub fn from_parts(config: &Config, parts: AppParts<S>) -> Self {
        let AppParts {
            store,
            outbound,
            clock,
            entropy,
            floor,
        } = parts;
        let mut metrics = Metrics::new();
        let traffic = Arc::new(Traffic::default());
        metrics.register_collector(Box::new(TrafficMetrics(traffic.clone())));
        let moves = Arc::new(MoveLog::counting(metrics.failovers.clone()));
        let entropy_for_dashboard = entropy.clone();
        let prover = HttpProver::new(
            outbound.clone(),
            Duration::from_millis(config.challenge_timeout_ms),
        );
        Self {
            store: store.clone(),
            registry: Registry::new(
                store.clone(),
                prover,
                clock.clone(),
                entropy.clone(),
                floor.clone(),
                RegistryConfig {
                    lease_ttl_ms: config.lease_ttl_ms,
                    takeover_wind_down_ms: config.takeover_wind_down_ms,
                },
            ),
            directory: Directory::new(
                store,
                clock.clone(),
                entropy,
                floor,
                DirectorySettings {
                    refresh_ms: config.worker_refresh_ms,
                    quarantine_ms: config.quarantine_ms(),
                    lease_ttl_ms: config.lease_ttl_ms,
                    route_capacity: config.route_cache_capacity,
                    unknown_session_ttl_ms: config.unknown_session_ttl_ms,
                    forced_refresh_interval_ms: config.forced_refresh_interval_ms,
                    upstream_tls: outbound.tls().cloned(),
                },
                DirectoryCounters {
                    placements: metrics.placements.clone(),
                    worker_reads: metrics.store_worker_reads.clone(),
                    rolled_back: metrics.placements_rolled_back.clone(),
                    store_losses: metrics.store_losses.clone(),
                    moves: moves.clone(),
                },
            ),
            outbound,
            clock,
            metrics,
            credentials: config.credentials(),
            proxy: ProxySettings {
                retries: config.proxy_retries,
                retry_body_limit: config.retry_body_limit,
                upstream_timeout: Duration::from_millis(config.upstream_timeout_ms),
                body_timeout: Duration::from_millis(config.body_timeout_ms),
                upstream_body_timeout: Duration::from_millis(config.upstream_body_timeout_ms),
            },
            registry_body: BodyLimits {
                max_bytes: config.max_registry_body_bytes,
                timeout: Duration::from_millis(config.body_timeout_ms),
            },
            moves,
            sweeper_enabled: config.database_url.is_some(),
            traffic,
            dashboard: Dashboard::new(
                DashboardSettings {
                    lease_ttl_ms: config.lease_ttl_ms,
                    secure_cookie: config.secure_cookie(),
                    login_window: Duration::from_millis(config.dashboard_login_window_ms),
                },
                entropy_for_dashboard,
            ),
        }
    }
}

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
        .directory
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
    if let Ok(n) = app.directory.live_workers().await {
        app.metrics.live_workers.set(n as i64);
    }
    app.metrics
        .cached_routes
        .set(app.directory.cached_routes() as i64);
    app.metrics
        .quarantined
        .set(i64::from(app.directory.quarantine_left_ms() > 0));
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
    /// `GET`: liveness.
    pub const HEALTHZ: &str = "/healthz";
    /// `GET`: readiness (store reachable, no quarantine).
    pub const READYZ: &str = "/readyz";
    /// `GET`: Prometheus metrics.
    pub const METRICS: &str = "/metrics";
    /// Every path above.
    pub const ALL: [&str; 21] = [
        REGISTER,
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
        DASHBOARD,
        DASHBOARD_JS,
        DASHBOARD_CSS,
        DASHBOARD_LOGIN,
        DASHBOARD_LOGOUT,
        DASHBOARD_STATE,
        DASHBOARD_PUSH,
        HEALTHZ,
        READYZ,
        METRICS,
    ];
}

/// The full router: registry, health, metrics, and the proxy fallback.
pub fn router<S: PlacementStore>(app: Arc<App<S>>) -> Router {
    Router::new()
        .route(paths::REGISTER, post(registry::http::register::<S>))
        .route(paths::HEARTBEAT, post(registry::http::heartbeat::<S>))
        .route(paths::RELEASE, post(registry::http::release::<S>))
        .route(paths::DEREGISTER, post(registry::http::deregister::<S>))
        .route(paths::TAG, post(registry::http::tag::<S>))
        .route(paths::PUSH, post(registry::http::push::<S>))
        .route(paths::WORKERS, get(registry::http::workers::<S>))
        .route(paths::OVERVIEW, get(registry::http::overview::<S>))
        .route(paths::PLACEMENTS, get(operator::http::placements::<S>))
        .route(paths::SWEEPER, get(operator::http::sweeper::<S>))
        .route(paths::MOVES, get(operator::http::moves::<S>))
        .route(paths::DASHBOARD, get(dashboard::http::page::<S>))
        .route(paths::DASHBOARD_JS, get(dashboard::http::script))
        .route(paths::DASHBOARD_CSS, get(dashboard::http::style))
        .route(paths::DASHBOARD_LOGIN, post(dashboard::http::login::<S>))
        .route(paths::DASHBOARD_LOGOUT, post(dashboard::http::logout::<S>))
        .route(paths::DASHBOARD_STATE, get(dashboard::http::state::<S>))
        .route(paths::DASHBOARD_PUSH, post(dashboard::http::push::<S>))
        .route(paths::HEALTHZ, get(healthz))
        .route(paths::READYZ, get(readyz::<S>))
        .route(paths::METRICS, get(metrics::<S>))
        .fallback(proxy::handle::<S>)
        .with_state(app)
}
