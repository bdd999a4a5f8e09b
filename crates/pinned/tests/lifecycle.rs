//! Lifecycle, on tokio's paused clock: idle eviction, capacity,
//! drain with and without deadline and its revocation, abort, wind-down,
//! tracked work, close.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::Query;
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use pinned::{BoxError, Call, Context, HostOptions, Object, Options, This};
use serde::Deserialize;
use serde_json::{json, Value};
use support::{json, start, Counter};
use test_support::metrics;

/// Events recorded by `Tracked` instances, as `"<id>:<event>"`.
static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn events_of(id: &str) -> Vec<String> {
    let prefix = format!("{id}:");
    EVENTS
        .lock()
        .iter()
        .filter_map(|e| e.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

fn record(id: &str, event: &str) {
    EVENTS.lock().push(format!("{id}:{event}"));
}

#[derive(Deserialize)]
struct Ms {
    ms: Option<u64>,
}

struct Tracked {
    hits: AtomicU64,
}

impl Object for Tracked {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        record(ctx.id(), "activate");
        for n in 1..=3 {
            let id = ctx.id().to_owned();
            let cancelled = ctx.clone();
            ctx.on_stop(move || async move {
                // The eviction signal fired before any on_stop handler.
                assert!(cancelled.is_cancelled());
                record(&id, &format!("stop{n}"));
                if n == 2 {
                    return Err("second handler fails".into());
                }
                Ok(())
            });
        }
        Ok(Tracked {
            hits: AtomicU64::new(0),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/hit",
                post(|this: This<Tracked>| async move {
                    Json(json!({ "hits": this.hits.fetch_add(1, Ordering::SeqCst) + 1 }))
                }),
            )
            .route(
                "/hang",
                post(|call: Call, Query(q): Query<Ms>| async move {
                    tokio::time::sleep(Duration::from_millis(q.ms.unwrap_or(60_000))).await;
                    record(call.ctx().id(), "hang-done");
                    "done"
                }),
            )
            .route(
                "/abort",
                post(|call: Call| async move {
                    call.ctx().abort();
                    "aborting"
                }),
            )
            .route(
                "/wind",
                post(|call: Call, Query(q): Query<Ms>| async move {
                    call.ctx().wind_down(q.ms.map(Duration::from_millis));
                    Json(json!({ "winding": call.ctx().winding_down() }))
                }),
            )
            .route(
                "/wait-until",
                post(|call: Call, Query(q): Query<Ms>| async move {
                    let id = call.ctx().id().to_owned();
                    let ms = q.ms.unwrap_or(0);
                    call.ctx().wait_until(async move {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        record(&id, "waited");
                        Ok(())
                    });
                    "tracked"
                }),
            )
            .route(
                "/spawn",
                post(|call: Call| async move {
                    let id = call.ctx().id().to_owned();
                    call.ctx().spawn(async move {
                        struct Dropped(String);
                        impl Drop for Dropped {
                            fn drop(&mut self) {
                                record(&self.0, "spawn-dropped");
                            }
                        }
                        let _dropped = Dropped(id);
                        std::future::pending::<()>().await;
                    });
                    "spawned"
                }),
            )
            .route("/ok", get(|| async { "ok" }))
    }
}

fn quick() -> HostOptions {
    HostOptions::default()
        .idle_timeout(Duration::from_millis(300))
        .sweep_interval(Duration::from_millis(50))
}

#[tokio::test(start_paused = true)]
async fn idle_instances_are_evicted_and_on_stop_runs_last_first() {
    let w = start(Options::new().host_with::<Tracked>("/t", quick())).await;
    let fresh = metrics::parse(&w.worker.metrics());
    let (_, body) = json(w.post("/t/idle-1/hit").await).await;
    assert_eq!(body["hits"], 1);
    let live = metrics::parse(&w.worker.metrics());
    assert_eq!(
        metrics::moved(&fresh, &live, "pinned_instance_activations"),
        1.0
    );
    assert_eq!(
        metrics::moved(&fresh, &live, "pinned_active_instances"),
        1.0
    );
    let timed = metrics::moved(
        &fresh,
        &live,
        r#"pinned_request_duration_seconds{namespace="/t"}"#,
    );
    assert_eq!(timed, 1.0);
    // Still resident after a third of its idle timeout.
    let stats = w.wait_idle(100).await;
    assert_eq!(stats["instances"][0]["id"], "idle-1");
    let stats = w
        .wait_for("eviction", |s| {
            s["instances"].as_array().is_some_and(Vec::is_empty)
        })
        .await;
    assert_eq!(stats["namespaces"]["/t"]["evictions"], 1);
    let evicted = metrics::parse(&w.worker.metrics());
    assert_eq!(
        metrics::moved(&live, &evicted, "pinned_instance_evictions"),
        1.0
    );
    assert_eq!(
        metrics::moved(&live, &evicted, "pinned_active_instances"),
        -1.0
    );
    // The second on_stop handler's error.
    let failed = metrics::moved(
        &live,
        &evicted,
        r#"pinned_shutdown_failures{phase="directory"}"#,
    );
    assert_eq!(failed, 1.0);
    // Last registered first; a failing handler does not stop the others.
    assert_eq!(
        events_of("idle-1"),
        vec!["activate", "stop3", "stop2", "stop1"]
    );
    // The next request activates a fresh instance.
    let (_, body) = json(w.post("/t/idle-1/hit").await).await;
    assert_eq!(body["hits"], 1);
}

#[tokio::test(start_paused = true)]
async fn idle_eviction_on_paused_time() {
    use tower::ServiceExt;
    let worker = Options::new()
        .host::<Counter>("/counter")
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("worker");
    worker.start();
    let request = || {
        http::Request::post("/counter/p/increment")
            .body(axum::body::Body::empty())
            .expect("request")
    };
    let response = worker
        .router()
        .oneshot(request())
        .await
        .expect("infallible");
    assert_eq!(response.status(), 200);
    // Default idle timeout is 300 s, swept every 5 s.
    tokio::time::advance(Duration::from_secs(290)).await;
    tokio::task::yield_now().await;
    assert_eq!(
        worker.stats()["instances"].as_array().map(Vec::len),
        Some(1)
    );
    tokio::time::advance(Duration::from_secs(16)).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let stats = worker.stats();
    assert_eq!(stats["instances"], json!([]), "{stats}");
    assert_eq!(stats["namespaces"]["/counter"]["evictions"], 1);
}

#[tokio::test(start_paused = true)]
async fn capacity_refuses_new_ids_while_existing_ones_serve() {
    let options = HostOptions::default()
        .max_instances(2)
        .evict_idle_at_capacity(false);
    let w = start(Options::new().host_with::<Counter>("/counter", options)).await;
    assert_eq!(w.post("/counter/a/increment").await.status(), 200);
    assert_eq!(w.post("/counter/b/increment").await.status(), 200);
    let refused = w.post("/counter/c/increment").await;
    assert_eq!(refused.status(), 503);
    assert_eq!(
        refused.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    assert!(refused.headers().get("pinned-refusal").is_none());
    assert_eq!(
        refused.text().await.expect("body"),
        r#"{"detail":"instance capacity reached; retry"}"#
    );
    let (status, body) = json(w.post("/counter/a/increment").await).await;
    assert_eq!((status, body["value"].as_u64()), (200, Some(2)));
}

#[tokio::test(start_paused = true)]
async fn at_capacity_the_least_recently_used_idle_instance_makes_room() {
    let options = HostOptions::default().max_instances(2);
    let w = start(Options::new().host_with::<Tracked>("/t", options)).await;
    assert_eq!(w.post("/t/cap-old/hit").await.status(), 200);
    w.wait_idle(20).await;
    assert_eq!(w.post("/t/cap-new/hit").await.status(), 200);
    // Full: the new id evicts the idler of the two (its on_stop runs).
    assert_eq!(w.post("/t/cap-third/hit").await.status(), 200);
    w.wait_for("cap-old evicted", |s| {
        let ids: Vec<&str> = s["instances"]
            .as_array()
            .map(|rows| rows.iter().filter_map(|r| r["id"].as_str()).collect())
            .unwrap_or_default();
        ids == ["cap-new", "cap-third"]
    })
    .await;
    assert!(events_of("cap-old").contains(&"stop1".to_owned()));
    // Every instance busy: nothing to evict, the refusal stands.
    let busy: Vec<_> = ["cap-new", "cap-third"]
        .iter()
        .map(|id| {
            let request = w.client.post(w.url(&format!("/t/{id}/hang?ms=500")));
            tokio::spawn(async move { request.send().await.expect("hang").status() })
        })
        .collect();
    w.wait_for("both busy", |s| {
        s["instances"]
            .as_array()
            .is_some_and(|rows| rows.iter().all(|r| r["tasks"] == 1))
    })
    .await;
    let refused = w.post("/t/cap-fourth/hit").await;
    assert_eq!(refused.status(), 503);
    for call in busy {
        assert_eq!(call.await.expect("join"), 200);
    }
}

#[tokio::test(start_paused = true)]
async fn drain_without_deadline_waits_for_work_and_can_be_revoked() {
    let w = start(Options::new().host::<Tracked>("/t")).await;
    assert_eq!(w.post("/t/drain-idle/hit").await.status(), 200);
    let busy = {
        let request = w.client.post(w.url("/t/drain-busy/hang?ms=400"));
        tokio::spawn(async move { request.send().await.expect("hang").status() })
    };
    w.wait_for("busy instance", |s| {
        s["instances"]
            .as_array()
            .is_some_and(|rows| rows.len() == 2)
    })
    .await;
    let drained = {
        let worker = w.worker.clone();
        tokio::spawn(async move { worker.drain(None).await })
    };
    // The idle instance goes at once; the busy one keeps serving.
    w.wait_for("idle eviction on drain", |s| {
        s["draining"] == true
            && s["instances"]
                .as_array()
                .is_some_and(|rows| rows.len() == 1)
    })
    .await;
    let refused = w.post("/t/drain-new/hit").await;
    assert_eq!(refused.status(), 503);
    // The process is on its way out: no keep-alive connection is left to
    // race its exit.
    assert_eq!(
        refused.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    assert_eq!(
        refused.text().await.expect("body"),
        r#"{"detail":"host draining; retry"}"#
    );
    assert!(!drained.is_finished());
    assert_eq!(busy.await.expect("join"), 200);
    tokio::time::timeout(Duration::from_secs(5), drained)
        .await
        .expect("drain resolves once empty")
        .expect("join");
    assert_eq!(
        events_of("drain-busy").first().map(String::as_str),
        Some("activate")
    );
    assert!(events_of("drain-busy").contains(&"hang-done".to_owned()));
    w.worker.undrain();
    assert!(!w.worker.draining());
    let served = w.post("/t/drain-new/hit").await;
    assert_eq!(served.status(), 200);
    assert!(served.headers().get("connection").is_none());
}

#[tokio::test(start_paused = true)]
async fn drain_deadline_aborts_in_flight_requests() {
    let w = start(Options::new().host::<Tracked>("/t")).await;
    let before = metrics::parse(&w.worker.metrics());
    let hanging = {
        let request = w.client.post(w.url("/t/drain-hang/hang"));
        tokio::spawn(async move { json(request.send().await.expect("hang")).await })
    };
    w.wait_for("hanging instance", |s| {
        s["instances"]
            .as_array()
            .is_some_and(|rows| rows.len() == 1)
    })
    .await;
    tokio::time::timeout(
        Duration::from_secs(5),
        w.worker.drain(Some(Duration::from_millis(200))),
    )
    .await
    .expect("drain resolves after the deadline");
    let (status, body) = hanging.await.expect("join");
    assert_eq!(status, 503);
    assert_eq!(body, json!({"detail": "instance aborted"}));
    assert!(!events_of("drain-hang").contains(&"hang-done".to_owned()));
    let after = metrics::parse(&w.worker.metrics());
    assert_eq!(
        metrics::moved(&before, &after, "pinned_instance_aborts"),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn abort_cancels_in_flight_work_and_spawned_tasks() {
    let w = start(Options::new().host::<Tracked>("/t")).await;
    assert_eq!(w.post("/t/ab/spawn").await.status(), 200);
    let hanging = {
        let request = w.client.post(w.url("/t/ab/hang"));
        tokio::spawn(async move { json(request.send().await.expect("hang")).await })
    };
    w.wait_for("hanging request", |s| s["instances"][0]["tasks"] == 2)
        .await;
    assert_eq!(w.post("/t/ab/abort").await.status(), 200);
    let (status, body) = hanging.await.expect("join");
    assert_eq!((status, body), (503, json!({"detail": "instance aborted"})));
    w.wait_for("teardown", |s| {
        s["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let events = events_of("ab");
    assert!(events.contains(&"spawn-dropped".to_owned()), "{events:?}");
    assert_eq!(&events[events.len() - 3..], ["stop3", "stop2", "stop1"]);
}

#[tokio::test(start_paused = true)]
async fn wait_until_keeps_an_instance_past_its_idle_timeout() {
    let w = start(Options::new().host_with::<Tracked>("/t", quick())).await;
    assert_eq!(w.post("/t/wu/wait-until?ms=800").await.status(), 200);
    // Twice the idle timeout (300 ms) passed, but the tracked work holds it.
    let stats = w.wait_idle(600).await;
    assert_eq!(stats["instances"][0]["id"], "wu");
    assert_eq!(stats["instances"][0]["tasks"], 1);
    w.wait_for("eviction after the work", |s| {
        s["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let events = events_of("wu");
    let waited = events.iter().position(|e| e == "waited").expect("waited");
    let stopped = events.iter().position(|e| e == "stop3").expect("stopped");
    assert!(waited < stopped, "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn wind_down_closes_when_idle_and_aborts_at_its_deadline() {
    let w = start(Options::new().host::<Tracked>("/t")).await;
    // Without a deadline: closes as soon as the request that asked is done.
    let (_, body) = json(w.post("/t/wd-1/wind").await).await;
    assert_eq!(body["winding"], true);
    w.wait_for("wind-down eviction", |s| {
        s["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    // With a deadline: a hanging request is aborted at the deadline.
    let hanging = {
        let request = w.client.post(w.url("/t/wd-2/hang"));
        tokio::spawn(async move { json(request.send().await.expect("hang")).await })
    };
    w.wait_for("hanging", |s| s["instances"][0]["tasks"] == 1)
        .await;
    assert_eq!(w.post("/t/wd-2/wind?ms=200").await.status(), 200);
    let (status, body) = hanging.await.expect("join");
    assert_eq!((status, body), (503, json!({"detail": "instance aborted"})));
}

#[tokio::test(start_paused = true)]
async fn close_aborts_everything_and_refuses_later_requests() {
    let w = start(Options::new().host::<Tracked>("/t")).await;
    assert_eq!(w.post("/t/cl/hit").await.status(), 200);
    tokio::time::timeout(Duration::from_secs(5), w.worker.close())
        .await
        .expect("close resolves");
    assert!(events_of("cl").contains(&"stop1".to_owned()));
    let response = w.post("/t/cl/hit").await;
    assert_eq!(response.status(), 500);
}

#[tokio::test(start_paused = true)]
async fn stats_rows_carry_the_reference_fields() {
    let w = start(
        Options::new()
            .host::<Tracked>("/t")
            .host::<Counter>("/counter"),
    )
    .await;
    assert_eq!(w.post("/t/s1/hit").await.status(), 200);
    assert_eq!(w.post("/counter/s2/increment").await.status(), 200);
    let stats: Value = w.stats().await;
    assert_eq!(stats["draining"], false);
    assert_eq!(stats["leaseFlaps"], 0);
    assert_eq!(stats["reregistrations"], 0);
    assert_eq!(
        stats["namespaces"]["/t"],
        json!({"activations": 1, "evictions": 0})
    );
    let rows = stats["instances"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["namespace"], "/t");
    assert_eq!(rows[1]["namespace"], "/counter");
    for row in rows {
        assert_eq!(row["connections"], 0);
        assert_eq!(row["tasks"], 0);
        assert!(row["idleMs"].as_u64().is_some());
        assert!(row["activatedAt"]
            .as_u64()
            .is_some_and(|ms| ms > 1_700_000_000_000));
    }
    assert!(stats["process"]["uptimeMs"].as_u64().is_some());
    assert!(stats["process"]["rssBytes"].as_u64().is_some_and(|b| b > 0));
    // Without the proxy secret: the reference's 403.
    let refused = w.get("/_pinned/stats").await;
    assert_eq!(refused.status(), 403);
    assert_eq!(
        refused.text().await.expect("body"),
        r#"{"detail":"invalid proxy secret"}"#
    );
    let wrong = w
        .client
        .get(w.url("/_pinned/stats"))
        .header("pinboard-proxy-secret", "nope")
        .send()
        .await
        .expect("stats");
    assert_eq!(wrong.status(), 403);
}

/// The parts are wired top down: no host points back at the worker, and the
/// background tasks (idle sweep, in-process cluster switchboard) hold their
/// parts only until the worker is dropped. A started worker's tasks all end
/// once its last handle goes.
#[tokio::test(start_paused = true)]
async fn dropping_the_worker_ends_its_background_tasks() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .host::<Counter>("/counter")
        .host::<Tracked>("/tracked")
        .build()
        .expect("valid options");
    worker.start();
    assert!(
        metrics.num_alive_tasks() >= before + 3,
        "two sweeps and the switchboard run"
    );
    drop(worker);
    support::until("the worker's tasks ended", support::PATIENCE, || {
        metrics.num_alive_tasks() == before
    })
    .await;
}

/// Draws one random number when it activates, through its domain.
struct Dice {
    roll: u64,
}

impl Object for Dice {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        Ok(Dice {
            roll: ctx.domain().random_u64(),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/roll",
            get(|this: This<Dice>| async move { Json(json!({ "roll": this.roll })) }),
        )
    }
}

/// One injectable domain gives the worker its secrets and the instance its
/// randomness: the same seed replays both, another seed does not.
#[tokio::test(start_paused = true)]
async fn a_seeded_domain_replays_the_worker_and_its_instances() {
    async fn run(seed: u64) -> (String, Value) {
        let w = start(
            Options::new()
                .host::<Dice>("/dice")
                .domain(pinned::Domain::simulated(seed)),
        )
        .await;
        let (status, body) = json(w.get("/dice/a/roll").await).await;
        assert_eq!(status, 200, "{body}");
        (w.worker.secret().to_owned(), body)
    }
    let first = run(42).await;
    assert_eq!(run(42).await, first, "one seed, one run");
    let other = run(43).await;
    assert_ne!(other.0, first.0, "another seed, another secret");
    assert_ne!(other.1, first.1, "another seed, another roll");
}
