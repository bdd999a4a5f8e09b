//! An object behind `Object::authorize`, for the fleet tests of denials: a
//! request without an `x-user` header is denied (401) before the instance
//! activates; with one it is served (`GET /hit` counts, as the counter's).

use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::request::Parts;
use axum::routing::get;
use axum::{Json, Router};
use pinned::{AuthError, BoxError, Context, Denial, Object, This};
use serde_json::{json, Value};

use crate::counter::process_token;

/// The guarded object: `GET /hit` for callers naming themselves.
pub struct Guarded {
    id: String,
    count: AtomicU64,
}

async fn hit(this: This<Guarded>) -> Json<Value> {
    let count = this.count.fetch_add(1, Ordering::SeqCst) + 1;
    Json(json!({ "id": this.id, "count": count, "process": process_token() }))
}

impl Object for Guarded {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        Ok(Guarded {
            id: ctx.id().to_owned(),
            count: AtomicU64::new(0),
        })
    }

    async fn authorize(_ctx: &Context, request: &Parts) -> Result<(), AuthError> {
        match request.headers.get("x-user") {
            Some(_) => Ok(()),
            None => Err(Denial::unauthorized("who are you?"))?,
        }
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/hit", get(hit))
    }
}
