//! Keyed cross-tray dispatch (`TrayCtx::dispatch`) held to the Python
//! reference's own executable spec: a Rust port of its crash workload
//! (`pinned/sim/workload.py`, `SweepLane`: `relay` items dispatch into the
//! `sink` tray beside the `work` lane and the keyed `kwork` lanes, whose
//! deliveries take feed entries, cycle the steer lane through takes and
//! untakes, set dispatch state and log effects in ad-hoc storage, and a
//! keyed `scratch` tray put and deleted) runs on a store that fails one
//! write, at every write in turn (not applied, and applied with the answer
//! lost), a fresh worker then drains what the store kept, and the rows,
//! shaped as the reference's `MemoryStateStore` disk image, go through the
//! reference's `pinned.sim.contract.validate` (the interpreter is
//! `$PINNED_PY`, else the workspace's `.venv`). The same again with the
//! worker in a process of its own on Postgres (`PINNED_TEST_DATABASE_URL`),
//! SIGKILLed after each step of the generation, a new process recovering. Also: the rows of one
//! dispatch at each phase, byte for byte the reference's shape, and a
//! failed run's redelivery answering the recorded outcome.
#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::Path;
use axum::routing::post;
use axum::Router;
use pinned::pinned_store::conformance::{database_url, unique_ns, PostgresCleanup};
use pinned::pinned_store::{
    FailingStore, InstanceKey, MemoryStore, PostgresOptions, PostgresStore, StateStore, TrayKey,
};
use pinned::tray::{
    Dispatched, Fields, Queue, Tray, TrayCtx, TrayError, TrayHandler, Trays, Value,
};
use pinned::{BoxError, Context, Object, Options};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};
use support::{eventually, start, TestWorker, PATIENCE};

/// The reference workload's instance (`workload.NS`, `workload.ID`).
const NS: &str = "/threads";
const ID: &str = "a";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Item {
    n: u64,
}

/// A steer lane entry: each admission appends its lead, then its tail; a
/// delivery that rewrites the lane marks the entries of other items with
/// `after`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Steer {
    n: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    tail: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    after: Option<u64>,
}

/// The reference's `SweepTray`: the work lane, its feed and steer lanes and
/// a done cursor; ad-hoc storage holds the `log` of effects and what each
/// item `steered`. `Lane<false>` is the singleton `work`, `Lane<true>` the
/// keyed `kwork`.
#[derive(Default)]
struct Lane<const KEYED: bool> {
    queue: Queue<Item>,
    feed: Queue<Item>,
    steer: Queue<Steer>,
    done: Value<u64>,
}

impl<const KEYED: bool> Tray for Lane<KEYED> {
    const NAME: &'static str = if KEYED { "kwork" } else { "work" };
    type Item = Item;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
        fields.field("feed", &mut self.feed);
        fields.field("steer", &mut self.steer);
        fields.field("done", &mut self.done);
    }

    fn head(&self) -> Option<Item> {
        self.queue.front().cloned()
    }

    fn ack(&mut self, _item: &Item) {
        self.queue.pop_front();
    }
}

type Work = Lane<false>;
type KWork = Lane<true>;

/// The reference's `ScratchTray`: a keyed tray with one value and no
/// items, put and deleted.
#[derive(Default)]
struct Scratch {
    note: Value<i64>,
}

impl Tray for Scratch {
    const NAME: &'static str = "scratch";
    type Item = Item;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("note", &mut self.note);
    }

    fn head(&self) -> Option<Item> {
        None
    }

    fn ack(&mut self, _item: &Item) {}
}

/// The reference's `PipeTray`, once as `relay` and once as `sink`.
macro_rules! pipe {
    ($tray:ident, $name:literal) => {
        #[derive(Default)]
        struct $tray {
            queue: Queue<Item>,
            done: Value<u64>,
        }

        impl Tray for $tray {
            const NAME: &'static str = $name;
            type Item = Item;

            fn fields(&mut self, fields: &mut Fields<'_>) {
                fields.field("queue", &mut self.queue);
                fields.field("done", &mut self.done);
            }

            fn head(&self) -> Option<Item> {
                self.queue.front().cloned()
            }

            fn ack(&mut self, _item: &Item) {
                self.queue.pop_front();
            }
        }
    };
}

pipe!(Relay, "relay");
pipe!(Sink, "sink");

/// The port of `SweepLane`.
struct SweepLane;

/// The reference's admission: the item, its feed entry and its pair of
/// steer entries, in one write.
fn admit_lane<const KEYED: bool>(lane: &mut Lane<KEYED>, n: u64) {
    lane.queue.push_back(Item { n });
    lane.feed.push_back(Item { n });
    for tail in [false, true] {
        lane.steer.push_back(Steer {
            n,
            tail,
            after: None,
        });
    }
}

async fn enqueue(ctx: Context, Path(n): Path<u64>) -> Result<axum::Json<Json>, TrayError> {
    let work = ctx.tray::<Work>().await?;
    work.admit(|work| admit_lane(work, n))?.await?;
    Ok(axum::Json(json!({ "admitted": n })))
}

async fn kenqueue(
    ctx: Context,
    Path((key, n)): Path<(String, u64)>,
) -> Result<axum::Json<Json>, TrayError> {
    let lane = ctx.keyed::<KWork>()?.get_or_create(&key).await?;
    lane.admit(|lane| admit_lane(lane, n))?.await?;
    Ok(axum::Json(json!({ "admitted": n })))
}

async fn scratch_put(ctx: Context, Path(v): Path<i64>) -> Result<axum::Json<Json>, TrayError> {
    let scratch = ctx.keyed::<Scratch>()?.get_or_create("s").await?;
    scratch.admit(|scratch| scratch.note.set(v))?.await?;
    Ok(axum::Json(json!({})))
}

async fn scratch_drop(ctx: Context) -> Result<axum::Json<Json>, TrayError> {
    match ctx.keyed::<Scratch>()?.delete("s").await {
        Ok(()) | Err(TrayError::NotFound { .. }) => Ok(axum::Json(json!({}))),
        Err(error) => Err(error),
    }
}

async fn relay(ctx: Context, Path(n): Path<u64>) -> Result<axum::Json<Json>, TrayError> {
    let relay = ctx.tray::<Relay>().await?;
    relay
        .admit(|relay| relay.queue.push_back(Item { n }))?
        .await?;
    Ok(axum::Json(json!({ "admitted": n })))
}

impl Object for SweepLane {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(SweepLane)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/enqueue/{n}", post(enqueue))
            .route("/kenqueue/{key}/{n}", post(kenqueue))
            .route("/relay/{n}", post(relay))
            .route("/scratch/{v}", post(scratch_put))
            .route("/scratch_drop", post(scratch_drop))
    }

    fn trays() -> Trays<Self> {
        Trays::new()
            .singleton::<Work>()
            .keyed::<KWork>()
            .keyed::<Scratch>()
            .singleton::<Relay>()
            .singleton::<Sink>()
    }
}

/// Appends the seq-keyed effect `{n, attempts}` to the `log` in ad-hoc
/// storage and moves the done cursor (two writes, as the reference).
fn log_effect<T: Tray>(
    tray: &pinned::tray::TrayHandle<T>,
    done: u64,
    n: u64,
    attempts: u64,
    set_done: impl FnOnce(&mut T, u64),
) -> Result<(), TrayError> {
    let seq = done + 1;
    let mut log: Vec<Json> = tray.storage_get("log")?.unwrap_or_default();
    log.truncate(usize::try_from(seq - 1).unwrap());
    log.push(json!({ "n": n, "attempts": attempts }));
    let _ = tray.storage_set("log", &log)?;
    let _ = tray.update(|tray| set_done(tray, seq))?;
    Ok(())
}

/// The reference's `consume_steer`: cycles the steer lane down to `n`'s
/// entries (take every entry and hand them all back, take `n`'s first, then
/// rewrite the lane with that one still taken and take the rest of `n`'s),
/// one write per step; answers the `n` of each entry it took.
fn consume_steer<const KEYED: bool>(
    lane: &pinned::tray::TrayHandle<Lane<KEYED>>,
    n: u64,
) -> Result<Vec<u64>, TrayError> {
    let (all, _) = lane.update(|lane| lane.steer.take(lane.steer.len()).len())?;
    let _ = lane.update(|lane| lane.steer.untake(all))?;
    let (mut mine, _) = lane.update(|lane| {
        if lane.steer.front().is_some_and(|entry| entry.n == n) {
            lane.steer.take(1)
        } else {
            Vec::new()
        }
    })?;
    let (keep, _) = lane.update(|lane| {
        let mut entries = Vec::new();
        while let Some(entry) = lane.steer.pop_front() {
            entries.push(entry);
        }
        let (keep, rest): (Vec<Steer>, Vec<Steer>) =
            entries.into_iter().partition(|entry| entry.n == n);
        let kept = keep.len();
        for entry in keep {
            lane.steer.push_back(entry);
        }
        for entry in rest {
            lane.steer.push_back(Steer {
                after: Some(n),
                ..entry
            });
        }
        kept
    })?;
    let (more, _) = lane.update(|lane| lane.steer.take(keep))?;
    mine.extend(more);
    Ok(mine.into_iter().map(|entry| entry.n).collect())
}

impl<const KEYED: bool> TrayHandler<Lane<KEYED>> for SweepLane {
    async fn handle(&self, mut ctx: TrayCtx<Lane<KEYED>>, item: Item) -> Result<(), BoxError> {
        if ctx.state::<Json>()?.is_none() {
            let _ = ctx.set_state(&json!({ "stage": "taking" }))?;
        }
        let lane = ctx.tray();
        let (fed, _) = lane.update(|lane| lane.feed.take(1))?;
        let entry = fed.into_iter().next().ok_or("no feed entry")?;
        let _ = ctx.set_state(&json!({ "stage": "took", "n": entry.n }))?;
        if entry.n != item.n {
            return Err(format!("fed {} for item {}", entry.n, item.n).into());
        }
        let mine = consume_steer(&lane, item.n)?;
        let mut steered: BTreeMap<String, Vec<u64>> =
            lane.storage_get("steered")?.unwrap_or_default();
        steered.insert(item.n.to_string(), mine);
        let _ = lane.storage_set("steered", &steered)?;
        let done = lane.read(|lane| *lane.done);
        log_effect(&lane, done, entry.n, ctx.attempts(), |lane, seq| {
            lane.done.set(seq);
        })?;
        // A durable mid-dispatch effect: crash points between it and the
        // ack exercise the redelivery.
        ctx.written().await?;
        Ok(())
    }
}

impl TrayHandler<Scratch> for SweepLane {
    async fn handle(&self, _ctx: TrayCtx<Scratch>, _item: Item) -> Result<(), BoxError> {
        Err("a scratch tray has no items".into())
    }
}

/// Relay items from [`HELD`] on wait for a permit here after their
/// dispatch, so a test can read the rows between the two phases.
static HOLD: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
const HELD: u64 = 1000;
/// Relay items from [`FAILING`] on fail their first run after their
/// dispatch.
const FAILING: u64 = 500;

/// The relay item [`LATE`] leaves a task holding its `TrayCtx` that
/// dispatches once a permit here lets it, after the run ended; its answer
/// goes to [`LATE_ANSWER`].
static LATE_GO: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
static LATE_ANSWER: parking_lot::Mutex<Option<Result<Dispatched, String>>> =
    parking_lot::Mutex::new(None);
const LATE: u64 = 2000;

impl TrayHandler<Relay> for SweepLane {
    async fn handle(&self, ctx: TrayCtx<Relay>, item: Item) -> Result<(), BoxError> {
        let sink = ctx.context().tray::<Sink>().await?;
        if item.n == LATE {
            tokio::spawn(async move {
                if let Ok(permit) = LATE_GO.acquire().await {
                    permit.forget();
                }
                let answer = ctx.dispatch(&sink, &("late", item.n), |sink| {
                    sink.queue.push_back(item.clone());
                });
                *LATE_ANSWER.lock() = Some(answer.map_err(|error| error.to_string()));
            });
            return Ok(());
        }
        let admitted = item.clone();
        let outcome = ctx.dispatch(&sink, &("r", item.n), move |sink| {
            sink.queue.push_back(admitted);
        })?;
        if item.n >= HELD {
            ctx.written().await?;
            HOLD.acquire().await?.forget();
        } else if item.n >= FAILING && ctx.attempts() == 1 {
            return Err("the first run fails after its dispatch".into());
        }
        let relay = ctx.tray();
        let mut relayed: BTreeMap<String, Dispatched> =
            relay.storage_get("relayed")?.unwrap_or_default();
        relayed.insert(item.n.to_string(), outcome);
        let _ = relay.storage_set("relayed", &relayed)?;
        // The admission durable, the relay's ack not: the tear a re-run
        // must absorb through.
        ctx.written().await?;
        Ok(())
    }
}

impl TrayHandler<Sink> for SweepLane {
    async fn handle(&self, ctx: TrayCtx<Sink>, item: Item) -> Result<(), BoxError> {
        let sink = ctx.tray();
        let done = sink.read(|sink| *sink.done);
        log_effect(&sink, done, item.n, ctx.attempts(), |sink, seq| {
            sink.done.set(seq);
        })?;
        ctx.written().await?;
        Ok(())
    }
}

async fn worker(store: Arc<dyn StateStore>, ns: &str) -> TestWorker {
    start(Options::new().host::<SweepLane>(ns).store(store)).await
}

/// The rows of instance `ns`/`a` as the reference's `MemoryStateStore.trays`
/// entries: `[ns, id, tray_ns, tray_id, marked, doc]`.
async fn image(store: &dyn StateStore, ns: &str) -> Json {
    let rows = store
        .list(InstanceKey::new(ns, ID), 0, None, None)
        .await
        .unwrap();
    Json::Array(
        rows.into_iter()
            .map(|row| json!([ns, ID, row.tray_ns, row.tray_id, row.marked, row.doc]))
            .collect(),
    )
}

/// Whether instance `ns`/`a` has no marked row left.
async fn drained_rows(store: &dyn StateStore, ns: &str) -> bool {
    store
        .list(InstanceKey::new(ns, ID), 0, None, Some(true))
        .await
        .unwrap()
        .is_empty()
}

/// What the client sent on one lane, and which of its sends were answered.
#[derive(Default, Serialize)]
struct Sends {
    sent: Vec<u64>,
    acked: Vec<u64>,
}

/// What one crash run sent and saw: the instance's namespace, the
/// client's bookkeeping per lane (`work`, `relay`, `kwork` by key) and the
/// disk images at the crash and after the drain.
#[derive(Serialize)]
struct Run {
    case: String,
    ns: String,
    lanes: BTreeMap<String, Sends>,
    crash: Json,
    drained: Json,
}

/// The reference's generation: a scratch put, `enqueue` 1..3 interleaved
/// with `kenqueue` k1 101 and k2 102, `relay` 201 and 202, the scratch
/// drop.
const GENERATION: [&str; 9] = [
    "scratch/1",
    "enqueue/1",
    "kenqueue/k1/101",
    "enqueue/2",
    "kenqueue/k2/102",
    "enqueue/3",
    "relay/201",
    "relay/202",
    "scratch_drop",
];

/// The recovery after a crash: the scratch drop again, `enqueue` 9,
/// `relay` 209 (the contract's script counts these as sent after the
/// crash's bookkeeping).
const RECOVERY: [&str; 3] = ["scratch_drop", "enqueue/9", "relay/209"];

/// A client of one worker.
struct Client {
    http: reqwest::Client,
    base: String,
    ns: String,
}

impl Client {
    /// Sends `path` to instance `a`; records it on its lane in `lanes`,
    /// acked when answered 200 (a failed write aborts the instance: its
    /// answer is an error, and the next request activates it again).
    async fn send(&self, path: &str, lanes: &mut BTreeMap<String, Sends>) -> bool {
        let ok = self
            .http
            .post(format!("{}{}/{ID}/{path}", self.base, self.ns))
            .send()
            .await
            .is_ok_and(|response| response.status().is_success());
        let parts: Vec<&str> = path.split('/').collect();
        let lane = match parts[..] {
            ["enqueue", n] => Some(("work", n)),
            ["relay", n] => Some(("relay", n)),
            ["kenqueue", key, n] => Some((key, n)),
            _ => None,
        };
        if let Some((lane, n)) = lane {
            let sends = lanes.entry(lane.to_owned()).or_default();
            sends.sent.push(n.parse().unwrap());
            if ok {
                sends.acked.push(n.parse().unwrap());
            }
        }
        ok
    }
}

fn lanes() -> BTreeMap<String, Sends> {
    ["work", "relay", "k1", "k2"]
        .into_iter()
        .map(|lane| (lane.to_owned(), Sends::default()))
        .collect()
}

impl TestWorker {
    fn client(&self, ns: &str) -> Client {
        Client {
            http: self.client.clone(),
            base: self.url.clone(),
            ns: ns.to_owned(),
        }
    }
}

/// One run of the reference's generation on a store that fails write
/// `fail_at`, then its recovery on a fresh worker over what the store kept,
/// drained. Answers the run and the first worker's writes.
async fn crash_run(fail_at: usize, applied: bool) -> (Run, usize) {
    let inner = Arc::new(MemoryStore::new());
    let flaky = Arc::new(FailingStore::new(inner.clone(), fail_at, applied));
    let first = worker(flaky.clone(), NS).await;
    let mut lanes = lanes();
    for path in GENERATION {
        let _ = first.client(NS).send(path, &mut lanes).await;
    }
    eventually("the first worker drained or failed", PATIENCE, || async {
        (flaky.failed() || drained_rows(&*inner, NS).await).then_some(())
    })
    .await;
    first.worker.close().await;
    let writes = flaky.writes();
    let crash = image(&*inner, NS).await;

    let second = worker(inner.clone(), NS).await;
    for path in RECOVERY {
        assert!(
            second.client(NS).send(path, &mut lanes).await,
            "POST {path} after the restart"
        );
    }
    eventually("the second worker drained", PATIENCE, || async {
        drained_rows(&*inner, NS).await.then_some(())
    })
    .await;
    second.worker.close().await;
    let run = Run {
        case: format!("write {fail_at} failing (applied: {applied})"),
        ns: NS.to_owned(),
        lanes,
        crash,
        drained: image(&*inner, NS).await,
    };
    (run, writes)
}

/// The reference's harness after a crash, in its own words: the contract
/// on the crash image, the residue it leaves, every durable admission
/// counted as acked, then the recovery's admissions and the contract on
/// the drained image. Prints how many relay outcomes were absorbed.
const VALIDATE: &str = r#"
import json, sys
from pinned.durability import MemoryStateStore
from pinned.sim.contract import KeyedLane, RelayLane, admitted, crash_residue, validate

def disk(rows):
    image = MemoryStateStore()
    for ns, id, tray_ns, tray_id, marked, doc in rows:
        image.trays[(ns, id, tray_ns, tray_id)] = (marked, doc)
    return image

# The recovery's sends, counted once the crash's bookkeeping is done.
RECOVERY = {"work": [9], "relay": [209]}

runs = json.load(open(sys.argv[1]))
absorbed = 0
inflight = 0
for run in runs:
    try:
        ns = run["ns"]
        lanes = run["lanes"]
        def before(lane, field):
            recovered = RECOVERY.get(lane, [])
            return [n for n in lanes[lane][field] if n not in recovered]
        sent, acked = before("work", "sent"), before("work", "acked")
        relay = RelayLane(sent=before("relay", "sent"), acked=before("relay", "acked"))
        keyed = {
            key: KeyedLane(sent=before(key, "sent"), acked=before(key, "acked"))
            for key in ("k1", "k2")
        }
        crash = disk(run["crash"])
        inflight += any(marked for (marked, _doc) in crash.trays.values())
        validate(crash, sent=sent, acked=acked, keyed=keyed, relay=relay, ns=ns)
        residue = crash_residue(crash, ns=ns)
        for key, lane in keyed.items():
            lane.residue = crash_residue(crash, ns=ns, tray="kwork", tray_id=key)
            lane.acked.extend(
                sorted(admitted(crash, ns=ns, tray="kwork", tray_id=key) - set(lane.acked))
            )
        acked.extend(sorted(admitted(crash, ns=ns) - set(acked)))
        relay.acked.extend(
            sorted(admitted(crash, ns=ns, tray="relay", done="relayed") - set(relay.acked))
        )
        sent += RECOVERY["work"]; acked += RECOVERY["work"]
        relay.sent += RECOVERY["relay"]; relay.acked += RECOVERY["relay"]
        drained = disk(run["drained"])
        validate(
            drained, sent=sent, acked=acked, drained=True, residue=residue,
            keyed=keyed, relay=relay, ns=ns,
        )
        relayed = drained.trays[(ns, "a", "relay", "~")][1]["relayed"]
        absorbed += sum(1 for outcome in relayed.values() if outcome == "absorbed")
    except AssertionError as error:
        print(f"{run['case']}: {error}", file=sys.stderr)
        sys.exit(1)
print(json.dumps({"runs": len(runs), "absorbed": absorbed, "inflight": inflight}))
"#;

/// Runs the reference's contract on `runs`; answers its summary.
fn validate(runs: &[Run]) -> Json {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("runs.json");
    std::fs::write(&data, serde_json::to_vec(runs).unwrap()).unwrap();
    let script = dir.path().join("validate.py");
    std::fs::write(&script, VALIDATE).unwrap();
    let output = std::process::Command::new(test_support::python())
        .arg(&script)
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the reference's contract failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_contract_holds_on_the_sweep_lane_port_after_a_crash_at_every_write() {
    let (clean, writes) = crash_run(usize::MAX, false).await;
    assert_eq!(clean.lanes["work"].acked, [1, 2, 3, 9]);
    assert_eq!(clean.lanes["relay"].acked, [201, 202, 209]);
    assert_eq!(clean.lanes["k2"].acked, [102]);
    eprintln!("a clean run makes {writes} writes");
    // How many writes carry the workload depends on how the scheduler lets
    // them coalesce (19 to 25 on 2 cores): the acked lists above show it ran
    // whole, and this floor only catches a crash loop grown too short to
    // cover its phases.
    assert!(writes >= 15, "{writes} writes");
    let mut runs = vec![clean];
    for applied in [false, true] {
        for fail_at in 1..=writes + 1 {
            runs.push(crash_run(fail_at, applied).await.0);
        }
    }
    let summary = validate(&runs);
    eprintln!("the reference's contract held on {summary}");
    assert_eq!(summary["runs"], runs.len());
}

/// Row `tray` of instance `id`: `(marked, doc)`.
async fn row(store: &dyn StateStore, id: &str, tray: &str) -> Option<(bool, Json)> {
    support::stored_tray(store, NS, id, TrayKey::singleton(tray)).await
}

#[tokio::test]
async fn a_dispatch_writes_the_references_rows_and_releases_them_before_the_ack() {
    let store = Arc::new(MemoryStore::new());
    let w = worker(store.clone(), NS).await;
    let id = "rows";
    let response = w.post(&format!("{NS}/{id}/relay/{HELD}")).await;
    assert_eq!(response.status(), 200);
    // Phase one, the item held after its dispatch: the relay's record, the
    // sink's ignore-record, both as the reference writes them.
    let (marked, relay) = eventually("the dispatch recorded", PATIENCE, || async {
        row(&*store, id, "relay")
            .await
            .filter(|(_, doc)| doc.get("~dispatch").is_some())
    })
    .await;
    assert!(marked);
    assert_eq!(
        relay["~dispatch"],
        json!([{"key": ["r", HELD], "target": ["sink", "~"], "outcome": "admitted", "cleaned": false}])
    );
    let (_, sink) = row(&*store, id, "sink").await.unwrap();
    assert_eq!(sink["~ignore"], json!([["r", HELD]]));
    // The sink ran the item (its tag gone with the pop) or still holds it
    // tagged with the key.
    let ran = sink["log"] == json!([{"n": HELD, "attempts": 1}]);
    assert!(
        ran || sink["queue"] == json!([{"n": HELD, "~admit": ["r", HELD]}]),
        "{sink}"
    );
    // Phase two and the ack: the key released, the record gone with the pop.
    HOLD.add_permits(1);
    let (marked, relay) = eventually("the relay item acked", PATIENCE, || async {
        row(&*store, id, "relay")
            .await
            .filter(|(marked, _)| !marked)
    })
    .await;
    assert!(!marked);
    assert_eq!(relay, json!({"relayed": {HELD.to_string(): "admitted"}}));
    let (_, sink) = eventually("the sink drained", PATIENCE, || async {
        row(&*store, id, "sink").await.filter(|(marked, _)| !marked)
    })
    .await;
    assert_eq!(
        sink,
        json!({"log": [{"n": HELD, "attempts": 1}], "done": 1})
    );
    w.worker.close().await;
}

#[tokio::test]
async fn a_redelivered_item_answers_its_recorded_outcome_and_admits_nothing_again() {
    let store = Arc::new(MemoryStore::new());
    let w = worker(store.clone(), NS).await;
    let id = "again";
    let n = FAILING + 1;
    assert_eq!(w.post(&format!("{NS}/{id}/relay/{n}")).await.status(), 200);
    let (_, relay) = eventually("the relay item acked", PATIENCE, || async {
        row(&*store, id, "relay")
            .await
            .filter(|(marked, _)| !marked)
    })
    .await;
    assert_eq!(relay["relayed"], json!({n.to_string(): "admitted"}));
    let (_, sink) = eventually("the sink drained", PATIENCE, || async {
        row(&*store, id, "sink").await.filter(|(marked, _)| !marked)
    })
    .await;
    assert_eq!(
        sink["log"],
        json!([{"n": n, "attempts": 1}]),
        "admitted once"
    );
    assert!(sink.get("~ignore").is_none(), "{sink}");
    w.worker.close().await;
}

#[tokio::test]
async fn a_dispatch_after_the_handlers_run_ended_is_refused() {
    let store = Arc::new(MemoryStore::new());
    let w = worker(store.clone(), NS).await;
    let id = "late";
    assert_eq!(
        w.post(&format!("{NS}/{id}/relay/{LATE}")).await.status(),
        200
    );
    eventually("the relay item acked", PATIENCE, || async {
        row(&*store, id, "relay")
            .await
            .filter(|(marked, _)| !marked)
    })
    .await;
    LATE_GO.add_permits(1);
    let answer = eventually("the late dispatch answered", PATIENCE, || async {
        LATE_ANSWER.lock().take()
    })
    .await;
    let refusal = answer.expect_err("a dispatch after the run ended is refused");
    assert!(
        refusal.contains("dispatch after this dispatch settled"),
        "{refusal}"
    );
    // Nothing reached the sink, nor the relay's ledger.
    assert_eq!(row(&*store, id, "sink").await, None);
    let (_, relay) = row(&*store, id, "relay").await.unwrap();
    assert!(relay.get("~dispatch").is_none(), "{relay}");
    w.worker.close().await;
}

/// The rows a crash between a dispatch's two phase-one writes leaves (the
/// sink's admission landed, the relay's record did not), written as a
/// Python worker's crash leaves them; the sink either still holds the
/// tagged item or already ran it.
async fn torn(store: &MemoryStore, id: &str, sink_ran: bool) {
    let doc = |value: Json| value.as_object().unwrap().clone();
    let instance = InstanceKey::new(NS, id);
    store
        .set_tray(
            instance,
            TrayKey::singleton("relay"),
            true,
            doc(json!({"queue": [{"n": 5}], "~attempts": 1})),
            0,
        )
        .await
        .unwrap();
    let sink = if sink_ran {
        json!({"log": [{"n": 5, "attempts": 1}], "done": 1, "~ignore": [["r", 5]]})
    } else {
        json!({"queue": [{"n": 5, "~admit": ["r", 5]}], "~ignore": [["r", 5]]})
    };
    store
        .set_tray(
            instance,
            TrayKey::singleton("sink"),
            !sink_ran,
            doc(sink),
            0,
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_re_run_whose_record_was_lost_absorbs_the_admission_the_target_holds() {
    for sink_ran in [false, true] {
        let store = Arc::new(MemoryStore::new());
        let id = if sink_ran { "ran" } else { "queued" };
        torn(&store, id, sink_ran).await;
        let w = worker(store.clone(), NS).await;
        assert_eq!(w.post(&format!("{NS}/{id}/relay/6")).await.status(), 200);
        let (_, relay) = eventually("the relay drained", PATIENCE, || async {
            row(&*store, id, "relay")
                .await
                .filter(|(marked, _)| !marked)
        })
        .await;
        assert_eq!(
            relay,
            json!({"relayed": {"5": "absorbed", "6": "admitted"}}),
            "sink ran: {sink_ran}"
        );
        let (_, sink) = eventually("the sink drained", PATIENCE, || async {
            row(&*store, id, "sink").await.filter(|(marked, _)| !marked)
        })
        .await;
        let ns: Vec<u64> = sink["log"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry["n"].as_u64().unwrap())
            .collect();
        assert_eq!(ns, [5, 6], "sink ran: {sink_ran}: each admitted once");
        assert!(sink.get("~ignore").is_none(), "{sink}");
        w.worker.close().await;
    }
}

/// The environment variable that turns [`serve_sweep_lane`] into a
/// server: the namespace to host the port at, on Postgres at
/// `PINNED_TEST_DATABASE_URL`.
const SERVE_NS: &str = "SWEEP_LANE_SERVE_NS";

/// Not a test of its own: the process the SIGKILL test starts (this test
/// binary again, with [`SERVE_NS`] set) and kills. Serves the port and
/// prints its address.
#[tokio::test]
#[ignore = "the worker process of the SIGKILL test"]
async fn serve_sweep_lane() {
    let ns = std::env::var(SERVE_NS).expect("started by the SIGKILL test");
    let store = PostgresStore::open(&database_url(), PostgresOptions::default())
        .await
        .unwrap();
    let w = worker(Arc::new(store), &ns).await;
    println!("sweep lane listening on {}", w.url);
    std::future::pending::<()>().await;
}

/// Starts [`serve_sweep_lane`] in a process of its own hosting `ns`;
/// answers the process and its base URL.
async fn spawn_server(ns: &str) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["serve_sweep_lane", "--exact", "--ignored", "--nocapture"])
        .env(SERVE_NS, ns)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(url) = line.strip_prefix("sweep lane listening on ") {
                return url.to_owned();
            }
        }
        panic!("the sweep lane server exited before listening");
    })
    .await
    .expect("the sweep lane server never listened");
    (child, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_contract_holds_on_the_sweep_lane_port_after_a_sigkill_at_every_step() {
    let store: Arc<dyn StateStore> = Arc::new(
        PostgresStore::open(&database_url(), PostgresOptions::default())
            .await
            .expect("Postgres must be reachable at PINNED_TEST_DATABASE_URL"),
    );
    let http = reqwest::Client::new();
    let mut runs = Vec::new();
    let mut cleanups = Vec::new();
    for killed_after in 1..=GENERATION.len() {
        let ns = unique_ns("sweep");
        cleanups.push(PostgresCleanup::new(&ns));
        let (mut first, base) = spawn_server(&ns).await;
        let client = Client {
            http: http.clone(),
            base,
            ns: ns.clone(),
        };
        let mut lanes = lanes();
        for path in &GENERATION[..killed_after] {
            assert!(client.send(path, &mut lanes).await, "POST {path}");
        }
        // Mid-flight: the pumps are working what was just admitted.
        first.start_kill().unwrap();
        first.wait().await.unwrap();
        let crash = image(&*store, &ns).await;

        let (mut second, base) = spawn_server(&ns).await;
        let client = Client { base, ..client };
        for path in RECOVERY {
            assert!(
                client.send(path, &mut lanes).await,
                "POST {path} after the restart"
            );
        }
        eventually("the second worker drained", PATIENCE, || async {
            drained_rows(&*store, &ns).await.then_some(())
        })
        .await;
        second.start_kill().unwrap();
        second.wait().await.unwrap();
        runs.push(Run {
            case: format!("SIGKILL after {}", GENERATION[killed_after - 1]),
            ns: ns.clone(),
            lanes,
            crash,
            drained: image(&*store, &ns).await,
        });
    }
    let summary = validate(&runs);
    eprintln!("the reference's contract held on {summary}");
    assert_eq!(summary["runs"], runs.len());
    assert!(
        summary["inflight"].as_u64().unwrap() > 0,
        "no kill caught work in flight: {summary}"
    );
}
