//! The shared state of a pinboard node: [`App`], every long-lived part a
//! handler, the proxy, the sweeper and upkeep use, built top-down in one
//! function ([`App::from_parts`]).
//!
//! Owns how the parts are wired together; never serves, routes or decides
//! anything itself. Sits above the parts it holds (routes, registry,
//! outbound, metrics) and below everything that takes an `App` (the proxy,
//! the HTTP shells, the sweeper, upkeep, the router).

use std::sync::Arc;
use std::time::Duration;

use pinned_edge::tls::TlsError;

use crate::challenge::HttpProver;
use crate::clock::{Clock, Entropy, EpochFloor};
use crate::config::{BodyLimits, Config, ProxySettings};
use crate::dashboard::{Dashboard, DashboardSettings};
use crate::held::{HeldSettings, HeldSockets};
use crate::metrics::Metrics;
use crate::operator::moves::MoveLog;
use crate::operator::traffic::{Traffic, TrafficMetrics};
use crate::outbound::Outbound;
use crate::placement::PlacementStore;
use crate::registry::auth::Credentials;
use crate::registry::{Registry, RegistryConfig};
use crate::routes::{Routes, RoutesCounters, RoutesSettings};

/// Everything a request handler needs.
pub struct App<S> {
    /// The placement store (the sweeper's lease lives there too).
    pub store: Arc<S>,
    /// Registry core.
    pub registry: Registry<S, HttpProver>,
    /// The route directory: routes, worker view, generation, readiness.
    pub routes: Routes<S>,
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
    /// What moved recently (shared with the route directory, which records).
    pub moves: Arc<MoveLog>,
    /// Whether this node runs the sweeper (`--database-url`).
    pub sweeper_enabled: bool,
    /// Per-namespace request, error and latency counters of the proxy
    /// (exported on `/metrics` too).
    pub traffic: Arc<Traffic>,
    /// The dashboard's login sessions and settings.
    pub dashboard: Dashboard,
    /// The operator's state controls asked for on this node.
    pub state_audit: crate::operator::audit::StateAudit,
    /// The WebSockets this node holds for their workers.
    pub held: Arc<HeldSockets>,
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
        let held = Arc::new(HeldSockets::new(
            entropy.token_hex(6),
            HeldSettings::default(),
            &metrics,
        ));
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
            routes: Routes::new(
                store,
                clock.clone(),
                entropy,
                floor,
                RoutesSettings {
                    refresh_ms: config.worker_refresh_ms,
                    quarantine_ms: config.quarantine_ms(),
                    lease_ttl_ms: config.lease_ttl_ms,
                    route_capacity: config.route_cache_capacity,
                    unknown_session_ttl_ms: config.unknown_session_ttl_ms,
                    forced_refresh_interval_ms: config.forced_refresh_interval_ms,
                    upstream_tls: outbound.tls().cloned(),
                },
                RoutesCounters {
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
            proxy: config.proxy_settings(),
            registry_body: config.registry_body_limits(),
            moves,
            state_audit: crate::operator::audit::StateAudit::default(),
            held,
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
