//! The worker the deployment recipes in `deploy/` run: the counter
//! (`/counter`) and the jobs runner (`/runners`) of the other examples on
//! one store, with the two endpoints an orchestrator probes. Your own
//! worker binary takes its place; these two routes are what it needs to add.
//!
//! - `GET /healthz`, liveness: 200 `{"ok":true}` while the process serves
//!   HTTP. It looks at nothing else: an outage of pinboard or the database
//!   must not get every worker restarted.
//! - `GET /readyz`, readiness: 200 once the worker is registered with
//!   pinboard and its lease is unexpired (at once in local mode); 503 before
//!   that, while it drains (SIGTERM, or an operator's `pinboard drain`),
//!   once its lease lapsed, and when a newer deployment superseded it. A
//!   rolling update that waits for it starts no second worker's drain
//!   before the new one took placements. Its JSON adds `drained`: draining
//!   and every instance closed, so stopping the process loses nothing.
//!
//! ```text
//! PINBOARD_URL=http://127.0.0.1:7070 PINBOARD_TOKEN=change-me \
//! ADVERTISE_URL=http://127.0.0.1:8080 PORT=8080 cargo run --release --example worker
//! curl localhost:8080/readyz
//! ```
//!
//! Environment: what `Options::from_env` reads (`HOST`, default
//! `127.0.0.1`; `PORT`, default 0, any free port; `PINBOARD_URL`,
//! `PINBOARD_TOKEN`, `ADVERTISE_URL`, `PINNED_*`), and the store as in the
//! jobs example: `DATABASE_URL` (Postgres), else the SQLite file
//! `PINNED_DB_PATH` (default `pinned.db`). An `ADVERTISE_URL` with port 0
//! advertises the port bound. SIGTERM drains with
//! [`pinned::SHUTDOWN_DRAIN_DEADLINE`] (30 s), closes and exits.

#[allow(dead_code)]
#[path = "counter.rs"]
mod counter;
#[allow(dead_code)]
#[path = "jobs.rs"]
mod jobs;

use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use pinned::pinned_store::StoreConfig;
use pinned::{Options, Worker};
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// Liveness: the process serves HTTP.
const HEALTHZ: &str = "/healthz";
/// Readiness: registered, leased, not draining, not superseded.
const READYZ: &str = "/readyz";

/// The probe routes, served beside the worker's.
fn probes(worker: Worker) -> Router {
    Router::new()
        .route(HEALTHZ, get(|| async { Json(json!({ "ok": true })) }))
        .route(READYZ, get(move || std::future::ready(readiness(&worker))))
}

fn readiness(worker: &Worker) -> (StatusCode, Json<Value>) {
    let (leased, draining, superseded) = (worker.ready(), worker.draining(), worker.superseded());
    let ready = leased && !draining && !superseded;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "ok": ready,
        "registered": leased,
        "draining": draining,
        "superseded": superseded,
        // Draining and every instance closed: safe to stop.
        "drained": worker.drained(),
    });
    (status, Json(body))
}

/// `url` with its port 0 replaced by `port` (`http://10.0.0.7:0` →
/// `http://10.0.0.7:8080`); any other URL as it is.
fn with_bound_port(url: &str, port: u16) -> String {
    match url.trim_end_matches('/').strip_suffix(":0") {
        Some(base) => format!("{base}:{port}"),
        None => url.to_owned(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    pinned::logging::init();
    let host = std::env::var("HOST").unwrap_or_else(|_| "127.0.0.1".into());
    let port: u16 = std::env::var("PORT").map_or(Ok(0), |port| port.parse())?;
    // Bound first, so the worker is built (for the readiness route's
    // handle) already knowing the port it advertises.
    let listener = TcpListener::bind((host.as_str(), port)).await?;
    let bound = listener.local_addr()?;
    let vars = std::env::vars().map(|(key, value)| match key.as_str() {
        "ADVERTISE_URL" => (key, with_bound_port(&value, bound.port())),
        _ => (key, value),
    });
    let location = std::env::var("DATABASE_URL").ok();
    let file = std::env::var("PINNED_DB_PATH").unwrap_or_else(|_| "pinned.db".into());
    let store = StoreConfig::from_location(location.as_deref(), file)?
        .open()
        .await?;
    let worker = Options::new()
        .env_vars(vars)
        .host::<counter::Counter>("/counter")
        .host::<jobs::Runner>("/runners")
        .store(store)
        .build()?;
    let scheme = if std::env::var_os("PINNED_TLS_CERT").is_some() {
        "https"
    } else {
        "http"
    };
    println!("pinned worker listening on {scheme}://{bound}");
    pinned::serve(worker.clone())
        .listener(listener)
        .routes(probes(worker))
        .await?;
    Ok(())
}
