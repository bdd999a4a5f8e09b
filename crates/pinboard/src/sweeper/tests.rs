//! The sweeper shell over real sockets: an in-process fake worker, the memory
//! placement store and the memory state store.

use std::collections::VecDeque;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use clap::Parser;
use pinned_store::MemoryStore as StateMemory;
use pinned_store::{InstanceKey, TrayKey};
use serde_json::{json, Value};

use super::*;
use crate::clock::{SeededEntropy, SystemClock};
use crate::placement::{MemoryStore, WorkerRecord};

const NS: &str = "/sw";

/// A worker answering `_alarm` from a script (the last answer repeats).
struct Scripted {
    answers: Mutex<VecDeque<(u16, bool)>>,
    epochs: Mutex<Vec<u64>>,
}

async fn answer(
    State(w): State<Arc<Scripted>>,
    Path((_ns, _id)): Path<(String, String)>,
    headers: HeaderMap,
) -> axum::response::Response {
    let epoch = headers
        .get("pinboard-epoch")
        .and_then(|e| e.to_str().ok())
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    w.epochs.lock().push(epoch);
    let (status, refusal) = {
        let mut a = w.answers.lock();
        if a.len() > 1 {
            a.pop_front().unwrap_or((200, false))
        } else {
            a.front().copied().unwrap_or((200, false))
        }
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let body = if status == StatusCode::OK {
        json!({"fired": true})
    } else {
        json!({"detail": "lease unhealthy; refusing new activations"})
    };
    let mut res = (status, axum::Json(body)).into_response();
    if refusal {
        res.headers_mut().insert(
            "pinned-refusal",
            HeaderValue::from_static("lease-unhealthy"),
        );
    }
    res
}

async fn worker(app: &App<MemoryStore>, sid: &str, answers: &[(u16, bool)]) -> Arc<Scripted> {
    let w = Arc::new(Scripted {
        answers: Mutex::new(answers.iter().copied().collect()),
        epochs: Mutex::new(Vec::new()),
    });
    let router = Router::new()
        .route("/{ns}/{id}/_alarm", post(answer))
        .with_state(w.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let record = WorkerRecord {
        session_id: sid.into(),
        client_id: sid.into(),
        secret: format!("secret-{sid}"),
        advertise_url: format!("http://{addr}"),
        namespaces: vec![NS.into()],
        headroom: 10,
        ..Default::default()
    };
    app.store
        .put_worker(&record, 60_000, app.clock.now())
        .await
        .expect("put worker");
    w
}

async fn setup() -> (
    Arc<App<MemoryStore>>,
    Arc<StateMemory>,
    Sweeper<MemoryStore>,
) {
    let config = Config::try_parse_from(["pinboard", "--token", "t", "--quarantine-ms", "0"])
        .expect("config");
    let app = Arc::new(
        App::new(
            &config,
            MemoryStore::new(),
            Arc::new(SystemClock::new()),
            Arc::new(SeededEntropy::seeded(1)),
        )
        .expect("app"),
    );
    app.routes.open_generation().await.expect("generation");
    let state = Arc::new(StateMemory::new());
    let settings = SweepSettings {
        interval_ms: 1_000,
        limit: 8,
        concurrency: 4,
    };
    let sweeper = Sweeper::new(app.clone(), state.clone(), settings, "node".into());
    (app, state, sweeper)
}

async fn due(state: &StateMemory, id: &str) {
    let at = wall_ms() - 1_000;
    let doc = json!({"at": at, "nonce": "n"});
    let Value::Object(doc) = doc else { return };
    state
        .set_tray(
            InstanceKey::new(NS, id),
            TrayKey::new("pinned", "alarm"),
            false,
            doc,
            0,
        )
        .await
        .expect("set alarm");
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One lap, then wait until its calls finished.
async fn lap(s: &mut Sweeper<MemoryStore>) {
    s.lap().await;
    for _ in 0..500 {
        if s.shared.permits.available_permits() == s.settings.concurrency {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("calls did not finish");
}

#[tokio::test]
async fn a_worker_without_the_route_is_called_once_and_then_skipped() {
    let (app, state, mut s) = setup().await;
    let py = worker(&app, "py", &[(404, false)]).await;
    due(&state, "a").await;
    for _ in 0..3 {
        lap(&mut s).await;
    }
    assert_eq!(py.epochs.lock().len(), 1);
    assert!(s.shared.ledger.lock().is_unsupported(Call::Alarm, "py"));
    assert_eq!(app.metrics.sweep_alarms_delivered.get(), 0);
    assert_eq!(app.metrics.sweep_laps.get(), 3);
}

#[tokio::test]
async fn a_pinned_refusal_moves_the_id_to_another_worker_next_lap() {
    let (app, state, mut s) = setup().await;
    let sick = worker(&app, "sick", &[(503, true)]).await;
    let well = worker(&app, "well", &[(200, false)]).await;
    // The id lives on the sick worker.
    let now = app.clock.now();
    let generation = app
        .store
        .generation()
        .await
        .expect("generation")
        .expect("opened");
    app.store
        .resolve_or_claim(
            InstanceKey::new(NS, "a"),
            Some("sick"),
            None,
            1,
            &generation,
            now,
        )
        .await
        .expect("claim");
    due(&state, "a").await;
    lap(&mut s).await;
    assert_eq!(sick.epochs.lock().as_slice(), &[1]);
    assert!(well.epochs.lock().is_empty());
    lap(&mut s).await;
    let moved = well.epochs.lock().clone();
    assert_eq!(moved.len(), 1, "delivered on the other worker");
    assert!(moved[0] > 1, "at a larger epoch: {moved:?}");
    assert_eq!(sick.epochs.lock().len(), 1);
    assert_eq!(app.metrics.sweep_alarms_delivered.get(), 1);
}

#[tokio::test]
async fn a_fence_loss_re_places_above_the_old_epoch() {
    let (app, state, mut s) = setup().await;
    let w = worker(&app, "w", &[(409, false), (200, false)]).await;
    due(&state, "a").await;
    lap(&mut s).await;
    lap(&mut s).await;
    let epochs = w.epochs.lock().clone();
    assert_eq!(epochs.len(), 2);
    assert!(epochs[1] > epochs[0], "{epochs:?}");
}

#[tokio::test]
async fn a_node_without_the_lease_reads_nothing() {
    let (app, state, mut s) = setup().await;
    let w = worker(&app, "w", &[(200, false)]).await;
    let now = app.clock.now();
    assert!(app
        .store
        .acquire_sweeper_lease("other", 60_000, now)
        .await
        .expect("lease"));
    due(&state, "a").await;
    lap(&mut s).await;
    assert!(w.epochs.lock().is_empty());
    assert_eq!(app.metrics.sweep_laps.get(), 0);
    assert_eq!(app.metrics.sweep_lease_held.get(), 0);
    app.store
        .release_sweeper_lease("other")
        .await
        .expect("release");
    lap(&mut s).await;
    assert_eq!(w.epochs.lock().len(), 1);
    assert_eq!(app.metrics.sweep_lease_held.get(), 1);
}
