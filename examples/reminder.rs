//! Durable reminders: `POST /reminder/<id>/in?seconds=N` sets the
//! instance's alarm; when it is due the handler logs it, even if the
//! instance was evicted meanwhile or the process restarted (the alarm lives
//! in the embedded store file; `DATABASE_URL=postgres://...` picks Postgres
//! instead).
//!
//! ```text
//! PORT=8080 cargo run --example reminder
//! curl -X POST 'localhost:8080/reminder/tea/in?seconds=5'
//! curl localhost:8080/reminder/tea/when
//! ```

use std::time::{Duration, UNIX_EPOCH};

use axum::extract::Query;
use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::pinned_store::StoreConfig;
use pinned::{BoxError, Call, Context, Object, Options};
use serde::Deserialize;
use serde_json::{json, Value};

struct Reminder;

#[derive(Deserialize)]
struct In {
    seconds: u64,
}

impl Object for Reminder {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Reminder)
    }

    // Runs when the alarm is due, activating the id again if it was evicted.
    async fn alarm(&self, ctx: &Context) -> Result<(), BoxError> {
        println!("reminder {} is due", ctx.id());
        Ok(())
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/in",
                post(|call: Call, Query(q): Query<In>| async move {
                    match call
                        .ctx()
                        .alarm()
                        .set_in(Duration::from_secs(q.seconds))
                        .await
                    {
                        Ok(()) => Json(json!({ "ok": true })),
                        Err(error) => Json(json!({ "error": error.to_string() })),
                    }
                }),
            )
            .route(
                "/when",
                get(|call: Call| async move {
                    let at = call.ctx().alarm().get().await.ok().flatten();
                    let ms = at
                        .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
                        .map(|d| d.as_millis() as u64);
                    Json(json!({ "at": ms.map_or(Value::Null, Value::from) }))
                }),
            )
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Text or JSON (`PINNED_LOG_FORMAT`, `--log-format`) on stderr, no
    // colours unless it is a terminal; `RUST_LOG` filters (default info).
    pinned::logging::init();
    let location = std::env::var("DATABASE_URL").ok();
    let store = StoreConfig::from_location(location.as_deref(), "pinned-reminders.db")?
        .open()
        .await?;
    pinned::serve(
        Options::from_env()
            .host::<Reminder>("/reminder")
            .store(store),
    )
    .await?;
    Ok(())
}
