//! A fake worker for the sweeper suites: hosts one namespace, answers the
//! challenge, implements `POST /<ns>/<id>/_alarm` and `POST /<ns>/<id>/_wake`
//! and records every call. On `_alarm` it emulates a fired alarm: it deletes
//! the alarm row through the state store at the `Pinboard-Epoch` it got,
//! then answers 200 `{"fired": true}`. `_wake` answers 200 `{"ok": true}`.
//! The test registers it itself (no heartbeats: use a long lease).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use parking_lot::Mutex;
use pinned_store::{InstanceKey, PostgresOptions, PostgresStore, StateStore, TrayKey};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::registration::Identity;

/// The Postgres database the suites share (tables shared with other suites:
/// always use a unique namespace and delete its rows at the end).
pub const DATABASE_URL: &str = "postgresql://postgres@127.0.0.1:5432/test";

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `/<ns>/<id>/_alarm` or `/<ns>/<id>/_wake`.
    pub path: String,
    /// The request headers.
    pub headers: HeaderMap,
    /// When it arrived.
    pub at: Instant,
}

/// The fake worker's state.
pub struct Durable {
    pub ns: String,
    pub identity: Identity,
    pub store: Arc<PostgresStore>,
    pub calls: Mutex<Vec<Seen>>,
}

impl Durable {
    /// Recorded calls whose path ends with `suffix`.
    pub fn calls_to(&self, suffix: &str) -> Vec<Seen> {
        self.calls
            .lock()
            .iter()
            .filter(|s| s.path.ends_with(suffix))
            .cloned()
            .collect()
    }
}

/// Open the shared Postgres state store (creating the tables if needed).
pub async fn store() -> Arc<PostgresStore> {
    Arc::new(
        PostgresStore::open(DATABASE_URL, PostgresOptions::default())
            .await
            .expect("postgres"),
    )
}

/// Delete every row of namespace `ns` (both tables).
pub async fn cleanup(ns: &str) {
    let (client, conn) = tokio_postgres::connect(DATABASE_URL, tokio_postgres::NoTls)
        .await
        .expect("postgres");
    tokio::spawn(conn);
    client
        .execute("DELETE FROM pinned_tray_index WHERE ns = $1", &[&ns])
        .await
        .expect("delete trays");
    client
        .execute("DELETE FROM pinned_epoch WHERE ns = $1", &[&ns])
        .await
        .expect("delete epochs");
}

/// A namespace no other test uses; its rows are deleted when the guard
/// drops, even when the test panicked.
pub fn unique_ns(tag: &str) -> Namespace {
    Namespace(format!("/sweep-{tag}-{}", super::unique()))
}

/// A test's own namespace (see [`unique_ns`]).
pub struct Namespace(pub String);

impl std::ops::Deref for Namespace {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let ns = self.0.clone();
        // Drop cannot await: clean up on a thread with its own runtime.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(cleanup(&ns));
            }
        })
        .join();
    }
}

async fn challenge(
    State(f): State<Arc<Durable>>,
    headers: HeaderMap,
    Query(q): Query<Value>,
) -> Response {
    let proxy_secret = headers
        .get("pinboard-proxy-secret")
        .and_then(|h| h.to_str().ok());
    let (status, body) = f
        .identity
        .answer_challenge(proxy_secret, q["challenge"].as_str());
    let status = StatusCode::from_u16(status).expect("a status");
    (status, axum::Json(body)).into_response()
}

fn record(f: &Durable, ns: &str, id: &str, call: &str, headers: HeaderMap) {
    f.calls.lock().push(Seen {
        path: format!("/{ns}/{id}/{call}"),
        headers,
        at: Instant::now(),
    });
}

async fn alarm(
    State(f): State<Arc<Durable>>,
    Path((ns, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    record(&f, &ns, &id, "_alarm", headers.clone());
    let epoch: Option<u64> = headers
        .get("pinboard-epoch")
        .and_then(|h| h.to_str().ok())
        .and_then(|e| e.parse().ok());
    let Some(epoch) = epoch else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"detail": "malformed placement epoch"})),
        )
            .into_response();
    };
    // The alarm "ran": delete its row at our epoch, then answer.
    match f
        .store
        .delete_tray(
            InstanceKey::new(&format!("/{ns}"), &id),
            TrayKey::new("pinned", "alarm"),
            epoch,
        )
        .await
    {
        Ok(()) => axum::Json(json!({"fired": true})).into_response(),
        Err(pinned_store::StoreError::FenceLost { .. }) => StatusCode::CONFLICT.into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn wake(
    State(f): State<Arc<Durable>>,
    Path((ns, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    record(&f, &ns, &id, "_wake", headers);
    axum::Json(json!({"ok": true})).into_response()
}

/// Start the fake hosting `ns` and register it with `pb`; returns it with
/// its session id.
pub async fn durable(pb: &str, ns: &str, store: Arc<PostgresStore>) -> (Arc<Durable>, String) {
    durable_in(pb, ns, store, None).await
}

/// [`durable`], registered under `hostname` (a hostname world) when given.
pub async fn durable_in(
    pb: &str,
    ns: &str,
    store: Arc<PostgresStore>,
    hostname: Option<&str>,
) -> (Arc<Durable>, String) {
    let tag = hostname.map_or_else(String::new, |h| format!("@{h}"));
    let f = Arc::new(Durable {
        ns: ns.to_owned(),
        identity: Identity {
            client_id: format!("durable{ns}{tag}"),
            secret: format!("secret-of{}{tag}", ns.replace('/', "-")),
            challenge: ("ch-durable".into(), "val-durable".into()),
        },
        store,
        calls: Mutex::new(Vec::new()),
    });
    let app = Router::new()
        .route("/_pinned/challenge", get(challenge))
        .route("/{ns}/{id}/_alarm", post(alarm))
        .route("/{ns}/{id}/_wake", post(wake))
        .with_state(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let session = f.identity.register(pb, &[ns], addr, hostname).await;
    (f, session)
}
