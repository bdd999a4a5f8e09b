//! Exclusive (turn-based) hosting runs one request at a time per instance,
//! and an alarm takes a turn of its own (never inside a request's); the
//! default runs them concurrently.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use pinned::pinned_store::MemoryStore;
use pinned::{BoxError, Call, Context, HostOptions, Object, Options, This};
use serde_json::json;
use support::{eventually, json, start, PATIENCE};

struct Turns {
    inside: AtomicU64,
    most: AtomicU64,
    alarms: AtomicU64,
}

impl Turns {
    /// One turn of `work`: counts how many turns overlapped.
    async fn turn(&self, work: Duration) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(work).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Object for Turns {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Turns {
            inside: AtomicU64::new(0),
            most: AtomicU64::new(0),
            alarms: AtomicU64::new(0),
        })
    }

    async fn alarm(&self, _ctx: &Context) -> Result<(), BoxError> {
        self.turn(Duration::from_millis(10)).await;
        self.alarms.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/turn",
                post(|this: This<Turns>| async move {
                    this.turn(Duration::from_millis(50)).await;
                    Json(json!({ "most": this.most.load(Ordering::SeqCst) }))
                }),
            )
            // Sets an alarm due in 50 ms, then works for 400 ms in its turn.
            .route(
                "/alarm-then-work",
                post(|this: This<Turns>, call: Call| async move {
                    let set = call.ctx().alarm().set_in(Duration::from_millis(50)).await;
                    this.turn(Duration::from_millis(400)).await;
                    Json(
                        json!({ "set": set.is_ok(), "alarms": this.alarms.load(Ordering::SeqCst) }),
                    )
                }),
            )
            .route(
                "/stats",
                post(|this: This<Turns>| async move {
                    Json(json!({
                        "most": this.most.load(Ordering::SeqCst),
                        "alarms": this.alarms.load(Ordering::SeqCst),
                    }))
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

#[tokio::test(start_paused = true)]
async fn exclusive_mode_serializes_requests() {
    assert_eq!(most_concurrent(true).await, 1);
}

#[tokio::test(start_paused = true)]
async fn default_mode_runs_requests_concurrently() {
    assert!(most_concurrent(false).await > 1);
}

#[tokio::test(start_paused = true)]
async fn an_alarm_waits_for_the_turn_of_the_request_that_set_it() {
    let options = HostOptions::default().exclusive(true);
    let w = start(
        Options::new()
            .host_with::<Turns>("/turns", options)
            .store(MemoryStore::new())
            .domain(pinned::Domain::system().with_tokio_clock()),
    )
    .await;
    let (status, body) = json(w.post("/turns/a/alarm-then-work").await).await;
    assert_eq!((status, body["set"].as_bool()), (200, Some(true)));
    // The alarm came due 350 ms before the turn ended, and did not run in it.
    assert_eq!(body["alarms"], 0, "the alarm ran inside the request's turn");
    let stats = eventually("the alarm run", PATIENCE, || async {
        let (_, stats) = json(w.post("/turns/a/stats").await).await;
        (stats["alarms"] == 1).then_some(stats)
    })
    .await;
    assert_eq!(stats["most"], 1, "the alarm overlapped a request: {stats}");
}
