//! Durable jobs: the trays seed's `Runner`/`Jobs` example. Each runner id
//! has one tray with a queue of jobs and the list of names done; the tray's
//! handler works each job (`JOBS_WORK_MS` milliseconds, default 0), then
//! records its name, exactly once, in admission order, across crashes.
//!
//! ```text
//! PORT=8080 cargo run --example jobs
//! curl -X POST localhost:8080/runners/r1/enqueue -H 'content-type: application/json' -d '{"name":"build"}'
//! curl localhost:8080/runners/r1/done      # {"done":["build"]}
//! ```
//!
//! A client that may retry an enqueue (a lost connection, pinboard's 502)
//! sends an `Idempotency-Key` header: a repeat of a key among the runner's
//! last 128 is admitted once, and answered `{"admitted": …, "repeat": true}`.
//!
//! Store: `DATABASE_URL` (Postgres) when set, else the SQLite file `PINNED_DB_PATH` (default `pinned.db`).
//! Local mode by default; `PINBOARD_URL`, `PINBOARD_TOKEN` and
//! `ADVERTISE_URL` put it behind pinboard. Its rows are the Python
//! reference's (`tray_ns` `jobs`, id `~`, doc `{"queue": [...], "done":
//! [...]}`), so a Python worker running the seed's example on the same
//! database can take over its work, and the other way round.

use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::pinned_store::StoreConfig;
use pinned::tray::{Fields, Queue, Tray, TrayCtx, TrayHandler, Trays, Value};
use pinned::{BoxError, Context, Object, Options};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// One job. Unknown fields ride along untouched.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Job {
    name: String,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

#[derive(Default)]
struct Jobs {
    queue: Queue<Job>,
    done: Value<Vec<String>>,
}

impl Tray for Jobs {
    const NAME: &'static str = "jobs";
    type Item = Job;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
        fields.field("done", &mut self.done);
    }

    fn head(&self) -> Option<Job> {
        self.queue.front().cloned()
    }

    fn ack(&mut self, _job: &Job) {
        self.queue.pop_front();
    }
}

pub(crate) struct Runner {
    work: Duration,
}

impl Object for Runner {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        let ms = std::env::var("JOBS_WORK_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0);
        Ok(Runner {
            work: Duration::from_millis(ms),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/enqueue", post(enqueue))
            .route("/done", get(done))
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Jobs>()
    }
}

impl TrayHandler<Jobs> for Runner {
    async fn handle(&self, ctx: TrayCtx<Jobs>, job: Job) -> Result<(), BoxError> {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        // Lands in the same row write as the job's ack: exactly once.
        ctx.on_ack(move |jobs| jobs.done.push(job.name));
        Ok(())
    }
}

fn failed(error: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "detail": error.to_string() })),
    )
        .into_response()
}

async fn enqueue(ctx: Context, headers: HeaderMap, Json(job): Json<Job>) -> Response {
    let jobs = match ctx.tray::<Jobs>().await {
        Ok(jobs) => jobs,
        Err(error) => return failed(error),
    };
    let name = job.name.clone();
    let key = headers.get("idempotency-key").map(|key| key.to_str());
    let admitted = match key {
        // Without a key the reference's answer, word for word.
        None => match jobs.admit(|jobs| jobs.queue.push_back(job)) {
            Ok(receipt) => receipt.await.map(|()| json!({ "admitted": name })),
            Err(error) => Err(error),
        },
        Some(Ok(key)) => match jobs.admit_once(key, |jobs| jobs.queue.push_back(job)) {
            Ok(admission) => {
                let repeat = admission.is_repeat();
                admission
                    .receipt()
                    .await
                    .map(|()| json!({ "admitted": name, "repeat": repeat }))
            }
            Err(error) => return error.into_response(),
        },
        Some(Err(_)) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({ "detail": "the Idempotency-Key header is not visible ASCII" })),
            )
                .into_response()
        }
    };
    match admitted {
        Ok(answer) => Json(answer).into_response(),
        Err(error) => failed(error),
    }
}

async fn done(ctx: Context) -> Response {
    match ctx.tray::<Jobs>().await {
        Ok(jobs) => Json(json!({ "done": jobs.read(|jobs| (*jobs.done).clone()) })).into_response(),
        Err(error) => failed(error),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Text or JSON (`PINNED_LOG_FORMAT`, `--log-format`) on stderr, no
    // colours unless it is a terminal; `RUST_LOG` filters (default info).
    pinned::logging::init();
    let location = std::env::var("DATABASE_URL").ok();
    let file = std::env::var("PINNED_DB_PATH").unwrap_or_else(|_| "pinned.db".into());
    let store = StoreConfig::from_location(location.as_deref(), file)?
        .open()
        .await?;
    pinned::serve(Options::from_env().host::<Runner>("/runners").store(store)).await?;
    Ok(())
}
