//! Migrating a fleet from the Python reference to Rust workers, and back,
//! as a deploy does it: under client load, with tray work in flight on
//! Postgres.
//!
//! Two workers of one side (the Python reference running
//! `py/migrate_app.py`, or the `worker` example) serve counters and job
//! runners behind a real pinboard, whose sweeper reads the same Postgres.
//! Clients increment counters and admit jobs (each job takes
//! `JOBS_WORK_MS`: longer on the old side than jobs take to arrive, so
//! every runner has a backlog in flight when it is drained). Two workers of the other
//! side join; the first two are drained with `pinboard drain <session>`,
//! stopped with SIGTERM once they report every instance closed, and the
//! load goes on against the newcomers. Then:
//!
//! - no client request failed. A 503 with `Retry-After` is a retry the
//!   client was told to make: the client waits what it says and sends the
//!   request again (at most [`RETRIES`] times), and the test counts it.
//!   Anything else (another status, a connection error, retries run out)
//!   is a failure;
//! - every admitted job is done exactly once, in admission order: each
//!   runner's `done` list, read through pinboard at the end, equals the
//!   names it admitted.
//!
//! Needs Postgres at `PINNED_TEST_DATABASE_URL` and the reference venv at
//! `PINNED_PY` (both set by `scripts/test`); fails, never skips, without
//! them.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _};
use serde_json::{json, Value};
use support::jobs::done;
use support::{example_binary, overview, pinboard_binary};
use test_support::{
    eventually, until_explained, Pinboard, Proc, PythonWorker, RustWorker, PATIENCE, TOKEN,
};

/// Counter ids the load increments.
const COUNTERS: usize = 40;
/// Counter lanes, each sending one request at a time.
const COUNTER_LANES: usize = 4;
/// Pause between two counter requests of a lane.
const COUNTER_PACE: Duration = Duration::from_millis(10);
/// Job runners, one admitting lane each.
const RUNNERS: usize = 4;
/// Pause between two admissions of a runner lane.
const ADMISSION_PACE: Duration = Duration::from_millis(40);
/// Each job's work on the old side, in milliseconds: slower than jobs
/// arrive, so every runner has a backlog in flight when it is drained.
const OLD_WORK_MS: &str = "150";
/// Each job's work on the new side: faster than jobs arrive, so it works
/// the backlog off.
const NEW_WORK_MS: &str = "20";
/// Answers the old side gives before the deploy starts, and the new side
/// alone after it.
const ANSWERS: u64 = 300;
/// Re-sends of one request the client makes when told to (503 + Retry-After).
const RETRIES: u32 = 10;

fn database_url() -> String {
    std::env::var("PINNED_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned())
}

/// Which implementation a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Python,
    Rust,
}

/// A worker of either side, started behind `pinboard`.
async fn start_worker(side: Side, pinboard: &str, work_ms: &str) -> anyhow::Result<Proc> {
    let url = database_url();
    Ok(match side {
        Side::Python => PythonWorker::new(pinboard)
            .app(
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py"),
                "migrate_app:app",
            )
            .envs(&[
                ("DATABASE_URL", url.as_str()),
                ("JOBS_WORK_MS", work_ms),
                ("HEARTBEAT_S", "0.3"),
                ("LEASE_BUFFER_S", "0.5"),
                ("SWEEP_S", "1"),
            ])
            .name("migrate-python")
            .start(),
        Side::Rust => RustWorker::new(example_binary("worker").await?, pinboard)
            .on_any_port()
            .envs(&[
                ("DATABASE_URL", url.as_str()),
                ("JOBS_WORK_MS", work_ms),
                ("RUST_LOG", "warn"),
            ])
            .name("migrate-rust")
            .start(),
    })
}

/// Whether `worker` drained and closed every instance (the Python app's
/// `/drained`, the worker example's `/readyz`).
async fn drained(client: &reqwest::Client, side: Side, worker: &str) -> bool {
    let url = match side {
        Side::Python => format!("{worker}/drained"),
        Side::Rust => format!("{worker}/readyz"),
    };
    let body: Option<Value> = match client.get(url).send().await {
        Ok(answer) => answer.json().await.ok(),
        Err(_) => None,
    };
    body.is_some_and(|body| body["drained"] == true)
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    retries: AtomicU64,
    failures: Mutex<Vec<String>>,
    /// Each runner's admitted job names, in admission order.
    admitted: Mutex<BTreeMap<String, Vec<String>>>,
}

impl Tally {
    fn failed(&self) -> usize {
        self.failures.lock().map_or(0, |f| f.len())
    }

    /// A copy of what each runner admitted so far (the lock is never held
    /// across an await: the load's lanes take it).
    fn admitted(&self) -> BTreeMap<String, Vec<String>> {
        self.admitted.lock().map(|a| a.clone()).unwrap_or_default()
    }

    fn record(&self, failure: String) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.push(failure);
        }
    }
}

/// Sends what `request` builds until it is answered, re-sending (after the
/// wait it names) each 503 that carries `Retry-After`; `None` (recorded as
/// a failure) for any other error or when the retries run out.
async fn send(
    tally: &Tally,
    what: &str,
    request: impl Fn() -> reqwest::RequestBuilder,
) -> Option<Value> {
    for _ in 0..=RETRIES {
        let answer = match request().timeout(Duration::from_secs(10)).send().await {
            Ok(answer) => answer,
            Err(error) => {
                tally.record(format!("{what}: {error}"));
                return None;
            }
        };
        let status = answer.status();
        if status.is_success() {
            tally.answered.fetch_add(1, Ordering::Relaxed);
            return answer.json().await.ok();
        }
        let retry_after = answer
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        match retry_after {
            Some(seconds) if status == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                tally.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(seconds)).await;
            }
            _ => {
                let body = answer.text().await.unwrap_or_default();
                tally.record(format!("{what}: {status} {body}"));
                return None;
            }
        }
    }
    tally.record(format!("{what}: still 503 after {RETRIES} retries"));
    None
}

/// The client load: counter lanes and one admitting lane per runner, until
/// `stop`.
fn start_load(
    client: &reqwest::Client,
    pinboard: &str,
    tag: &str,
    tally: &Arc<Tally>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut lanes = Vec::new();
    for lane in 0..COUNTER_LANES {
        let (client, tally, stop) = (client.clone(), tally.clone(), stop.clone());
        let base = format!("{pinboard}/counter/{tag}-c");
        lanes.push(tokio::spawn(async move {
            let mut pace = tokio::time::interval(COUNTER_PACE);
            let mut n = lane;
            while !stop.load(Ordering::SeqCst) {
                pace.tick().await;
                let url = format!("{base}{}/increment", n % COUNTERS);
                send(&tally, &url, || client.post(&url)).await;
                n += COUNTER_LANES;
            }
        }));
    }
    for runner in 0..RUNNERS {
        let (client, tally, stop) = (client.clone(), tally.clone(), stop.clone());
        let id = format!("{tag}-r{runner}");
        let url = format!("{pinboard}/runners/{id}/enqueue");
        lanes.push(tokio::spawn(async move {
            let mut pace = tokio::time::interval(ADMISSION_PACE);
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                pace.tick().await;
                let name = format!("{id}/{n}");
                let job = json!({ "name": name });
                let answer = send(&tally, &url, || client.post(&url).json(&job)).await;
                if answer.is_some_and(|a| a == json!({ "admitted": name })) {
                    if let Ok(mut admitted) = tally.admitted.lock() {
                        admitted.entry(id.clone()).or_default().push(name);
                    }
                }
                n += 1;
            }
        }));
    }
    lanes
}

/// The sessions of the workers at `urls`, from pinboard's worker list.
async fn sessions(client: &reqwest::Client, pinboard: &str, urls: &[String]) -> Vec<String> {
    let rows = test_support::workers(client, pinboard, TOKEN).await;
    rows.iter()
        .filter(|row| {
            row["advertiseUrl"]
                .as_str()
                .is_some_and(|url| urls.iter().any(|u| u == url))
        })
        .filter_map(|row| row["sessionId"].as_str().map(str::to_owned))
        .collect()
}

/// How many ids pinboard places on `sessions` (its overview's placements).
async fn placements_of(
    client: &reqwest::Client,
    pinboard: &str,
    sessions: &[String],
) -> anyhow::Result<usize> {
    let overview = overview(client, pinboard).await?;
    let rows = overview["placements"].as_array().context("placements")?;
    Ok(rows
        .iter()
        .filter(|row| {
            row["sessionId"]
                .as_str()
                .is_some_and(|s| sessions.iter().any(|own| own == s))
        })
        .count())
}

/// `pinboard drain <session>`, the operator command.
async fn operator_drain(pinboard: &str, session: &str) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(pinboard_binary().await?)
        .args(["drain", session])
        .env("PINBOARD_URL", pinboard)
        .env("PINBOARD_OPERATOR_TOKEN", TOKEN)
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "pinboard drain {session}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The two directions run one after the other: each loads the two cores
/// on its own, and its figures should be its own.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One deploy from `from` to `to`, under load; prints what it measured.
async fn migrate(from: Side, to: Side) -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let pinboard = Pinboard::new(pinboard_binary().await?)
        .args(&["--database-url", &database_url()])
        .args(&["--sweep-interval-ms", "200"])
        .name("migrate-pinboard")
        .start();
    let pb = pinboard.url.clone();
    let client = reqwest::Client::new();
    let mut old = Vec::new();
    for _ in 0..2 {
        old.push(start_worker(from, &pb, OLD_WORK_MS).await?);
    }
    test_support::wait_workers(&client, &pb, TOKEN, 2).await;

    let tag = format!("mig-{}", test_support::unique());
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let lanes = start_load(&client, &pb, &tag, &tally, &stop);
    // Work in flight on the old side: every runner has admitted jobs and
    // done some, and the counters answered.
    let first = format!("{tag}-r0");
    eventually("jobs done on the old side", PATIENCE, || {
        let (client, pb, first) = (client.clone(), pb.clone(), first.clone());
        async move {
            done(&client, &pb, &first)
                .await
                .ok()
                .filter(|d| d.len() >= 5)
        }
    })
    .await;

    // The deploy: new workers join, the old ones are drained, then stopped.
    let mut new = Vec::new();
    for _ in 0..2 {
        new.push(start_worker(to, &pb, NEW_WORK_MS).await?);
    }
    test_support::wait_workers(&client, &pb, TOKEN, 4).await;
    let old_urls: Vec<String> = old.iter().map(|w| w.url.clone()).collect();
    let old_sessions = sessions(&client, &pb, &old_urls).await;
    ensure!(old_sessions.len() == 2, "old sessions: {old_sessions:?}");
    // What the old side holds as the drain starts: its placements, and the
    // jobs admitted and not yet done.
    let placed = placements_of(&client, &pb, &old_sessions).await?;
    // Admissions go on throughout, so a backlog shows up within a few
    // admission paces; a loaded machine can read one snapshot just as the
    // old workers caught up, so it looks again until one does.
    let backlog = eventually("a job in flight at the drain", PATIENCE, || async {
        let mut backlog = 0;
        for (id, names) in tally.admitted() {
            let finished = done(&client, &pb, &id).await.ok()?.len();
            backlog += names.len().saturating_sub(finished);
        }
        (backlog > 0).then_some(backlog)
    })
    .await;
    let drain_started = Instant::now();
    for session in &old_sessions {
        operator_drain(&pb, session).await?;
    }
    for worker in &old {
        let url = worker.url.clone();
        let what = format!("{from:?} worker {url} to drain");
        eventually(&what, PATIENCE, || {
            let (client, url) = (client.clone(), url.clone());
            async move { drained(&client, from, &url).await.then_some(()) }
        })
        .await;
    }
    let drained_in = drain_started.elapsed();
    for worker in &old {
        worker.terminate();
    }
    for worker in &mut old {
        ensure!(
            worker.wait_exit(PATIENCE).await.is_some(),
            "a drained {from:?} worker did not exit on SIGTERM"
        );
    }
    test_support::wait_workers(&client, &pb, TOKEN, 2).await;

    // The newcomers alone serve as many answers again.
    let after = tally.answered.load(Ordering::SeqCst);
    until_explained(
        "answers from the new side alone",
        PATIENCE,
        || tally.answered.load(Ordering::SeqCst) >= after + ANSWERS || tally.failed() > 0,
        || format!("{} since", tally.answered.load(Ordering::SeqCst) - after),
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for lane in lanes {
        lane.await?;
    }

    // Every admitted job done once, in order, on whichever side ran it.
    let admitted = tally.admitted();
    ensure!(
        admitted.len() == RUNNERS,
        "runners that admitted: {}",
        admitted.len()
    );
    for (id, names) in &admitted {
        let finished = eventually(&format!("runner {id} to finish"), PATIENCE, || {
            let (client, pb) = (client.clone(), pb.clone());
            let (id, want) = (id.clone(), names.len());
            async move {
                done(&client, &pb, &id)
                    .await
                    .ok()
                    .filter(|d| d.len() >= want)
            }
        })
        .await;
        ensure!(
            &finished == names,
            "runner {id}: done differs from admitted ({} done, {} admitted)",
            finished.len(),
            names.len()
        );
    }
    let failures = tally.failures.lock().map(|f| f.clone()).unwrap_or_default();
    let jobs: usize = admitted.values().map(Vec::len).sum();
    eprintln!(
        "{from:?} -> {to:?}: {} requests answered, {} retries told by 503 + Retry-After, \
         {} failed; {jobs} jobs over {RUNNERS} runners done once in order; \
         at the drain the old side held {placed} placements and {backlog} jobs not yet done, \
         and drained in {drained_in:?}; {:?} in all",
        tally.answered.load(Ordering::SeqCst),
        tally.retries.load(Ordering::SeqCst),
        failures.len(),
        started.elapsed(),
    );
    ensure!(
        failures.is_empty(),
        "{} requests failed: {:?}",
        failures.len(),
        failures.iter().take(5).collect::<Vec<_>>()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_workers_are_replaced_by_rust_workers_under_load() -> anyhow::Result<()> {
    migrate(Side::Python, Side::Rust)
        .await
        .context("Python -> Rust")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_workers_are_replaced_by_python_workers_under_load() -> anyhow::Result<()> {
    migrate(Side::Rust, Side::Python)
        .await
        .context("Rust -> Python")
}
