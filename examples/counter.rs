//! A counter per id.
//!
//! ```text
//! PORT=8080 cargo run --release --example counter
//! curl -X POST localhost:8080/counter/a/increment   # {"value":1}
//! curl localhost:8080/counter/a/value               # {"value":1}
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::{BoxError, Context, Object, Options, This};
use serde_json::{json, Value};

pub(crate) struct Counter {
    value: AtomicU64,
}

impl Object for Counter {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        let id = ctx.id().to_owned();
        ctx.on_stop(move || async move {
            println!("counter {id} evicted");
            Ok(())
        });
        Ok(Counter {
            value: AtomicU64::new(0),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/increment", post(increment))
            .route("/value", get(value))
    }
}

async fn increment(this: This<Counter>) -> Json<Value> {
    Json(json!({ "value": this.value.fetch_add(1, Ordering::SeqCst) + 1 }))
}

async fn value(this: This<Counter>) -> Json<Value> {
    Json(json!({ "value": this.value.load(Ordering::SeqCst) }))
}

#[tokio::main]
async fn main() -> Result<(), pinned::ServeError> {
    // Text or JSON (`PINNED_LOG_FORMAT`, `--log-format`) on stderr, no
    // colours unless it is a terminal; `RUST_LOG` filters (default info).
    pinned::logging::init();
    pinned::serve(Options::from_env().host::<Counter>("/counter")).await
}
