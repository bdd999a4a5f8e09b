//! A scripted Rust worker for tests that need to know a worker's secret or
//! make it refuse on purpose; the test registers it itself (no heartbeats, so
//! use a long lease).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::{bearer, client};

/// How a fake worker answers instance requests.
#[derive(Clone, Copy)]
pub enum Mode {
    /// 200 `{"worker": name}`.
    Serve,
    /// 503 `host draining; retry` (never activates anything).
    Draining,
    /// 503 with `Pinned-Refusal: lease-unhealthy`.
    Unhealthy,
    /// 403 `invalid attestation`.
    Forbidden,
    /// 503 `instance capacity reached; retry` (every instance busy).
    Full,
}

pub struct Fake {
    pub name: &'static str,
    pub secret: String,
    pub challenge: Mutex<(String, String)>,
    pub mode: Mode,
    pub hits: AtomicU32,
    pub seen: Mutex<Vec<HeaderMap>>,
}

async fn challenge(
    State(f): State<Arc<Fake>>,
    headers: HeaderMap,
    Query(q): Query<Value>,
) -> Response {
    let (c, v) = f.challenge.lock().clone();
    let secret_ok = headers
        .get("pinboard-proxy-secret")
        .and_then(|h| h.to_str().ok())
        == Some(f.secret.as_str());
    if !secret_ok {
        return (
            StatusCode::FORBIDDEN,
            axum::Json(json!({"detail": "invalid proxy secret"})),
        )
            .into_response();
    }
    if q["challenge"].as_str() != Some(c.as_str()) {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"detail": "unknown challenge"})),
        )
            .into_response();
    }
    axum::Json(json!({ "value": v })).into_response()
}

async fn instance(State(f): State<Arc<Fake>>, headers: HeaderMap) -> Response {
    f.hits.fetch_add(1, Ordering::SeqCst);
    f.seen.lock().push(headers);
    let refusal = |detail: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "1")],
            axum::Json(json!({ "detail": detail })),
        )
            .into_response()
    };
    match f.mode {
        Mode::Serve => axum::Json(json!({ "worker": f.name })).into_response(),
        Mode::Draining => refusal("host draining; retry"),
        Mode::Full => refusal("instance capacity reached; retry"),
        Mode::Unhealthy => {
            let mut r = refusal("lease unhealthy; refusing new activations");
            r.headers_mut()
                .insert("pinned-refusal", "lease-unhealthy".parse().expect("hv"));
            r
        }
        Mode::Forbidden => (
            StatusCode::FORBIDDEN,
            axum::Json(json!({"detail": "invalid attestation"})),
        )
            .into_response(),
    }
}

/// Start a fake worker and register it; returns it with its session id.
pub async fn fake(pb: &str, name: &'static str, mode: Mode) -> (Arc<Fake>, String) {
    let f = Arc::new(Fake {
        name,
        secret: format!("secret-of-{name}"),
        challenge: Mutex::new((format!("ch-{name}"), format!("val-{name}"))),
        mode,
        hits: AtomicU32::new(0),
        seen: Mutex::new(Vec::new()),
    });
    let app = Router::new()
        .route("/_pinned/challenge", get(challenge))
        .route("/counter/{id}/hit", get(instance))
        .with_state(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let (c, v) = f.challenge.lock().clone();
    let res = client()
        .post(format!("{pb}/registry/register"))
        .header("authorization", bearer())
        .json(&json!({
            "clientId": name, "secret": f.secret, "namespaces": ["/counter"],
            "advertiseUrl": format!("http://{addr}"), "headroom": 100, "draining": false,
            "challenge": c, "challengeValue": v,
        }))
        .send()
        .await
        .expect("register");
    assert_eq!(res.status(), 200);
    let ack: Value = res.json().await.expect("ack");
    (f, ack["sessionId"].as_str().expect("session").to_owned())
}

/// One heartbeat for a fake worker registered as `name` (it answers the
/// same challenge pair every time); returns the status.
pub async fn beat(pb: &str, name: &str, session: &str) -> u16 {
    client()
        .post(format!("{pb}/registry/heartbeat"))
        .header("authorization", bearer())
        .json(&json!({
            "sessionId": session, "headroom": 100, "draining": false,
            "challenge": format!("ch-{name}"), "challengeValue": format!("val-{name}"),
        }))
        .send()
        .await
        .expect("heartbeat")
        .status()
        .as_u16()
}
