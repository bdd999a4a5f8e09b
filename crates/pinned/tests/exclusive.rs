//! Exclusive (turn-based) hosting runs one request at a time per instance;
//! the default runs them concurrently.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use pinned::{BoxError, Context, HostOptions, Object, Options, This};
use serde_json::json;
use support::{json, start};

struct Turns {
    inside: AtomicU64,
    most: AtomicU64,
}

impl Object for Turns {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Turns {
            inside: AtomicU64::new(0),
            most: AtomicU64::new(0),
        })
    }

    fn routes() -> Router {
        Router::new().route(
            "/turn",
            post(|this: This<Turns>| async move {
                let now = this.inside.fetch_add(1, Ordering::SeqCst) + 1;
                this.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                this.inside.fetch_sub(1, Ordering::SeqCst);
                Json(json!({ "most": this.most.load(Ordering::SeqCst) }))
            }),
        )
    }
}

async fn most_concurrent(exclusive: bool) -> u64 {
    let options = HostOptions::default().exclusive(exclusive);
    let w = start(Options::new().host_with::<Turns>("/turns", options)).await;
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let request = w.client.post(w.url("/turns/x/turn"));
            tokio::spawn(async move { json(request.send().await.expect("turn")).await })
        })
        .collect();
    let mut most = 0;
    for call in calls {
        let (status, body) = call.await.expect("join");
        assert_eq!(status, 200);
        most = most.max(body["most"].as_u64().expect("most"));
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_mode_serializes_requests() {
    assert_eq!(most_concurrent(true).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_mode_runs_requests_concurrently() {
    assert!(most_concurrent(false).await > 1);
}
