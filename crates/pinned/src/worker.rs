//! The [`Worker`]: every hosted namespace of one process, its HTTP surface
//! (`/_pinned/stats`, `/<ns>/<id>/...`, optionally `/metrics`) and its
//! process-wide lifecycle (start, drain, close).
//!
//! The worker owns no sockets; [`serve`](crate::serve) binds one, or the
//! application merges [`Worker::router`] beside its own routes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, StatusCode};
use pinned_wire::{attestation, headers};
use rand::RngCore;
use serde_json::{json, Map, Value};
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use crate::config::{ConfigErrors, Options};
use crate::directory::HostShared;
use crate::dispatch::dispatch;
use crate::metrics::Metrics;
use crate::process::CpuProbe;
use crate::response;

/// A process hosting pinned objects.
///
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

struct Inner {
    hosts: Vec<Arc<HostShared>>,
    /// Authenticates `/_pinned/*` (the proxy secret). In local mode only
    /// in-process callers know it.
    secret: String,
    /// One local audience per host, for tokens the worker mints itself.
    audiences: Vec<String>,
    metrics: Arc<Metrics>,
    created: Instant,
    cpu: CpuProbe,
    started: AtomicBool,
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

fn route_escape(ns: &str) -> String {
    ns.replace('{', "{{").replace('}', "}}")
}

impl Options {
    /// Validates the options and builds the worker (not yet started).
    ///
    /// # Errors
    ///
    /// Every configuration problem at once: invalid or duplicate
    /// namespaces, no hosts, bad per-host options, a non-integer `PORT`, dev
    /// mode in production.
    pub fn build(self) -> Result<Worker, ConfigErrors> {
        self.validate()?;
        tracing::warn!(
            "pinned DEV MODE: no pinboard configured; serving instances locally with \
             attestation checks off. Do not run this in production."
        );
        let metrics = Arc::new(Metrics::new());
        let hosts: Vec<Arc<HostShared>> = self
            .into_hosts()
            .into_iter()
            .map(|spec| {
                Arc::new(HostShared::new(
                    Arc::from(spec.ns.as_str()),
                    spec.options,
                    spec.activator,
                    (spec.routes)(),
                    metrics.clone(),
                ))
            })
            .collect();
        let audiences = hosts.iter().map(|_| random_hex(16)).collect();
        Ok(Worker {
            inner: Arc::new(Inner {
                hosts,
                secret: random_hex(32),
                audiences,
                metrics,
                created: Instant::now(),
                cpu: CpuProbe::default(),
                started: AtomicBool::new(false),
            }),
        })
    }
}

impl Worker {
    /// The worker's routes: `GET /_pinned/stats` and, per namespace `ns`,
    /// every method on `/<ns>/` and `/<ns>/*`. Merge it beside the
    /// application's own routes.
    pub fn router(&self) -> Router {
        let stats_worker = self.clone();
        let mut router = Router::new().route(
            "/_pinned/stats",
            get(move |headers: HeaderMap| {
                let worker = stats_worker.clone();
                async move { worker.stats_route(&headers) }
            }),
        );
        for host in &self.inner.hosts {
            let ns = route_escape(&host.ns);
            let bare = host.clone();
            let nested = host.clone();
            router = router
                .route(
                    &format!("{ns}/"),
                    any(move |request: Request| dispatch(bare.clone(), request)),
                )
                .route(
                    &format!("{ns}/{{*rest}}"),
                    any(move |request: Request| dispatch(nested.clone(), request)),
                );
        }
        router
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

    /// Starts the idle sweeps (idempotent). Call once the server listens.
    pub fn start(&self) {
        if self.inner.started.swap(true, Ordering::SeqCst) {
            return;
        }
        for host in &self.inner.hosts {
            host.start();
        }
    }

    /// Drains every namespace: refuses new activations, evicts idle
    /// instances now, aborts the rest `deadline` from now (`None`: never),
    /// and resolves once every instance closed. [`undrain`](Self::undrain)
    /// revokes it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the drain in force.
    pub async fn drain(&self, deadline: Option<Duration>) {
        for host in &self.inner.hosts {
            host.start_drain(deadline);
        }
        for host in &self.inner.hosts {
            host.wait_empty().await;
        }
    }

    /// Revokes a drain: new activations are accepted again.
    pub fn undrain(&self) {
        for host in &self.inner.hosts {
            host.stop_drain();
        }
    }

    /// Whether the worker is draining.
    pub fn draining(&self) -> bool {
        self.inner.hosts.iter().any(|host| host.draining())
    }

    /// Aborts every instance, waits for all to close, and refuses every
    /// later request with 500.
    pub async fn close(&self) {
        for host in &self.inner.hosts {
            host.shut_down().await;
        }
    }

    /// The proxy secret that authenticates `/_pinned/*` calls.
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
        json!({
            "draining": self.draining(),
            "leaseFlaps": 0,
            "reregistrations": 0,
            "namespaces": namespaces,
            "instances": instances,
            "process": process,
        })
    }

    /// `/_pinned/*` accepts the proxy secret, or a token for one of the
    /// worker's audiences.
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
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|since| since.as_secs_f64())
            .unwrap_or(0.0);
        let audiences = &self.inner.audiences;
        attestation::verify(
            token,
            &self.inner.secret,
            |aud| audiences.iter().any(|a| a == aud),
            now,
        )
        .is_some()
    }

    fn stats_route(&self, headers: &HeaderMap) -> Response {
        if !self.authorized(headers) {
            return response::detail(StatusCode::FORBIDDEN, "invalid proxy secret");
        }
        axum::Json(self.stats()).into_response()
    }
}
