//! Trays end to end on a real worker and a real SQLite file: admission
//! receipts, ordered at-least-once dispatch with `on_ack` edits landing
//! with the ack, parking and unparking, cancel, keyed trays (create, get,
//! passivate, delete), ad-hoc storage, schema versions, refusal of rows
//! that match no declaration, resuming marked work in a new worker
//! with no request arriving, and the worker's storage inspector
//! (`/_pinned/state/…`: list, show, skip, unpark, pause, resume, delete).
#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use pinned::pinned_store::{
    FailingStore, InstanceKey, MemoryStore, SqliteOptions, SqliteStore, StateStore, TrayKey,
};
use pinned::tray::{
    Fields, Queue, Tray, TrayCtx, TrayError, TrayHandle, TrayHandler, Trays, Value,
};
use pinned::{BoxError, Context, Object, Options, State};
use serde_json::json;
use support::{eventually, json, start, TestWorker, PATIENCE};

/// What the tests steer and observe, shared by every instance.
#[derive(Clone)]
struct Lab {
    /// Handlers fail while set.
    fail: Arc<AtomicBool>,
    /// Handlers wait for a permit while set.
    hold: Arc<AtomicBool>,
    release: Arc<tokio::sync::Semaphore>,
    /// Every handler run, in order.
    runs: Arc<Mutex<Vec<String>>>,
    /// `on_open`/`on_close` of keyed trays, as `"open <key>"`/`"close <key>"`.
    events: Arc<Mutex<Vec<String>>>,
    /// Every run of the `jobs` handler with its delivery count, in order.
    deliveries: Arc<Mutex<Vec<(String, u64)>>>,
}

impl Default for Lab {
    fn default() -> Self {
        Self {
            fail: Arc::default(),
            hold: Arc::default(),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
            runs: Arc::default(),
            events: Arc::default(),
            deliveries: Arc::default(),
        }
    }
}

#[derive(Default)]
struct Jobs {
    queue: Queue<String>,
    done: Value<Vec<String>>,
}

impl Tray for Jobs {
    const NAME: &'static str = "jobs";
    const MAX_ATTEMPTS: u64 = 3;
    const ADMISSION_WINDOW: usize = 3;
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

/// A keyed tray type.
#[derive(Default)]
struct Inbox {
    queue: Queue<String>,
    seen: Value<Vec<String>>,
}

impl Tray for Inbox {
    const NAME: &'static str = "inbox";
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
        fields.field("seen", &mut self.seen);
    }

    fn head(&self) -> Option<String> {
        self.queue.front().cloned()
    }

    fn ack(&mut self, _item: &String) {
        self.queue.pop_front();
    }
}

/// An intake tray: keeps dispatching while the instance winds down.
#[derive(Default)]
struct Intake {
    queue: Queue<String>,
    done: Value<Vec<String>>,
}

impl Tray for Intake {
    const NAME: &'static str = "intake";
    const DRAIN_ON_EVICTION: bool = true;
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
            .route("/enqueue/{name}", post(enqueue))
            .route("/once/{key}/{name}", post(enqueue_once))
            .route("/done", get(done))
            .route("/unpark", post(unpark))
            .route("/cancel", post(cancel))
            .route("/storage/{name}", get(storage_get).post(storage_set))
            .route("/keyed/{key}", get(keyed_get).delete(keyed_delete))
            .route("/keyed/{key}/{name}", post(keyed_add))
            .route("/open", get(open_keys))
            .route("/intake/{name}", post(intake))
            .route("/wind-down", post(wind))
            .route("/noop", post(noop))
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
            .singleton::<Jobs>()
            .keyed::<Inbox>()
            .singleton::<Intake>()
    }
}

impl Runner {
    async fn work(&self, name: &str) -> Result<(), BoxError> {
        self.lab.runs.lock().push(name.to_owned());
        if self.lab.hold.load(Ordering::SeqCst) {
            self.lab.release.acquire().await?.forget();
        }
        if self.lab.fail.load(Ordering::SeqCst) {
            return Err(format!("{name} failed on purpose").into());
        }
        Ok(())
    }
}

impl TrayHandler<Jobs> for Runner {
    async fn handle(&self, ctx: TrayCtx<Jobs>, name: String) -> Result<(), BoxError> {
        self.lab
            .deliveries
            .lock()
            .push((name.clone(), ctx.attempts()));
        self.work(&name).await?;
        if let Some(next) = name.strip_prefix("then-") {
            // An admission made while this run is under way, as a client's
            // arriving mid-run would be; the yields let the tray's store
            // writer run before this run acks.
            let jobs = ctx.context().tray::<Jobs>().await?;
            let receipt = jobs.admit(|jobs| jobs.queue.push_back(next.to_owned()))?;
            drop(receipt);
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
        }
        ctx.on_ack(move |jobs| jobs.done.push(name));
        Ok(())
    }
}

impl TrayHandler<Inbox> for Runner {
    async fn handle(&self, ctx: TrayCtx<Inbox>, name: String) -> Result<(), BoxError> {
        self.work(&name).await?;
        ctx.on_ack(move |inbox| inbox.seen.push(name));
        Ok(())
    }

    async fn on_open(&self, _ctx: &Context, tray: &TrayHandle<Inbox>) -> Result<(), BoxError> {
        self.lab.events.lock().push(format!("open {}", tray.key()));
        Ok(())
    }

    async fn on_close(&self, _ctx: &Context, tray: &TrayHandle<Inbox>) -> Result<(), BoxError> {
        self.lab.events.lock().push(format!("close {}", tray.key()));
        Ok(())
    }
}

impl TrayHandler<Intake> for Runner {
    async fn handle(&self, ctx: TrayCtx<Intake>, name: String) -> Result<(), BoxError> {
        self.work(&name).await?;
        ctx.on_ack(move |intake| intake.done.push(name));
        Ok(())
    }
}

/// Admits `name` at most once per `key`: answers whether it was a repeat.
async fn enqueue_once(
    ctx: Context,
    Path((key, name)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, TrayError> {
    let jobs = ctx.tray::<Jobs>().await?;
    let admission = jobs.admit_once(&key, |jobs| jobs.queue.push_back(name.clone()))?;
    let repeat = admission.is_repeat();
    admission.receipt().await?;
    Ok(Json(json!({ "repeat": repeat })))
}

async fn intake(ctx: Context, Path(name): Path<String>) -> Response {
    let admitted = async {
        let intake = ctx.tray::<Intake>().await?;
        intake
            .admit(|intake| intake.queue.push_back(name.clone()))?
            .await
    };
    match admitted.await {
        Ok(()) => Json(json!({ "admitted": name })).into_response(),
        Err(error) => refused(error),
    }
}

async fn wind(ctx: Context) -> Json<serde_json::Value> {
    ctx.wind_down(None);
    Json(json!({ "winding": true }))
}

/// An update that changes nothing.
async fn noop(ctx: Context) -> Response {
    let updated = async {
        let jobs = ctx.tray::<Jobs>().await?;
        let (_, receipt) = jobs.update(|jobs| {
            let done = (*jobs.done).clone();
            jobs.done.set(done);
        })?;
        receipt.await
    };
    match updated.await {
        Ok(()) => Json(json!({ "ok": true })).into_response(),
        Err(error) => refused(error),
    }
}

fn refused(error: TrayError) -> Response {
    let status = match error {
        TrayError::NotFound { .. } => StatusCode::NOT_FOUND,
        TrayError::InvalidName(_) => StatusCode::BAD_REQUEST,
        TrayError::NotParked(_) => StatusCode::CONFLICT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, Json(json!({ "detail": error.to_string() }))).into_response()
}

async fn enqueue(ctx: Context, Path(name): Path<String>) -> Response {
    let admitted = async {
        let jobs = ctx.tray::<Jobs>().await?;
        jobs.admit(|jobs| jobs.queue.push_back(name.clone()))?.await
    };
    match admitted.await {
        Ok(()) => Json(json!({ "admitted": name })).into_response(),
        Err(error) => refused(error),
    }
}

async fn done(ctx: Context) -> Response {
    match ctx.tray::<Jobs>().await {
        Ok(jobs) => Json(json!({
            "done": jobs.read(|jobs| (*jobs.done).clone()),
            "queued": jobs.read(|jobs| jobs.queue.len()),
            "parked": jobs.parked(),
            "attempts": jobs.attempts(),
        }))
        .into_response(),
        Err(error) => refused(error),
    }
}

async fn unpark(ctx: Context) -> Response {
    let unparked = async { ctx.tray::<Jobs>().await?.unpark()?.await };
    match unparked.await {
        Ok(()) => Json(json!({ "ok": true })).into_response(),
        Err(error) => refused(error),
    }
}

async fn cancel(ctx: Context) -> Response {
    match ctx.tray::<Jobs>().await {
        Ok(jobs) => Json(json!({ "cancelled": jobs.cancel_dispatch() })).into_response(),
        Err(error) => refused(error),
    }
}

async fn storage_get(ctx: Context, Path(name): Path<String>) -> Response {
    let read = async {
        ctx.tray::<Jobs>()
            .await?
            .storage_get::<serde_json::Value>(&name)
    };
    match read.await {
        Ok(value) => Json(json!({ "value": value })).into_response(),
        Err(error) => refused(error),
    }
}

async fn storage_set(
    ctx: Context,
    Path(name): Path<String>,
    Json(value): Json<serde_json::Value>,
) -> Response {
    let written = async { ctx.tray::<Jobs>().await?.storage_set(&name, &value)?.await };
    match written.await {
        Ok(()) => Json(json!({ "ok": true })).into_response(),
        Err(error) => refused(error),
    }
}

async fn keyed_add(ctx: Context, Path((key, name)): Path<(String, String)>) -> Response {
    let admitted = async {
        let inbox = ctx.keyed::<Inbox>()?.get_or_create(&key).await?;
        inbox
            .admit(|inbox| inbox.queue.push_back(name.clone()))?
            .await
    };
    match admitted.await {
        Ok(()) => Json(json!({ "admitted": name })).into_response(),
        Err(error) => refused(error),
    }
}

async fn keyed_get(ctx: Context, Path(key): Path<String>) -> Response {
    let read = async {
        let inbox = ctx.keyed::<Inbox>()?.get(&key).await?;
        Ok::<_, TrayError>(inbox.read(|inbox| (*inbox.seen).clone()))
    };
    match read.await {
        Ok(seen) => Json(json!({ "seen": seen })).into_response(),
        Err(error) => refused(error),
    }
}

async fn keyed_delete(ctx: Context, Path(key): Path<String>) -> Response {
    let deleted = async { ctx.keyed::<Inbox>()?.delete(&key).await };
    match deleted.await {
        Ok(()) => Json(json!({ "deleted": key })).into_response(),
        Err(error) => refused(error),
    }
}

async fn open_keys(State(_lab): State<Lab>, ctx: Context) -> Response {
    match ctx.keyed::<Inbox>() {
        Ok(inbox) => Json(json!({ "open": inbox.open_keys() })).into_response(),
        Err(error) => refused(error),
    }
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

async fn worker(store: impl StateStore + 'static, lab: &Lab) -> TestWorker {
    start(
        Options::new()
            .host::<Runner>("/runners")
            .state(lab.clone())
            .store(store),
    )
    .await
}

/// The stored row of `(tray_ns, tray_id)` of `/runners/<id>`.
async fn row(
    store: &SqliteStore,
    id: &str,
    tray_ns: &str,
    tray_id: &str,
) -> Option<(bool, serde_json::Value)> {
    support::stored_tray(store, "/runners", id, TrayKey::new(tray_ns, tray_id)).await
}

/// Writes a row of `/runners/<id>` directly, as another worker would have.
async fn seed(store: &SqliteStore, id: &str, tray_ns: &str, marked: bool, doc: serde_json::Value) {
    let serde_json::Value::Object(doc) = doc else {
        panic!("a doc is an object");
    };
    store
        .set_tray(
            InstanceKey::new("/runners", id),
            TrayKey::singleton(tray_ns),
            marked,
            doc,
            0,
        )
        .await
        .unwrap();
}

async fn done_list(w: &TestWorker, id: &str) -> serde_json::Value {
    json(w.get(&format!("/runners/{id}/done")).await).await.1
}

#[tokio::test]
async fn admitted_items_run_in_order_and_the_row_rests_unmarked_with_the_results() {
    let setup = sqlite().await;
    let lab = Lab::default();
    let w = worker(setup.store.clone(), &lab).await;
    let names: Vec<String> = (0..20).map(|n| format!("job-{n}")).collect();
    for name in &names {
        let (status, body) = json(w.post(&format!("/runners/r1/enqueue/{name}")).await).await;
        assert_eq!((status, body), (200, json!({ "admitted": name })));
    }
    eventually("every job done", PATIENCE, || async {
        let body = done_list(&w, "r1").await;
        (body["done"] == json!(names)).then_some(())
    })
    .await;
    assert_eq!(
        *lab.runs.lock(),
        names,
        "one run per job, in admission order"
    );
    // The last write is the last ack, with the tray dry: unmarked, the
    // queue gone (an empty queue occupies no entry), no delivery count.
    eventually("the row at rest", PATIENCE, || async {
        let stored = row(&setup.store, "r1", "jobs", "~").await;
        (stored == Some((false, json!({ "done": names })))).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_failing_item_parks_after_max_attempts_and_unpark_delivers_it_afresh() {
    let setup = sqlite().await;
    let lab = Lab::default();
    lab.fail.store(true, Ordering::SeqCst);
    let w = worker(setup.store.clone(), &lab).await;
    assert_eq!(json(w.post("/runners/p/enqueue/poison").await).await.0, 200);
    let body = eventually("the tray parked", PATIENCE, || async {
        let body = done_list(&w, "p").await;
        (body["parked"] == json!(true)).then_some(body)
    })
    .await;
    assert_eq!(body["attempts"], json!(3), "MAX_ATTEMPTS deliveries");
    assert_eq!(lab.runs.lock().len(), 3);
    let (marked, doc) = row(&setup.store, "p", "jobs", "~").await.unwrap();
    assert!(marked, "a parked tray keeps its row marked");
    assert_eq!(doc["~parked"], json!(true));
    assert_eq!(doc["~attempts"], json!(3));
    assert_eq!(doc["queue"], json!(["poison"]));

    // Not parked any more after this: a second unpark is refused.
    lab.fail.store(false, Ordering::SeqCst);
    assert_eq!(json(w.post("/runners/p/unpark").await).await.0, 200);
    eventually("the unparked item done", PATIENCE, || async {
        (done_list(&w, "p").await["done"] == json!(["poison"])).then_some(())
    })
    .await;
    assert_eq!(lab.runs.lock().len(), 4, "one fresh delivery after unpark");
    let (status, body) = json(w.post("/runners/p/unpark").await).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["detail"], json!("tray jobs/~ is not parked"));
}

#[tokio::test]
async fn a_cancelled_dispatch_consumes_its_item_without_its_edits() {
    let setup = sqlite().await;
    let lab = Lab::default();
    lab.hold.store(true, Ordering::SeqCst);
    let w = worker(setup.store.clone(), &lab).await;
    assert_eq!(json(w.post("/runners/c/enqueue/slow").await).await.0, 200);
    eventually("the handler running", PATIENCE, || async {
        (!lab.runs.lock().is_empty()).then_some(())
    })
    .await;
    let (_, body) = json(w.post("/runners/c/cancel").await).await;
    assert_eq!(body, json!({ "cancelled": true }));
    let body = eventually("the queue empty", PATIENCE, || async {
        let body = done_list(&w, "c").await;
        (body["queued"] == json!(0)).then_some(body)
    })
    .await;
    assert_eq!(
        body["done"],
        json!([]),
        "the on_ack edit of a cancelled run is dropped"
    );
    assert_eq!(lab.runs.lock().len(), 1, "never redelivered");
}

#[tokio::test]
async fn keyed_trays_are_created_on_use_passivate_when_dry_and_delete_frees_the_key() {
    let setup = sqlite().await;
    let lab = Lab::default();
    let w = worker(setup.store.clone(), &lab).await;
    let (status, body) = json(w.get("/runners/k/keyed/a").await).await;
    assert_eq!(status, 404);
    assert_eq!(body["detail"], json!("tray inbox/a does not exist"));

    for name in ["x", "y"] {
        assert_eq!(
            json(w.post(&format!("/runners/k/keyed/a/{name}")).await)
                .await
                .0,
            200
        );
    }
    assert_eq!(json(w.post("/runners/k/keyed/b/z").await).await.0, 200);
    eventually(
        "both keyed trays drained and passivated",
        PATIENCE,
        || async {
            let open = json(w.get("/runners/k/open").await).await.1;
            (open["open"] == json!([])).then_some(())
        },
    )
    .await;
    assert_eq!(
        row(&setup.store, "k", "inbox", "a").await,
        Some((false, json!({ "seen": ["x", "y"] })))
    );
    // A passivated tray reopens from its row.
    let (_, body) = json(w.get("/runners/k/keyed/a").await).await;
    assert_eq!(body, json!({ "seen": ["x", "y"] }));

    let (status, body) = json(
        w.client
            .delete(w.url("/runners/k/keyed/a"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, body), (200, json!({ "deleted": "a" })));
    assert_eq!(
        row(&setup.store, "k", "inbox", "a").await,
        None,
        "one row delete"
    );
    assert_eq!(
        json(w.get("/runners/k/keyed/a").await).await.0,
        404,
        "the key is free"
    );
    assert_eq!(
        row(&setup.store, "k", "inbox", "b").await,
        Some((false, json!({ "seen": ["z"] }))),
        "other keys untouched"
    );
    // Created again, it starts blank.
    assert_eq!(json(w.post("/runners/k/keyed/a/w").await).await.0, 200);
    eventually("the new tray drained", PATIENCE, || async {
        let body = json(w.get("/runners/k/keyed/a").await).await.1;
        (body == json!({ "seen": ["w"] })).then_some(())
    })
    .await;
}

#[tokio::test]
async fn storage_entries_live_beside_the_fields_and_reserved_names_are_refused() {
    let setup = sqlite().await;
    let lab = Lab::default();
    let w = worker(setup.store.clone(), &lab).await;
    let set = w
        .client
        .post(w.url("/runners/s/storage/cursor"))
        .json(&json!({ "at": 7 }))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let (_, body) = json(w.get("/runners/s/storage/cursor").await).await;
    assert_eq!(body, json!({ "value": { "at": 7 } }));
    assert_eq!(
        row(&setup.store, "s", "jobs", "~").await,
        Some((false, json!({ "cursor": { "at": 7 } })))
    );
    for name in ["~attempts", "done"] {
        let (status, body) = json(w.get(&format!("/runners/s/storage/{name}")).await).await;
        assert_eq!(status, 400, "{name}: {body}");
    }
}

#[tokio::test]
async fn a_new_worker_resumes_marked_work_with_no_request_and_runs_each_item_once_more_at_most() {
    let setup = sqlite().await;
    let lab = Lab::default();
    lab.hold.store(true, Ordering::SeqCst);
    let first = worker(setup.store.clone(), &lab).await;
    for id in ["a", "b"] {
        for n in 0..3 {
            assert_eq!(
                json(first.post(&format!("/runners/{id}/enqueue/{id}{n}")).await)
                    .await
                    .0,
                200
            );
        }
    }
    eventually(
        "both handlers stuck on their first item",
        PATIENCE,
        || async { (lab.runs.lock().len() == 2).then_some(()) },
    )
    .await;
    // The worker goes away with the handlers stuck: its rows stay marked.
    first.worker.close().await;
    let marked = setup.store.marked_instances(None, 10).await.unwrap();
    assert_eq!(marked.len(), 2, "{marked:?}");

    let lab2 = Lab::default();
    let store = Arc::new(
        SqliteStore::open(&setup.path, SqliteOptions::default())
            .await
            .unwrap(),
    );
    let _second = worker(store.clone(), &lab2).await;
    eventually(
        "every marked row drained by the new worker",
        PATIENCE,
        || async {
            store
                .marked_instances(None, 10)
                .await
                .unwrap()
                .is_empty()
                .then_some(())
        },
    )
    .await;
    for id in ["a", "b"] {
        let expected: Vec<String> = (0..3).map(|n| format!("{id}{n}")).collect();
        assert_eq!(
            row(&store, id, "jobs", "~").await,
            Some((false, json!({ "done": expected })))
        );
    }
    // The interrupted first items ran again (at least once); nothing else did.
    assert_eq!(lab2.runs.lock().len(), 6);
}

#[tokio::test]
async fn a_marked_row_of_an_undeclared_tray_fails_activation() {
    let setup = sqlite().await;
    setup
        .store
        .set_tray(
            InstanceKey::new("/runners", "ghost"),
            TrayKey::singleton("gone"),
            true,
            serde_json::Map::new(),
            0,
        )
        .await
        .unwrap();
    let lab = Lab::default();
    let w = worker(setup.store.clone(), &lab).await;
    let (status, _) = json(w.get("/runners/ghost/done").await).await;
    assert_eq!(status, 500);
    // An unmarked row of an unknown tray is left alone.
    setup
        .store
        .set_tray(
            InstanceKey::new("/runners", "ghost"),
            TrayKey::singleton("gone"),
            false,
            serde_json::Map::new(),
            0,
        )
        .await
        .unwrap();
    assert_eq!(json(w.get("/runners/ghost/done").await).await.0, 200);
}

/// The `jobs` tray at schema version 2.
#[derive(Default)]
struct JobsV2 {
    done: Value<Vec<String>>,
}

impl Tray for JobsV2 {
    const NAME: &'static str = "jobs";
    const VERSION: i64 = 2;
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("done", &mut self.done);
    }

    fn head(&self) -> Option<String> {
        None
    }

    fn ack(&mut self, _item: &String) {}
}

struct RunnerV2;

impl Object for RunnerV2 {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(RunnerV2)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/done",
            get(|ctx: Context| async move {
                let jobs = ctx.tray::<JobsV2>().await.unwrap();
                Json(json!({ "done": jobs.read(|jobs| (*jobs.done).clone()) }))
            }),
        )
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<JobsV2>()
    }
}

impl TrayHandler<JobsV2> for RunnerV2 {
    async fn handle(&self, _ctx: TrayCtx<JobsV2>, _item: String) -> Result<(), BoxError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_version_bump_discards_the_stored_row_and_drops_its_stale_mark() {
    let setup = sqlite().await;
    seed(
        &setup.store,
        "v",
        "jobs",
        true,
        json!({ "done": ["old"], "queue": ["stale"] }),
    )
    .await;
    let w = start(
        Options::new()
            .host::<RunnerV2>("/runners")
            .store(setup.store.clone()),
    )
    .await;
    let (status, body) = json(w.get("/runners/v/done").await).await;
    assert_eq!((status, body), (200, json!({ "done": [] })));
    eventually("the row rewritten blank at version 2", PATIENCE, || async {
        (row(&setup.store, "v", "jobs", "~").await == Some((false, json!({ "~v": 2 }))))
            .then_some(())
    })
    .await;
}

/// One crash run: five admissions through a worker whose store fails
/// write `fail_at`, then a fresh worker on the surviving rows drains what
/// is left. Answers the acknowledged names, the final `done` list and
/// how many writes the first worker made.
async fn crash_run(fail_at: usize, applied: bool) -> (Vec<String>, Vec<String>, usize) {
    let inner = Arc::new(MemoryStore::new());
    let flaky = Arc::new(FailingStore::new(inner.clone(), fail_at, applied));
    let lab = Lab::default();
    let first = worker(flaky.clone(), &lab).await;
    let mut acknowledged = Vec::new();
    for n in 0..5 {
        let name = format!("j{n}");
        let response = first.post(&format!("/runners/x/enqueue/{name}")).await;
        if response.status() == 200 {
            acknowledged.push(name);
        }
    }
    eventually("the first worker done or failed", PATIENCE, || async {
        let failed = flaky.failed();
        let drained = inner.marked_instances(None, 1).await.unwrap().is_empty();
        (failed || drained).then_some(())
    })
    .await;
    first.worker.close().await;
    let writes = flaky.writes();

    let second = start(
        Options::new()
            .host::<Runner>("/runners")
            .state(Lab::default())
            .store(inner.clone()),
    )
    .await;
    eventually(
        "the second worker drained every marked row",
        PATIENCE,
        || async {
            inner
                .marked_instances(None, 1)
                .await
                .unwrap()
                .is_empty()
                .then_some(())
        },
    )
    .await;
    let done = match inner
        .get_tray(
            InstanceKey::new("/runners", "x"),
            TrayKey::singleton("jobs"),
            u64::MAX / 2,
        )
        .await
        .unwrap()
    {
        Some(row) => {
            serde_json::from_value(row.doc.get("done").cloned().unwrap_or(json!([]))).unwrap()
        }
        None => Vec::new(),
    };
    second.worker.close().await;
    (acknowledged, done, writes)
}

#[tokio::test]
async fn a_crash_at_any_write_loses_no_acknowledged_admission_and_repeats_no_effect() {
    let (acknowledged, done, clean_writes) = crash_run(usize::MAX, false).await;
    assert_eq!(acknowledged, done, "a clean run does everything once");
    assert!(clean_writes >= 2, "{clean_writes} writes");
    for applied in [false, true] {
        for fail_at in 1..=clean_writes + 1 {
            let (acknowledged, done, _) = crash_run(fail_at, applied).await;
            let case = format!("write {fail_at} failing (applied: {applied}): acknowledged {acknowledged:?}, done {done:?}");
            for name in &acknowledged {
                assert_eq!(
                    done.iter().filter(|d| *d == name).count(),
                    1,
                    "{case}: an acknowledged admission done exactly once"
                );
            }
            let mut unique = done.clone();
            unique.dedup();
            assert_eq!(unique, done, "{case}: no effect twice");
            let order: Vec<usize> = done.iter().map(|name| name[1..].parse().unwrap()).collect();
            assert!(
                order.windows(2).all(|w| w[0] < w[1]),
                "{case}: admission order"
            );
        }
    }
}

#[tokio::test]
async fn keyed_trays_bracket_each_hydration_with_on_open_and_on_close() {
    let setup = sqlite().await;
    let lab = Lab::default();
    let w = worker(setup.store.clone(), &lab).await;
    assert_eq!(json(w.post("/runners/h/keyed/a/x").await).await.0, 200);
    eventually("the tray passivated and closed", PATIENCE, || async {
        (lab.events.lock().len() == 2).then_some(())
    })
    .await;
    assert_eq!(
        json(w.get("/runners/h/keyed/a").await).await.0,
        200,
        "reopened"
    );
    w.worker.close().await;
    assert_eq!(
        *lab.events.lock(),
        vec!["open a", "close a", "open a", "close a"],
        "passivation closes it; the reopened tray closes at teardown"
    );
}

/// Opens its tray inside `activate`, before the object exists.
struct Eager {
    lab: Lab,
}

impl Object for Eager {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        let jobs = ctx.tray::<Jobs>().await?;
        let queued = jobs.read(|jobs| jobs.queue.len());
        ctx.state::<Lab>()
            .ok_or("no lab")?
            .events
            .lock()
            .push(format!("queued at activation: {queued}"));
        Ok(Eager {
            lab: ctx.state().ok_or("no lab")?,
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/done", get(done))
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Jobs>()
    }
}

impl TrayHandler<Jobs> for Eager {
    async fn handle(&self, ctx: TrayCtx<Jobs>, name: String) -> Result<(), BoxError> {
        self.lab
            .runs
            .lock()
            .push(format!("{name} attempt {}", ctx.attempts()));
        ctx.on_ack(move |jobs| jobs.done.push(name));
        Ok(())
    }
}

#[tokio::test]
async fn a_tray_opened_inside_activate_pumps_only_once_the_object_exists() {
    let setup = sqlite().await;
    seed(
        &setup.store,
        "e",
        "jobs",
        true,
        json!({ "queue": ["left-over"] }),
    )
    .await;
    let lab = Lab::default();
    let w = start(
        Options::new()
            .host::<Eager>("/runners")
            .state(lab.clone())
            .store(setup.store.clone()),
    )
    .await;
    eventually("the left-over job done", PATIENCE, || async {
        (done_list(&w, "e").await["done"] == json!(["left-over"])).then_some(())
    })
    .await;
    assert_eq!(*lab.events.lock(), vec!["queued at activation: 1"]);
    assert_eq!(
        *lab.runs.lock(),
        vec!["left-over attempt 1"],
        "no delivery burnt before the object existed"
    );
}

#[tokio::test]
async fn winding_down_pauses_execution_trays_after_the_item_in_hand_but_intake_trays_drain() {
    let setup = sqlite().await;
    let lab = Lab::default();
    lab.hold.store(true, Ordering::SeqCst);
    let w = worker(setup.store.clone(), &lab).await;
    for n in 0..3 {
        assert_eq!(
            json(w.post(&format!("/runners/w/enqueue/job{n}")).await)
                .await
                .0,
            200
        );
        assert_eq!(
            json(w.post(&format!("/runners/w/intake/in{n}")).await)
                .await
                .0,
            200
        );
    }
    eventually("both trays on their first item", PATIENCE, || async {
        (lab.runs.lock().len() == 2).then_some(())
    })
    .await;
    assert_eq!(json(w.post("/runners/w/wind-down").await).await.0, 200);
    lab.hold.store(false, Ordering::SeqCst);
    lab.release.add_permits(2);
    w.wait_for("the instance closed", |s| {
        s["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let (marked, doc) = row(&setup.store, "w", "jobs", "~").await.unwrap();
    assert!(
        marked,
        "the paused execution tray keeps its claim for the next owner"
    );
    assert_eq!(doc["done"], json!(["job0"]), "the item in hand finished");
    assert_eq!(doc["queue"], json!(["job1", "job2"]));
    assert_eq!(
        row(&setup.store, "w", "intake", "~").await,
        Some((false, json!({ "done": ["in0", "in1", "in2"] }))),
        "the intake tray drained before release"
    );
}

#[tokio::test]
async fn a_write_that_changes_nothing_goes_nowhere() {
    let inner = Arc::new(MemoryStore::new());
    let counting = Arc::new(FailingStore::passing(inner));
    let lab = Lab::default();
    let w = worker(counting.clone(), &lab).await;
    assert_eq!(json(w.post("/runners/n/noop").await).await.0, 200);
    let before = counting.writes();
    for _ in 0..5 {
        assert_eq!(json(w.post("/runners/n/noop").await).await.0, 200);
    }
    assert_eq!(
        counting.writes(),
        before,
        "no row write for an unchanged tray"
    );
}

/// The `jobs` row of `/runners/<id>` on a memory store, as `(marked, doc)`.
async fn memory_row(store: &MemoryStore, id: &str) -> Option<(bool, serde_json::Value)> {
    support::stored_tray(store, "/runners", id, TrayKey::singleton("jobs")).await
}

#[tokio::test]
async fn an_admission_to_an_idle_tray_takes_one_store_write_before_its_handler_runs() {
    let inner = Arc::new(MemoryStore::new());
    let counting = Arc::new(FailingStore::passing(inner.clone()));
    let lab = Lab::default();
    lab.hold.store(true, Ordering::SeqCst);
    let w = worker(counting.clone(), &lab).await;
    assert_eq!(json(w.get("/runners/one/done").await).await.0, 200);
    for round in 0..3 {
        let name = format!("j{round}");
        // The tray rests dry and unmarked: the last round's ack landed.
        eventually("the tray at rest", PATIENCE, || async {
            let row = memory_row(&inner, "one").await;
            (round == 0
                || row.is_some_and(|(marked, doc)| {
                    !marked && doc["done"].as_array().map(Vec::len) == Some(round)
                }))
            .then_some(())
        })
        .await;
        let before = counting.writes();
        let admitted = json(w.post(&format!("/runners/one/enqueue/{name}")).await).await;
        assert_eq!(admitted, (200, json!({ "admitted": name })));
        eventually("the handler running", PATIENCE, || async {
            lab.runs.lock().contains(&name).then_some(())
        })
        .await;
        // The handler holds: nothing else can write until it is released.
        assert_eq!(
            counting.writes() - before,
            1,
            "round {round}: the admission and its delivery's count in one write"
        );
        let (marked, doc) = memory_row(&inner, "one").await.unwrap();
        assert!(marked, "round {round}");
        assert_eq!(doc["queue"], json!([name]), "round {round}");
        assert_eq!(
            doc["~attempts"],
            json!(1),
            "round {round}: counted before the run"
        );
        lab.release.add_permits(1);
    }
    eventually("the last ack landed", PATIENCE, || async {
        memory_row(&inner, "one")
            .await
            .filter(|(marked, _)| !marked)
    })
    .await;
    let (_, doc) = memory_row(&inner, "one").await.unwrap();
    assert_eq!(doc, json!({ "done": ["j0", "j1", "j2"] }));
    assert_eq!(
        *lab.deliveries.lock(),
        [
            ("j0".to_owned(), 1),
            ("j1".to_owned(), 1),
            ("j2".to_owned(), 1)
        ]
    );
    w.worker.close().await;
}

// One thread: the tray's store writer runs only when the handler yields,
// so what it writes while the run is under way is deterministic.
#[tokio::test(flavor = "current_thread")]
async fn an_admission_during_a_quick_run_leaves_with_that_runs_ack_in_one_write() {
    let inner = Arc::new(MemoryStore::new());
    let counting = Arc::new(FailingStore::passing(inner.clone()));
    let lab = Lab::default();
    let w = worker(counting.clone(), &lab).await;
    let at_rest = |done: usize| {
        let inner = inner.clone();
        async move {
            eventually("the tray at rest", PATIENCE, || async {
                memory_row(&inner, "one")
                    .await
                    .filter(|(marked, doc)| {
                        !marked && doc["done"].as_array().map(Vec::len) == Some(done)
                    })
                    .map(|_| ())
            })
            .await;
        }
    };
    // A quick run first: the tray learns its runs end within the linger.
    let admitted = json(w.post("/runners/one/enqueue/first").await).await;
    assert_eq!(admitted, (200, json!({ "admitted": "first" })));
    at_rest(1).await;
    let before = counting.writes();
    let admitted = json(w.post("/runners/one/enqueue/then-second").await).await;
    assert_eq!(admitted, (200, json!({ "admitted": "then-second" })));
    at_rest(3).await;
    // The admission of `then-second` with its count; the ack of
    // `then-second` with `second`'s admission (made during that run) and
    // its count; `second`'s ack. Written alone, `second`'s admission
    // would be a fourth.
    assert_eq!(counting.writes() - before, 3);
    let (_, doc) = memory_row(&inner, "one").await.unwrap();
    assert_eq!(doc["done"], json!(["first", "then-second", "second"]));
    assert_eq!(
        lab.deliveries
            .lock()
            .iter()
            .map(|(_, n)| *n)
            .collect::<Vec<_>>(),
        [1, 1, 1]
    );
    w.worker.close().await;
}

#[tokio::test]
async fn a_crash_right_after_an_idle_admissions_write_redelivers_with_the_attempt_counted() {
    // A clean run finds the admission's write number: activation writes
    // the same every time.
    let probe = Arc::new(FailingStore::passing(Arc::new(MemoryStore::new())));
    let w = start(
        Options::new()
            .host::<Runner>("/runners")
            .state(Lab::default())
            .store(probe.clone()),
    )
    .await;
    assert_eq!(json(w.get("/runners/c/done").await).await.0, 200);
    let admission = probe.writes() + 1;
    w.worker.close().await;

    // The write lands and its answer is lost: the instance aborts before
    // the handler could run, as a crash right after the write.
    let inner = Arc::new(MemoryStore::new());
    let flaky = Arc::new(FailingStore::new(inner.clone(), admission, true));
    let lab = Lab::default();
    let first = worker(flaky.clone(), &lab).await;
    assert_eq!(json(first.get("/runners/c/done").await).await.0, 200);
    let response = first.post("/runners/c/enqueue/j0").await;
    assert_ne!(
        response.status(),
        200,
        "the failed write is not acknowledged"
    );
    assert!(flaky.failed());
    first.worker.close().await;
    assert!(lab.runs.lock().is_empty(), "no run on a write that failed");
    let (marked, doc) = memory_row(&inner, "c").await.unwrap();
    assert!(marked);
    assert_eq!(doc, json!({ "queue": ["j0"], "~attempts": 1 }));

    // The next worker redelivers it as the second attempt.
    let lab = Lab::default();
    let second = worker(inner.clone(), &lab).await;
    eventually("the item redelivered and acked", PATIENCE, || async {
        memory_row(&inner, "c").await.filter(|(marked, _)| !marked)
    })
    .await;
    assert_eq!(*lab.deliveries.lock(), [("j0".to_owned(), 2)]);
    let (_, doc) = memory_row(&inner, "c").await.unwrap();
    assert_eq!(doc, json!({ "done": ["j0"] }));
    second.worker.close().await;
}

#[tokio::test]
async fn locally_an_instance_aborted_with_work_pending_is_woken_again_with_no_request() {
    let setup = sqlite().await;
    let lab = Lab::default();
    lab.hold.store(true, Ordering::SeqCst);
    let w = start(
        Options::new()
            .host_with::<Runner>(
                "/runners",
                pinned::HostOptions::default()
                    .sweep_interval(std::time::Duration::from_millis(100)),
            )
            .state(lab.clone())
            .store(setup.store.clone()),
    )
    .await;
    assert_eq!(json(w.post("/runners/a/enqueue/stuck").await).await.0, 200);
    eventually("the handler running", PATIENCE, || async {
        (lab.runs.lock().len() == 1).then_some(())
    })
    .await;
    lab.hold.store(false, Ordering::SeqCst);
    let _ = w.post("/runners/a/abort").await;
    eventually(
        "the aborted instance woken and its item done",
        PATIENCE,
        || async {
            let stored = row(&setup.store, "a", "jobs", "~").await;
            (stored == Some((false, json!({ "done": ["stuck"] })))).then_some(())
        },
    )
    .await;
    assert_eq!(lab.runs.lock().len(), 2, "redelivered once after the abort");
}

/// Rows of each table of the SQLite file at `path`: (data rows, fence rows).
fn table_rows(path: &std::path::Path) -> (i64, i64) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let count = |table: &str| -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .unwrap()
    };
    (count("pinned_tray_index"), count("pinned_epoch"))
}

#[tokio::test]
async fn ids_that_write_nothing_leave_no_data_row_and_their_fences_are_reclaimed() {
    let setup = sqlite().await;
    let lab = Lab::default();
    let w = start(
        Options::new()
            .host::<Runner>("/runners")
            .state(lab.clone())
            .store(setup.store.clone())
            .fence_reclaim(
                std::time::Duration::from_millis(100),
                std::time::Duration::from_secs(3600),
            ),
    )
    .await;
    // One id that writes; 10 000 a scanner reads (each opens its singleton
    // trays, so each reads them from the store).
    let (status, _) = json(w.post("/runners/writer/enqueue/a").await).await;
    assert_eq!(status, 200);
    eventually("the job ran", PATIENCE, || async {
        (done_list(&w, "writer").await["done"] == json!(["a"])).then_some(())
    })
    .await;
    // Sent 64 at a time, as a scanner would.
    use futures_util::StreamExt as _;
    let scans = futures_util::stream::iter(0..10_000)
        .map(|n| {
            let w = &w;
            async move { json(w.get(&format!("/runners/scan-{n}/done")).await).await }
        })
        .buffer_unordered(64);
    scans
        .for_each(|(status, body)| async move {
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["done"], json!([]));
        })
        .await;
    let (data, _) = table_rows(&setup.path);
    assert_eq!(data, 1, "only the writer's tray holds a row");
    // Local mode's epoch is 0: every fence row is old enough at once, and
    // the reclaimer takes those of ids without data on its next pass.
    eventually(
        "the scanned ids' fence rows reclaimed",
        PATIENCE,
        || async { (table_rows(&setup.path) == (1, 1)).then_some(()) },
    )
    .await;
    // The writer's rows and fence stay; a scanned id reads fresh again.
    assert_eq!(done_list(&w, "writer").await["done"], json!(["a"]));
    assert_eq!(done_list(&w, "scan-7").await["done"], json!([]));
}

/// `POST /runners/o/once/<key>/<name>`: its status and body.
async fn once(w: &TestWorker, key: &str, name: &str) -> (u16, serde_json::Value) {
    let (status, body) = json(w.post(&format!("/runners/o/once/{key}/{name}")).await).await;
    (status, body)
}

#[tokio::test]
async fn a_keyed_admission_admits_once_across_a_restart_within_its_window() {
    let setup = sqlite().await;
    let lab = Lab::default();
    let w = worker(setup.store.clone(), &lab).await;
    assert_eq!(once(&w, "k1", "a").await, (200, json!({"repeat": false})));
    assert_eq!(once(&w, "k1", "a").await, (200, json!({"repeat": true})));
    eventually("a ran", PATIENCE, || async {
        (done_list(&w, "o").await["done"] == json!(["a"])).then_some(())
    })
    .await;
    // The keys are in the row: a new worker on the same file knows them.
    w.worker.close().await;
    let w = worker(setup.store.clone(), &lab).await;
    assert_eq!(once(&w, "k1", "a").await, (200, json!({"repeat": true})));
    assert_eq!(
        row(&setup.store, "o", "jobs", "~").await.unwrap().1["~admitted"],
        json!(["k1"])
    );
    // The window holds the last three keys (`Jobs::ADMISSION_WINDOW`):
    // k1 leaves it after three more, and is then admitted afresh.
    for (key, name) in [("k2", "b"), ("k3", "c"), ("k4", "d")] {
        assert_eq!(once(&w, key, name).await, (200, json!({"repeat": false})));
    }
    assert_eq!(once(&w, "k3", "c").await, (200, json!({"repeat": true})));
    assert_eq!(once(&w, "k1", "e").await, (200, json!({"repeat": false})));
    eventually("every admitted job ran once", PATIENCE, || async {
        (done_list(&w, "o").await["done"] == json!(["a", "b", "c", "d", "e"])).then_some(())
    })
    .await;
    assert_eq!(lab.runs.lock().iter().filter(|r| *r == "a").count(), 1);
    // A key longer than 200 bytes is refused, and admits nothing.
    let (status, body) = once(&w, &"k".repeat(201), "z").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["detail"],
        json!("an admission key must be 1 to 200 bytes long")
    );
}

/// `/_pinned/state/<op>?<query>` on `w`, authenticated with its secret.
async fn state(w: &TestWorker, post: bool, op_query: &str) -> (u16, serde_json::Value) {
    let url = w.url(&format!("/_pinned/state/{op_query}"));
    let request = if post {
        w.client.post(url)
    } else {
        w.client.get(url)
    };
    json(
        request
            .header("pinboard-proxy-secret", w.worker.secret())
            .send()
            .await
            .unwrap(),
    )
    .await
}

#[tokio::test]
async fn the_storage_inspector_lists_shows_and_steers_one_key_on_the_embedded_store() {
    let setup = sqlite().await;
    let lab = Lab::default();
    lab.fail.store(true, Ordering::SeqCst);
    let w = worker(setup.store.clone(), &lab).await;
    assert_eq!(json(w.post("/runners/p/enqueue/poison").await).await.0, 200);
    assert_eq!(json(w.post("/runners/p/enqueue/next").await).await.0, 200);
    eventually("the tray parked", PATIENCE, || async {
        (done_list(&w, "p").await["parked"] == json!(true)).then_some(())
    })
    .await;
    // Two more ids with rows: one at rest, one with a due alarm.
    seed(&setup.store, "a", "jobs", false, json!({"done": ["x"]})).await;
    let due = json!({"at": 1, "nonce": "n"}).as_object().cloned().unwrap();
    setup
        .store
        .set_tray(
            InstanceKey::new("/runners", "z"),
            TrayKey::new("pinned", "alarm"),
            false,
            due,
            0,
        )
        .await
        .unwrap();

    // Lists: every id, each filter, and pages by the cursor.
    let ids = |body: &serde_json::Value| -> Vec<String> {
        body["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (status, all) = state(&w, false, "ids?ns=/runners").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(ids(&all), ["a", "p", "z"]);
    assert_eq!(all["next"], json!(null), "one page holds them all");
    let (_, parked) = state(&w, false, "ids?ns=/runners&filter=parked").await;
    assert_eq!(ids(&parked), ["p"]);
    let (_, marked) = state(&w, false, "ids?ns=/runners&filter=marked").await;
    assert_eq!(ids(&marked), ["p"]);
    let (_, due) = state(&w, false, "ids?ns=/runners&filter=alarm-due").await;
    assert_eq!(ids(&due), ["z"]);
    let (_, first) = state(&w, false, "ids?ns=/runners&limit=2").await;
    assert_eq!(
        (ids(&first), &first["next"]),
        (vec!["a".to_owned(), "p".to_owned()], &json!("p"))
    );
    let (_, second) = state(&w, false, "ids?ns=/runners&limit=2&after=p").await;
    assert_eq!(
        (ids(&second), &second["next"]),
        (vec!["z".to_owned()], &json!(null))
    );

    // Bad input: a precise 4xx each.
    for (query, status, detail) in [
        (
            "ids?ns=/nowhere",
            404,
            "unknown namespace \"/nowhere\": this worker does not host it",
        ),
        (
            "ids?ns=/runners&limit=0",
            400,
            "limit must be an integer from 1 to 200, got \"0\"",
        ),
        (
            "ids?ns=/runners&limit=201",
            400,
            "limit must be an integer from 1 to 200, got \"201\"",
        ),
        (
            "ids?ns=/runners&after=a%2Fb",
            400,
            "malformed cursor: pass the `next` of the previous page",
        ),
        (
            "ids?ns=/runners&filter=odd",
            400,
            "unknown filter \"odd\": one of all, marked, parked, alarm-due",
        ),
        (
            "show?ns=/runners&id=a%20b",
            400,
            "malformed id: id must contain only [A-Za-z0-9._~-]",
        ),
        ("ids", 400, "missing query parameter \"ns\""),
    ] {
        let (got, body) = state(&w, false, query).await;
        assert_eq!(
            (got, body["detail"].as_str().unwrap_or_default()),
            (status, detail),
            "{query}"
        );
    }
    let (got, _) = state(&w, true, "act?ns=/runners&id=p&action=explode").await;
    assert_eq!(got, 400);
    let (got, body) = state(&w, true, "act?ns=/runners&id=p&action=skip").await;
    assert_eq!(
        (got, body["detail"].clone()),
        (400, json!("skip needs a tray (query parameter \"tray\")"))
    );
    let anonymous = w
        .client
        .get(w.url("/_pinned/state/ids?ns=/runners"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 403);

    // Show: the parked tray's fields and bookkeeping.
    let (_, shown) = state(&w, false, "show?ns=/runners&id=p").await;
    let tray = &shown["trays"][0];
    assert_eq!(
        (&tray["tray"], &tray["key"]),
        (&json!("jobs"), &json!("~")),
        "{shown}"
    );
    assert_eq!(
        (&tray["parked"], &tray["attempts"], &tray["marked"]),
        (&json!(true), &json!(3), &json!(true))
    );
    assert_eq!(tray["fields"]["queue"], json!(["poison", "next"]));
    assert_eq!(shown["epoch"], json!(0));
    let (_, z) = state(&w, false, "show?ns=/runners&id=z").await;
    assert_eq!(
        (&z["alarm"]["atMs"], &z["alarm"]["due"]),
        (&json!(1), &json!(true)),
        "{z}"
    );

    // Skip the poison: it lands in the dead letters, the next item runs.
    lab.fail.store(false, Ordering::SeqCst);
    let (status, body) = state(
        &w,
        true,
        "act?ns=/runners&id=p&action=skip&tray=jobs&by=alice",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["outcome"]["skipped"]["fieldsBefore"]["queue"],
        json!(["poison", "next"])
    );
    eventually("the next item done", PATIENCE, || async {
        (done_list(&w, "p").await["done"] == json!(["next"])).then_some(())
    })
    .await;
    let (_, shown) = state(&w, false, "show?ns=/runners&id=p").await;
    let dead = &shown["trays"][0]["dead"];
    assert_eq!(
        (dead[0]["by"].clone(), dead[0]["attempts"].clone()),
        (json!("alice"), json!(3)),
        "{shown}"
    );
    assert_eq!(shown["trays"][0]["parked"], json!(false));
    let (status, body) = state(&w, true, "act?ns=/runners&id=p&action=unpark&tray=jobs").await;
    assert_eq!(
        (status, body["detail"].clone()),
        (409, json!("tray jobs/~ is not parked"))
    );

    // Pause: the id leaves and its requests answer 503 until resumed.
    let (status, body) = state(&w, true, "act?ns=/runners&id=p&action=pause&by=alice").await;
    assert_eq!(
        (status, &body["closedInstance"]),
        (200, &json!(true)),
        "{body}"
    );
    let (status, body) = json(w.get("/runners/p/done").await).await;
    assert_eq!(
        (status, body["detail"].clone()),
        (
            503,
            json!("instance paused by an operator; resume it to serve")
        )
    );
    let (_, listed) = state(&w, false, "ids?ns=/runners").await;
    assert_eq!(listed["ids"][1]["paused"], json!(true), "{listed}");
    let (status, _) = state(&w, true, "act?ns=/runners&id=p&action=resume").await;
    assert_eq!(status, 200);
    assert_eq!(done_list(&w, "p").await["done"], json!(["next"]));

    // Delete: every row goes, the id starts afresh.
    let (status, body) = state(&w, true, "act?ns=/runners&id=p&action=delete").await;
    assert_eq!(
        (status, &body["closedInstance"]),
        (200, &json!(true)),
        "{body}"
    );
    let (_, shown) = state(&w, false, "show?ns=/runners&id=p").await;
    assert_eq!(shown["rows"], json!(0), "{shown}");
    assert_eq!(done_list(&w, "p").await["done"], json!([]));
}

/// An activation reads the id's pause row and its pending work in one
/// store call, before the object activates, and the trays open from those
/// rows (no second read of the marked rows); a pause row refuses the
/// activation with the reference's 503 after that one read.
#[tokio::test]
async fn an_activation_reads_its_pause_row_and_pending_work_in_one_store_call() {
    let setup = sqlite().await;
    // Work another worker left, and an id an operator paused.
    seed(
        &setup.store,
        "p",
        "jobs",
        true,
        json!({ "queue": ["left"] }),
    )
    .await;
    setup
        .store
        .set_tray(
            InstanceKey::new("/runners", "q"),
            TrayKey::new("pinned", "paused"),
            false,
            pinned::pinned_store::conformance::doc(json!({ "atMs": 1, "by": "test" })),
            0,
        )
        .await
        .unwrap();
    let journaled = Arc::new(FailingStore::passing(setup.store.clone()));
    let lab = Lab::default();
    let w = worker(journaled.clone(), &lab).await;
    eventually("the left job done", PATIENCE, || async {
        (done_list(&w, "p").await["done"] == json!(["left"])).then_some(())
    })
    .await;
    let calls = journaled.calls(InstanceKey::new("/runners", "p"));
    assert_eq!(
        calls.first().map(String::as_str),
        Some("list_marked_and pinned/paused"),
        "{calls:?}"
    );
    assert!(
        !calls
            .iter()
            .any(|call| call.starts_with("list ") && call.ends_with("Some(true)")),
        "the marked rows are read once: {calls:?}"
    );
    assert_eq!(
        calls
            .iter()
            .filter(|call| call.contains("pinned/paused"))
            .count(),
        1,
        "{calls:?}"
    );

    let (status, body) = json(w.get("/runners/q/done").await).await;
    assert_eq!(
        (status, body),
        (
            503,
            json!({ "detail": "instance paused by an operator; resume it to serve" })
        )
    );
    assert_eq!(
        journaled.calls(InstanceKey::new("/runners", "q")),
        ["list_marked_and pinned/paused"],
        "nothing of a paused id's activation runs after its read"
    );
}
