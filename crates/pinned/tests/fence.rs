//! A lost store fence aborts the instance: once a newer epoch owns an id's
//! rows, the stale instance's memory must not keep serving ahead of the
//! store. The request that hit the fence gets the store's error (its
//! handler decides the answer), the instance is gone, and the next request
//! (at the newer epoch) activates afresh from the rows.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::routing::post;
use axum::{Json, Router};
use pinned::pinned_store::{Doc, InstanceKey, MemoryStore, StateStore, TrayKey};
use pinned::{BoxError, Call, Context, Object, Options};
use serde_json::json;
use support::json;

static ACTIVATIONS: AtomicU64 = AtomicU64::new(0);

/// Writes a row on every request.
struct Writer;

impl Object for Writer {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        ACTIVATIONS.fetch_add(1, Ordering::SeqCst);
        Ok(Writer)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/write",
            post(|call: Call| async move {
                let store = call.ctx().store().expect("a store");
                let written = store.set_tray("notes", "~", false, Doc::new()).await;
                Json(json!({ "written": written.is_ok(), "epoch": call.epoch() }))
            }),
        )
    }
}

#[tokio::test]
async fn a_lost_fence_aborts_the_instance() {
    let store = Arc::new(MemoryStore::new());
    let w = support::start(Options::new().host::<Writer>("/w").store(store.clone())).await;
    let write = |epoch: u64| {
        w.client
            .post(w.url("/w/x/write"))
            .header("pinboard-epoch", epoch.to_string())
            .send()
    };
    let (status, body) = json(write(1).await.expect("send")).await;
    assert_eq!((status, body["written"].clone()), (200, json!(true)));
    // A newer owner (epoch 2, elsewhere in the fleet) writes the same id.
    store
        .set_tray(
            InstanceKey::new("/w", "x"),
            TrayKey::singleton("notes"),
            false,
            Doc::new(),
            2,
        )
        .await
        .expect("the newer owner writes");
    let (status, body) = json(write(1).await.expect("send")).await;
    assert_eq!((status, body["written"].clone()), (200, json!(false)));
    w.wait_for("the stale instance gone", |stats| {
        stats["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let (status, body) = json(write(2).await.expect("send")).await;
    assert_eq!((status, body["written"].clone()), (200, json!(true)));
    assert_eq!(ACTIVATIONS.load(Ordering::SeqCst), 2);
}
