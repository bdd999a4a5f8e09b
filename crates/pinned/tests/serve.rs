//! `serve_worker`: a shutdown signal drains (in-flight work finishes), then
//! the server stops; and a request that meets a closing instance waits for
//! the close and activates it afresh.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use pinned::{BoxError, Call, Context, Object, Options, This};
use serde_json::json;
use support::{json, Counter};

#[tokio::test]
async fn a_shutdown_signal_drains_then_stops_the_server() {
    let worker = Options::new()
        .host::<Counter>("/counter")
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("worker");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(pinned::serve_worker(listener, worker.clone(), async move {
        let _ = signal.await;
    }));
    let client = reqwest::Client::new();
    let slow = {
        let request = client.post(format!("{url}/counter/s/sleep/300"));
        tokio::spawn(async move { request.send().await.expect("slow").status() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = stop.send(());
    // The in-flight request finishes within the drain.
    assert_eq!(slow.await.expect("join"), 200);
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("server stops after the drain")
        .expect("join")
        .expect("serve");
    assert_eq!(worker.stats()["instances"], json!([]));
    assert!(worker.stats()["draining"].as_bool().expect("bool"));
}

static ACTIVATIONS: AtomicU64 = AtomicU64::new(0);

/// Takes 300 ms to stop.
struct SlowStop {
    hits: AtomicU64,
}

impl Object for SlowStop {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        ACTIVATIONS.fetch_add(1, Ordering::SeqCst);
        ctx.on_stop(|| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(())
        });
        Ok(SlowStop {
            hits: AtomicU64::new(0),
        })
    }

    fn routes() -> Router {
        Router::new()
            .route(
                "/hit",
                post(|this: This<SlowStop>| async move {
                    Json(json!({ "hits": this.hits.fetch_add(1, Ordering::SeqCst) + 1 }))
                }),
            )
            .route(
                "/wind",
                post(|call: Call| async move {
                    call.ctx().wind_down(None);
                    "ok"
                }),
            )
    }
}

#[tokio::test]
async fn a_request_for_a_closing_instance_waits_and_reactivates() {
    let w = support::start(Options::new().host::<SlowStop>("/slow")).await;
    let (_, body) = json(w.post("/slow/c/hit").await).await;
    assert_eq!(body["hits"], 1);
    assert_eq!(w.post("/slow/c/wind").await.status(), 200);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The instance is closing (its on_stop takes 300 ms): this request waits
    // for the close, then reaches a fresh instance.
    let (status, body) = json(w.post("/slow/c/hit").await).await;
    assert_eq!((status, body["hits"].as_u64()), (200, Some(1)));
    assert_eq!(ACTIVATIONS.load(Ordering::SeqCst), 2);
}
