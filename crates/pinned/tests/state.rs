//! Application state given once with `Options::state` reaches handlers
//! (`State<S>`) and activation (`ctx.state()`), shared by every instance;
//! a state that was never given answers 500.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use pinned::{BoxError, Context, Object, Options, State};
use serde_json::json;
use support::{json, start};

/// Shared by every instance: counts visits across all of them.
#[derive(Clone)]
struct Hits(Arc<AtomicU64>);

#[derive(Clone)]
struct Greeting(&'static str);

#[derive(Clone)]
struct NeverGiven;

struct Visitor {
    greeting: &'static str,
}

impl Object for Visitor {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        let Greeting(greeting) = ctx.state().ok_or("no greeting")?;
        Ok(Visitor { greeting })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/visit",
                get(
                    |this: pinned::This<Visitor>, State(Hits(hits)): State<Hits>| async move {
                        let total = hits.fetch_add(1, Ordering::SeqCst) + 1;
                        Json(json!({ "greeting": this.greeting, "total": total }))
                    },
                ),
            )
            .route(
                "/missing",
                get(|_: State<NeverGiven>| async { "unreachable" }),
            )
    }
}

#[tokio::test]
async fn state_reaches_handlers_and_activation() {
    let hits = Hits(Arc::new(AtomicU64::new(0)));
    let w = start(
        Options::new()
            .host::<Visitor>("/v")
            .state(hits.clone())
            .state(Greeting("hello")),
    )
    .await;
    for (id, total) in [("a", 1), ("b", 2), ("a", 3)] {
        let (status, body) = json(w.get(&format!("/v/{id}/visit")).await).await;
        assert_eq!(status, 200);
        assert_eq!(body, json!({ "greeting": "hello", "total": total }));
    }
    assert_eq!(hits.0.load(Ordering::SeqCst), 3);
    let (status, body) = json(w.get("/v/a/missing").await).await;
    assert_eq!(
        (status, body),
        (500, json!({ "detail": "Internal Server Error" }))
    );
}
