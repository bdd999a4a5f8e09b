//! The counter object every Rust worker of the fleet tests and the
//! benchmarks hosts: the Python test app's routes and JSON fields
//! (`id`, `count`, `instance`, `process`), so Rust and Python workers answer
//! alike and are interchangeable behind one pinboard.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path, Query};
use axum::routing::get;
use axum::{Json, Router};
use pinned::{BoxError, Call, Caller, Context, Object, This};
use serde_json::{json, Value};

/// A random token for this process, in every answer as `process`.
pub fn process_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| format!("{:016x}", rand::random::<u64>()))
}

/// The counter: `GET /hit`, `/peek`, `/whoami`, `/call/{target}`,
/// `/slow?ms=`, and with a state store `POST /alarm?ms=`, `GET /fired`,
/// `POST /write?later_ms=`, `GET /state`, `POST /bump`.
pub struct Counter {
    id: String,
    count: AtomicU64,
    instance: String,
    /// Bumps answered by this instance (the fault suite's in-memory counter).
    bumps: AtomicU64,
    /// One bump at a time per instance: a bump is a read then a write of
    /// the durable tally, and two interleaved would both write `n + 1`.
    bump_turn: tokio::sync::Mutex<()>,
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

/// Outcomes of `write` calls in this process, as `"<id> <outcome>"`.
static WRITES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

static LEASE_EVENTS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Lease hooks heard in this process so far, as `<hook> <id>` (the
/// wind-down hook adds the time left, see [`Counter`]'s `on_wind_down`).
pub fn lease_events() -> Vec<String> {
    LEASE_EVENTS.lock().map(|e| e.clone()).unwrap_or_default()
}

fn log_lease_event(hook: &str, id: &str) {
    if let Ok(mut events) = LEASE_EVENTS.lock() {
        events.push(format!("{hook} {id}"));
    }
}

/// Outcomes of `write` calls in this process so far.
pub fn writes() -> Vec<String> {
    WRITES.lock().map(|w| w.clone()).unwrap_or_default()
}

fn log_write(id: &str, outcome: &str) {
    if let Ok(mut writes) = WRITES.lock() {
        writes.push(format!("{id} {outcome}"));
    }
}

fn error(e: impl std::fmt::Display) -> (axum::http::StatusCode, String) {
    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// `POST /alarm?ms=N`: the alarm fires N ms from now.
async fn set_alarm(
    call: Call,
    Query(q): Query<std::collections::HashMap<String, u64>>,
) -> Result<&'static str, (axum::http::StatusCode, String)> {
    let ms = q.get("ms").copied().unwrap_or(1000);
    call.ctx()
        .alarm()
        .set_in(Duration::from_millis(ms))
        .await
        .map_err(error)?;
    Ok("set")
}

/// `GET /fired`: the `("fired", "~")` row the alarm handler keeps.
async fn fired(call: Call) -> Result<Json<Value>, (axum::http::StatusCode, String)> {
    let store = call.ctx().store().ok_or_else(|| error("no store"))?;
    let row = store.get_tray("fired", "~").await.map_err(error)?;
    Ok(Json(row.map_or(json!({ "count": 0 }), |tray| {
        Value::Object(tray.doc)
    })))
}

/// `POST /write?later_ms=N`: writes `("state", "~")` now, or N ms later
/// from tracked work (which survives until the instance's teardown).
async fn write(
    call: Call,
    Query(q): Query<std::collections::HashMap<String, u64>>,
) -> Result<&'static str, (axum::http::StatusCode, String)> {
    let store = call.ctx().store().ok_or_else(|| error("no store"))?;
    let id = call.ctx().id().to_owned();
    let write = async move {
        let mut doc = serde_json::Map::new();
        doc.insert("by".into(), process_token().into());
        let outcome = match store.set_tray("state", "~", false, doc).await {
            Ok(()) => "written".to_owned(),
            Err(e) => e.to_string(),
        };
        log_write(&id, &outcome);
        outcome
    };
    match q.get("later_ms").copied() {
        None => {
            let outcome = write.await;
            if outcome == "written" {
                Ok("written")
            } else {
                Err(error(outcome))
            }
        }
        Some(ms) => {
            call.ctx().wait_until(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                write.await;
                Ok(())
            });
            Ok("scheduled")
        }
    }
}

/// `POST /bump`: adds one to the durable tally (the `("tally", "~")` row,
/// written through the fenced state store) and answers the new value with
/// the epoch it was written at, this instance's own count of bumps, and
/// who answered. A write the fence refused answers 500 with the store's
/// error, so the fault suite's checker never counts it as acknowledged.
async fn bump(
    this: This<Counter>,
    call: Call,
) -> Result<Json<Value>, (axum::http::StatusCode, String)> {
    let store = call.ctx().store().ok_or_else(|| error("no store"))?;
    let _turn = this.bump_turn.lock().await;
    let value = store
        .get_tray("tally", "~")
        .await
        .map_err(error)?
        .and_then(|tray| tray.doc.get("value").and_then(Value::as_u64))
        .unwrap_or(0)
        + 1;
    let mut doc = serde_json::Map::new();
    doc.insert("value".into(), value.into());
    // The epoch the write below carries (bumps of one id run one at a time).
    let epoch = store.epoch();
    store
        .set_tray("tally", "~", false, doc)
        .await
        .map_err(error)?;
    let bumps = this.bumps.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(Json(json!({
        "id": this.id,
        "value": value,
        "epoch": epoch,
        "bumps": bumps,
        "instance": this.instance,
        "process": process_token(),
    })))
}

/// `GET /state`: the `("state", "~")` row.
async fn state(call: Call) -> Result<Json<Value>, (axum::http::StatusCode, String)> {
    let store = call.ctx().store().ok_or_else(|| error("no store"))?;
    let row = store.get_tray("state", "~").await.map_err(error)?;
    Ok(Json(
        row.map_or(Value::Null, |tray| Value::Object(tray.doc)),
    ))
}

impl Object for Counter {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        Ok(Counter {
            id: ctx.id().to_owned(),
            count: AtomicU64::new(0),
            instance: format!("{:016x}", rand::random::<u64>()),
            bumps: AtomicU64::new(0),
            bump_turn: tokio::sync::Mutex::new(()),
        })
    }

    async fn on_unhealthy(&self, ctx: &Context) -> Result<(), BoxError> {
        log_lease_event("on_unhealthy", ctx.id());
        Ok(())
    }

    async fn on_restored(&self, ctx: &Context) -> Result<(), BoxError> {
        log_lease_event("on_restored", ctx.id());
        Ok(())
    }

    /// Heard as `on_wind_down <id> <ms>`: the milliseconds left to the
    /// deadline when it was applied (`none` without one).
    async fn on_wind_down(
        &self,
        ctx: &Context,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), BoxError> {
        let left = deadline.map_or_else(
            || "none".to_owned(),
            |at| {
                at.saturating_duration_since(tokio::time::Instant::now())
                    .as_millis()
                    .to_string()
            },
        );
        log_lease_event("on_wind_down", &format!("{} {left}", ctx.id()));
        Ok(())
    }

    /// Counts firings in the `("fired", "~")` row, with the process that ran it.
    async fn alarm(&self, ctx: &Context) -> Result<(), BoxError> {
        let Some(store) = ctx.store() else {
            return Ok(());
        };
        let count = store
            .get_tray("fired", "~")
            .await?
            .and_then(|tray| tray.doc.get("count").and_then(Value::as_u64))
            .unwrap_or(0);
        let mut doc = serde_json::Map::new();
        doc.insert("count".into(), (count + 1).into());
        doc.insert("process".into(), process_token().into());
        store.set_tray("fired", "~", false, doc).await?;
        Ok(())
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/hit", get(hit))
            .route(
                "/peek",
                get(|this: This<Counter>| async move { Json(this.state()) }),
            )
            .route("/whoami", get(whoami))
            .route("/call/{target}", get(call_peer))
            .route("/slow", get(slow))
            .route("/alarm", axum::routing::post(set_alarm))
            .route("/fired", get(fired))
            .route("/write", axum::routing::post(write))
            .route("/state", get(state))
            .route("/bump", axum::routing::post(bump))
    }
}
