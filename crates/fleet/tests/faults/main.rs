//! The fault-injection suite: real pinboard processes, real Rust workers
//! with a Postgres state store, a private Redis, real sockets, real
//! signals. A well-behaved load bumps durable per-id tallies through
//! pinboard while each scenario injects one fault, and the
//! [`checker`] holds every scenario to the same properties: one
//! owner per id at a time, no acknowledged durable write lost, no in-memory
//! counter going backwards while its instance lives, and (where the fault
//! spares every worker process) no instance's memory thrown away.
//!
//! Every scenario owns its processes, its Postgres database and (when it
//! needs Redis) its own `redis-server`, so scenarios run in parallel and
//! never disturb other suites. Each is bounded: every wait has a deadline,
//! and the whole suite runs in well under two minutes on two cores.
//!
//! Run it alone with `cargo test -p pinned-fleet --test faults` (Postgres
//! from `PINNED_TEST_DATABASE_URL`, `redis-server` on the `PATH`).
//!
//! - [`worker_signals`]: SIGKILL, and SIGSTOP then SIGCONT, of a worker.
//! - [`pinboard_nodes`]: SIGKILL of one of two pinboard nodes on one Redis.
//! - [`redis_faults`]: `FLUSHALL`, a restart, `CLIENT PAUSE`.
//! - [`cluster_faults`]: a Redis Cluster master flushed, one killed.
//! - [`postgres_faults`]: every state-store connection killed during writes.
//! - [`partition`]: a worker cut off from pinboard's registry, not from clients.
//! - [`abuse`]: slowloris, a connection flood, an id flood.

#[path = "../support/mod.rs"]
mod support;

mod abuse;
mod checker;
mod cluster_faults;
mod load;
mod partition;
mod pinboard_nodes;
mod postgres_faults;
mod private_postgres;
mod redis_faults;
mod relay;
mod worker_signals;

use std::sync::Arc;
use std::time::Duration;

use checker::{Memory, Summary};
use load::{Entrances, Load};
use private_postgres::PrivateDatabase;
use support::Proc;

/// The lease TTL every scenario's pinboard grants (the fleet harness's
/// default): short, so a lapse takes two seconds.
pub(crate) const LEASE: Duration = Duration::from_millis(2_000);

/// pinboard flags every scenario adds: a frozen owner answers 504 after a
/// second, well inside the load's own call deadline.
pub(crate) const PINBOARD_ARGS: [&str; 2] = ["--upstream-timeout-ms", "1000"];

/// One scenario's world: its database and its ids.
pub(crate) struct Scene {
    /// The workers' state store and the durable tallies.
    pub(crate) db: PrivateDatabase,
    /// The ids the load bumps.
    pub(crate) ids: Vec<String>,
}

impl Scene {
    /// A fresh database and `n` ids.
    pub(crate) async fn new(name: &str, n: usize) -> Self {
        let token = format!("{:08x}", rand::random::<u32>());
        Self {
            db: PrivateDatabase::create().await,
            ids: (0..n).map(|i| format!("{name}-{token}-{i}")).collect(),
        }
    }

    /// A Rust worker on `pinboard` with this scene's state store. A worker
    /// frozen mid-transaction blocks its ids' next owner until the server
    /// ends its session: 1.5 s here (the default is 5 s), so scenarios stay
    /// short.
    pub(crate) fn worker(&self, pinboard: &str, env: &[(&str, &str)]) -> Proc {
        let mut all = vec![
            ("FLEET_DATABASE_URL", self.db.url.as_str()),
            ("FLEET_PG_IDLE_TXN_MS", "1500"),
        ];
        all.extend_from_slice(env);
        support::rust_worker(pinboard).envs(&all).start()
    }

    /// Starts the load through `entrances`.
    pub(crate) fn load(&self, entrances: &[&str]) -> (Load, Entrances) {
        let entrances: Entrances = Arc::new(std::sync::Mutex::new(
            entrances.iter().map(|e| (*e).to_owned()).collect(),
        ));
        (Load::start(&self.ids, entrances.clone()), entrances)
    }

    /// Stops the load, reads the durable tallies and runs the checker;
    /// drops the database. Every id must answer again by the end (each
    /// scenario ends after the fault healed).
    pub(crate) async fn finish(self, scenario: &str, load: Load) -> Summary {
        self.finish_judging(scenario, load, Memory::MayReset).await
    }

    /// As [`finish`](Self::finish), for a fault that spares every worker
    /// process: an instance thrown away by a live process is a violation.
    pub(crate) async fn finish_keeping_memory(self, scenario: &str, load: Load) -> Summary {
        self.finish_judging(scenario, load, Memory::Kept).await
    }

    async fn finish_judging(self, scenario: &str, load: Load, memory: Memory) -> Summary {
        let history = load.stop().await;
        let durable = self.db.tallies(&self.ids).await;
        let verdict = history.verify(&durable, memory);
        self.db.drop_now().await;
        let summary = verdict.unwrap_or_else(|violations| panic!("{scenario}: {violations}"));
        eprintln!("{scenario}: {summary:?}");
        assert_eq!(
            summary.failing_at_end, 0,
            "{scenario}: not recovered: {summary:?}"
        );
        assert!(summary.answered > 0, "{scenario}: no answer at all");
        summary
    }
}

/// The process token a worker's counters answer with.
pub(crate) async fn process_of(worker: &Proc) -> String {
    support::client()
        .get(format!("{}/fleet/process", worker.url))
        .send()
        .await
        .expect("process token")
        .text()
        .await
        .expect("process token body")
}
