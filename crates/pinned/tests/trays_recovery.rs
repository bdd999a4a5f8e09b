//! Trays recovering from what stops a delivery, end to end on a real worker
//! and a real SQLite file: a handler past `Tray::DISPATCH_TIMEOUT` is cut
//! off and its item delivered again; an outbox carries an item across the
//! handler's own retries and across a crash; a `delete()` interrupted by a
//! crash runs again at the next activation; a keyed tray declared
//! `keyed_always_open` opens every stored key at activation and never
//! passivates.
#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use pinned::pinned_store::{SqliteOptions, SqliteStore, TrayKey, SINGLETON_TRAY_ID};
use pinned::tray::{
    Fields, Outbox, Queue, Tray, TrayCtx, TrayError, TrayHandle, TrayHandler, Trays, Value,
};
use pinned::{BoxError, Context, Object, Options};
use serde_json::json;
use support::{eventually, json, start, TestWorker, PATIENCE};

/// The dispatch timeout of [`Slow`]: short, so a cut-off run costs little.
const SLOW_TIMEOUT: Duration = Duration::from_millis(300);

/// What the tests steer and observe, shared by every instance.
#[derive(Clone, Default)]
struct Lab {
    /// `"<tray> <item> <attempt>"` for every handler run, in order.
    runs: Arc<Mutex<Vec<String>>>,
    /// Every send of the outbox tray: `(item, outbox attempt)`.
    sends: Arc<Mutex<Vec<(String, u64)>>>,
    /// Sends fail while set.
    refuse_sends: Arc<AtomicBool>,
    /// Handlers of the keyed trays wait forever while set.
    hold: Arc<AtomicBool>,
    /// `"open <tray>/<key>"` / `"close <tray>/<key>"` of the keyed trays.
    events: Arc<Mutex<Vec<String>>>,
}

impl Lab {
    fn ran(&self, tray: &str, item: &str, attempt: u64) {
        self.runs.lock().push(format!("{tray} {item} {attempt}"));
    }
}

macro_rules! queue_tray {
    ($name:ident, $tray_name:literal $(, $konst:ident : $ty:ty = $value:expr)*) => {
        #[derive(Default)]
        struct $name {
            queue: Queue<String>,
            done: Value<Vec<String>>,
        }

        impl Tray for $name {
            const NAME: &'static str = $tray_name;
            $(const $konst: $ty = $value;)*
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
    };
}

// A singleton tray whose first delivery of each item hangs past its timeout.
queue_tray!(Slow, "slow", DISPATCH_TIMEOUT: Duration = SLOW_TIMEOUT);
// A keyed tray that opens at activation and stays open.
queue_tray!(Watch, "watch");
// A keyed tray of the default kind (opens on use, passivates when dry).
queue_tray!(Box_, "box");

/// A tray sending each item elsewhere through an outbox: the handler
/// records the send (and its attempt) durably before making it, returns
/// without acking the outbox when the send fails, and the unacked outbox
/// is the head again at once.
#[derive(Default)]
struct Sends {
    queue: Queue<String>,
    outbox: Outbox<String>,
    sent: Value<Vec<String>>,
}

impl Tray for Sends {
    const NAME: &'static str = "sends";
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
        fields.field("outbox", &mut self.outbox);
        fields.field("sent", &mut self.sent);
    }

    fn head(&self) -> Option<String> {
        self.outbox
            .item()
            .cloned()
            .or_else(|| self.queue.front().cloned())
    }

    fn ack(&mut self, item: &String) {
        // The item leaves the queue at its first delivery's ack; it may stay
        // in the outbox for the next.
        if self.queue.front() == Some(item) {
            self.queue.pop_front();
        }
    }
}

struct Runner {
    lab: Lab,
}

impl Object for Runner {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        Ok(Runner {
            lab: ctx.state().ok_or("no lab")?,
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/slow/{item}", post(slow_add))
            .route("/slow", get(slow_read))
            .route("/send/{item}", post(send_add))
            .route("/sends", get(sends_read))
            .route("/watch/{key}/{item}", post(watch_add))
            .route("/watch", get(watch_open))
            .route("/box/{key}/{item}", post(box_add))
            .route("/box/{key}", get(box_read).delete(box_delete))
            .route(
                "/abort",
                post(|ctx: Context| async move {
                    ctx.abort();
                    "aborted"
                }),
            )
    }

    fn trays() -> Trays<Self> {
        Trays::new()
            .singleton::<Slow>()
            .singleton::<Sends>()
            .keyed_always_open::<Watch>()
            .keyed::<Box_>()
    }
}

impl TrayHandler<Slow> for Runner {
    async fn handle(&self, ctx: TrayCtx<Slow>, item: String) -> Result<(), BoxError> {
        self.lab.ran("slow", &item, ctx.attempts());
        if ctx.attempts() == 1 {
            std::future::pending::<()>().await;
        }
        ctx.on_ack(move |slow| slow.done.push(item));
        Ok(())
    }
}

impl TrayHandler<Sends> for Runner {
    async fn handle(&self, ctx: TrayCtx<Sends>, item: String) -> Result<(), BoxError> {
        self.lab.ran("sends", &item, ctx.attempts());
        // In flight, durably, before the send: a crash or a failed send is
        // retried with a higher attempt.
        let (attempt, receipt) = ctx
            .tray()
            .update(|sends| sends.outbox.dispatch(item.clone()))?;
        receipt.await?;
        self.lab.sends.lock().push((item.clone(), attempt));
        if self.lab.hold.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.lab.refuse_sends.load(Ordering::SeqCst) && attempt < 3 {
            // The handler's own retry: done with this delivery, the outbox
            // keeps the item.
            return Ok(());
        }
        ctx.on_ack(move |sends| {
            sends.outbox.ack();
            sends.sent.push(item);
        });
        Ok(())
    }
}

impl Runner {
    async fn keyed_run(&self, tray: &str, key: &str, item: &str, attempt: u64) {
        self.lab.ran(tray, &format!("{key}/{item}"), attempt);
        if self.lab.hold.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    fn event(&self, what: &str, tray: &str, key: &str) {
        self.lab.events.lock().push(format!("{what} {tray}/{key}"));
    }
}

impl TrayHandler<Watch> for Runner {
    async fn handle(&self, ctx: TrayCtx<Watch>, item: String) -> Result<(), BoxError> {
        self.keyed_run("watch", ctx.key(), &item, ctx.attempts())
            .await;
        ctx.on_ack(move |watch| watch.done.push(item));
        Ok(())
    }

    async fn on_open(&self, _ctx: &Context, tray: &TrayHandle<Watch>) -> Result<(), BoxError> {
        self.event("open", "watch", tray.key());
        Ok(())
    }

    async fn on_close(&self, _ctx: &Context, tray: &TrayHandle<Watch>) -> Result<(), BoxError> {
        self.event("close", "watch", tray.key());
        Ok(())
    }
}

impl TrayHandler<Box_> for Runner {
    async fn handle(&self, ctx: TrayCtx<Box_>, item: String) -> Result<(), BoxError> {
        self.keyed_run("box", ctx.key(), &item, ctx.attempts())
            .await;
        ctx.on_ack(move |b| b.done.push(item));
        Ok(())
    }

    async fn on_close(&self, _ctx: &Context, tray: &TrayHandle<Box_>) -> Result<(), BoxError> {
        self.event("close", "box", tray.key());
        Ok(())
    }
}

fn refused(error: TrayError) -> Response {
    let status = match error {
        TrayError::NotFound { .. } => StatusCode::NOT_FOUND,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, Json(json!({ "detail": error.to_string() }))).into_response()
}

fn answer(result: Result<serde_json::Value, TrayError>) -> Response {
    match result {
        Ok(body) => Json(body).into_response(),
        Err(error) => refused(error),
    }
}

async fn slow_add(ctx: Context, Path(item): Path<String>) -> Response {
    answer(
        async {
            let slow = ctx.tray::<Slow>().await?;
            slow.admit(|slow| slow.queue.push_back(item.clone()))?
                .await?;
            Ok(json!({ "admitted": item }))
        }
        .await,
    )
}

async fn slow_read(ctx: Context) -> Response {
    answer(
        async {
            let slow = ctx.tray::<Slow>().await?;
            Ok(slow.read(|slow| json!({ "done": *slow.done, "queued": slow.queue.len() })))
        }
        .await,
    )
}

async fn send_add(ctx: Context, Path(item): Path<String>) -> Response {
    answer(
        async {
            let sends = ctx.tray::<Sends>().await?;
            sends
                .admit(|sends| sends.queue.push_back(item.clone()))?
                .await?;
            Ok(json!({ "admitted": item }))
        }
        .await,
    )
}

async fn sends_read(ctx: Context) -> Response {
    answer(
        async {
            let sends = ctx.tray::<Sends>().await?;
            Ok(sends.read(|sends| {
                json!({
                    "sent": *sends.sent,
                    "queued": sends.queue.len(),
                    "outbox": sends.outbox.item(),
                })
            }))
        }
        .await,
    )
}

async fn watch_add(ctx: Context, Path((key, item)): Path<(String, String)>) -> Response {
    answer(
        async {
            let watch = ctx.keyed::<Watch>()?.get_or_create(&key).await?;
            watch
                .admit(|watch| watch.queue.push_back(item.clone()))?
                .await?;
            Ok(json!({ "admitted": item }))
        }
        .await,
    )
}

async fn watch_open(ctx: Context) -> Response {
    answer(
        async {
            let mut open = ctx.keyed::<Watch>()?.open_keys();
            open.sort();
            Ok(json!({ "open": open }))
        }
        .await,
    )
}

async fn box_add(ctx: Context, Path((key, item)): Path<(String, String)>) -> Response {
    answer(
        async {
            let tray = ctx.keyed::<Box_>()?.get_or_create(&key).await?;
            tray.admit(|b| b.queue.push_back(item.clone()))?.await?;
            Ok(json!({ "admitted": item }))
        }
        .await,
    )
}

async fn box_read(ctx: Context, Path(key): Path<String>) -> Response {
    answer(
        async {
            let tray = ctx.keyed::<Box_>()?.get(&key).await?;
            Ok(tray.read(|b| json!({ "done": *b.done })))
        }
        .await,
    )
}

async fn box_delete(ctx: Context, Path(key): Path<String>) -> Response {
    answer(
        async {
            ctx.keyed::<Box_>()?.delete(&key).await?;
            Ok(json!({ "deleted": key }))
        }
        .await,
    )
}

struct Setup {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    store: Arc<SqliteStore>,
}

async fn sqlite() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trays.db");
    let store = Arc::new(
        SqliteStore::open(&path, SqliteOptions::default())
            .await
            .unwrap(),
    );
    Setup {
        _dir: dir,
        path,
        store,
    }
}

impl Setup {
    /// The same file opened again, as a restarted worker's process would.
    async fn reopen(&self) -> Arc<SqliteStore> {
        Arc::new(
            SqliteStore::open(&self.path, SqliteOptions::default())
                .await
                .unwrap(),
        )
    }
}

async fn worker(store: Arc<SqliteStore>, lab: &Lab) -> TestWorker {
    start(
        Options::new()
            .host::<Runner>("/runners")
            .state(lab.clone())
            .store(store),
    )
    .await
}

/// The stored row `(tray_ns, tray_id)` of `/runners/<id>`.
async fn row(
    store: &SqliteStore,
    id: &str,
    tray_ns: &str,
    tray_id: &str,
) -> Option<(bool, serde_json::Value)> {
    support::stored_tray(store, "/runners", id, TrayKey::new(tray_ns, tray_id)).await
}

#[tokio::test]
async fn a_handler_past_its_dispatch_timeout_is_cut_off_and_its_item_delivered_again() {
    let setup = sqlite().await;
    let lab = Lab::default();
    let w = worker(setup.store.clone(), &lab).await;
    let admitted = tokio::time::Instant::now();
    for item in ["a", "b"] {
        assert_eq!(
            json(w.post(&format!("/runners/t/slow/{item}")).await)
                .await
                .0,
            200
        );
    }
    eventually("both items done", PATIENCE, || async {
        let body = json(w.get("/runners/t/slow").await).await.1;
        (body["done"] == json!(["a", "b"])).then_some(())
    })
    .await;
    // Each item's first run hung and was cut off at the timeout; the second ran.
    assert_eq!(
        *lab.runs.lock(),
        ["slow a 1", "slow a 2", "slow b 1", "slow b 2"]
    );
    assert!(
        admitted.elapsed() >= SLOW_TIMEOUT * 2,
        "two runs cut off after {SLOW_TIMEOUT:?} each, done in {:?}",
        admitted.elapsed()
    );
    eventually("the row at rest", PATIENCE, || async {
        (row(&setup.store, "t", "slow", SINGLETON_TRAY_ID).await
            == Some((false, json!({ "done": ["a", "b"] }))))
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_outbox_carries_its_item_across_the_handlers_retries_and_a_crash() {
    let setup = sqlite().await;
    let lab = Lab::default();
    lab.refuse_sends.store(true, Ordering::SeqCst);
    let w = worker(setup.store.clone(), &lab).await;
    assert_eq!(json(w.post("/runners/o/send/a").await).await.0, 200);
    eventually("a sent on its third attempt", PATIENCE, || async {
        let body = json(w.get("/runners/o/sends").await).await.1;
        (body["sent"] == json!(["a"])).then_some(())
    })
    .await;
    // Two failed sends returned from the handler: each time the outbox was
    // the head again, at once, its attempt one higher; each delivery was a
    // fresh one (the handler returned), not a redelivery.
    assert_eq!(
        *lab.sends.lock(),
        [
            ("a".to_owned(), 1),
            ("a".to_owned(), 2),
            ("a".to_owned(), 3)
        ]
    );
    assert_eq!(*lab.runs.lock(), ["sends a 1", "sends a 1", "sends a 1"]);
    let body = json(w.get("/runners/o/sends").await).await.1;
    assert_eq!(body, json!({ "sent": ["a"], "queued": 0, "outbox": null }));

    // A crash mid-send: the outbox entry, durable before the send, brings
    // the attempt back to the next activation.
    lab.refuse_sends.store(false, Ordering::SeqCst);
    lab.hold.store(true, Ordering::SeqCst);
    assert_eq!(json(w.post("/runners/o/send/b").await).await.0, 200);
    eventually("b in flight", PATIENCE, || async {
        (lab.sends.lock().len() == 4).then_some(())
    })
    .await;
    let stored = row(&setup.store, "o", "sends", SINGLETON_TRAY_ID).await;
    let (marked, doc) = stored.unwrap();
    assert!(marked);
    assert_eq!(doc["outbox"], json!({ "item": "b", "attempt": 1 }));
    assert_eq!(json(w.post("/runners/o/abort").await).await.0, 200);
    lab.hold.store(false, Ordering::SeqCst);
    eventually("b sent after the crash", PATIENCE, || async {
        let body = json(w.get("/runners/o/sends").await).await.1;
        (body["sent"] == json!(["a", "b"])).then_some(())
    })
    .await;
    assert_eq!(
        lab.sends.lock()[3..],
        [("b".to_owned(), 1), ("b".to_owned(), 2)]
    );
    eventually("the row at rest, the outbox empty", PATIENCE, || async {
        let (marked, doc) = row(&setup.store, "o", "sends", SINGLETON_TRAY_ID).await?;
        (!marked && doc.get("outbox").is_none() && doc["sent"] == json!(["a", "b"])).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_delete_interrupted_by_a_crash_runs_again_at_the_next_activation() {
    let setup = sqlite().await;
    let lab = Lab::default();
    lab.hold.store(true, Ordering::SeqCst);
    let first = worker(setup.store.clone(), &lab).await;
    assert_eq!(json(first.post("/runners/d/box/k/x").await).await.0, 200);
    eventually("the handler in hand", PATIENCE, || async {
        (lab.runs.lock().len() == 1).then_some(())
    })
    .await;
    // The delete waits for the run in hand, which never ends: its command
    // is durable, the row delete not yet.
    let url = first.url("/runners/d/box/k");
    let client = first.client.clone();
    let waiting = tokio::spawn(async move { client.delete(url).send().await });
    eventually("the delete command durable", PATIENCE, || async {
        let (marked, doc) = row(&setup.store, "d", "box", "k").await?;
        (marked && doc["~inbox"] == json!([{ "command": "delete" }])).then_some(())
    })
    .await;
    // The worker goes away (a crash, as far as the tray can tell).
    first.worker.close().await;
    waiting.abort();
    assert!(row(&setup.store, "d", "box", "k").await.is_some());

    let lab2 = Lab::default();
    let store = setup.reopen().await;
    let second = worker(store.clone(), &lab2).await;
    // No request: the marked row wakes the instance, and its pump runs the
    // command before any item.
    eventually("the row deleted by the new worker", PATIENCE, || async {
        row(&store, "d", "box", "k").await.is_none().then_some(())
    })
    .await;
    // The tray closes after its row is gone.
    eventually("the deleted tray closed", PATIENCE, || async {
        (*lab2.events.lock() == ["close box/k"]).then_some(())
    })
    .await;
    assert!(lab2.runs.lock().is_empty(), "{:?}", lab2.runs.lock());
    let (status, body) = json(second.get("/runners/d/box/k").await).await;
    assert_eq!(status, 404, "the key is free: {body}");
}

#[tokio::test]
async fn an_always_open_keyed_tray_opens_every_stored_key_at_activation_and_stays_open() {
    let setup = sqlite().await;
    let lab = Lab::default();
    let first = worker(setup.store.clone(), &lab).await;
    for (key, item) in [("a", "x"), ("b", "y")] {
        assert_eq!(
            json(first.post(&format!("/runners/w/watch/{key}/{item}")).await)
                .await
                .0,
            200
        );
    }
    // And a tray of the default kind, for contrast: it passivates when dry.
    assert_eq!(json(first.post("/runners/w/box/c/z").await).await.0, 200);
    eventually("every tray drained", PATIENCE, || async {
        let a = row(&setup.store, "w", "watch", "a").await?;
        let b = row(&setup.store, "w", "watch", "b").await?;
        let c = row(&setup.store, "w", "box", "c").await?;
        (!a.0 && !b.0 && !c.0).then_some(())
    })
    .await;
    eventually("the box tray passivated", PATIENCE, || async {
        lab.events
            .lock()
            .contains(&"close box/c".to_owned())
            .then_some(())
    })
    .await;
    // Dry, and still open.
    let (_, body) = json(first.get("/runners/w/watch").await).await;
    assert_eq!(body, json!({ "open": ["a", "b"] }));
    assert!(!lab
        .events
        .lock()
        .iter()
        .any(|e| e.starts_with("close watch/")));
    first.worker.close().await;

    // A new activation opens both stored keys (unmarked rows) by itself.
    let lab2 = Lab::default();
    let store = setup.reopen().await;
    let second = worker(store, &lab2).await;
    let (_, body) = json(second.get("/runners/w/watch").await).await;
    assert_eq!(body, json!({ "open": ["a", "b"] }));
    let mut events = lab2.events.lock().clone();
    events.sort();
    assert_eq!(events, ["open watch/a", "open watch/b"]);
    assert!(lab2.runs.lock().is_empty(), "nothing was left to run");
}
