//! Lifecycle hooks and the instance's lease view: `on_idle` can keep an
//! idle instance (asked once per idle period), `on_wind_down` hears the
//! deadline, a detached instance is wound down whatever work it holds, and
//! `eviction_checkpoint` yields to a wind-down.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use pinned::{BoxError, Call, Context, HostOptions, Idle, Object, Options};
use serde_json::json;
use support::{json, start, until, PATIENCE};

fn quick() -> HostOptions {
    HostOptions::default()
        .idle_timeout(Duration::from_millis(100))
        .sweep_interval(Duration::from_millis(20))
}

static KEEPER_ACTIVATIONS: AtomicU64 = AtomicU64::new(0);
static KEEPER_ASKED: AtomicU64 = AtomicU64::new(0);

/// Keeps itself the first time it is idle, then lets go.
struct Keeper;

impl Object for Keeper {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        KEEPER_ACTIVATIONS.fetch_add(1, Ordering::SeqCst);
        Ok(Keeper)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/", get(|| async { "here" }))
    }

    async fn on_idle(&self, _ctx: &Context) -> Result<Idle, BoxError> {
        // An asynchronous answer, to go through the hook's own task.
        tokio::task::yield_now().await;
        Ok(match KEEPER_ASKED.fetch_add(1, Ordering::SeqCst) {
            0 => Idle::Keep,
            _ => Idle::Evict,
        })
    }
}

#[tokio::test(start_paused = true)]
async fn on_idle_keeps_an_instance_until_its_next_idle_period() {
    let w = start(Options::new().host_with::<Keeper>("/keep", quick())).await;
    assert_eq!(w.get("/keep/k/").await.status(), 200);
    until("asked once", PATIENCE, || {
        KEEPER_ASKED.load(Ordering::SeqCst) == 1
    })
    .await;
    // Kept: many sweeps later it is still resident and not asked again
    // until it has been busy.
    let stats = w.stats().await;
    assert_eq!(stats["instances"][0]["id"], "k", "{stats}");
    assert_eq!(w.get("/keep/k/").await.status(), 200);
    w.wait_for("evicted after the second idle period", |stats| {
        stats["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert_eq!(KEEPER_ASKED.load(Ordering::SeqCst), 2);
    assert_eq!(
        KEEPER_ACTIVATIONS.load(Ordering::SeqCst),
        1,
        "kept, not re-activated"
    );
}

static HEARD: Mutex<Vec<Option<u64>>> = Mutex::new(Vec::new());
static DETACHED_STOPS: AtomicU64 = AtomicU64::new(0);

fn lease(call: &Call) -> Json<serde_json::Value> {
    let lease = call.ctx().lease();
    Json(json!({
        "healthy": lease.healthy,
        "expired": lease.expired,
        "expiresAt": lease.expires_at.is_some(),
        "windingDown": lease.winding_down,
        "evictionDeadline": lease.eviction_deadline.is_some(),
        "checkpoint": call.ctx().eviction_checkpoint().is_ok(),
    }))
}

/// Reports its lease, hears its wind-down, and can hold background work.
struct Listener;

impl Object for Listener {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Listener)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/lease", get(|call: Call| async move { lease(&call) }))
            // Winds down, then reports from inside the same request (the
            // instance closes as soon as it is idle).
            .route(
                "/wind",
                post(|call: Call| async move {
                    call.ctx().wind_down(Some(Duration::from_secs(30)));
                    lease(&call)
                }),
            )
            .route(
                "/hold",
                post(|call: Call| async move {
                    // Background work that never ends on its own.
                    call.ctx().spawn(std::future::pending());
                    "holding"
                }),
            )
    }

    async fn on_wind_down(
        &self,
        ctx: &Context,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), BoxError> {
        if ctx.id() != "a" {
            return Ok(());
        }
        let left = deadline.map(|at| {
            at.saturating_duration_since(tokio::time::Instant::now())
                .as_secs()
        });
        HEARD.lock().push(left);
        Ok(())
    }

    async fn on_stop(&self, ctx: &Context) -> Result<(), BoxError> {
        if ctx.id() == "detached" {
            DETACHED_STOPS.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn the_lease_view_and_on_wind_down_follow_a_wind_down() {
    let w = start(Options::new().host::<Listener>("/l")).await;
    let (status, body) = json(w.get("/l/a/lease").await).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({
            "healthy": true, "expired": false, "expiresAt": false,
            "windingDown": false, "evictionDeadline": false, "checkpoint": true,
        })
    );
    let (status, body) = json(w.post("/l/a/wind").await).await;
    assert_eq!(status, 200);
    assert_eq!(body["windingDown"], true);
    assert_eq!(body["evictionDeadline"], true);
    assert_eq!(body["checkpoint"], false, "the checkpoint yields");
    until("on_wind_down heard", PATIENCE, || !HEARD.lock().is_empty()).await;
    let heard = HEARD.lock().clone();
    assert!(
        matches!(heard.first(), Some(Some(29 | 30))),
        "deadline about 30 s away: {heard:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_detached_instance_is_wound_down_whatever_it_holds() {
    let options = quick()
        .idle_timeout(Duration::from_secs(3600))
        .detached_timeout(Duration::from_millis(150));
    let w = start(Options::new().host_with::<Listener>("/d", options)).await;
    assert_eq!(w.post("/d/detached/hold").await.status(), 200);
    w.wait_for("the detached instance closed", |stats| {
        stats["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert_eq!(DETACHED_STOPS.load(Ordering::SeqCst), 1);
}
