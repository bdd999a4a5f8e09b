//! Keyed cross-tray dispatch: each relay id has a `relay` tray whose
//! handler hands every item on to the id's `sink` tray with
//! `TrayCtx::dispatch`, keyed `["r", n]`, so the sink admits each item
//! exactly once however often the relay's handler runs (a crash after the
//! hand-over, before the relay's ack, runs it again). The relay records
//! each item's outcome (`admitted`, or `absorbed` for a re-run that found
//! its admission already made) under `relayed`; the sink records each
//! delivery as `{"n", "attempts"}` under `log`, with a `done` cursor.
//! `RELAY_HOLD=1` (a test fixture, off unless set) makes the relay's
//! handler stop for good once its hand-over is written, before its ack:
//! its item stays mid-dispatch for a test to kill the process in.
//!
//! ```text
//! PORT=8080 cargo run --example relay
//! curl -X POST localhost:8080/relays/a/relay -H 'content-type: application/json' -d '{"n":1}'
//! curl localhost:8080/relays/a/state   # {"relayed":{"1":"admitted"},"log":[{"n":1,"attempts":1}]}
//! ```
//!
//! Store: `DATABASE_URL` (Postgres) when set, else the SQLite file
//! `PINNED_DB_PATH` (default `pinned.db`). Its rows are those of the
//! Python reference's crash workload (`pinned.sim.workload.SweepLane`'s
//! `relay` and `sink`): a Python worker running that pair on the same
//! database takes over its dispatching trays, and the other way round.

use std::collections::BTreeMap;

use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::pinned_store::StoreConfig;
use pinned::tray::{
    Dispatched, Fields, Queue, Tray, TrayCtx, TrayError, TrayHandle, TrayHandler, Trays, Value,
};
use pinned::{BoxError, Context, Object, Options};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value as JsonValue};

/// One item.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Item {
    n: u64,
}

/// The relay's and the sink's tray: a queue and a done cursor.
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

pipe!(RelayTray, "relay");
pipe!(SinkTray, "sink");

struct Relay {
    /// `RELAY_HOLD`: the relay's handler never acks (see the module docs).
    hold: bool,
}

impl Object for Relay {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Relay {
            hold: std::env::var("RELAY_HOLD").is_ok_and(|v| v == "1"),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/relay", post(relay))
            .route("/state", get(state))
    }

    fn trays() -> Trays<Self> {
        Trays::new()
            .singleton::<RelayTray>()
            .singleton::<SinkTray>()
    }
}

impl TrayHandler<RelayTray> for Relay {
    async fn handle(&self, ctx: TrayCtx<RelayTray>, item: Item) -> Result<(), BoxError> {
        let sink = ctx.context().tray::<SinkTray>().await?;
        let n = item.n;
        let outcome = ctx.dispatch(&sink, &("r", n), move |sink| {
            sink.queue.push_back(item);
        })?;
        let relay = ctx.tray();
        let mut relayed: BTreeMap<String, Dispatched> =
            relay.storage_get("relayed")?.unwrap_or_default();
        relayed.insert(n.to_string(), outcome);
        let _ = relay.storage_set("relayed", &relayed)?;
        ctx.written().await?;
        if self.hold {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

impl TrayHandler<SinkTray> for Relay {
    async fn handle(&self, ctx: TrayCtx<SinkTray>, item: Item) -> Result<(), BoxError> {
        let sink = ctx.tray();
        record(&sink, item.n, ctx.attempts())?;
        ctx.written().await?;
        Ok(())
    }
}

/// Writes delivery `seq` (one past the done cursor) of item `n` into the
/// `log`, then moves the cursor: a redelivery after a crash between the
/// two rewrites the same position.
fn record(sink: &TrayHandle<SinkTray>, n: u64, attempts: u64) -> Result<(), TrayError> {
    let seq = sink.read(|sink| *sink.done) + 1;
    let mut log: Vec<JsonValue> = sink.storage_get("log")?.unwrap_or_default();
    log.truncate(usize::try_from(seq - 1).unwrap_or(usize::MAX));
    log.push(json!({ "n": n, "attempts": attempts }));
    let _ = sink.storage_set("log", &log)?;
    let _ = sink.update(|sink| sink.done.set(seq))?;
    Ok(())
}

async fn relay(ctx: Context, Json(item): Json<Item>) -> Result<Json<JsonValue>, TrayError> {
    let n = item.n;
    let relay = ctx.tray::<RelayTray>().await?;
    relay.admit(|relay| relay.queue.push_back(item))?.await?;
    Ok(Json(json!({ "admitted": n })))
}

async fn state(ctx: Context) -> Result<Json<JsonValue>, TrayError> {
    let relayed: Option<JsonValue> = ctx.tray::<RelayTray>().await?.storage_get("relayed")?;
    let log: Option<JsonValue> = ctx.tray::<SinkTray>().await?.storage_get("log")?;
    Ok(Json(json!({
        "relayed": relayed.unwrap_or_else(|| json!({})),
        "log": log.unwrap_or_else(|| json!([])),
    })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    pinned::logging::init();
    let location = std::env::var("DATABASE_URL").ok();
    let file = std::env::var("PINNED_DB_PATH").unwrap_or_else(|_| "pinned.db".into());
    let store = StoreConfig::from_location(location.as_deref(), file)?
        .open()
        .await?;
    pinned::serve(Options::from_env().host::<Relay>("/relays").store(store)).await?;
    Ok(())
}
