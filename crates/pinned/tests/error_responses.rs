//! The library's errors answer requests themselves: handlers of a real
//! worker return `Result<_, TrayError>` (or the store's, the alarm's, the
//! cluster's error) and use `?`; each mapped case is asserted by status,
//! body shape (`{"detail": …}` and nothing else), detail and
//! `Retry-After`, including a store outage and a lost fence. Auth denials
//! keep `{"message": …}`.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::Path;
use axum::routing::{get, post};
use axum::{Json, Router};
use http::request::Parts;
use pinned::pinned_store::{
    Doc, FailingStore, InstanceKey, MemoryStore, Outage, StateStore, TrayKey,
};
use pinned::tray::{Fields, Queue, Tray, TrayCtx, TrayError, TrayHandler, Trays};
use pinned::{
    AlarmError, AuthError, BoxError, ClusterError, Context, Denial, InstanceStoreError, Object,
    Options, Routes,
};
use serde_json::{json, Value as Json_};

use support::{start, TestWorker};

/// A keyed tray whose items are acknowledged as they come.
#[derive(Default)]
struct Inbox {
    queue: Queue<String>,
}

impl Tray for Inbox {
    const NAME: &'static str = "inbox";
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
    }

    fn head(&self) -> Option<String> {
        self.queue.front().cloned()
    }

    fn ack(&mut self, _item: &String) {
        self.queue.pop_front();
    }
}

/// An object whose handlers only use `?`.
struct Desk;

impl Object for Desk {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Desk)
    }

    fn routes() -> Routes<Self> {
        Router::new()
            .route("/ping", get(|| async { "pong" }))
            .route("/inbox/{key}", get(inbox_get).post(inbox_post))
            .route("/inbox-empty-key", get(inbox_empty_key))
            .route("/inbox/{key}/more", post(inbox_more))
            .route("/inbox/{key}/unpark", post(inbox_unpark))
            .route("/inbox/{key}/deleted", post(inbox_write_after_delete))
            .route("/inbox/{key}/storage/{name}", post(inbox_storage))
            .route("/note", get(note_get).post(note_post))
            .route("/note-as-number", get(note_as_number))
            .route("/reserved", post(reserved))
            .route("/schedule/{name}", post(schedule))
            .route("/alarm-before-1970", post(alarm_before_1970))
            .route("/call/{*path}", get(call))
            .route("/private", get(|| async { "secret" }))
    }

    fn trays() -> Trays<Self> {
        Trays::new().keyed::<Inbox>()
    }

    async fn authorize(_ctx: &Context, request: &Parts) -> Result<(), AuthError> {
        if request.uri.path().ends_with("/private") {
            match request.headers.get("x-who").map(|v| v.as_bytes()) {
                None => return Err(Denial::unauthorized("missing x-who").into()),
                Some(b"mallory") => return Err(Denial::forbidden("not a member").into()),
                Some(b"broken") => return Err("directory service down".into()),
                Some(_) => {}
            }
        }
        Ok(())
    }
}

impl TrayHandler<Inbox> for Desk {
    async fn handle(&self, _ctx: TrayCtx<Inbox>, _item: String) -> Result<(), BoxError> {
        Ok(())
    }
}

async fn inbox_get(ctx: Context, Path(key): Path<String>) -> Result<Json<Json_>, TrayError> {
    let inbox = ctx.keyed::<Inbox>()?.get(&key).await?;
    Ok(Json(
        json!({ "queued": inbox.read(|inbox| inbox.queue.len()) }),
    ))
}

async fn inbox_post(ctx: Context, Path(key): Path<String>) -> Result<Json<Json_>, TrayError> {
    let inbox = ctx.keyed::<Inbox>()?.get_or_create(&key).await?;
    inbox
        .admit(|inbox| inbox.queue.push_back("hello".into()))?
        .await?;
    Ok(Json(json!({ "admitted": true })))
}

async fn inbox_more(ctx: Context, Path(key): Path<String>) -> Result<Json<Json_>, TrayError> {
    let inbox = ctx.keyed::<Inbox>()?.get(&key).await?;
    inbox
        .admit(|inbox| inbox.queue.push_back("more".into()))?
        .await?;
    Ok(Json(json!({ "admitted": true })))
}

async fn inbox_empty_key(ctx: Context) -> Result<&'static str, TrayError> {
    ctx.keyed::<Inbox>()?.get("").await?;
    Ok("unreachable")
}

async fn inbox_unpark(ctx: Context, Path(key): Path<String>) -> Result<&'static str, TrayError> {
    let inbox = ctx.keyed::<Inbox>()?.get_or_create(&key).await?;
    inbox.unpark()?.await?;
    Ok("unparked")
}

async fn inbox_write_after_delete(
    ctx: Context,
    Path(key): Path<String>,
) -> Result<&'static str, TrayError> {
    let inbox = ctx.keyed::<Inbox>()?.get_or_create(&key).await?;
    inbox.delete().await?;
    inbox
        .admit(|inbox| inbox.queue.push_back("late".into()))?
        .await?;
    Ok("written")
}

async fn inbox_storage(
    ctx: Context,
    Path((key, name)): Path<(String, String)>,
) -> Result<&'static str, TrayError> {
    let inbox = ctx.keyed::<Inbox>()?.get_or_create(&key).await?;
    inbox.storage_set(&name, &1)?.await?;
    Ok("stored")
}

async fn note_get(ctx: Context) -> Result<Json<Json_>, InstanceStoreError> {
    let store = ctx.store().expect("a store is configured");
    let note: Option<Json_> = store.get("notes", "~").await?;
    Ok(Json(json!({ "note": note })))
}

async fn note_post(ctx: Context) -> Result<&'static str, InstanceStoreError> {
    let store = ctx.store().expect("a store is configured");
    store.put("notes", "~", &json!({ "text": "hi" })).await?;
    Ok("saved")
}

async fn note_as_number(ctx: Context) -> Result<String, InstanceStoreError> {
    let store = ctx.store().expect("a store is configured");
    let number: Option<u64> = store.get("notes", "~").await?;
    Ok(format!("{number:?}"))
}

async fn reserved(ctx: Context) -> Result<&'static str, InstanceStoreError> {
    let store = ctx.store().expect("a store is configured");
    store.put("pinned", "mine", &json!({})).await?;
    Ok("written")
}

async fn schedule(ctx: Context, Path(name): Path<String>) -> Result<&'static str, AlarmError> {
    // A name longer than the limit comes from the path as it is.
    ctx.schedule(&name).after(Duration::from_secs(3600)).await?;
    Ok("scheduled")
}

async fn alarm_before_1970(ctx: Context) -> Result<&'static str, AlarmError> {
    let before = SystemTime::UNIX_EPOCH - Duration::from_secs(60);
    ctx.alarm().set(Some(before)).await?;
    Ok("set")
}

async fn call(ctx: Context, Path(path): Path<String>) -> Result<&'static str, ClusterError> {
    ctx.cluster().get(&path).await?;
    Ok("called")
}

/// Status, `Retry-After` and body of `response`.
async fn answer(response: reqwest::Response) -> (u16, Option<String>, Json_) {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().expect("ascii").to_owned());
    let body = response.json().await.expect("a JSON body");
    (status, retry_after, body)
}

/// Asserts a `{"detail": detail}` answer (no other key) with `status`.
async fn assert_detail(
    response: reqwest::Response,
    status: u16,
    retry_after: Option<&str>,
    detail: &str,
) {
    let (got, got_retry, body) = answer(response).await;
    assert_eq!(
        (got, got_retry.as_deref(), &body),
        (status, retry_after, &json!({ "detail": detail })),
    );
}

async fn desk(store: Arc<dyn StateStore>) -> TestWorker {
    start(Options::new().host::<Desk>("/desks").store(store)).await
}

#[tokio::test]
async fn tray_errors_answer_with_the_reference_shape() {
    let w = desk(Arc::new(MemoryStore::new())).await;

    // The reference's KeyError text for a key never created.
    assert_detail(
        w.get("/desks/a/inbox/nobody").await,
        404,
        None,
        "tray inbox/nobody does not exist",
    )
    .await;
    assert_detail(
        w.get("/desks/a/inbox-empty-key").await,
        400,
        None,
        "a keyed tray needs a non-empty key",
    )
    .await;
    assert_detail(
        w.post("/desks/a/inbox/k/storage/~dispatch").await,
        400,
        None,
        "invalid tray storage name \"~dispatch\": it must be non-empty, not start with '~', and not name a declared field",
    )
    .await;
    assert_detail(
        w.post("/desks/a/inbox/k/unpark").await,
        409,
        None,
        "tray inbox/k is not parked",
    )
    .await;
    assert_detail(
        w.post("/desks/a/inbox/gone/deleted").await,
        409,
        None,
        "tray inbox/gone is deleted; writes are rejected",
    )
    .await;

    // And the happy path still answers the handler's own body.
    let (status, _, body) = answer(w.post("/desks/a/inbox/k").await).await;
    assert_eq!((status, body), (200, json!({ "admitted": true })));
}

#[tokio::test]
async fn instance_store_and_alarm_errors_answer_with_the_reference_shape() {
    let w = desk(Arc::new(MemoryStore::new())).await;

    assert_detail(
        w.post("/desks/b/reserved").await,
        400,
        None,
        "tray namespace \"pinned\" is reserved for pinned itself",
    )
    .await;
    // A stored doc that does not decode is the server's fault: a generic
    // 500 that names neither the row nor the type.
    assert_eq!(w.post("/desks/b/note").await.status(), 200);
    assert_detail(
        w.get("/desks/b/note-as-number").await,
        500,
        None,
        "Internal Server Error",
    )
    .await;

    let long = "n".repeat(300);
    assert_detail(
        w.post(&format!("/desks/b/schedule/{long}")).await,
        400,
        None,
        "a schedule name must be 1 to 256 bytes",
    )
    .await;
    assert_detail(
        w.post("/desks/b/alarm-before-1970").await,
        400,
        None,
        "invalid alarm time",
    )
    .await;
}

#[tokio::test]
async fn cluster_errors_from_the_app_are_the_servers_fault() {
    let w = desk(Arc::new(MemoryStore::new())).await;
    // A path that is not /<ns>/<id>/..., and a namespace nobody hosts in
    // local mode: mistakes of the app, answered 500 without their text.
    assert_detail(
        w.get("/desks/c/call/nowhere").await,
        500,
        None,
        "Internal Server Error",
    )
    .await;
    assert_detail(
        w.get("/desks/c/call/elsewhere/x/y").await,
        500,
        None,
        "Internal Server Error",
    )
    .await;
}

#[tokio::test]
async fn a_store_outage_answers_503_with_retry_after_and_no_internals() {
    let store = Arc::new(FailingStore::passing(Arc::new(MemoryStore::new())));
    let w = desk(store.clone()).await;
    assert_eq!(w.get("/desks/o/ping").await.status(), 200);

    store.set_outage(Outage::All);
    for path in ["/desks/o/note", "/desks/o/inbox/fresh"] {
        let (status, retry_after, body) = answer(w.get(path).await).await;
        assert_eq!(
            (status, retry_after.as_deref(), &body),
            (
                503,
                Some("1"),
                &json!({ "detail": "state store unavailable; retry" })
            ),
            "{path}"
        );
        assert!(
            !body.to_string().contains("10.0.0.9"),
            "the cause stays in the log"
        );
    }

    // Back up: the same requests succeed; nothing was poisoned.
    store.set_outage(Outage::None);
    assert_eq!(w.get("/desks/o/note").await.status(), 200);
    assert_detail(
        w.get("/desks/o/inbox/fresh").await,
        404,
        None,
        "tray inbox/fresh does not exist",
    )
    .await;
}

#[tokio::test]
async fn a_tray_write_that_fails_during_an_outage_answers_instance_aborted() {
    let store = Arc::new(FailingStore::passing(Arc::new(MemoryStore::new())));
    let w = desk(store.clone()).await;
    assert_eq!(w.post("/desks/p/inbox/k").await.status(), 200);

    // The tray opens (its row reads), then the admission's flush fails:
    // the tray is poisoned and the instance aborted, as the reference
    // does, and the request answers its refusal.
    store.set_outage(Outage::Writes);
    assert_detail(
        w.post("/desks/p/inbox/k/more").await,
        503,
        None,
        "instance aborted",
    )
    .await;

    // The next request after the outage activates afresh.
    store.set_outage(Outage::None);
    let (status, _, body) = answer(w.post("/desks/p/inbox/k").await).await;
    assert_eq!((status, body), (200, json!({ "admitted": true })));
}

#[tokio::test]
async fn a_lost_fence_answers_instance_aborted() {
    let store = Arc::new(MemoryStore::new());
    let w = desk(store.clone()).await;
    assert_eq!(w.get("/desks/f/ping").await.status(), 200);

    // A newer activation (epoch 5) wrote the id's rows behind this one's
    // back (local mode writes at epoch 0).
    store
        .set_tray(
            InstanceKey::new("/desks", "f"),
            TrayKey::new("elsewhere", "~"),
            false,
            Doc::new(),
            5,
        )
        .await
        .expect("a write at the newer epoch");
    assert_detail(w.post("/desks/f/note").await, 503, None, "instance aborted").await;
}

#[tokio::test]
async fn auth_denials_keep_the_message_shape() {
    let w = desk(Arc::new(MemoryStore::new())).await;
    let private = |who: Option<&'static str>| {
        let mut request = w.client.get(w.url("/desks/d/private"));
        if let Some(who) = who {
            request = request.header("x-who", who);
        }
        request.send()
    };
    let (status, _, body) = answer(private(None).await.expect("sent")).await;
    assert_eq!((status, body), (401, json!({ "message": "missing x-who" })));
    let (status, _, body) = answer(private(Some("mallory")).await.expect("sent")).await;
    assert_eq!((status, body), (403, json!({ "message": "not a member" })));
    // An authorizer that fails (not a denial) is the reference's detail.
    let (status, retry_after, body) = answer(private(Some("broken")).await.expect("sent")).await;
    assert_eq!(
        (status, retry_after, body),
        (503, None, json!({ "detail": "authorization failed" }))
    );
    assert_eq!(private(Some("alice")).await.expect("sent").status(), 200);
}
