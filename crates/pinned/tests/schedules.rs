//! Named schedules: many durable timers per instance beside its alarm,
//! fired in time order through the alarm row (whose `at` is the earliest),
//! each at least once, cancelled, listed, bounded. On tokio's paused clock.
#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use pinned::pinned_store::{MemoryStore, TrayKey};
use pinned::{AlarmError, BoxError, Context, Object, Options, MAX_SCHEDULES};
use serde::Deserialize;
use serde_json::json;
use support::{json, start, until, PATIENCE};

/// What fired, as `"<id>:<name>"` (`alarm` for the alarm), in order.
static FIRED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Schedules that fail this many more times before succeeding.
static FLAKY: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());

fn fired(id: &str) -> Vec<String> {
    FIRED
        .lock()
        .iter()
        .filter_map(|f| f.strip_prefix(&format!("{id}:")).map(str::to_owned))
        .collect()
}

#[derive(Deserialize)]
struct After {
    ms: u64,
}

struct Planner;

fn failed(error: AlarmError) -> (http::StatusCode, String) {
    let status = match error {
        AlarmError::InvalidName | AlarmError::TooManySchedules => http::StatusCode::BAD_REQUEST,
        _ => http::StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, error.to_string())
}

impl Object for Planner {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Planner)
    }

    async fn alarm(&self, ctx: &Context) -> Result<(), BoxError> {
        FIRED.lock().push(format!("{}:alarm", ctx.id()));
        Ok(())
    }

    async fn scheduled(&self, ctx: &Context, name: &str) -> Result<(), BoxError> {
        let entry = format!("{}:{name}", ctx.id());
        FIRED.lock().push(entry.clone());
        let mut flaky = FLAKY.lock();
        if let Some((_, left)) = flaky.iter_mut().find(|(e, left)| *e == entry && *left > 0) {
            *left -= 1;
            return Err("not yet".into());
        }
        Ok(())
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/schedule/{name}",
                post(
                    |ctx: Context, Path(name): Path<String>, Query(q): Query<After>| async move {
                        ctx.schedule(&name)
                            .after(Duration::from_millis(q.ms))
                            .await
                            .map_err(failed)?;
                        Ok::<_, (http::StatusCode, String)>("set")
                    },
                ),
            )
            .route(
                "/cancel/{name}",
                delete(|ctx: Context, Path(name): Path<String>| async move {
                    let removed = ctx.schedule(&name).cancel().await.map_err(failed)?;
                    Ok::<_, (http::StatusCode, String)>(Json(json!({ "removed": removed })))
                }),
            )
            .route(
                "/schedules",
                get(|ctx: Context| async move {
                    let names: Vec<String> = ctx
                        .schedules()
                        .await
                        .map_err(failed)?
                        .into_iter()
                        .map(|(name, _)| name)
                        .collect();
                    Ok::<_, (http::StatusCode, String)>(Json(json!({ "names": names })))
                }),
            )
            .route(
                "/alarm",
                post(|ctx: Context, Query(q): Query<After>| async move {
                    ctx.alarm()
                        .set_in(Duration::from_millis(q.ms))
                        .await
                        .map_err(failed)?;
                    Ok::<_, (http::StatusCode, String)>("set")
                }),
            )
            .route(
                "/alarm",
                get(|ctx: Context| async move {
                    let set = ctx.alarm().get().await.map_err(failed)?.is_some();
                    Ok::<_, (http::StatusCode, String)>(Json(json!({ "set": set })))
                }),
            )
    }
}

async fn planner() -> (support::TestWorker, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let w = start(
        Options::new()
            .host::<Planner>("/p")
            .store(store.clone())
            .domain(pinned::Domain::system().with_tokio_clock()),
    )
    .await;
    (w, store)
}

async fn alarm_doc(store: &MemoryStore, id: &str) -> Option<serde_json::Value> {
    support::stored_tray(store, "/p", id, TrayKey::new("pinned", "alarm"))
        .await
        .map(|(_, doc)| doc)
}

#[tokio::test(start_paused = true)]
async fn schedules_and_the_alarm_fire_in_time_order_each_once_then_the_row_goes() {
    let (w, store) = planner().await;
    for (name, ms) in [("c", 300), ("a", 100), ("b", 200)] {
        assert_eq!(
            w.post(&format!("/p/order/schedule/{name}?ms={ms}"))
                .await
                .status(),
            200
        );
    }
    assert_eq!(w.post("/p/order/alarm?ms=150").await.status(), 200);
    let doc = alarm_doc(&store, "order").await.unwrap();
    assert_eq!(doc["schedules"].as_object().map(|s| s.len()), Some(3));
    assert_eq!(
        doc["at"], doc["schedules"]["a"],
        "at is the earliest: {doc}"
    );
    let (_, body) = json(w.get("/p/order/schedules").await).await;
    assert_eq!(body, json!({ "names": ["a", "b", "c"] }), "earliest first");

    until("all four fired", PATIENCE, || fired("order").len() >= 4).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(fired("order"), vec!["a", "alarm", "b", "c"]);
    assert_eq!(
        alarm_doc(&store, "order").await,
        None,
        "nothing left: the row is deleted"
    );
    let (_, body) = json(w.get("/p/order/schedules").await).await;
    assert_eq!(body, json!({ "names": [] }));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_schedule_never_fires_and_the_alarm_row_keeps_the_reference_shape() {
    let (w, store) = planner().await;
    assert_eq!(w.post("/p/cancel/alarm?ms=500").await.status(), 200);
    let doc = alarm_doc(&store, "cancel").await.unwrap();
    let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
    assert_eq!(keys, vec!["at", "nonce"], "without schedules: {doc}");
    assert_eq!(w.post("/p/cancel/schedule/gone?ms=100").await.status(), 200);
    assert_eq!(w.post("/p/cancel/schedule/kept?ms=200").await.status(), 200);
    let (_, body) = json(
        w.client
            .delete(w.url("/p/cancel/cancel/gone"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(body, json!({ "removed": true }));
    let (_, body) = json(
        w.client
            .delete(w.url("/p/cancel/cancel/gone"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(body, json!({ "removed": false }));
    until("kept and the alarm fired", PATIENCE, || {
        fired("cancel").len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(fired("cancel"), vec!["kept", "alarm"]);
    let (_, body) = json(w.get("/p/cancel/alarm").await).await;
    assert_eq!(body, json!({ "set": false }));
}

#[tokio::test(start_paused = true)]
async fn a_failing_schedule_fires_again_while_the_others_are_cleared() {
    let (w, _store) = planner().await;
    FLAKY.lock().push(("flaky:bad".to_owned(), 2));
    assert_eq!(w.post("/p/flaky/schedule/bad?ms=100").await.status(), 200);
    assert_eq!(w.post("/p/flaky/schedule/good?ms=100").await.status(), 200);
    until("bad fired three times", PATIENCE, || {
        fired("flaky").iter().filter(|f| *f == "bad").count() >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let runs = fired("flaky");
    assert_eq!(runs.iter().filter(|f| *f == "bad").count(), 3, "{runs:?}");
    assert_eq!(runs.iter().filter(|f| *f == "good").count(), 1, "{runs:?}");
}

#[tokio::test(start_paused = true)]
async fn names_and_counts_are_bounded() {
    let (w, _store) = planner().await;
    let (status, body) = json(w.post("/p/bound/schedule/%20?ms=100").await).await;
    assert_eq!(status, 200, "a one-byte name is fine: {body}");
    let long = "x".repeat(257);
    let response = w.post(&format!("/p/bound/schedule/{long}?ms=100")).await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        response.text().await.unwrap(),
        "a schedule name must be 1 to 256 bytes"
    );
    for n in 1..MAX_SCHEDULES {
        assert_eq!(
            w.post(&format!("/p/bound/schedule/s{n}?ms=100000"))
                .await
                .status(),
            200
        );
    }
    let response = w.post("/p/bound/schedule/one-more?ms=100000").await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        response.text().await.unwrap(),
        format!("an instance holds at most {MAX_SCHEDULES} schedules")
    );
    // Setting an existing name again is not one more.
    assert_eq!(w.post("/p/bound/schedule/s1?ms=100000").await.status(), 200);
}
