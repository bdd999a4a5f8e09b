//! Messages between objects on a real worker and a real SQLite file:
//! letters from a tray handler's ack and from a handle are delivered
//! through cluster calls and admitted once each, in order per sender; a
//! letter sent again is a repeat; bad letters and bad sends are refused
//! with precise answers; letters a receiver does not take yet wait in the
//! sender's row, are retried, and a new worker delivers them after the
//! first one closed; and a store write failing anywhere (landed or not)
//! never loses an acknowledged order's note nor admits one twice.
#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, Query};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::pinned_store::{
    FailingStore, InstanceKey, MemoryStore, SqliteOptions, SqliteStore, StateStore, TrayKey,
};
use pinned::tray::{
    Fields, Queue, Receive, Recipient, Tray, TrayCtx, TrayError, TrayHandler, Trays, Value,
};
use pinned::{AuthError, BoxError, Context, Denial, Object, Options};
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::{eventually, json, start, TestWorker, PATIENCE};
use test_support::metrics;

/// Steers the receiver: it turns every request away while `closed`.
#[derive(Clone, Default)]
struct Lab {
    closed: Arc<AtomicBool>,
}

/// One message: who sent it and its number.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Note {
    from: String,
    n: u64,
}

/// The sender's tray: numbers to send, one message each.
#[derive(Default)]
struct Orders {
    queue: Queue<u64>,
}

impl Tray for Orders {
    const NAME: &'static str = "orders";
    type Item = u64;
    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
    }
    fn head(&self) -> Option<u64> {
        self.queue.front().copied()
    }
    fn ack(&mut self, _n: &u64) {
        self.queue.pop_front();
    }
}

/// The receiver's tray: notes received, and what its handler recorded.
#[derive(Default)]
struct Book {
    queue: Queue<Note>,
    got: Value<Vec<String>>,
}

impl Tray for Book {
    const NAME: &'static str = "book";
    type Item = Note;
    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
        fields.field("got", &mut self.got);
    }
    fn head(&self) -> Option<Note> {
        self.queue.front().cloned()
    }
    fn ack(&mut self, _note: &Note) {
        self.queue.pop_front();
    }
}

impl Receive for Book {
    type Message = Note;
    fn receive(&mut self, note: Note) {
        self.queue.push_back(note);
    }
}

/// A keyed receiving tray: one desk per key, created by its first note.
#[derive(Default)]
struct Desk {
    queue: Queue<Note>,
    got: Value<Vec<String>>,
}

impl Tray for Desk {
    const NAME: &'static str = "desk";
    type Item = Note;
    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
        fields.field("got", &mut self.got);
    }
    fn head(&self) -> Option<Note> {
        self.queue.front().cloned()
    }
    fn ack(&mut self, _note: &Note) {
        self.queue.pop_front();
    }
}

impl Receive for Desk {
    type Message = Note;
    fn receive(&mut self, note: Note) {
        self.queue.push_back(note);
    }
}

const LEDGER: &str = "/books";

struct Shop;

impl Object for Shop {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Shop)
    }
    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/place/{n}", post(place))
            .route("/direct", post(direct))
            .route("/forge", post(forge))
            .route("/desk/{key}/{n}", post(to_desk))
    }
    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Orders>()
    }
}

impl TrayHandler<Orders> for Shop {
    async fn handle(&self, ctx: TrayCtx<Orders>, n: u64) -> Result<(), BoxError> {
        let from = ctx.context().id().to_owned();
        ctx.send::<Book>(&Recipient::singleton(LEDGER, "ledger"), &Note { from, n })?;
        Ok(())
    }
}

async fn place(ctx: Context, Path(n): Path<u64>) -> Result<Response, TrayError> {
    let orders = ctx.tray::<Orders>().await?;
    orders.admit(|orders| orders.queue.push_back(n))?.await?;
    Ok(Json(json!({ "placed": n })).into_response())
}

#[derive(Deserialize)]
struct DirectQuery {
    ns: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    pad: usize,
}

/// Sends one note from the handle, with no handler run.
async fn direct(ctx: Context, Query(q): Query<DirectQuery>) -> Result<Response, TrayError> {
    let orders = ctx.tray::<Orders>().await?;
    let to = match q.key {
        Some(key) => Recipient::keyed(q.ns, "ledger", key),
        None => Recipient::singleton(q.ns, "ledger"),
    };
    let note = Note {
        from: "x".repeat(q.pad),
        n: 0,
    };
    orders.send::<Book>(&to, &note)?.await?;
    Ok(Json(json!({ "sent": true })).into_response())
}

/// Sends note `n` to the ledger's desk `key`, from the handle.
async fn to_desk(ctx: Context, Path((key, n)): Path<(String, u64)>) -> Result<Response, TrayError> {
    let orders = ctx.tray::<Orders>().await?;
    let note = Note {
        from: ctx.id().to_owned(),
        n,
    };
    orders
        .send::<Desk>(&Recipient::keyed(LEDGER, "ledger", key), &note)?
        .await?;
    Ok(Json(json!({ "sent": n })).into_response())
}

/// Posts a raw letter to the ledger's receiving route, as a courier would.
async fn forge(ctx: Context, Json(letter): Json<serde_json::Value>) -> Response {
    let answer = ctx
        .cluster()
        .post(
            "/books/ledger/_pinned/messages",
            serde_json::to_vec(&letter).unwrap(),
        )
        .await
        .unwrap();
    let status = answer.status();
    let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
        .await
        .unwrap();
    Json(json!({
        "status": status.as_u16(),
        "body": serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default(),
    }))
    .into_response()
}

struct Ledger;

impl Object for Ledger {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Ledger)
    }
    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/got", get(got))
            .route("/desk/{key}", get(desk))
    }
    fn trays() -> Trays<Self> {
        Trays::new()
            .singleton::<Book>()
            .keyed::<Desk>()
            .receives::<Book>()
            .receives::<Desk>()
    }
    async fn authorize(ctx: &Context, _request: &http::request::Parts) -> Result<(), AuthError> {
        let closed = ctx
            .state::<Lab>()
            .is_some_and(|lab| lab.closed.load(Ordering::SeqCst));
        if closed {
            Err(Denial::forbidden("closed for the test"))?;
        }
        Ok(())
    }
}

impl TrayHandler<Book> for Ledger {
    async fn handle(&self, ctx: TrayCtx<Book>, note: Note) -> Result<(), BoxError> {
        ctx.on_ack(move |book| book.got.push(format!("{}:{}", note.from, note.n)));
        Ok(())
    }
}

impl TrayHandler<Desk> for Ledger {
    async fn handle(&self, ctx: TrayCtx<Desk>, note: Note) -> Result<(), BoxError> {
        ctx.on_ack(move |desk| desk.got.push(format!("{}:{}", note.from, note.n)));
        Ok(())
    }
}

async fn desk(ctx: Context, Path(key): Path<String>) -> Result<Response, TrayError> {
    let desk = ctx.keyed::<Desk>()?.get(&key).await?;
    Ok(Json(json!(desk.read(|desk| (*desk.got).clone()))).into_response())
}

async fn got(ctx: Context) -> Result<Response, TrayError> {
    let book = ctx.tray::<Book>().await?;
    Ok(Json(json!(book.read(|book| (*book.got).clone()))).into_response())
}

struct Setup {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("messages.db");
    Setup { _dir: dir, path }
}

async fn store(setup: &Setup) -> Arc<SqliteStore> {
    Arc::new(
        SqliteStore::open(&setup.path, SqliteOptions::default())
            .await
            .unwrap(),
    )
}

async fn worker(store: Arc<SqliteStore>, lab: &Lab) -> TestWorker {
    start(
        Options::new()
            .host::<Shop>("/shops")
            .host::<Ledger>(LEDGER)
            .state(lab.clone())
            .store(store),
    )
    .await
}

async fn got_list(w: &TestWorker) -> Vec<String> {
    let (status, body) = json(w.get("/books/ledger/got").await).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_value(body).unwrap()
}

/// The sender's `orders` row: its mark and its `~outgoing` entry.
async fn sender_row(store: &SqliteStore, id: &str) -> (bool, serde_json::Value) {
    let (marked, doc) = support::stored_tray(store, "/shops", id, TrayKey::singleton("orders"))
        .await
        .expect("the sender's row");
    (marked, doc.get("~outgoing").cloned().unwrap_or_default())
}

/// Every sender's notes appear once each, in the order sent.
fn assert_once_in_order(got: &[String], senders: &[&str], count: u64) {
    for sender in senders {
        let theirs: Vec<u64> = got
            .iter()
            .filter_map(|entry| entry.strip_prefix(&format!("{sender}:")))
            .map(|n| n.parse().unwrap())
            .collect();
        let expected: Vec<u64> = (1..=count).collect();
        assert_eq!(theirs, expected, "{sender}'s notes in {got:?}");
    }
    assert_eq!(got.len() as u64, count * senders.len() as u64, "{got:?}");
}

#[tokio::test]
async fn notes_sent_from_handlers_are_admitted_once_each_in_order_per_sender() {
    let setup = setup();
    let store = store(&setup).await;
    let lab = Lab::default();
    let w = worker(store.clone(), &lab).await;
    let before = metrics::parse(&w.worker.metrics());
    let place = |id: &'static str, n: u64| {
        let w = &w;
        async move {
            let (status, body) = json(w.post(&format!("/shops/{id}/place/{n}")).await).await;
            assert_eq!(status, 200, "{body}");
        }
    };
    for n in 1..=15 {
        tokio::join!(place("a", n), place("b", n));
    }
    let got = eventually("30 notes in the ledger", PATIENCE, || async {
        let got = got_list(&w).await;
        (got.len() >= 30).then_some(got)
    })
    .await;
    assert_once_in_order(&got, &["a", "b"], 15);
    for id in ["a", "b"] {
        let rested = eventually("the sender's row rests", PATIENCE, || async {
            let (marked, outgoing) = sender_row(&store, id).await;
            (!marked && outgoing["queue"] == json!([])).then_some(outgoing)
        })
        .await;
        assert_eq!(rested["next"], 16, "{rested}");
    }
    let after = metrics::parse(&w.worker.metrics());
    let delivered = metrics::moved(
        &before,
        &after,
        r#"pinned_tray_messages{side="sent",outcome="delivered"}"#,
    );
    let admitted = metrics::moved(
        &before,
        &after,
        r#"pinned_tray_messages{side="received",outcome="admitted"}"#,
    );
    assert_eq!((delivered, admitted), (30.0, 30.0));
    assert_eq!(got_list(&w).await.len(), 30, "nothing came twice later");
}

#[tokio::test]
async fn a_letter_sent_again_is_a_repeat_and_bad_letters_are_refused() {
    let setup = setup();
    let lab = Lab::default();
    let w = worker(store(&setup).await, &lab).await;
    let before = metrics::parse(&w.worker.metrics());
    let forge = |letter: serde_json::Value| {
        let w = &w;
        async move {
            let response = w
                .client
                .post(w.url("/shops/f/forge"))
                .json(&letter)
                .send()
                .await
                .unwrap();
            json(response).await.1
        }
    };
    let letter = |seq: u64, n: u64| {
        json!({"stream": "s1", "seq": seq, "tray": "book", "key": "~",
               "message": {"from": "f", "n": n}})
    };
    let first = forge(letter(1, 1)).await;
    assert_eq!(first, json!({"status": 200, "body": {"admitted": true}}));
    let again = forge(letter(1, 99)).await;
    assert_eq!(again, json!({"status": 200, "body": {"admitted": false}}));
    let second = forge(letter(2, 2)).await;
    assert_eq!(second["body"]["admitted"], true);
    // Another stream of the same instance is another sender.
    let other = forge(json!({"stream": "s2", "seq": 1, "tray": "book", "key": "~",
                             "message": {"from": "g", "n": 1}}))
    .await;
    assert_eq!(other["body"]["admitted"], true);
    let got = eventually("three notes", PATIENCE, || async {
        let got = got_list(&w).await;
        (got.len() >= 3).then_some(got)
    })
    .await;
    assert_eq!(got, vec!["f:1", "f:2", "g:1"]);

    let refusals = [
        (
            json!({"stream": "s1", "seq": 3, "tray": "nope", "key": "~", "message": {}}),
            "tray \"nope\" does not receive messages here",
        ),
        (
            json!({"stream": "s1", "seq": 3, "tray": "book", "key": "k", "message": {"from": "f", "n": 3}}),
            "does not fit its singleton tray",
        ),
        (
            json!({"stream": "s1", "seq": 3, "tray": "book", "key": "~", "message": {"n": "x"}}),
            "tray book cannot read the message",
        ),
        (json!({"seq": 3}), "malformed letter"),
    ];
    for (bad, says) in refusals {
        let answer = forge(bad).await;
        assert_eq!(answer["status"], 422, "{answer}");
        let detail = answer["body"]["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{detail:?} should say {says:?}");
    }
    // Not from an instance: refused before anything is read.
    let (status, body) = json(
        w.client
            .post(w.url("/books/ledger/_pinned/messages"))
            .json(&letter(9, 9))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["detail"],
        "messages are taken from other instances only"
    );
    let after = metrics::parse(&w.worker.metrics());
    let repeats = metrics::moved(
        &before,
        &after,
        r#"pinned_tray_messages{side="received",outcome="repeat"}"#,
    );
    assert_eq!(repeats, 1.0);
    assert_eq!(got_list(&w).await.len(), 3);
}

#[tokio::test]
async fn bad_sends_are_refused_with_what_is_wrong_and_a_handle_sends_too() {
    let setup = setup();
    let lab = Lab::default();
    let w = worker(store(&setup).await, &lab).await;
    let cases = [
        ("/shops/a/direct?ns=books", "namespace \"books\""),
        ("/shops/a/direct?ns=/bo%20oks", "namespace \"/bo oks\""),
        (
            "/shops/a/direct?ns=/books&key=",
            "a tray key must be 1 to 200 bytes",
        ),
        ("/shops/a/direct?ns=/books&pad=70000", "at most 65536 bytes"),
    ];
    for (path, says) in cases {
        let (status, body) = json(w.post(path).await).await;
        assert_eq!(status, 400, "{path}: {body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains(says),
            "{path}: {detail:?} should say {says:?}"
        );
    }
    let (status, body) = json(w.post("/shops/a/direct?ns=/books&pad=3").await).await;
    assert_eq!((status, body), (200, json!({"sent": true})));
    let got = eventually("the handle's note", PATIENCE, || async {
        let got = got_list(&w).await;
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(got, vec!["xxx:0"]);
}

#[tokio::test]
async fn notes_a_receiver_turns_away_wait_in_the_senders_row_and_a_new_worker_delivers_them() {
    let setup = setup();
    let first_store = store(&setup).await;
    let lab = Lab::default();
    lab.closed.store(true, Ordering::SeqCst);
    let first = worker(first_store.clone(), &lab).await;
    let before = metrics::parse(&first.worker.metrics());
    for n in 1..=5 {
        assert_eq!(
            first.post(&format!("/shops/a/place/{n}")).await.status(),
            200
        );
    }
    // Every order acked, every note waiting in the row, the row marked.
    eventually(
        "five notes waiting in the sender's row",
        PATIENCE,
        || async {
            let (marked, outgoing) = sender_row(&first_store, "a").await;
            let waiting = outgoing["queue"].as_array().map_or(0, Vec::len);
            (marked && waiting == 5).then_some(())
        },
    )
    .await;
    let retried = r#"pinned_tray_messages{side="sent",outcome="retried"}"#;
    let after = eventually("a delivery retried", PATIENCE, || async {
        let now = metrics::parse(&first.worker.metrics());
        (now.value(retried) > before.value(retried)).then_some(now)
    })
    .await;
    metrics::moved(&before, &after, retried);
    first.worker.close().await;
    let (marked, outgoing) = sender_row(&first_store, "a").await;
    assert!(marked, "a row with notes waiting stays marked: {outgoing}");
    assert_eq!(outgoing["queue"].as_array().unwrap().len(), 5);

    // A new worker wakes the marked sender with no request and delivers.
    let lab = Lab::default();
    let second_store = store(&setup).await;
    let second = worker(second_store.clone(), &lab).await;
    let got = eventually("five notes in the ledger", PATIENCE, || async {
        let got = got_list(&second).await;
        (got.len() >= 5).then_some(got)
    })
    .await;
    assert_once_in_order(&got, &["a"], 5);
    eventually("the sender's row rests", PATIENCE, || async {
        let (marked, outgoing) = sender_row(&second_store, "a").await;
        (!marked && outgoing["queue"] == json!([])).then_some(())
    })
    .await;
}

/// One crash run: four orders through a worker whose store fails write
/// `fail_at` (having `applied` it or not), then a fresh worker on the
/// surviving rows delivers what is left. Answers the acknowledged orders,
/// the ledger's final `got` list and how many writes the first worker made.
async fn crash_run(fail_at: usize, applied: bool) -> (Vec<String>, Vec<String>, usize) {
    let inner = Arc::new(MemoryStore::new());
    let flaky = Arc::new(FailingStore::new(inner.clone(), fail_at, applied));
    let options = |store: Arc<dyn StateStore>| {
        Options::new()
            .host::<Shop>("/shops")
            .host::<Ledger>(LEDGER)
            .state(Lab::default())
            .store(store)
    };
    let first = start(options(flaky.clone())).await;
    let mut acknowledged = Vec::new();
    for n in 1..=4 {
        if first.post(&format!("/shops/a/place/{n}")).await.status() == 200 {
            acknowledged.push(format!("a:{n}"));
        }
    }
    eventually("the first worker done or failed", PATIENCE, || async {
        let drained = inner.marked_instances(None, 1).await.unwrap().is_empty();
        (flaky.failed() || drained).then_some(())
    })
    .await;
    first.worker.close().await;
    let writes = flaky.writes();

    let second = start(options(inner.clone())).await;
    eventually(
        "the second worker drained every marked row",
        PATIENCE,
        || async {
            let marked = inner.marked_instances(None, 1).await.unwrap();
            marked.is_empty().then_some(())
        },
    )
    .await;
    let got = inner
        .get_tray(
            InstanceKey::new(LEDGER, "ledger"),
            TrayKey::singleton("book"),
            u64::MAX / 2,
        )
        .await
        .unwrap()
        .and_then(|row| row.doc.get("got").cloned())
        .map(|got| serde_json::from_value(got).unwrap())
        .unwrap_or_default();
    second.worker.close().await;
    (acknowledged, got, writes)
}

#[tokio::test]
async fn a_write_failing_anywhere_books_every_acknowledged_order_exactly_once_in_order() {
    let (acknowledged, got, clean_writes) = crash_run(usize::MAX, false).await;
    assert_eq!(acknowledged, got, "a clean run sends everything once");
    assert!(clean_writes >= 4, "{clean_writes} writes");
    for applied in [false, true] {
        for fail_at in 1..=clean_writes + 1 {
            let (acknowledged, got, _) = crash_run(fail_at, applied).await;
            let case = format!(
                "write {fail_at} failing (applied: {applied}): acknowledged {acknowledged:?}, got {got:?}"
            );
            for note in &acknowledged {
                assert_eq!(
                    got.iter().filter(|g| *g == note).count(),
                    1,
                    "{case}: an acknowledged order's note admitted exactly once"
                );
            }
            let mut unique = got.clone();
            unique.dedup();
            assert_eq!(unique, got, "{case}: no note twice");
            let order: Vec<u64> = got.iter().map(|g| g[2..].parse().unwrap()).collect();
            assert!(order.windows(2).all(|w| w[0] < w[1]), "{case}: order kept");
        }
    }
}

#[tokio::test]
async fn a_keyed_receiving_tray_is_created_by_its_first_note_and_each_key_gets_its_own() {
    let setup = setup();
    let lab = Lab::default();
    let w = worker(store(&setup).await, &lab).await;
    for (key, n) in [("k1", 1), ("k2", 2), ("k1", 3)] {
        let (status, body) = json(w.post(&format!("/shops/a/desk/{key}/{n}")).await).await;
        assert_eq!(status, 200, "{body}");
    }
    for (key, expected) in [("k1", json!(["a:1", "a:3"])), ("k2", json!(["a:2"]))] {
        let got = eventually(&format!("desk {key}'s notes"), PATIENCE, || async {
            let (status, got) = json(w.get(&format!("/books/ledger/desk/{key}")).await).await;
            (status == 200 && got == expected).then_some(got)
        })
        .await;
        assert_eq!(got, expected);
    }
    // A keyed tray with no note was never created.
    let (status, body) = json(w.get("/books/ledger/desk/k3").await).await;
    assert_eq!(status, 404, "{body}");
}
