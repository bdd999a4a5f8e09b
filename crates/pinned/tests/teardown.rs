//! An evicted instance is freed whatever its state and hooks hold: the
//! object's state, `on_stop` handlers and background tasks may all hold the
//! instance's own `Context` without keeping it alive (each of these once
//! made a reference cycle through the instance record).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use pinned::pinned_store::MemoryStore;
use pinned::{BoxError, Call, Context, HostOptions, Object, Options};
use support::{start, until, PATIENCE};

/// Counts drops of the state of each object kind.
struct Dropped(&'static AtomicU64);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

static PLAIN: AtomicU64 = AtomicU64::new(0);
static ALARMED: AtomicU64 = AtomicU64::new(0);
static ALARMS_RUN: AtomicU64 = AtomicU64::new(0);
static HOLDS_CONTEXT: AtomicU64 = AtomicU64::new(0);
static STOP_CAPTURES: AtomicU64 = AtomicU64::new(0);
static TASK_CAPTURES: AtomicU64 = AtomicU64::new(0);

/// (a) Nothing but state.
struct Plain {
    _dropped: Dropped,
}

impl Object for Plain {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Plain {
            _dropped: Dropped(&PLAIN),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/", get(|| async { "ok" }))
    }
}

/// (b) An alarm that runs (and writes the store through its context)
/// before the instance is evicted.
struct Alarmed {
    _dropped: Dropped,
}

impl Object for Alarmed {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Alarmed {
            _dropped: Dropped(&ALARMED),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/",
            get(|call: Call| async move {
                call.ctx()
                    .alarm()
                    .set_in(Duration::from_millis(1))
                    .await
                    .map(|()| "set")
                    .map_err(|e| e.to_string())
            }),
        )
    }

    async fn alarm(&self, ctx: &Context) -> Result<(), BoxError> {
        let store = ctx.store().ok_or("no store")?;
        store
            .set_tray("ran", "~", false, serde_json::Map::new())
            .await?;
        ALARMS_RUN.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// (c) State that holds the instance's own context.
struct HoldsContext {
    _ctx: Context,
    _dropped: Dropped,
}

impl Object for HoldsContext {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        Ok(HoldsContext {
            _ctx: ctx.clone(),
            _dropped: Dropped(&HOLDS_CONTEXT),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/", get(|| async { "ok" }))
    }
}

/// (d) An `on_stop` handler that captures the context and the state's
/// drop counter.
struct StopCaptures;

impl Object for StopCaptures {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        let held = ctx.clone();
        let dropped = Dropped(&STOP_CAPTURES);
        ctx.on_stop(move || async move {
            let _still_here = (held.id(), &dropped);
            Ok(())
        });
        Ok(StopCaptures)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/", get(|| async { "ok" }))
    }
}

/// (e) A background task holding the context until the instance winds
/// down (it keeps the instance in flight, so it must end for the instance
/// to close).
struct TaskCaptures;

impl Object for TaskCaptures {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        let held = ctx.clone();
        let dropped = Dropped(&TASK_CAPTURES);
        ctx.spawn(async move {
            let _dropped = dropped;
            held.wind_down_started().await;
        });
        Ok(TaskCaptures)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/",
            get(|call: Call| async move {
                call.ctx().wind_down(Some(Duration::from_secs(30)));
                "winding down"
            }),
        )
    }
}

#[tokio::test(start_paused = true)]
async fn evicted_instances_are_freed_whatever_holds_their_context() {
    let quick = || {
        HostOptions::default()
            .idle_timeout(Duration::from_millis(100))
            .sweep_interval(Duration::from_millis(20))
    };
    let w = start(
        Options::new()
            .host_with::<Plain>("/plain", quick())
            .host_with::<Alarmed>("/alarmed", quick())
            .host_with::<HoldsContext>("/holds", quick())
            .host_with::<StopCaptures>("/stop", quick())
            .host_with::<TaskCaptures>("/task", quick())
            .store(MemoryStore::new())
            .domain(pinned::Domain::system().with_tokio_clock()),
    )
    .await;
    const IDS: u64 = 3;
    for ns in ["plain", "alarmed", "holds", "stop", "task"] {
        for id in 0..IDS {
            let answer = w.get(&format!("/{ns}/{id}")).await;
            assert_eq!(answer.status(), 200, "/{ns}/{id}");
        }
    }
    until("every alarm ran", PATIENCE, || {
        ALARMS_RUN.load(Ordering::SeqCst) == IDS
    })
    .await;
    w.wait_for("every instance evicted", |stats| {
        stats["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    for (kind, counter) in [
        ("plain state", &PLAIN),
        ("state of an object with an alarm", &ALARMED),
        ("state holding its Context", &HOLDS_CONTEXT),
        ("an on_stop handler capturing its Context", &STOP_CAPTURES),
        ("a background task holding its Context", &TASK_CAPTURES),
    ] {
        until(&format!("{kind} dropped after eviction"), PATIENCE, || {
            counter.load(Ordering::SeqCst) == IDS
        })
        .await;
    }
}
