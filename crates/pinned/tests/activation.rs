//! Activation: once per id under a burst, failures leave nothing resident,
//! panics answer 500 without harming other instances, and the app sees the
//! request below its instance.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path, Query};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::HeaderMap;
use pinned::{BoxError, Call, Context, Object, Options, This};
use serde_json::{json, Value};
use support::{json, start};
use test_support::metrics;

/// Activation takes a while, to widen the window for a double activation.
struct Slow {
    value: AtomicU64,
}

impl Object for Slow {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(Slow {
            value: AtomicU64::new(0),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/increment",
            post(|this: This<Slow>| async move {
                Json(json!({ "value": this.value.fetch_add(1, Ordering::SeqCst) + 1 }))
            }),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activates_once_under_200_concurrent_first_requests() {
    let w = start(Options::new().host::<Slow>("/slow")).await;
    let url = w.url("/slow/burst/increment");
    let requests = (0..200).map(|_| {
        let client = w.client.clone();
        let url = url.clone();
        tokio::spawn(async move { json(client.post(url).send().await.expect("post")).await })
    });
    let mut values = Vec::new();
    for request in requests {
        let (status, body) = request.await.expect("join");
        assert_eq!(status, 200, "{body}");
        values.push(body["value"].as_u64().expect("value"));
    }
    values.sort_unstable();
    // One instance saw all 200 increments.
    assert_eq!(values, (1..=200).collect::<Vec<u64>>());
    let stats = w.stats().await;
    assert_eq!(stats["namespaces"]["/slow"]["activations"], 1);
    assert_eq!(w.resident().await, vec!["burst"]);
}

async fn boom() -> &'static str {
    panic!("handler exploded")
}

/// Fails or panics on activation depending on the id.
struct Fragile;

impl Object for Fragile {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        if ctx.id().starts_with("fail") {
            return Err("refusing to activate".into());
        }
        if ctx.id().starts_with("panic") {
            panic!("activation exploded");
        }
        Ok(Fragile)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/", get(|| async { "root" }))
            .route("/boom", get(boom))
    }
}

#[tokio::test]
async fn failing_or_panicking_activation_answers_500_and_leaves_nothing() {
    let w = start(Options::new().host::<Fragile>("/fragile")).await;
    let before = metrics::parse(&w.worker.metrics());
    for id in ["fail-1", "panic-1"] {
        let response = w.get(&format!("/fragile/{id}/")).await;
        assert_eq!(response.status(), 500);
        assert_eq!(
            response.text().await.expect("body"),
            r#"{"detail":"Internal Server Error"}"#
        );
    }
    assert!(w.resident().await.is_empty());
    let stats = w.stats().await;
    assert_eq!(stats["namespaces"]["/fragile"]["activations"], 0);
    // The worker still activates healthy ids.
    let response = w.get("/fragile/fine/").await;
    assert_eq!(response.status(), 200);
    assert_eq!(w.resident().await, vec!["fine"]);
    let after = metrics::parse(&w.worker.metrics());
    let failed = metrics::moved(
        &before,
        &after,
        r#"pinned_request_failures{phase="lifespan",transport="http"}"#,
    );
    assert_eq!(failed, 2.0);
}

#[tokio::test]
async fn a_second_request_retries_a_failed_activation() {
    let w = start(Options::new().host::<Fragile>("/fragile")).await;
    assert_eq!(w.get("/fragile/fail-x/").await.status(), 500);
    assert_eq!(w.get("/fragile/fail-x/").await.status(), 500);
    assert!(w.resident().await.is_empty());
}

#[tokio::test]
async fn handler_panic_answers_500_and_the_worker_keeps_serving() {
    let w = start(Options::new().host::<Fragile>("/fragile")).await;
    assert_eq!(w.get("/fragile/other/").await.status(), 200);
    let response = w.get("/fragile/victim/boom").await;
    assert_eq!(response.status(), 500);
    assert_eq!(
        response.text().await.expect("body"),
        r#"{"detail":"Internal Server Error"}"#
    );
    // Both the panicking instance and its neighbour still answer.
    assert_eq!(w.get("/fragile/victim/").await.status(), 200);
    assert_eq!(w.get("/fragile/other/").await.status(), 200);
}

/// Echoes what the app sees of the request.
struct Echo;

impl Object for Echo {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Echo)
    }

    fn routes() -> pinned::Routes<Self> {
        async fn echo(
            call: Call,
            uri: http::Uri,
            headers: HeaderMap,
            Query(query): Query<Value>,
            body: String,
        ) -> Json<Value> {
            Json(json!({
                "path": uri.path(),
                "query": query,
                "header": headers.get("x-test").and_then(|v| v.to_str().ok()),
                "body": body,
                "ns": call.ctx().ns(),
                "id": call.ctx().id(),
                "epoch": call.epoch(),
                "ctxEpoch": call.ctx().epoch(),
                "caller": call.attestation().is_some(),
            }))
        }
        Router::new()
            .route("/", get(echo).post(echo))
            .route("/items/{item}", post(echo))
            .route(
                "/param/{item}",
                get(|Path(item): Path<String>| async move { item }),
            )
    }
}

#[tokio::test]
async fn the_app_sees_the_request_below_its_instance() {
    let w = start(Options::new().host::<Echo>("/echo")).await;
    let (status, body) = json(
        w.client
            .post(w.url("/echo/e1/items/42?x=1&y=two"))
            .header("x-test", "kept")
            .body("payload")
            .send()
            .await
            .expect("post"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["path"], "/items/42");
    assert_eq!(body["query"], json!({"x": "1", "y": "two"}));
    assert_eq!(body["header"], "kept");
    assert_eq!(body["body"], "payload");
    assert_eq!(body["ns"], "/echo");
    assert_eq!(body["id"], "e1");
    assert_eq!(body["epoch"], Value::Null);
    assert_eq!(body["caller"], false);
    // The bare instance URL, with or without a slash, is the app's "/".
    for path in ["/echo/e1", "/echo/e1/"] {
        let (status, body) = json(w.get(path).await).await;
        assert_eq!(status, 200);
        assert_eq!(body["path"], "/");
    }
    // Path parameters are the object's own, not the worker's.
    let response = w.get("/echo/e1/param/abc").await;
    assert_eq!(response.text().await.expect("text"), "abc");
    // Unknown routes are the object's 404.
    assert_eq!(w.get("/echo/e1/nope").await.status(), 404);
}

#[tokio::test]
async fn placement_epochs_are_parsed_and_adopted() {
    let w = start(Options::new().host::<Echo>("/echo")).await;
    let epoch = |value: &'static str| {
        w.client
            .get(w.url("/echo/e2/"))
            .header("pinboard-epoch", value)
            .send()
    };
    let (status, body) = json(epoch("7").await.expect("get")).await;
    assert_eq!(status, 200);
    assert_eq!(body["epoch"], 7);
    assert_eq!(body["ctxEpoch"], 7);
    let (_, body) = json(epoch("0009").await.expect("get")).await;
    assert_eq!(body["ctxEpoch"], 9);
    for bad in [
        "",
        "-1",
        "1.5",
        "abc",
        "1 2",
        "+1",
        "99999999999999999999999",
    ] {
        let (status, body) = json(epoch(bad).await.expect("get")).await;
        assert_eq!(status, 400, "{bad:?}");
        assert_eq!(
            body,
            json!({"detail": "malformed placement epoch"}),
            "{bad:?}"
        );
    }
}

#[tokio::test]
async fn extractors_outside_an_instance_route_answer_500() {
    let worker = Options::new()
        .host::<Echo>("/echo")
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("worker");
    let app = Router::new()
        .route("/misuse", get(|_call: Call| async { "unreachable" }))
        .merge(worker.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/misuse", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let response = reqwest::get(url).await.expect("get");
    assert_eq!(response.status(), 500);
}
