//! The append-only tray field `Log`, end to end on real workers: appends
//! land in page rows beside a tray row that stays small, read back by
//! range before and after a restart (SQLite, and Postgres at
//! `PINNED_TEST_DATABASE_URL`); a trim deletes whole pages; a keyed tray's
//! delete takes its pages with it; a new schema version drops the old
//! pages; and a crash at every store write loses no acknowledged append,
//! repeats none and keeps their order.
#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

mod support;

use std::sync::Arc;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::pinned_store::conformance::{database_url, unique_ns, PostgresCleanup};
use pinned::pinned_store::{
    FailingStore, InstanceKey, MemoryStore, PostgresOptions, PostgresStore, SqliteOptions,
    SqliteStore, StateStore, TrayKey,
};
use pinned::tray::{Fields, Log, Queue, Tray, TrayCtx, TrayError, TrayHandler, Trays};
use pinned::{BoxError, Context, Object, Options};
use serde_json::{json, Value};
use support::{eventually, json, start, TestWorker, PATIENCE};

/// Entries per page: small, so a few messages cross pages.
const PAGE: u32 = 3;

/// A session: messages wait in `inbox`; each admission appends `in:<msg>`
/// to `history`, each handled message `out:<msg>` (with its ack).
struct Session {
    inbox: Queue<String>,
    history: Log<String>,
}

impl Default for Session {
    fn default() -> Self {
        Self {
            inbox: Queue::new(),
            history: Log::with_page_len(PAGE),
        }
    }
}

impl Tray for Session {
    const NAME: &'static str = "session";
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("inbox", &mut self.inbox);
        fields.field("history", &mut self.history);
    }

    fn head(&self) -> Option<String> {
        self.inbox.front().cloned()
    }

    fn ack(&mut self, _msg: &String) {
        self.inbox.pop_front();
    }
}

/// A keyed tray of the same shape.
struct Thread {
    inbox: Queue<String>,
    log: Log<String>,
}

impl Default for Thread {
    fn default() -> Self {
        Self {
            inbox: Queue::new(),
            log: Log::with_page_len(PAGE),
        }
    }
}

impl Tray for Thread {
    const NAME: &'static str = "thread";
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("inbox", &mut self.inbox);
        fields.field("log", &mut self.log);
    }

    fn head(&self) -> Option<String> {
        self.inbox.front().cloned()
    }

    fn ack(&mut self, _msg: &String) {
        self.inbox.pop_front();
    }
}

struct Chat;

impl Object for Chat {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Chat)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/say/{msg}", post(say))
            .route("/latest/{count}", get(latest))
            .route("/from/{position}/{limit}", get(from))
            .route("/keep/{count}", post(keep))
            .route("/trim/{position}", post(trim))
            .route("/thread/{key}/{msg}", post(thread_say))
            .route("/thread/{key}", get(thread_read).delete(thread_delete))
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Session>().keyed::<Thread>()
    }
}

impl TrayHandler<Session> for Chat {
    async fn handle(&self, ctx: TrayCtx<Session>, msg: String) -> Result<(), BoxError> {
        ctx.on_ack(move |session| {
            session.history.append(format!("out:{msg}"));
        });
        Ok(())
    }
}

impl TrayHandler<Thread> for Chat {
    async fn handle(&self, ctx: TrayCtx<Thread>, msg: String) -> Result<(), BoxError> {
        ctx.on_ack(move |thread| {
            thread.log.append(format!("out:{msg}"));
        });
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

fn answer(result: Result<Value, TrayError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(error) => refused(error),
    }
}

async fn say(ctx: Context, Path(msg): Path<String>) -> Response {
    answer(
        async {
            let session = ctx.tray::<Session>().await?;
            session
                .admit(|session| {
                    session.inbox.push_back(msg.clone());
                    session.history.append(format!("in:{msg}"));
                })?
                .await?;
            Ok(json!({ "admitted": msg }))
        }
        .await,
    )
}

/// A slice of `history` with the log's bounds and inbox length.
async fn slice(
    ctx: &Context,
    read: impl FnOnce(&Session) -> pinned::tray::LogRead<String>,
) -> Result<Value, TrayError> {
    let session = ctx.tray::<Session>().await?;
    let (read, start, end, queued) = session.read(|session| {
        (
            read(session),
            session.history.start(),
            session.history.end(),
            session.inbox.len(),
        )
    });
    let slice = read.await?;
    Ok(json!({
        "first": slice.first,
        "entries": slice.entries,
        "start": start,
        "end": end,
        "queued": queued,
    }))
}

async fn latest(ctx: Context, Path(count): Path<u64>) -> Response {
    answer(slice(&ctx, |session| session.history.latest(count)).await)
}

async fn from(ctx: Context, Path((position, limit)): Path<(u64, u64)>) -> Response {
    answer(slice(&ctx, |session| session.history.from(position, limit)).await)
}

async fn keep(ctx: Context, Path(count): Path<u64>) -> Response {
    answer(
        async {
            let session = ctx.tray::<Session>().await?;
            let ((), receipt) = session.update(|session| session.history.keep_last(count))?;
            receipt.await?;
            Ok(json!({ "ok": true }))
        }
        .await,
    )
}

async fn trim(ctx: Context, Path(position): Path<u64>) -> Response {
    answer(
        async {
            let session = ctx.tray::<Session>().await?;
            let ((), receipt) = session.update(|session| session.history.trim_before(position))?;
            receipt.await?;
            Ok(json!({ "ok": true }))
        }
        .await,
    )
}

async fn thread_say(ctx: Context, Path((key, msg)): Path<(String, String)>) -> Response {
    answer(
        async {
            let thread = ctx.keyed::<Thread>()?.get_or_create(&key).await?;
            thread
                .admit(|thread| {
                    thread.inbox.push_back(msg.clone());
                    thread.log.append(format!("in:{msg}"));
                })?
                .await?;
            Ok(json!({ "admitted": msg }))
        }
        .await,
    )
}

async fn thread_read(ctx: Context, Path(key): Path<String>) -> Response {
    answer(
        async {
            let thread = ctx.keyed::<Thread>()?.get(&key).await?;
            let (read, queued) =
                thread.read(|thread| (thread.log.latest(1000), thread.inbox.len()));
            let slice = read.await?;
            Ok(json!({ "first": slice.first, "entries": slice.entries, "queued": queued }))
        }
        .await,
    )
}

async fn thread_delete(ctx: Context, Path(key): Path<String>) -> Response {
    answer(
        async {
            ctx.keyed::<Thread>()?.delete(&key).await?;
            Ok(json!({ "deleted": key }))
        }
        .await,
    )
}

async fn worker(store: Arc<dyn StateStore>, ns: &str) -> TestWorker {
    start(Options::new().host::<Chat>(ns).store(store)).await
}

/// `GET path` answered 200, its body.
async fn get_ok(w: &TestWorker, path: &str) -> Value {
    let (status, body) = json(w.get(path).await).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// `POST path` answered 200.
async fn post_ok(w: &TestWorker, path: &str) {
    let (status, body) = json(w.post(path).await).await;
    assert_eq!(status, 200, "POST {path}: {body}");
}

/// The whole history of `/<ns>/<id>` once its inbox is empty.
async fn drained(w: &TestWorker, ns: &str, id: &str) -> Value {
    eventually("the inbox drained", PATIENCE, || async {
        let body = get_ok(w, &format!("{ns}/{id}/from/0/100000")).await;
        (body["queued"] == 0).then_some(body)
    })
    .await
}

fn strings(body: &Value) -> Vec<String> {
    serde_json::from_value(body["entries"].clone()).unwrap()
}

/// The page rows of `field` of tray `tray` under `key`: their tray ids and
/// entries.
async fn pages(
    store: &dyn StateStore,
    ns: &str,
    id: &str,
    tray: &str,
    key: &str,
) -> Vec<(String, Value)> {
    let field = if tray == "session" { "history" } else { "log" };
    let mut rows: Vec<(String, Value)> = store
        .list(
            InstanceKey::new(ns, id),
            0,
            Some(&format!("{tray}~{field}")),
            None,
        )
        .await
        .unwrap()
        .into_iter()
        .filter(|row| row.tray_id.starts_with(&format!("{key}~")))
        .map(|row| {
            assert!(!row.marked, "a page row is never marked");
            (row.tray_id, row.doc["entries"].clone())
        })
        .collect();
    rows.sort_by_key(|(tray_id, _)| tray_id.rsplit('~').next().unwrap().parse::<u64>().unwrap());
    rows
}

/// Every `in:` of `said` once, in order, each before its `out:`, and
/// nothing else: what a drained history must hold.
fn assert_history(history: &[String], said: &[String]) {
    let ins: Vec<&String> = history.iter().filter(|e| e.starts_with("in:")).collect();
    let outs: Vec<&String> = history.iter().filter(|e| e.starts_with("out:")).collect();
    let want_ins: Vec<String> = said.iter().map(|m| format!("in:{m}")).collect();
    let want_outs: Vec<String> = said.iter().map(|m| format!("out:{m}")).collect();
    assert_eq!(ins, want_ins.iter().collect::<Vec<_>>(), "{history:?}");
    assert_eq!(outs, want_outs.iter().collect::<Vec<_>>(), "{history:?}");
    for m in said {
        let at = |e: String| history.iter().position(|h| *h == e).unwrap();
        assert!(
            at(format!("in:{m}")) < at(format!("out:{m}")),
            "{history:?}"
        );
    }
}

async fn sqlite() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("log.db"), SqliteOptions::default())
        .await
        .unwrap();
    (dir, Arc::new(store))
}

#[tokio::test]
async fn appends_land_in_pages_beside_a_small_row_and_read_back_by_range_after_a_restart() {
    let (_dir, store) = sqlite().await;
    let ns = "/chat";
    let w = worker(store.clone(), ns).await;
    let said: Vec<String> = (0..7).map(|n| format!("m{n}")).collect();
    for m in &said {
        post_ok(&w, &format!("{ns}/a/say/{m}")).await;
    }
    let all = drained(&w, ns, "a").await;
    let history = strings(&all);
    assert_eq!((all["first"].clone(), history.len()), (json!(0), 14));
    assert_history(&history, &said);

    let latest = get_ok(&w, &format!("{ns}/a/latest/5")).await;
    assert_eq!(latest["first"], 9);
    assert_eq!(strings(&latest), history[9..]);
    let from = get_ok(&w, &format!("{ns}/a/from/4/3")).await;
    assert_eq!(
        (from["first"].clone(), strings(&from)),
        (json!(4), history[4..7].to_vec())
    );
    let past = get_ok(&w, &format!("{ns}/a/from/99/3")).await;
    assert_eq!(
        (past["first"].clone(), past["entries"].clone()),
        (json!(14), json!([]))
    );

    // The tray's row says where the pages are; the entries are in them, at
    // most a page's worth each.
    let (_, doc) = support::stored_tray(&*store, ns, "a", TrayKey::singleton("session"))
        .await
        .expect("the session's row");
    assert_eq!(
        doc["history"],
        json!({"start": 0, "next": 14, "page": PAGE})
    );
    assert!(doc.to_string().len() < 100, "{:?}", doc);
    let stored = pages(&*store, ns, "a", "session", "~").await;
    let ids: Vec<&str> = stored.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["~~0", "~~1", "~~2", "~~3", "~~4"]);
    let flat: Vec<String> = stored
        .iter()
        .flat_map(|(_, entries)| serde_json::from_value::<Vec<String>>(entries.clone()).unwrap())
        .collect();
    assert_eq!(flat, history, "the pages hold the log, in order");

    // A restarted worker reads it back, and appends after it: the newest
    // page, two entries long, is read back and extended.
    w.worker.close().await;
    let w = worker(store.clone(), ns).await;
    assert_eq!(
        strings(&get_ok(&w, &format!("{ns}/a/from/0/100")).await),
        history
    );
    post_ok(&w, &format!("{ns}/a/say/m7")).await;
    let all = drained(&w, ns, "a").await;
    let mut said = said;
    said.push("m7".to_owned());
    assert_history(&strings(&all), &said);
    assert_eq!(strings(&all)[..14], history[..]);
    let stored = pages(&*store, ns, "a", "session", "~").await;
    assert_eq!(stored.len(), 6);
    assert_eq!(stored[4].1, json!([history[12], history[13], "in:m7"]));
    w.worker.close().await;
}

#[tokio::test]
async fn a_trim_deletes_whole_pages_and_reads_leave_out_what_it_dropped() {
    let (_dir, store) = sqlite().await;
    let ns = "/chat";
    let w = worker(store.clone(), ns).await;
    let said: Vec<String> = (0..6).map(|n| format!("m{n}")).collect();
    for m in &said {
        post_ok(&w, &format!("{ns}/b/say/{m}")).await;
    }
    let history = strings(&drained(&w, ns, "b").await);
    assert_eq!(history.len(), 12);

    post_ok(&w, &format!("{ns}/b/keep/4")).await;
    let kept = get_ok(&w, &format!("{ns}/b/latest/100")).await;
    assert_eq!(
        (kept["first"].clone(), kept["start"].clone()),
        (json!(8), json!(8))
    );
    assert_eq!(strings(&kept), history[8..]);
    let from = get_ok(&w, &format!("{ns}/b/from/0/2")).await;
    assert_eq!(
        (from["first"].clone(), strings(&from)),
        (json!(8), history[8..10].to_vec())
    );
    // Pages 0 and 1 (positions 0 to 5) are wholly before 8; page 2 (6 to 8)
    // is not.
    let ids: Vec<String> = pages(&*store, ns, "b", "session", "~")
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, ["~~2", "~~3"]);

    post_ok(&w, &format!("{ns}/b/trim/100")).await;
    let none = get_ok(&w, &format!("{ns}/b/latest/100")).await;
    assert_eq!(
        (none["first"].clone(), none["entries"].clone()),
        (json!(12), json!([]))
    );
    assert!(pages(&*store, ns, "b", "session", "~").await.is_empty());

    // Positions go on after a trim, across a restart.
    w.worker.close().await;
    let w = worker(store.clone(), ns).await;
    post_ok(&w, &format!("{ns}/b/say/m6")).await;
    let after = drained(&w, ns, "b").await;
    assert_eq!(after["first"], 12);
    assert_eq!(strings(&after), ["in:m6", "out:m6"]);
    w.worker.close().await;
}

#[tokio::test]
async fn a_keyed_tray_reads_its_log_back_and_its_delete_takes_the_pages() {
    let (_dir, store) = sqlite().await;
    let ns = "/chat";
    let w = worker(store.clone(), ns).await;
    for m in ["a", "b"] {
        post_ok(&w, &format!("{ns}/c/thread/k/{m}")).await;
    }
    let read = eventually("the thread drained", PATIENCE, || async {
        let body = get_ok(&w, &format!("{ns}/c/thread/k")).await;
        (body["queued"] == 0).then_some(body)
    })
    .await;
    assert_history(&strings(&read), &["a".to_owned(), "b".to_owned()]);
    let before = strings(&read);
    assert_eq!(pages(&*store, ns, "c", "thread", "k").await.len(), 2);

    w.worker.close().await;
    let w = worker(store.clone(), ns).await;
    post_ok(&w, &format!("{ns}/c/thread/k/c")).await;
    let read = eventually("the thread drained", PATIENCE, || async {
        let body = get_ok(&w, &format!("{ns}/c/thread/k")).await;
        (body["queued"] == 0).then_some(body)
    })
    .await;
    assert_eq!(strings(&read)[..4], before[..]);
    assert_eq!(strings(&read)[4..], ["in:c", "out:c"]);

    let (status, _) = json(
        w.client
            .delete(w.url(&format!("{ns}/c/thread/k")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        pages(&*store, ns, "c", "thread", "k").await.is_empty(),
        "the pages went with the tray"
    );
    let rows = store
        .list(InstanceKey::new(ns, "c"), 0, None, None)
        .await
        .unwrap();
    assert!(
        rows.iter().all(|row| !row.tray_ns.starts_with("thread")),
        "no row of the thread left: {rows:?}"
    );
    // The key is free: a new tray starts a new log.
    post_ok(&w, &format!("{ns}/c/thread/k/d")).await;
    let read = eventually("the thread drained", PATIENCE, || async {
        let body = get_ok(&w, &format!("{ns}/c/thread/k")).await;
        (body["queued"] == 0).then_some(body)
    })
    .await;
    assert_eq!(
        (read["first"].clone(), strings(&read)),
        (json!(0), vec!["in:d".to_owned(), "out:d".to_owned()])
    );
    w.worker.close().await;
}

/// The same session tray in a new schema version.
struct SessionV1 {
    inbox: Queue<String>,
    history: Log<String>,
}

impl Default for SessionV1 {
    fn default() -> Self {
        Self {
            inbox: Queue::new(),
            history: Log::with_page_len(PAGE),
        }
    }
}

impl Tray for SessionV1 {
    const NAME: &'static str = "session";
    const VERSION: i64 = 1;
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("inbox", &mut self.inbox);
        fields.field("history", &mut self.history);
    }

    fn head(&self) -> Option<String> {
        self.inbox.front().cloned()
    }

    fn ack(&mut self, _msg: &String) {
        self.inbox.pop_front();
    }
}

struct ChatV1;

impl Object for ChatV1 {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(ChatV1)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/end",
            get(|ctx: Context| async move {
                answer(
                    async {
                        let session = ctx.tray::<SessionV1>().await?;
                        Ok(json!(session.read(|session| session.history.end())))
                    }
                    .await,
                )
            }),
        )
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<SessionV1>()
    }
}

impl TrayHandler<SessionV1> for ChatV1 {
    async fn handle(&self, _ctx: TrayCtx<SessionV1>, _msg: String) -> Result<(), BoxError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_new_schema_version_deletes_the_pages_of_the_old_one() {
    let (_dir, store) = sqlite().await;
    let ns = "/chat";
    let w = worker(store.clone(), ns).await;
    for m in ["a", "b", "c"] {
        post_ok(&w, &format!("{ns}/d/say/{m}")).await;
    }
    drained(&w, ns, "d").await;
    assert_eq!(pages(&*store, ns, "d", "session", "~").await.len(), 2);
    w.worker.close().await;

    let w = start(Options::new().host::<ChatV1>(ns).store(store.clone())).await;
    assert_eq!(
        get_ok(&w, &format!("{ns}/d/end")).await,
        0,
        "the tray activates blank"
    );
    eventually("the old pages deleted", PATIENCE, || async {
        pages(&*store, ns, "d", "session", "~")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    w.worker.close().await;
}

/// One run of five admissions whose store fails write `fail_at`, then a
/// fresh worker on what the store kept; answers the acknowledged messages,
/// the history the second worker reads, and the first worker's writes.
async fn crash_run(fail_at: usize, applied: bool) -> (Vec<String>, Value, usize) {
    let inner = Arc::new(MemoryStore::new());
    let flaky = Arc::new(FailingStore::new(inner.clone(), fail_at, applied));
    let ns = "/chat";
    let first = worker(flaky.clone(), ns).await;
    let mut acknowledged = Vec::new();
    for n in 0..5 {
        let m = format!("m{n}");
        if first.post(&format!("{ns}/x/say/{m}")).await.status() == 200 {
            acknowledged.push(m);
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

    let second = worker(inner.clone(), ns).await;
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
    let history = drained(&second, ns, "x").await;
    second.worker.close().await;
    (acknowledged, history, writes)
}

#[tokio::test]
async fn a_crash_at_any_write_loses_no_acknowledged_append_repeats_none_and_keeps_their_order() {
    let (acknowledged, history, clean_writes) = crash_run(usize::MAX, false).await;
    assert_eq!(acknowledged.len(), 5);
    assert_history(&strings(&history), &acknowledged);
    assert!(clean_writes >= 5, "{clean_writes} writes");
    eprintln!("a clean run makes {clean_writes} writes");
    for applied in [false, true] {
        for fail_at in 1..=clean_writes + 1 {
            let (acknowledged, history, _) = crash_run(fail_at, applied).await;
            let entries = strings(&history);
            let case = format!(
                "write {fail_at} failing (applied: {applied}): acknowledged {acknowledged:?}, history {entries:?}"
            );
            assert_eq!(history["first"], 0, "{case}");
            assert_eq!(
                history["end"],
                entries.len(),
                "{case}: positions without a gap"
            );
            // Whatever was admitted (acknowledged, or applied before its
            // answer was lost) is in the log once, handled once, in order.
            let said: Vec<String> = entries
                .iter()
                .filter_map(|e| e.strip_prefix("in:").map(str::to_owned))
                .collect();
            assert_history(&entries, &said);
            for m in &acknowledged {
                assert!(said.contains(m), "{case}: acknowledged {m} is in the log");
            }
            let numbers: Vec<u32> = said.iter().map(|m| m[1..].parse().unwrap()).collect();
            assert!(
                numbers.windows(2).all(|w| w[0] < w[1]),
                "{case}: admission order kept"
            );
        }
    }
}

#[tokio::test]
async fn a_worker_restarted_on_the_same_postgres_reads_the_log_back() {
    let ns = unique_ns("log");
    let _cleanup = PostgresCleanup::new(&ns);
    let open = || async {
        let store = PostgresStore::open(&database_url(), PostgresOptions::default())
            .await
            .expect("Postgres must be reachable at PINNED_TEST_DATABASE_URL");
        Arc::new(store) as Arc<dyn StateStore>
    };
    let store = open().await;
    let w = worker(store.clone(), &ns).await;
    let said: Vec<String> = (0..20).map(|n| format!("m{n}")).collect();
    for m in &said {
        post_ok(&w, &format!("{ns}/p/say/{m}")).await;
    }
    let history = strings(&drained(&w, &ns, "p").await);
    assert_eq!(history.len(), 40);
    assert_history(&history, &said);
    w.worker.close().await;
    drop(store);

    let store = open().await;
    let w = worker(store.clone(), &ns).await;
    assert_eq!(
        strings(&get_ok(&w, &format!("{ns}/p/from/0/1000")).await),
        history
    );
    let latest = get_ok(&w, &format!("{ns}/p/latest/7")).await;
    assert_eq!(
        (latest["first"].clone(), strings(&latest)),
        (json!(33), history[33..].to_vec())
    );
    post_ok(&w, &format!("{ns}/p/say/m20")).await;
    let mut said = said;
    said.push("m20".to_owned());
    assert_history(&strings(&drained(&w, &ns, "p").await), &said);
    let (_, doc) = support::stored_tray(&*store, &ns, "p", TrayKey::singleton("session"))
        .await
        .expect("the session's row");
    assert_eq!(
        doc["history"],
        json!({"start": 0, "next": 42, "page": PAGE})
    );

    // A trim on Postgres: its page deletes land with the row.
    post_ok(&w, &format!("{ns}/p/keep/4")).await;
    let kept = get_ok(&w, &format!("{ns}/p/from/0/100")).await;
    let all = strings(&drained(&w, &ns, "p").await);
    assert_eq!((kept["first"].clone(), strings(&kept)), (json!(38), all));
    let ids: Vec<String> = pages(&*store, &ns, "p", "session", "~")
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        ids,
        ["~~12", "~~13"],
        "pages 0 to 11 (positions 0 to 35) deleted"
    );
    w.worker.close().await;
}

/// A tray whose name holds `~`.
#[derive(Default)]
struct Tilde {
    inbox: Queue<String>,
}

impl Tray for Tilde {
    const NAME: &'static str = "a~b";
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("inbox", &mut self.inbox);
    }

    fn head(&self) -> Option<String> {
        self.inbox.front().cloned()
    }

    fn ack(&mut self, _msg: &String) {
        self.inbox.pop_front();
    }
}

impl TrayHandler<Tilde> for Chat {
    async fn handle(&self, _ctx: TrayCtx<Tilde>, _msg: String) -> Result<(), BoxError> {
        Ok(())
    }
}

#[test]
#[should_panic(expected = "holds '~'")]
fn a_tray_name_with_a_tilde_is_refused_so_no_page_reads_as_a_tray() {
    let _ = Trays::<Chat>::new().singleton::<Tilde>();
}
