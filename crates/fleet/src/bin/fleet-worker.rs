//! A Rust worker for fleet tests, in control-plane mode: `/counter` with
//! the same routes as the Python test app (`hit`, `peek`, `whoami`,
//! `call/{target}`, `slow`, `stream`), so Rust and Python workers are
//! interchangeable behind one pinboard.
//!
//! Environment: `PINBOARD_URL`, `PINBOARD_TOKEN` (required);
//! `PINNED_HOSTNAME`, `FLEET_EPOCH`, `FLEET_TAKEOVER` (`wind_down`|`deny`),
//! `FLEET_HEARTBEAT_MS`, `FLEET_LEASE_BUFFER_MS`, `FLEET_DRAIN_MS` (the
//! SIGTERM drain deadline). Prints `secret <hex>` and then
//! `pinned worker listening on http://<addr>`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path, Query};
use axum::routing::get;
use axum::{Json, Router};
use pinned::{BoxError, Call, Caller, Context, Object, Options, Takeover, This};
use serde_json::{json, Value};

fn process_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| format!("{:016x}", rand::random::<u64>()))
}

struct Counter {
    id: String,
    count: AtomicU64,
    instance: String,
}

impl Counter {
    fn state(&self) -> Value {
        json!({
            "id": self.id,
            "count": self.count.load(Ordering::SeqCst),
            "instance": self.instance,
            "process": process_token(),
        })
    }
}

async fn hit(this: This<Counter>) -> Json<Value> {
    this.count.fetch_add(1, Ordering::SeqCst);
    Json(this.state())
}

async fn whoami(call: Call) -> Json<Value> {
    let caller = match call.attestation() {
        Some(Caller::Instance { ns, id, depth }) => json!({"ns": ns, "id": id, "depth": depth}),
        _ => Value::Null,
    };
    Json(json!({ "caller": caller, "process": process_token(), "id": call.ctx().id() }))
}

async fn call_peer(call: Call, Path(target): Path<String>) -> Result<Json<Value>, String> {
    let response = call
        .cluster()
        .get(&format!("/counter/{target}/whoami"))
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .map_err(|e| e.to_string())?;
    let target: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Json(json!({ "status": status, "target": target })))
}

async fn slow(
    this: This<Counter>,
    Query(q): Query<std::collections::HashMap<String, u64>>,
) -> Json<Value> {
    tokio::time::sleep(Duration::from_millis(q.get("ms").copied().unwrap_or(1000))).await;
    Json(this.state())
}

impl Object for Counter {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        Ok(Counter {
            id: ctx.id().to_owned(),
            count: AtomicU64::new(0),
            instance: format!("{:016x}", rand::random::<u64>()),
        })
    }

    fn routes() -> Router {
        Router::new()
            .route("/hit", get(hit))
            .route(
                "/peek",
                get(|this: This<Counter>| async move { Json(this.state()) }),
            )
            .route("/whoami", get(whoami))
            .route("/call/{target}", get(call_peer))
            .route("/slow", get(slow))
    }
}

fn ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let mut options = Options::from_env().host::<Counter>("/counter").pinboard(
        std::env::var("PINBOARD_URL")?,
        std::env::var("PINBOARD_TOKEN")?,
        format!("http://{addr}"),
    );
    if let Ok(epoch) = std::env::var("FLEET_EPOCH") {
        options = options.deployment_epoch(epoch.parse()?);
    }
    match std::env::var("FLEET_TAKEOVER").as_deref() {
        Ok("deny") => options = options.takeover(Takeover::Deny),
        Ok("wind_down") => options = options.takeover(Takeover::WindDown),
        _ => {}
    }
    if let Some(interval) = ms("FLEET_HEARTBEAT_MS") {
        options = options.heartbeat_interval(interval);
    }
    if let Some(buffer) = ms("FLEET_LEASE_BUFFER_MS") {
        options = options.lease_buffer(buffer);
    }
    let drain = ms("FLEET_DRAIN_MS").unwrap_or(pinned::SHUTDOWN_DRAIN_DEADLINE);
    let worker = options.build()?;
    println!("secret {}", worker.secret());
    println!("pinned worker listening on http://{addr}");
    pinned::serve_worker_with(listener, worker, pinned::shutdown_signal(), drain).await?;
    Ok(())
}
