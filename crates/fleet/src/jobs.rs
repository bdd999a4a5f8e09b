//! A job queue on one singleton tray, for the storage inspector's fleet
//! tests: `POST /enqueue/{name}` admits a job, `GET /done` reads the tray.
//! A job whose name starts with `poison` always fails, so after
//! [`JobQueue::MAX_ATTEMPTS`] deliveries the tray parks.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::tray::{Fields, Queue, Tray, TrayCtx, TrayHandler, Trays, Value};
use pinned::{BoxError, Context, Object};
use serde_json::json;

/// The tray: queued job names and the names done.
#[derive(Default)]
pub struct JobQueue {
    queue: Queue<String>,
    done: Value<Vec<String>>,
}

impl Tray for JobQueue {
    const NAME: &'static str = "jobs";
    const MAX_ATTEMPTS: u64 = 2;
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
        fields.field("done", &mut self.done);
    }

    fn head(&self) -> Option<String> {
        self.queue.front().cloned()
    }

    fn ack(&mut self, _item: &String) {
        self.queue.pop_front();
    }
}

/// The object holding the tray.
pub struct Jobs;

impl Object for Jobs {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Jobs)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/enqueue/{name}", post(enqueue))
            .route("/done", get(done))
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<JobQueue>()
    }
}

impl TrayHandler<JobQueue> for Jobs {
    async fn handle(&self, ctx: TrayCtx<JobQueue>, name: String) -> Result<(), BoxError> {
        if name.starts_with("poison") {
            return Err(format!("{name} always fails").into());
        }
        ctx.on_ack(move |jobs| jobs.done.push(name));
        Ok(())
    }
}

fn failed(error: impl std::fmt::Display) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({ "detail": error.to_string() })),
    )
        .into_response()
}

async fn enqueue(ctx: Context, Path(name): Path<String>) -> Response {
    let admitted = async {
        let jobs = ctx.tray::<JobQueue>().await?;
        jobs.admit(|jobs| jobs.queue.push_back(name.clone()))?.await
    };
    match admitted.await {
        Ok(()) => Json(json!({ "admitted": name })).into_response(),
        Err(error) => failed(error),
    }
}

async fn done(ctx: Context) -> Response {
    match ctx.tray::<JobQueue>().await {
        Ok(jobs) => Json(json!({
            "done": jobs.read(|jobs| (*jobs.done).clone()),
            "queued": jobs.read(|jobs| jobs.queue.len()),
            "parked": jobs.parked(),
        }))
        .into_response(),
        Err(error) => failed(error),
    }
}
