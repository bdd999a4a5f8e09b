//! Routing before activation: an unknown path or method answers the
//! reference's 404/405 and creates nothing (so nobody can fill a worker
//! with instances of routes that do not exist), and extensions set by
//! layers around the worker reach the object's handlers.

mod support;

use axum::routing::get;
use axum::{Extension, Router};
use pinned::{BoxError, Context, Object, Options};
use serde_json::json;
use support::{json, start, Counter};
use tokio::net::TcpListener;

#[tokio::test]
async fn unknown_routes_answer_before_any_instance_exists() {
    let w = start(Options::new().host::<Counter>("/counter")).await;
    let cases = [
        ("GET", "/counter/a/nope", 404, "Not Found"),
        ("GET", "/counter/b/", 404, "Not Found"),
        ("DELETE", "/counter/c/increment", 405, "Method Not Allowed"),
        ("GET", "/counter/d/increment", 405, "Method Not Allowed"),
        ("GET", "/elsewhere/e/value", 404, "Not Found"),
        ("GET", "/counter", 404, "Not Found"),
    ];
    for (method, path, status, detail) in cases {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let answer = w
            .client
            .request(method.clone(), w.url(path))
            .send()
            .await
            .expect("send");
        if status == 405 {
            assert!(answer.headers().contains_key("allow"), "{method} {path}");
        }
        assert_eq!(
            json(answer).await,
            (status, json!({ "detail": detail })),
            "{method} {path}"
        );
    }
    // A malformed id on an unknown route is still an unknown route (the
    // reference matches routes first).
    let (status, _) = json(w.get("/counter/a$b/nope").await).await;
    assert_eq!(status, 404);
    let stats = w.stats().await;
    assert_eq!(stats["instances"], json!([]), "{stats}");
    assert_eq!(stats["namespaces"]["/counter"]["activations"], 0);
    // A known route still activates.
    let (status, body) = json(w.post("/counter/a/increment").await).await;
    assert_eq!((status, body), (200, json!({ "value": 1 })));
}

/// Answers with the request id an outer layer attached.
struct Tagged;

#[derive(Clone)]
struct RequestId(&'static str);

impl Object for Tagged {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Tagged)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/id",
            get(|Extension(RequestId(id)): Extension<RequestId>| async move { id }),
        )
    }
}

#[tokio::test]
async fn extensions_from_outer_layers_reach_the_handlers() {
    let worker = Options::new()
        .host::<Tagged>("/tagged")
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("worker");
    let app = worker.router().layer(Extension(RequestId("req-42")));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let answer = reqwest::get(format!("{url}/tagged/x/id"))
        .await
        .expect("get");
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.expect("text"), "req-42");
}
