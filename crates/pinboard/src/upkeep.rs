//! Background upkeep of one node: notices a store that lost its data, and
//! removes placement rows that outlived their owner.
//!
//! Owns two cadences, both on every node (the work is idempotent, atomic in
//! the store, and small):
//!
//! - every `--worker-refresh-ms`, a generation check
//!   ([`Routes::check_generation`](crate::routes::Routes::check_generation)):
//!   a lost store puts the node in quarantine even when no claim happens to
//!   run into it first;
//! - every half lease TTL, an expiry pass
//!   ([`PlacementStore::expire_placements`]) in batches of
//!   [`EXPIRY_BATCH`] rows, at most [`EXPIRY_BATCHES_PER_PASS`] per pass,
//!   so one pass never holds Redis for long and a backlog (a worker with a
//!   hundred thousand instances died) drains over a few passes.
//!
//! With the expiry pass it reads the live worker list and logs, at warn,
//! each worker whose lease lapsed ([`lapses`]: once per session, on every
//! node); with the generation check it logs the end of a quarantine
//! ([`quarantine`]), at warn after a store loss.
//!
//! Never serves a request and never decides a placement. A failing store is
//! logged when it starts failing (with its cause), again with a count while
//! it lasts (`--log-repeat-ms`), and when it recovers.

pub mod lapses;
pub mod quarantine;

use std::sync::Arc;
use std::time::Duration;

use pinned_edge::logging::{repeats, Chain};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use self::lapses::LapseWatch;
use self::quarantine::QuarantineWatch;
use crate::app::App;
use crate::config::Config;
use crate::placement::PlacementStore;

/// Longest wait for one upkeep call to the store (a frozen Redis must not
/// stall upkeep, nor its shutdown).
pub const STORE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Rows one expiry call handles at most.
pub const EXPIRY_BATCH: usize = 1_000;
/// Expiry calls per pass at most.
pub const EXPIRY_BATCHES_PER_PASS: usize = 100;

/// How often upkeep runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpkeepSettings {
    /// Between two generation checks.
    pub check_every: Duration,
    /// Between two expiry passes.
    pub expire_every: Duration,
}

impl From<&Config> for UpkeepSettings {
    fn from(config: &Config) -> Self {
        Self {
            check_every: Duration::from_millis(config.worker_refresh_ms.max(1)),
            expire_every: Duration::from_millis((config.lease_ttl_ms / 2).max(1)),
        }
    }
}

/// Logs a store failure when it starts (and while it lasts, with a count)
/// and its recovery (see [`repeats`]), per upkeep task `what`.
fn record<T>(what: &'static str, result: Result<T, String>) -> Option<T> {
    match result {
        Ok(v) => {
            if let Some(after) = repeats().recovered("pinboard upkeep", what) {
                tracing::info!(target: "pinboard::upkeep", what, failures = after.failures, failing_for_ms = after.failing_for_ms(), "placement store answers again");
            }
            Some(v)
        }
        Err(error) => {
            if let Some(seen) = repeats().failed("pinboard upkeep", what, error) {
                tracing::warn!(target: "pinboard::upkeep", what, error = %seen, failures = seen.failures, "placement store failed");
            }
            None
        }
    }
}

/// Reads the live workers and logs each lease that lapsed since the last
/// read (warn, once per session).
async fn look_for_lapses<S: PlacementStore>(app: &App<S>, watch: &mut LapseWatch) {
    let now = app.clock.now();
    let Some(live) = record("worker list", bounded(app.store.list_workers(now)).await) else {
        return;
    };
    for lapse in watch.look(&live, now.wall_ms) {
        app.metrics.lease_lapses.inc();
        tracing::warn!(
            target: "pinboard::upkeep",
            session = %lapse.session,
            advertise_url = %lapse.advertise_url,
            hostname = lapse.hostname.as_deref().unwrap_or(""),
            namespaces = ?lapse.namespaces,
            lapsed_ms_ago = lapse.lapsed_ms_ago,
            "worker lease lapsed: no heartbeat in time; its ids move on their next request"
        );
    }
}

/// Logs the end of a quarantine (warn when a store loss began it).
fn look_at_quarantine<S: PlacementStore>(app: &App<S>, watch: &mut QuarantineWatch) {
    let left = app.routes.quarantine_left_ms();
    match watch.look(left, app.metrics.store_losses.get()) {
        Some(ended) if ended.after_loss => {
            tracing::warn!(target: "pinboard::upkeep", "quarantine after the store loss over: placing new ids again")
        }
        Some(_) => {
            tracing::info!(target: "pinboard::upkeep", "cold-start quarantine over: placing new ids")
        }
        None => {}
    }
}

/// One expiry pass; returns the rows handled.
async fn expire_pass<S: PlacementStore>(
    app: &App<S>,
) -> Result<usize, crate::placement::StoreError> {
    let mut total = 0;
    for _ in 0..EXPIRY_BATCHES_PER_PASS {
        let handled = app
            .store
            .expire_placements(EXPIRY_BATCH, app.clock.now())
            .await?;
        total += handled;
        if handled < EXPIRY_BATCH {
            break;
        }
    }
    app.metrics.placement_rows_expired.inc_by(total as u64);
    if total > 0 {
        tracing::debug!(target: "pinboard::upkeep", rows = total, "vacated placement rows expired");
    }
    Ok(total)
}

/// `call` within [`STORE_CALL_TIMEOUT`], its error as text.
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, crate::placement::StoreError>>,
) -> Result<T, String> {
    match tokio::time::timeout(STORE_CALL_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Chain(&e).to_string()),
        Err(_) => Err(format!(
            "no answer within {} ms",
            STORE_CALL_TIMEOUT.as_millis()
        )),
    }
}

/// Runs upkeep until `stop` turns true (or its sender is gone), inside the
/// caller's current span (pinboard's node span: its lines carry the node).
pub fn spawn<S: PlacementStore>(
    app: Arc<App<S>>,
    settings: UpkeepSettings,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(
        async move {
            let mut check = tokio::time::interval(settings.check_every);
            let mut expire = tokio::time::interval(settings.expire_every);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut lapses = LapseWatch::default();
            let mut quarantine = QuarantineWatch::default();
            loop {
                tokio::select! {
                    changed = stop.changed() => {
                        if changed.is_err() || *stop.borrow() {
                            return;
                        }
                    }
                    _ = check.tick() => {
                        record("generation check", bounded(app.routes.check_generation()).await);
                        look_at_quarantine(&app, &mut quarantine);
                    }
                    _ = expire.tick() => {
                        record("placement expiry", bounded(expire_pass(&app)).await);
                        look_for_lapses(&app, &mut lapses).await;
                    }
                }
            }
        }
        .instrument(tracing::Span::current()),
    )
}
