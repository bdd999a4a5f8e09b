//! The sweeper with no activities at all: a placement whose owner is gone
//! is re-placed at a higher epoch and woken on a live worker, a wake
//! answered 202 is repeated on the next lap until it answers 200, and a
//! settled placement is left alone; the re-placement is in the moves list
//! as the sweeper's. Driven through the product's seams
//! (`App::from_parts`, an `Exchange` transport, awaited laps), no sockets.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode};
use parking_lot::Mutex;
use pinboard::app::{App, AppParts};
use pinboard::clock::{EpochFloor, SeededEntropy, SystemClock};
use pinboard::operator::moves::{MoveReason, MovedBy};
use pinboard::outbound::{BoxFuture, Exchange, Outbound};
use pinboard::placement::{InstanceKey, MemoryStore, PlacementStore, WorkerRecord};
use pinboard::sweeper::{Activities, SweepSettings, Sweeper};
use pinboard::upstream::SendError;
use pinboard::Config;
use pinned_store::DueAlarm;

/// Records every call and answers wakes from a script (the last repeats).
#[derive(Default)]
struct Script {
    calls: Mutex<Vec<(String, String, u64)>>,
    answers: Mutex<VecDeque<u16>>,
}

impl Exchange for Script {
    fn exchange(
        &self,
        origin: &str,
        request: Request<Bytes>,
    ) -> BoxFuture<'_, Result<Response<Bytes>, SendError>> {
        let epoch = request
            .headers()
            .get("pinboard-epoch")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        self.calls
            .lock()
            .push((origin.to_owned(), request.uri().path().to_owned(), epoch));
        let status = {
            let mut a = self.answers.lock();
            if a.len() > 1 {
                a.pop_front().unwrap_or(200)
            } else {
                a.front().copied().unwrap_or(200)
            }
        };
        let body = if status == 200 {
            r#"{"ok":true}"#
        } else {
            r#"{"activating":true}"#
        };
        let mut res = Response::new(Bytes::from_static(body.as_bytes()));
        *res.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        Box::pin(async move { Ok(res) })
    }
}

/// No alarms, no marked rows.
struct Nothing;

impl Activities for Nothing {
    fn due_alarms(
        &self,
        _due_by_ms: i64,
        _limit: usize,
    ) -> BoxFuture<'_, Result<Vec<DueAlarm>, pinned_store::StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn marked_instances<'a>(
        &'a self,
        _after: Option<(&'a str, &'a str)>,
        _limit: usize,
    ) -> BoxFuture<'a, Result<Vec<pinned_store::MarkedInstance>, pinned_store::StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

fn rec(sid: &str) -> WorkerRecord {
    WorkerRecord {
        session_id: sid.into(),
        client_id: sid.into(),
        secret: format!("secret-{sid}"),
        advertise_url: format!("http://{sid}.test"),
        namespaces: vec!["/threads".into()],
        headroom: 10,
        ..Default::default()
    }
}

#[tokio::test]
async fn orphans_are_re_placed_and_woken_until_the_wake_answers_200() {
    let config = Config::try_parse_from(["pinboard", "--token", "t", "--quarantine-ms", "0"])
        .expect("config");
    let script = Arc::new(Script::default());
    let store = Arc::new(MemoryStore::new());
    let app = Arc::new(App::from_parts(
        &config,
        AppParts {
            store: store.clone(),
            outbound: Outbound::Exchange(script.clone()),
            clock: Arc::new(SystemClock::new()),
            entropy: Arc::new(SeededEntropy::seeded(7)),
            floor: Arc::new(EpochFloor::default()),
        },
    ));
    app.routes.open_generation().await.expect("generation");
    let now = app.clock.now();
    // Place `a` on `dead` (the only worker yet), then let `dead` go.
    store
        .put_worker(&rec("dead"), 60_000, now)
        .await
        .expect("put");
    let (route, claimed) = app
        .routes
        .resolve_claiming(
            "/threads/a",
            "/threads",
            "a",
            pinboard::world::Scope::Any,
            Default::default(),
        )
        .await
        .expect("placed");
    assert!(claimed);
    assert_eq!(route.worker.record.session_id, "dead");
    store
        .put_worker(&rec("live"), 60_000, now)
        .await
        .expect("put");
    let first = route.epoch;
    store.remove_worker("dead").await.expect("remove");
    app.routes.workers_changed();
    app.routes.invalidate("/threads/a");

    script.answers.lock().extend([202, 200]);
    let settings = SweepSettings {
        interval_ms: 1_000,
        limit: 8,
        concurrency: 4,
    };
    let mut sweeper =
        Sweeper::with_activities(app.clone(), Arc::new(Nothing), settings, "n".into());

    sweeper.lap_to_completion().await;
    let calls = script.calls.lock().clone();
    assert_eq!(calls.len(), 1, "one wake: {calls:?}");
    let (origin, path, epoch) = &calls[0];
    assert_eq!(origin, "http://live.test");
    assert_eq!(path, "/threads/a/_wake");
    assert!(*epoch > first, "re-placed above {first}: {epoch}");
    let row = store
        .placement(InstanceKey::new("/threads", "a"), app.clock.now())
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.placement.session_id, "live");
    assert!(!row.settled, "202 does not settle");
    // The operator's moves list has the re-placement, made by the sweeper.
    let moves = app.moves.recent(10);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(
        (
            moves[0].id.as_str(),
            moves[0].from.as_str(),
            moves[0].to.as_str(),
            moves[0].reason,
            moves[0].by
        ),
        (
            "a",
            "dead",
            "live",
            MoveReason::LeaseLapsed,
            MovedBy::Sweeper
        )
    );

    sweeper.lap_to_completion().await;
    assert_eq!(script.calls.lock().len(), 2, "woken again after 202");
    let row = store
        .placement(InstanceKey::new("/threads", "a"), app.clock.now())
        .await
        .expect("read")
        .expect("row");
    assert!(row.settled, "200 settles");
    assert_eq!(row.placement.epoch, *epoch);

    sweeper.lap_to_completion().await;
    assert_eq!(
        script.calls.lock().len(),
        2,
        "a settled live placement is left alone"
    );
}
