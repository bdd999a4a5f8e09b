//! `pinned::serve`: a shutdown signal drains (in-flight work finishes,
//! `on_stop` runs), then the server stops, also with the application's own
//! routes beside the worker's; overlapping routes are an error, not a
//! panic; a request that meets a closing instance waits for the close
//! and activates it afresh; and an advertise URL with port 0 registers the
//! port served.

mod support;

use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::{BoxError, Call, Context, Object, Options, This};
use serde_json::json;
use support::{json, Counter};

type Served = tokio::task::JoinHandle<Result<(), pinned::ServeError>>;

/// Builds `options` (empty environment), serves it on 127.0.0.1:0 through
/// `pinned::serve` configured by `configure`, until `stop` is sent.
async fn serving(
    options: Options,
    configure: impl FnOnce(pinned::Serve) -> pinned::Serve,
) -> (
    pinned::Worker,
    String,
    tokio::sync::oneshot::Sender<()>,
    Served,
) {
    let worker = options
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("worker");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let serve = configure(pinned::serve(worker.clone()).listener(listener));
    let server = tokio::spawn(
        serve
            .with_graceful_shutdown(async move {
                let _ = signal.await;
            })
            .into_future(),
    );
    (worker, url, stop, server)
}

#[tokio::test]
async fn a_shutdown_signal_drains_then_stops_the_server() {
    let (worker, url, stop, server) =
        serving(Options::new().host::<Counter>("/counter"), |serve| serve).await;
    let client = reqwest::Client::new();
    let slow = {
        let request = client.post(format!("{url}/counter/s/sleep/300"));
        tokio::spawn(async move { request.send().await.expect("slow").status() })
    };
    // The slow request is in flight before the signal.
    support::until("the slow request in flight", support::PATIENCE, || {
        worker.stats()["instances"][0]["tasks"] == 1
    })
    .await;
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

    fn routes() -> pinned::Routes<Self> {
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
    // The wind-down closes the instance as that request leaves it: by the
    // time its answer arrives the close (300 ms of on_stop) is under way.
    assert_eq!(w.post("/slow/c/wind").await.status(), 200);
    // The instance is closing (its on_stop takes 300 ms): this request waits
    // for the close, then reaches a fresh instance.
    let (status, body) = json(w.post("/slow/c/hit").await).await;
    assert_eq!((status, body["hits"].as_u64()), (200, Some(1)));
    assert_eq!(ACTIVATIONS.load(Ordering::SeqCst), 2);
}

static SNAPSHOTS: AtomicU64 = AtomicU64::new(0);

/// Counts its final snapshots (`Object::on_stop`).
struct Snapshotting;

impl Object for Snapshotting {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Snapshotting)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/", get(|| async { "here" }))
    }

    async fn on_stop(&self, _ctx: &Context) -> Result<(), BoxError> {
        SNAPSHOTS.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test]
async fn own_routes_beside_the_worker_keep_the_drain_and_on_stop() {
    let (worker, url, stop, server) =
        serving(Options::new().host::<Snapshotting>("/snap"), |serve| {
            serve
                .routes(Router::new().route("/healthz", get(|| async { "ok" })))
                .drain_deadline(Duration::from_secs(5))
        })
        .await;
    let client = reqwest::Client::new();
    let health = client
        .get(format!("{url}/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.text().await.expect("text"), "ok");
    for id in ["a", "b"] {
        let answer = client
            .get(format!("{url}/snap/{id}"))
            .send()
            .await
            .expect("snap");
        assert_eq!(answer.status(), 200);
    }
    // The worker's secret still opens /_pinned/stats beside the app's routes.
    let stats = client
        .get(format!("{url}/_pinned/stats"))
        .header("pinboard-proxy-secret", worker.secret())
        .send()
        .await
        .expect("stats");
    assert_eq!(stats.status(), 200);
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server stops after the drain")
        .expect("join")
        .expect("serve");
    assert_eq!(
        SNAPSHOTS.load(Ordering::SeqCst),
        2,
        "on_stop ran for both instances"
    );
}

#[tokio::test]
async fn routes_that_overlap_the_workers_are_an_error() {
    let served = pinned::serve(
        Options::new()
            .host::<Snapshotting>("/snap")
            .env_vars(Vec::<(String, String)>::new()),
    )
    .listener(
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind"),
    )
    .routes(Router::new().route("/metrics", get(|| async { "mine" })))
    .await;
    assert!(
        matches!(served, Err(pinned::ServeError::Routes(_))),
        "{served:?}"
    );
}

#[tokio::test]
async fn every_configuration_problem_is_reported_by_serve() {
    let served = pinned::serve(
        Options::new()
            .host::<Snapshotting>("bad")
            .env_vars([("PORT", "eighty")]),
    )
    .await;
    let Err(pinned::ServeError::Config(errors)) = served else {
        panic!("expected a configuration error, got {served:?}");
    };
    assert_eq!(errors.0.len(), 2, "{errors}");
}

/// A stand-in pinboard that hands over each register body's `advertiseUrl`
/// and defers the worker (503), so it keeps asking.
async fn recording_pinboard() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (seen, heard) = tokio::sync::mpsc::unbounded_channel();
    let app = Router::new().route(
        "/registry/register",
        post(move |Json(body): Json<serde_json::Value>| {
            let seen = seen.clone();
            async move {
                let _ = seen.send(body["advertiseUrl"].as_str().unwrap_or("").to_owned());
                (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "0.05")],
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, heard)
}

#[tokio::test]
async fn a_zero_advertise_port_registers_the_port_served() {
    let (pinboard, mut heard) = recording_pinboard().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        pinned::serve(Options::new().host::<Counter>("/counter").env_vars([
            ("PINBOARD_URL", pinboard.as_str()),
            ("PINBOARD_TOKEN", "t"),
            ("ADVERTISE_URL", "http://127.0.0.1:0"),
        ]))
        .listener(listener)
        .drain_deadline(Duration::from_secs(1))
        .with_graceful_shutdown(async move {
            let _ = signal.await;
        })
        .into_future(),
    );
    for _ in 0..2 {
        let advertised = tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await
            .expect("a register within 10 s")
            .expect("the stand-in pinboard runs");
        assert_eq!(advertised, format!("http://127.0.0.1:{port}"));
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("stopped within 10 s")
        .expect("joined")
        .expect("served");
}
