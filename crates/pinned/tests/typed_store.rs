//! Typed rows through `ctx.store()`: a serde struct saved by one activation
//! is read back by the next, refusals are precise, the reserved namespace
//! stays closed to typed writes too, and `delete_all` empties the id.

mod support;

use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::pinned_store::{SqliteOptions, SqliteStore};
use pinned::{BoxError, Call, Context, HostOptions, InstanceStoreError, Object, Options};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use support::{json, start};

#[derive(Serialize, Deserialize, Default)]
struct Profile {
    name: String,
    visits: u64,
}

/// Restores its profile on activation and saves it at every visit.
struct Visitor;

fn error(e: InstanceStoreError) -> (http::StatusCode, String) {
    (http::StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
}

impl Object for Visitor {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Visitor)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/visit",
                post(|call: Call| async move {
                    let store = call.ctx().store().expect("a store");
                    let mut profile: Profile = store
                        .get("profile", "~")
                        .await
                        .map_err(error)?
                        .unwrap_or_default();
                    profile.name = call.ctx().id().to_owned();
                    profile.visits += 1;
                    store.put("profile", "~", &profile).await.map_err(error)?;
                    Ok::<_, (http::StatusCode, String)>(Json(json!({ "visits": profile.visits })))
                }),
            )
            .route(
                "/list",
                post(|call: Call| async move {
                    let store = call.ctx().store().expect("a store");
                    store.put("profile", "~", &[1, 2, 3]).await.map_err(error)
                }),
            )
            .route(
                "/reserved",
                post(|call: Call| async move {
                    let store = call.ctx().store().expect("a store");
                    store
                        .put("pinned", "alarm", &json!({"at": 1}))
                        .await
                        .map_err(error)
                }),
            )
            .route(
                "/forget",
                post(|call: Call| async move {
                    let store = call.ctx().store().expect("a store");
                    call.ctx()
                        .alarm()
                        .set_in(Duration::from_secs(3600))
                        .await
                        .map_err(|e| (http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
                    store.delete_all().await.map_err(error)?;
                    let rows = store.list(None, None).await.map_err(error)?.len();
                    let alarm = call.ctx().alarm().get().await.ok().flatten().is_some();
                    Ok::<_, (http::StatusCode, String)>(Json(
                        json!({ "rows": rows, "alarm": alarm }),
                    ))
                }),
            )
            .route(
                "/wrong-shape",
                get(|call: Call| async move {
                    let store = call.ctx().store().expect("a store");
                    store
                        .put("count", "~", &json!({"n": "not a number"}))
                        .await
                        .map_err(error)?;
                    #[derive(Deserialize)]
                    struct Count {
                        #[allow(dead_code)]
                        n: u64,
                    }
                    store
                        .get::<Count>("count", "~")
                        .await
                        .map_err(error)
                        .map(|_| "decoded")
                }),
            )
    }
}

#[tokio::test]
async fn typed_rows_survive_eviction_and_refuse_precisely() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("typed.db"), SqliteOptions::default())
        .await
        .expect("sqlite");
    let quick = HostOptions::default()
        .idle_timeout(Duration::from_millis(50))
        .sweep_interval(Duration::from_millis(20));
    let w = start(
        Options::new()
            .host_with::<Visitor>("/v", quick)
            .store(store),
    )
    .await;

    let (status, body) = json(w.post("/v/ada/visit").await).await;
    assert_eq!((status, body["visits"].clone()), (200, json!(1)));
    w.wait_for("ada evicted", |stats| {
        stats["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    // A fresh activation reads what the evicted one wrote.
    let (status, body) = json(w.post("/v/ada/visit").await).await;
    assert_eq!((status, body["visits"].clone()), (200, json!(2)));

    let refusal = w.post("/v/ada/list").await;
    assert_eq!(refusal.status(), 422);
    assert_eq!(
        refusal.text().await.expect("text"),
        "tray profile/~ doc must be a JSON object, got array"
    );
    let refusal = w.post("/v/ada/reserved").await;
    assert_eq!(refusal.status(), 422);
    assert!(refusal.text().await.expect("text").contains("reserved"));
    let refusal = w.get("/v/ada/wrong-shape").await;
    assert_eq!(refusal.status(), 422);
    assert!(refusal
        .text()
        .await
        .expect("text")
        .starts_with("tray count/~ does not decode as the requested type"));
    // The refused writes left the row as it was.
    let (_, body) = json(w.post("/v/ada/visit").await).await;
    assert_eq!(body["visits"], Value::from(3));
    // Deleting everything of the id: its rows and its alarm.
    let (status, body) = json(w.post("/v/ada/forget").await).await;
    assert_eq!((status, body), (200, json!({ "rows": 0, "alarm": false })));
    let (_, body) = json(w.post("/v/ada/visit").await).await;
    assert_eq!(body["visits"], Value::from(1), "a fresh start");
}
