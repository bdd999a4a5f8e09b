//! The jobs example as a real process on a real SQLite file: SIGKILL it
//! while 500 admitted jobs across 10 runners are being worked, restart it
//! with no further request, and every admitted name ends up in its
//! runner's `done` list exactly once, in admission order.

mod support;

use std::time::Duration;

use anyhow::Context as _;
use pinned::pinned_store::{SqliteOptions, SqliteStore, StateStore};
use serde_json::{json, Value};
use support::{start_example, PATIENCE};
use tokio::time::{timeout, Instant};

const RUNNERS: usize = 10;
const JOBS: usize = 50;

async fn done(
    client: &reqwest::Client,
    address: &str,
    runner: usize,
) -> anyhow::Result<Vec<String>> {
    let body: Value = client
        .get(format!("http://{address}/runners/r{runner}/done"))
        .send()
        .await?
        .json()
        .await?;
    Ok(serde_json::from_value(body["done"].clone())?)
}

#[tokio::test]
async fn sigkill_mid_work_then_restart_finishes_every_job_exactly_once_in_order(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("jobs.db");
    let db_path = db.to_str().context("utf-8 path")?.to_owned();
    let env = [("PINNED_DB_PATH", db_path.as_str()), ("JOBS_WORK_MS", "5")];
    let (mut child, address) = start_example("jobs", &env).await?;
    let client = reqwest::Client::new();

    // Each runner's jobs go in one after another (order is per runner);
    // the runners go in side by side.
    let admissions = (0..RUNNERS).map(|runner| {
        let client = client.clone();
        let address = address.clone();
        async move {
            for job in 0..JOBS {
                let name = format!("r{runner}-{job}");
                let answer: Value = client
                    .post(format!("http://{address}/runners/r{runner}/enqueue"))
                    .json(&json!({ "name": name }))
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                anyhow::ensure!(answer == json!({ "admitted": name }), "{answer}");
            }
            anyhow::Ok(())
        }
    });
    for admitted in futures_util::future::join_all(admissions).await {
        admitted?;
    }
    let mut worked = 0;
    for runner in 0..RUNNERS {
        worked += done(&client, &address, runner).await?.len();
    }
    anyhow::ensure!(
        worked < RUNNERS * JOBS,
        "all {worked} jobs were done before the kill: nothing left to crash"
    );
    child.start_kill()?;
    child.wait().await?;
    eprintln!("killed with {worked} of {} jobs done", RUNNERS * JOBS);

    let restarted = Instant::now();
    let (mut child, address) = start_example("jobs", &env).await?;
    // No request: the restarted worker wakes its marked runners itself.
    let store = SqliteStore::open(&db, SqliteOptions::default()).await?;
    timeout(PATIENCE, async {
        loop {
            if store.marked_instances(None, 100).await?.is_empty() {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .context("the restarted worker did not finish the admitted jobs")??;
    eprintln!(
        "the restarted worker finished the rest in {:?}",
        restarted.elapsed()
    );
    for runner in 0..RUNNERS {
        let expected: Vec<String> = (0..JOBS).map(|job| format!("r{runner}-{job}")).collect();
        assert_eq!(
            done(&client, &address, runner).await?,
            expected,
            "runner r{runner}"
        );
    }
    child.start_kill()?;
    child.wait().await?;
    Ok(())
}
