//! Alarms in local mode: firing on time, surviving eviction and restarts,
//! at-least-once retries, and the API's refusals. Timing tests run on
//! tokio's paused clock (the worker's `Domain::with_tokio_clock`); the restart test,
//! whose SQLite store works on blocking threads, runs on real time.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Query;
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use pinned::pinned_store::{MemoryStore, SqliteOptions, SqliteStore, StateStore};
use pinned::{AlarmError, BoxError, Call, Context, HostOptions, Object, Options};
use serde::Deserialize;
use serde_json::json;
use support::{json, start};
use test_support::metrics;

/// Alarm firings as `"<id>"`, in order.
static FIRED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Failures left per id before a handler succeeds.
static FAILURES: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

fn fired(id: &str) -> usize {
    FIRED.lock().iter().filter(|f| *f == id).count()
}

#[derive(Deserialize)]
struct In {
    ms: Option<u64>,
    fail: Option<u64>,
}

struct Reminder {
    activations: AtomicU64,
}

impl Object for Reminder {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Reminder {
            activations: AtomicU64::new(1),
        })
    }

    async fn alarm(&self, ctx: &Context) -> Result<(), BoxError> {
        let id = ctx.id().to_owned();
        FIRED.lock().push(id.clone());
        let mut failures = FAILURES.lock();
        if let Some(left) = failures.iter_mut().find(|(f, _)| *f == id) {
            if left.1 > 0 {
                left.1 -= 1;
                return Err("not yet".into());
            }
        }
        Ok(())
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/in",
                post(|call: Call, Query(q): Query<In>| async move {
                    if let Some(fail) = q.fail {
                        FAILURES.lock().push((call.ctx().id().to_owned(), fail));
                    }
                    let ms = q.ms.unwrap_or(100);
                    call.ctx()
                        .alarm()
                        .set_in(Duration::from_millis(ms))
                        .await
                        .map_err(fail)?;
                    Ok::<_, (http::StatusCode, String)>("set")
                }),
            )
            .route(
                "/get",
                get(|call: Call| async move {
                    let at = call.ctx().alarm().get().await.map_err(fail)?;
                    Ok::<_, (http::StatusCode, String)>(Json(json!({ "set": at.is_some() })))
                }),
            )
            .route(
                "/clear",
                post(|call: Call| async move {
                    call.ctx().alarm().set(None).await.map_err(fail)?;
                    Ok::<_, (http::StatusCode, String)>("cleared")
                }),
            )
            .route(
                "/reserved",
                post(|call: Call| async move {
                    let store = call.ctx().store().expect("store");
                    let refused = store
                        .set_tray("pinned", "alarm", false, serde_json::Map::new())
                        .await
                        .is_err();
                    let allowed = store
                        .set_tray("mine", "~", false, serde_json::Map::new())
                        .await
                        .is_ok();
                    Json(json!({ "refused": refused, "allowed": allowed }))
                }),
            )
            .route(
                "/activations",
                get(|this: pinned::This<Reminder>| async move {
                    Json(json!({ "n": this.activations.load(Ordering::SeqCst) }))
                }),
            )
    }
}

fn fail(error: AlarmError) -> (http::StatusCode, String) {
    (http::StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
}

fn quick() -> HostOptions {
    HostOptions::default()
        .idle_timeout(Duration::from_millis(100))
        .sweep_interval(Duration::from_millis(100))
}

async fn wait_fired(id: &str, times: usize) {
    support::until(
        &format!("{id} to fire {times} times"),
        support::PATIENCE,
        || fired(id) >= times,
    )
    .await;
}

fn memory() -> Arc<dyn StateStore> {
    Arc::new(MemoryStore::new())
}

/// The worker on tokio's clock, for tests on paused time: alarm due times
/// advance with `tokio::time`, so a paused test sleeps through minutes of
/// alarms at once and deterministically.
fn paused(options: Options) -> Options {
    options.domain(pinned::Domain::simulated(7))
}

#[tokio::test(start_paused = true)]
async fn an_alarm_fires_once_and_its_row_is_cleared() {
    let w = start(paused(
        Options::new().host::<Reminder>("/r").store(memory()),
    ))
    .await;
    assert_eq!(w.post("/r/once/in?ms=150").await.status(), 200);
    let (_, body) = json(w.get("/r/once/get").await).await;
    assert_eq!(body["set"], true);
    wait_fired("once", 1).await;
    // Paused time: every timer due in the next minute runs first.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(fired("once"), 1);
    let (_, body) = json(w.get("/r/once/get").await).await;
    assert_eq!(body["set"], false);
}

#[tokio::test(start_paused = true)]
async fn an_alarm_fires_after_its_instance_was_evicted() {
    let w = start(paused(
        Options::new()
            .host_with::<Reminder>("/r", quick())
            .store(memory()),
    ))
    .await;
    assert_eq!(w.post("/r/evicted/in?ms=600").await.status(), 200);
    w.wait_for("eviction", |s| {
        s["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    wait_fired("evicted", 1).await;
    // Firing activated the id afresh.
    let stats = w.stats().await;
    assert_eq!(stats["namespaces"]["/r"]["activations"], 2, "{stats}");
}

#[tokio::test(start_paused = true)]
async fn a_failing_handler_fires_again_until_it_succeeds_then_never() {
    let w = start(paused(
        Options::new()
            .host_with::<Reminder>("/r", quick())
            .store(memory()),
    ))
    .await;
    let before = metrics::parse(&w.worker.metrics());
    assert_eq!(w.post("/r/flaky/in?ms=50&fail=2").await.status(), 200);
    wait_fired("flaky", 3).await;
    // A hundred retry periods later, still three.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(fired("flaky"), 3);
    let after = metrics::parse(&w.worker.metrics());
    let failed = metrics::moved(&before, &after, r#"pinned_callback_failures{hook="alarm"}"#);
    assert_eq!(failed, 2.0);
}

#[tokio::test(start_paused = true)]
async fn a_cleared_alarm_never_fires() {
    let w = start(paused(
        Options::new().host::<Reminder>("/r").store(memory()),
    ))
    .await;
    assert_eq!(w.post("/r/cleared/in?ms=200").await.status(), 200);
    assert_eq!(w.post("/r/cleared/clear").await.status(), 200);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(fired("cleared"), 0);
}

#[tokio::test]
async fn alarms_refuse_without_a_store_and_the_reserved_namespace() {
    let w = start(Options::new().host::<Reminder>("/r")).await;
    let response = w.post("/r/nostore/in").await;
    assert_eq!(response.status(), 500);
    assert!(response.text().await.expect("text").contains("state store"));
    let w = start(Options::new().host::<Reminder>("/r").store(memory())).await;
    let (_, body) = json(w.post("/r/res/reserved").await).await;
    assert_eq!(body, json!({"refused": true, "allowed": true}));
}

#[tokio::test]
async fn a_stored_alarm_fires_after_a_restart() {
    let dir = std::env::temp_dir().join(format!("pinned-alarm-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("restart.db");
    let _ = std::fs::remove_file(&path);
    {
        let store: Arc<dyn StateStore> = Arc::new(
            SqliteStore::open(&path, SqliteOptions::default())
                .await
                .expect("sqlite"),
        );
        let w = start(Options::new().host::<Reminder>("/r").store(store)).await;
        assert_eq!(w.post("/r/restart/in?ms=700").await.status(), 200);
        // The worker goes away before the alarm is due.
        w.worker.close().await;
    }
    assert_eq!(fired("restart"), 0);
    let store: Arc<dyn StateStore> = Arc::new(
        SqliteStore::open(&path, SqliteOptions::default())
            .await
            .expect("sqlite"),
    );
    let _w = start(Options::new().host::<Reminder>("/r").store(store)).await;
    wait_fired("restart", 1).await;
    let _ = std::fs::remove_dir_all(&dir);
}
