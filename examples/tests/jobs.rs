//! The jobs example as a real process on a real SQLite file: SIGKILL it
//! while 500 admitted jobs across 10 runners are being worked, restart it
//! with no further request, and every admitted name ends up in its
//! runner's `done` list exactly once, in admission order.

mod support;

use anyhow::Context as _;
use pinned::pinned_store::{SqliteOptions, SqliteStore, StateStore};
use support::jobs::{done, enqueue, wait};
use support::start_example;
use tokio::time::Instant;

const RUNNERS: usize = 10;
const JOBS: usize = 50;

fn names(runner: usize) -> Vec<String> {
    (0..JOBS).map(|job| format!("r{runner}-{job}")).collect()
}

#[tokio::test]
async fn sigkill_mid_work_then_restart_finishes_every_job_exactly_once_in_order(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("jobs.db");
    let db_path = db.to_str().context("utf-8 path")?.to_owned();
    let env = [("PINNED_DB_PATH", db_path.as_str()), ("JOBS_WORK_MS", "5")];
    let (mut child, address) = start_example("jobs", &env).await?;
    let base = format!("http://{address}");
    let client = reqwest::Client::new();

    // Each runner's jobs go in one after another (order is per runner);
    // the runners go in side by side.
    let admissions = (0..RUNNERS).map(|runner| {
        let (client, base) = (client.clone(), base.clone());
        async move { enqueue(&client, &base, &format!("r{runner}"), &names(runner)).await }
    });
    for admitted in futures_util::future::join_all(admissions).await {
        admitted?;
    }
    let mut worked = 0;
    for runner in 0..RUNNERS {
        worked += done(&client, &base, &format!("r{runner}")).await?.len();
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
    let base = format!("http://{address}");
    // No request: the restarted worker wakes its marked runners itself.
    let store = SqliteStore::open(&db, SqliteOptions::default()).await?;
    wait(
        "the restarted worker to finish the admitted jobs",
        || async {
            Ok(store
                .marked_instances(None, 100)
                .await?
                .is_empty()
                .then_some(()))
        },
    )
    .await?;
    eprintln!(
        "the restarted worker finished the rest in {:?}",
        restarted.elapsed()
    );
    for runner in 0..RUNNERS {
        assert_eq!(
            done(&client, &base, &format!("r{runner}")).await?,
            names(runner),
            "runner r{runner}"
        );
    }
    child.start_kill()?;
    child.wait().await?;
    Ok(())
}
