//! The [`Worker`]: every hosted namespace of one process, its HTTP surface
//! (`/_pinned/stats`, `/_pinned/challenge` behind pinboard,
//! `/<ns>/<id>/...`, optionally `/metrics`) and its process-wide lifecycle
//! (start, drain, close, registration).
//!
//! The worker owns no sockets; [`serve`](crate::serve) binds one, or the
//! application merges [`Worker::router`] beside its own routes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, StatusCode};
use parking_lot::Mutex;
use pinned_wire::{attestation, headers};
use serde_json::{json, Map, Value};
use subtle::ConstantTimeEq;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config_error::ConfigErrors;
use crate::durable::Durable;
use crate::metrics::Metrics;
use crate::namespace::{DrainKind, Durability, Namespace, NamespaceParts};
use crate::plane::control::ControlPlane;
use crate::plane::pinboard::{Plane, RegistrationState};
use crate::plane::switchboard::{switchboard, Exchange};
use crate::process::CpuProbe;
use crate::response;
use crate::serve::config::Options;
use crate::serve::dispatch::dispatch;
use crate::serve::namespaces::Namespaces;

/// A process hosting pinned objects.
///
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    hosts: Namespaces,
    /// Authenticates `/_pinned/*` (the proxy secret) and signs the tokens
    /// of in-process cluster calls. In local mode only in-process callers
    /// know it.
    secret: Arc<str>,
    control: ControlPlane,
    metrics: Arc<Metrics>,
    created: Instant,
    cpu: CpuProbe,
    started: AtomicBool,
    /// The receiving half of the in-process cluster calls, until the
    /// switchboard starts with the worker.
    exchange: Mutex<Option<Exchange>>,
    /// Cancels the hosts' and the switchboard's background tasks when the
    /// last handle to the worker is dropped (they hold the hosts strongly,
    /// so nothing else would end them).
    stop: DropGuard,
    /// `HOST` and `PORT` as configured, for [`serve`](crate::serve).
    bind: (String, u16),
    /// The deadlines and bounds [`serve`](crate::serve) holds clients to.
    edge: crate::serve::edge::EdgeSettings,
    /// HTTPS for [`serve`](crate::serve) (`None`: plain HTTP).
    tls: Option<pinned_edge::tls::tokio_rustls::TlsAcceptor>,
    domain: crate::time::Domain,
    /// When the fence rows of ids without data are reclaimed.
    fence_reclaim: crate::durable::reclaim::Schedule,
}

/// Alarms armed from the store at start (local mode).
const ALARM_SCAN_LIMIT: usize = 1_000_000;

impl Options {
    /// Validates the options and builds the worker (not yet started).
    ///
    /// # Errors
    ///
    /// Every configuration problem at once: invalid or duplicate
    /// namespaces, no hosts, bad per-host options, a non-integer `PORT`, an
    /// incomplete control-plane configuration, an advertise URL with port 0
    /// (only [`serve`](crate::serve) given these options fills it in), dev
    /// mode in production.
    pub fn build(self) -> Result<Worker, ConfigErrors> {
        self.build_worker(false)
    }

    /// [`build`](Self::build) for [`serve`](crate::serve), which binds
    /// before the worker starts and so may take an advertise URL with port
    /// 0 (filled in by [`Worker::listening_on`]).
    pub(crate) fn build_served(self) -> Result<Worker, ConfigErrors> {
        self.build_worker(true)
    }

    fn build_worker(mut self, served: bool) -> Result<Worker, ConfigErrors> {
        self.validate(served)?;
        let tls = self.tls_acceptor().map_err(|e| ConfigErrors(vec![e]))?;
        let metrics = Arc::new(Metrics::new());
        let plane = match self.plane_config() {
            None => {
                tracing::warn!(
                    "pinned DEV MODE: no pinboard configured; serving instances locally with \
                     attestation checks off. Do not run this in production."
                );
                None
            }
            Some(config) => {
                let lease_buffer = self.lease_buffer;
                let plane = Plane::new(config, lease_buffer, metrics.clone(), self.domain.clone())
                    .map_err(|e| ConfigErrors(vec![e]))?;
                Some(Arc::new(plane))
            }
        };
        let control = plane.map_or(ControlPlane::Local, ControlPlane::Pinboard);
        let secret: Arc<str> = control.pinboard().map_or_else(
            || Arc::from(self.domain.random_hex(32)),
            |plane| plane.secret.clone(),
        );
        let store = self.store.clone();
        let fence_reclaim = self.fence_reclaim;
        let states = Arc::new(std::mem::take(&mut self.states));
        let domain = self.domain.clone();
        let edge = self.edge;
        let bind = (
            self.bind.clone().unwrap_or_else(|| "127.0.0.1".to_owned()),
            self.parsed_port().unwrap_or(0),
        );
        // Top down: everything the hosts share exists before them, and each
        // host is handed its parts (the switchboard's sending half, the stop
        // token) when created; nothing is attached afterwards.
        let (switchboard, exchange) = switchboard();
        let stop = CancellationToken::new();
        let worker_sockets = (Arc::new(AtomicUsize::new(0)), self.max_sockets);
        let hosts: Vec<Arc<Namespace>> = self
            .into_hosts()
            .into_iter()
            .map(|spec| {
                // The namespace's router holds it weakly (its stack serves
                // that namespace), so it is built with the namespace.
                Arc::new_cyclic(|ns| {
                    let held = spec.options.sockets.survive_moves;
                    Namespace::new(NamespaceParts {
                        ns: Arc::from(spec.ns.as_str()),
                        options: spec.options,
                        lifecycle: spec.lifecycle,
                        router: (spec.routes)(ns.clone(), held),
                        durable: store.clone().map(|store| {
                            Arc::new(Durable::new(store, spec.trays)) as Arc<dyn Durability>
                        }),
                        metrics: metrics.clone(),
                        local_aud: domain.random_hex(16),
                        secret: secret.clone(),
                        control: control.clone(),
                        store: store.clone(),
                        states: states.clone(),
                        domain: domain.clone(),
                        switchboard: switchboard.clone(),
                        stop: stop.clone(),
                        worker_sockets: (worker_sockets.0.clone(), worker_sockets.1),
                    })
                })
            })
            .collect();
        Ok(Worker {
            inner: Arc::new(Inner {
                hosts: Namespaces::new(hosts),
                secret,
                control,
                metrics,
                created: Instant::now(),
                cpu: CpuProbe::default(),
                started: AtomicBool::new(false),
                exchange: Mutex::new(Some(exchange)),
                stop: stop.drop_guard(),
                bind,
                edge,
                tls,
                domain,
                fence_reclaim,
            }),
        })
    }
}

impl Worker {
    /// The worker's routes without starting it ([`serve`](crate::serve)
    /// starts it once the listener is bound).
    pub(crate) fn build_router(&self) -> Router {
        let stats_worker = self.clone();
        let mut router = Router::new().route(
            "/_pinned/stats",
            get(move |headers: HeaderMap| {
                let worker = stats_worker.clone();
                async move { worker.stats_route(&headers) }
            }),
        );
        let state_worker = self.clone();
        router = router.route(
            "/_pinned/state/{op}",
            axum::routing::any(
                move |axum::extract::Path(op): axum::extract::Path<String>,
                      method: http::Method,
                      headers: HeaderMap,
                      query: axum::extract::Query<HashMap<String, String>>| {
                    let worker = state_worker.clone();
                    async move { worker.state_route(&op, &method, &headers, &query).await }
                },
            ),
        );
        if self.inner.control.pinboard().is_some() {
            let challenge_worker = self.clone();
            router = router.route(
                "/_pinned/challenge",
                get(
                    move |headers: HeaderMap,
                          query: axum::extract::Query<HashMap<String, String>>| {
                        let worker = challenge_worker.clone();
                        async move { worker.challenge_route(&headers, &query) }
                    },
                ),
            );
        }
        // Namespaces are dispatched from the fallback, not matched as
        // routes: a route match would leave its path parameters in the
        // request's extensions, where the object's own routes would see
        // them; the fallback leaves every extension as the client's
        // request and the outer layers made it.
        let hosts = self.inner.hosts.clone();
        router = router.fallback(move |request: Request| {
            let hosts = hosts.clone();
            async move { dispatch(&hosts, request).await }
        });
        router
    }

    /// The worker's routes: `GET /_pinned/stats`, `GET /_pinned/challenge`
    /// in control-plane mode, and, as the router's fallback, every path
    /// under a hosted namespace (`/<ns>/<id>...`; any other path answers 404
    /// `{"detail":"Not Found"}`). Because namespaces are its fallback, it
    /// cannot be merged with another router that has a fallback of its own.
    ///
    /// Asking for the router starts the worker (as [`start`](Self::start)),
    /// so a router served by hand never runs without idle eviction. Prefer
    /// [`serve`](crate::serve) with [`Serve::routes`](crate::Serve::routes):
    /// a router served by hand gets no drain on SIGTERM.
    pub fn router(&self) -> Router {
        self.start();
        self.build_router()
    }

    /// Tells the worker the address its listener bound, before it starts:
    /// an advertise URL with port 0 takes that port (see
    /// [`Options::pinboard`]).
    pub(crate) fn listening_on(&self, addr: std::net::SocketAddr) {
        if let Some(plane) = self.inner.control.pinboard() {
            plane.listening_on(addr.port());
        }
    }

    /// The address [`serve`](crate::serve) binds: `HOST` (default
    /// `127.0.0.1`) and `PORT` (default 0, an ephemeral port).
    pub(crate) fn bind_address(&self) -> (&str, u16) {
        (&self.inner.bind.0, self.inner.bind.1)
    }

    /// The namespace table, for [`serve`](crate::serve)'s direct path to
    /// dispatch.
    pub(crate) fn hosts(&self) -> Namespaces {
        self.inner.hosts.clone()
    }

    /// The deadlines and bounds [`serve`](crate::serve) holds clients to.
    pub(crate) fn edge_settings(&self) -> crate::serve::edge::EdgeSettings {
        self.inner.edge
    }

    /// The TLS acceptor [`serve`](crate::serve) answers HTTPS with.
    pub(crate) fn tls_acceptor(&self) -> Option<pinned_edge::tls::tokio_rustls::TlsAcceptor> {
        self.inner.tls.clone()
    }

    /// `pinned_connections_reclaimed_total`, counted by the edge.
    pub(crate) fn connections_reclaimed(&self) -> prometheus_client::metrics::counter::Counter {
        self.inner.metrics.connections_reclaimed.clone()
    }

    /// `GET /metrics` in Prometheus text format, to merge where wanted.
    pub fn metrics_router(&self) -> Router {
        let worker = self.clone();
        Router::new().route(
            "/metrics",
            get(move || {
                let worker = worker.clone();
                async move {
                    (
                        [(
                            CONTENT_TYPE,
                            HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        )],
                        worker.metrics(),
                    )
                }
            }),
        )
    }

    /// Starts the idle sweeps and, behind pinboard, the registration loop
    /// (idempotent; [`serve`](crate::serve) and [`router`](Self::router) call
    /// it). Needs a tokio runtime.
    pub fn start(&self) {
        // Outside a runtime there is nothing to spawn on; a later call
        // (from `serve`, or the router asked for again) starts it.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if self.inner.started.swap(true, Ordering::SeqCst) {
            return;
        }
        for host in self.inner.hosts.iter() {
            host.start();
        }
        if let Some(exchange) = self.inner.exchange.lock().take() {
            self.inner.domain.spawn(crate::serve::exchange::serve(
                self.inner.hosts.clone(),
                exchange,
                self.inner.stop.token().clone(),
            ));
        }
        if let Some(plane) = self.inner.control.pinboard() {
            plane.start(self.inner.hosts.commanded());
        } else {
            self.arm_stored_alarms();
        }
        if let Some(store) = self.store() {
            let control = self.inner.control.clone();
            self.inner.domain.spawn(crate::durable::reclaim::run(
                store,
                self.inner.domain.clone(),
                self.inner.fence_reclaim,
                move || control.lease_ttl(),
                self.inner.stop.token().clone(),
            ));
        }
    }

    /// The worker's state store (every namespace shares it), if any.
    fn store(&self) -> Option<Arc<dyn pinned_store::StateStore>> {
        self.inner.hosts.first().and_then(|host| host.store.clone())
    }

    /// Local mode: every alarm in the store gets a process timer, so due
    /// ones fire now and evicted ids activate when theirs come due.
    fn arm_stored_alarms(&self) {
        let Some(store) = self.store() else {
            return;
        };
        let worker = self.clone();
        self.inner.domain.spawn(async move {
            match store.due_alarms(i64::MAX, ALARM_SCAN_LIMIT).await {
                Ok(alarms) => {
                    for alarm in alarms {
                        if let Some(host) = worker.inner.hosts.find(&alarm.ns) {
                            crate::durable::alarm::arm(host, &alarm.id, alarm.at);
                        }
                    }
                }
                Err(error) => tracing::error!(error = %pinned_edge::logging::Chain(&error), "cannot scan the store for alarms"),
            }
        });
    }

    /// Drains every namespace: refuses new activations, evicts idle
    /// instances now, aborts the rest `deadline` from now (`None`: never),
    /// reports `draining: true` to pinboard, and resolves once every
    /// instance closed. [`undrain`](Self::undrain) revokes it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the drain in force.
    pub async fn drain(&self, deadline: Option<Duration>) {
        if let Some(plane) = self.inner.control.pinboard() {
            plane.set_draining(true);
        }
        for host in &self.inner.hosts {
            host.start_drain(DrainKind::Local, deadline);
        }
        for host in &self.inner.hosts {
            host.wait_empty().await;
        }
        tracing::info!("drain complete: no live instances");
    }

    /// Revokes the worker's own drain: new activations are accepted again
    /// (a control-plane drain stays in force).
    pub fn undrain(&self) {
        for host in &self.inner.hosts {
            host.stop_drain(DrainKind::Local);
        }
        if let Some(plane) = self.inner.control.pinboard() {
            plane.set_draining(false);
        }
    }

    /// Whether any namespace is draining (the worker's own drain or the
    /// control plane's).
    pub fn draining(&self) -> bool {
        self.inner.hosts.iter().any(|host| host.draining())
    }

    /// Draining and every instance closed.
    pub fn drained(&self) -> bool {
        self.draining() && self.inner.hosts.iter().all(|host| host.len() == 0)
    }

    /// Aborts every instance (their placements are released), waits for all
    /// to close, deregisters from pinboard, and refuses every later request
    /// with 500.
    ///
    /// Until the deregistration is through, new activations answer the
    /// retryable `host draining; retry`, so pinboard moves them elsewhere
    /// instead of relaying an error.
    pub async fn close(&self) {
        for host in &self.inner.hosts {
            host.start_drain(DrainKind::Local, Some(Duration::ZERO));
        }
        for host in &self.inner.hosts {
            host.wait_empty().await;
        }
        if let Some(plane) = self.inner.control.pinboard() {
            plane.deregister().await;
            plane.stop();
        }
        for host in &self.inner.hosts {
            host.shut_down().await;
        }
    }

    /// Registered with pinboard and inside the lease (always true in local
    /// mode). Wire it to the readiness probe.
    pub fn ready(&self) -> bool {
        match self.inner.control.pinboard() {
            None => true,
            Some(plane) => plane.registered() && !plane.lease.expired(),
        }
    }

    /// A higher-epoch worker of the same hostname displaced this one: it
    /// stopped registering for good.
    pub fn superseded(&self) -> bool {
        self.inner
            .control
            .pinboard()
            .is_some_and(|plane| plane.superseded())
    }

    /// Lease health: new activations are allowed.
    pub fn lease_healthy(&self) -> bool {
        self.inner.control.lease_healthy()
    }

    /// The lease ran out: nothing is served until a fresh ack.
    pub fn lease_expired(&self) -> bool {
        self.inner.control.lease_expired()
    }

    /// Times the lease crossed into unhealthy.
    pub fn lease_flaps(&self) -> u64 {
        self.inner.control.lease().map_or(0, |lease| lease.flaps())
    }

    /// The registration state, `None` in local mode.
    pub fn registration(&self) -> Option<RegistrationState> {
        self.inner.control.pinboard().map(|plane| plane.state())
    }

    /// Every change of the registration state (registered, session,
    /// superseded, reregistrations, drain flag), `None` in local mode: for
    /// a readiness probe that should flip the moment the worker registers.
    ///
    /// ```no_run
    /// # async fn demo(worker: pinned::Worker) {
    /// if let Some(mut changes) = worker.watch_registration() {
    ///     while changes.changed().await.is_ok() {
    ///         let state = changes.borrow_and_update().clone();
    ///         println!("registered: {}", state.registered);
    ///     }
    /// }
    /// # }
    /// ```
    pub fn watch_registration(&self) -> Option<tokio::sync::watch::Receiver<RegistrationState>> {
        self.inner.control.pinboard().map(|plane| plane.watch())
    }

    /// The secret that authenticates `/_pinned/*` calls and signs
    /// attestations.
    pub fn secret(&self) -> &str {
        &self.inner.secret
    }

    /// The metrics in Prometheus text format.
    pub fn metrics(&self) -> String {
        self.inner.metrics.encode()
    }

    /// The `/_pinned/stats` body.
    pub fn stats(&self) -> Value {
        let mut namespaces = Map::new();
        let mut instances = Vec::new();
        for host in &self.inner.hosts {
            let (activations, evictions) = host.counters();
            namespaces.insert(
                host.ns.to_string(),
                json!({ "activations": activations, "evictions": evictions }),
            );
            for row in host.rows() {
                let mut entry = json!({
                    "namespace": &*host.ns,
                    "id": &*row.id,
                    "connections": row.connections,
                    "tasks": row.tasks,
                    "idleMs": row.idle_ms,
                });
                if let (Some(at), Some(object)) = (row.activated_at, entry.as_object_mut()) {
                    object.insert("activatedAt".into(), at.into());
                }
                instances.push(entry);
            }
        }
        let mut process = Map::new();
        let uptime = u64::try_from(self.inner.created.elapsed().as_millis()).unwrap_or(u64::MAX);
        process.insert("uptimeMs".into(), uptime.into());
        if let Some(rss) = self.inner.cpu.rss_bytes() {
            process.insert("rssBytes".into(), rss.into());
        }
        if let Some(cpu) = self.inner.cpu.cpu_percent() {
            process.insert("cpuPercent".into(), cpu.into());
        }
        let reregistrations = self
            .inner
            .control
            .pinboard()
            .map_or(0, |plane| plane.state().reregistrations);
        json!({
            "draining": self.draining(),
            "leaseFlaps": self.lease_flaps(),
            "reregistrations": reregistrations,
            "namespaces": namespaces,
            "instances": instances,
            "process": process,
        })
    }

    /// `/_pinned/*` accepts the proxy secret, or a token for one of the
    /// hosts' local audiences or the current session.
    fn authorized(&self, headers: &HeaderMap) -> bool {
        if let Some(secret) = headers.get(headers::PROXY_SECRET) {
            if bool::from(secret.as_bytes().ct_eq(self.inner.secret.as_bytes())) {
                return true;
            }
        }
        let Some(token) = headers
            .get(headers::ATTESTATION)
            .and_then(|value| value.to_str().ok())
        else {
            return false;
        };
        let hosts = &self.inner.hosts;
        let control = &self.inner.control;
        attestation::verify(
            token,
            &self.inner.secret,
            |aud| hosts.iter().any(|host| host.local_aud == aud) || control.is_session(aud),
            self.inner.domain.unix_secs(),
        )
        .is_some()
    }

    fn stats_route(&self, headers: &HeaderMap) -> Response {
        if !self.authorized(headers) {
            return response::detail(StatusCode::FORBIDDEN, "invalid proxy secret");
        }
        axum::Json(self.stats()).into_response()
    }

    /// `/_pinned/state/{ids,show,act}?ns=…`: the storage inspector
    /// ([`crate::durable::inspect`]).
    async fn state_route(
        &self,
        op: &str,
        method: &http::Method,
        headers: &HeaderMap,
        query: &HashMap<String, String>,
    ) -> Response {
        if !self.authorized(headers) {
            return response::detail(StatusCode::FORBIDDEN, "invalid proxy secret");
        }
        let Some(ns) = query.get("ns") else {
            return response::detail(StatusCode::BAD_REQUEST, "missing query parameter \"ns\"");
        };
        let Some(host) = self.inner.hosts.find(ns) else {
            return response::detail(
                StatusCode::NOT_FOUND,
                &format!("unknown namespace {ns:?}: this worker does not host it"),
            );
        };
        crate::durable::inspect::routes::serve(host, op, method, query, headers).await
    }

    fn challenge_route(&self, headers: &HeaderMap, query: &HashMap<String, String>) -> Response {
        if !self.authorized(headers) {
            return response::detail(StatusCode::FORBIDDEN, "invalid proxy secret");
        }
        let Some(challenge) = query.get("challenge") else {
            // The reference framework's validation error.
            let body = json!({"detail": [{
                "type": "missing", "loc": ["query", "challenge"],
                "msg": "Field required", "input": null,
            }]});
            return (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response();
        };
        match self
            .inner
            .control
            .pinboard()
            .and_then(|plane| plane.answer(challenge))
        {
            Some(value) => axum::Json(json!({ "value": value })).into_response(),
            None => response::detail(StatusCode::NOT_FOUND, "unknown challenge"),
        }
    }
}
