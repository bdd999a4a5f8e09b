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
//! Never serves a request and never decides a placement. A failing store is
//! logged once when it starts failing and once when it recovers.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

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

/// Logs a store failure when it starts and a recovery when it ends.
#[derive(Debug, Default)]
struct Health {
    failing: bool,
}

impl Health {
    fn record<T, E: std::fmt::Display>(&mut self, what: &str, result: Result<T, E>) {
        match result {
            Ok(_) if self.failing => {
                self.failing = false;
                tracing::info!(target: "pinboard::upkeep", what, "placement store answers again");
            }
            Ok(_) => {}
            Err(error) if !self.failing => {
                self.failing = true;
                tracing::warn!(target: "pinboard::upkeep", what, %error, "placement store failed");
            }
            Err(_) => {}
        }
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
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer within {} ms",
            STORE_CALL_TIMEOUT.as_millis()
        )),
    }
}

/// Runs upkeep until `stop` turns true (or its sender is gone).
pub fn spawn<S: PlacementStore>(
    app: Arc<App<S>>,
    settings: UpkeepSettings,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut check = tokio::time::interval(settings.check_every);
        let mut expire = tokio::time::interval(settings.expire_every);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut health = Health::default();
        loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
                _ = check.tick() => {
                    let checked = bounded(app.routes.check_generation()).await;
                    health.record("generation check", checked);
                }
                _ = expire.tick() => {
                    let expired = bounded(expire_pass(&app)).await;
                    health.record("placement expiry", expired);
                }
            }
        }
    })
}
