//! The jobs example as a real process on a real SQLite file: SIGKILL it
//! while 500 admitted jobs across 10 runners are being worked, restart it
//! with no further request, and every admitted name ends up in its
//! runner's `done` list exactly once, in admission order. And SIGKILL it
//! while keyed enqueues are on their way: a client that sends every one
//! again with its key after the restart gets each job done exactly once.

mod support;

use anyhow::Context as _;
use pinned::pinned_store::{SqliteOptions, SqliteStore};
use support::jobs::{done, drained, enqueue, wait};
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
    // Each job's work (30 ms) is far longer than its admission (a SQLite
    // write), so a backlog is left to crash however fast this machine
    // admits: with 5 ms, 430 to all 500 jobs were done by the kill.
    let env = [("PINNED_DB_PATH", db_path.as_str()), ("JOBS_WORK_MS", "30")];
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
    drained("the restarted worker to finish the admitted jobs", &store).await?;
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

/// Enqueues `names` into runner `id` with their names as idempotency keys,
/// one after another; answers how many were answered before the first
/// failure (the process died), and the repeats among them.
async fn enqueue_keyed(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    names: &[String],
) -> (usize, usize) {
    let mut repeats = 0;
    for (n, name) in names.iter().enumerate() {
        let answer = async {
            let answer: serde_json::Value = client
                .post(format!("{base}/runners/{id}/enqueue"))
                .header("idempotency-key", name.as_str())
                .json(&serde_json::json!({ "name": name }))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            anyhow::Ok(answer)
        };
        match answer.await {
            Ok(answer) => {
                assert_eq!(answer["admitted"], serde_json::json!(name), "{answer}");
                if answer["repeat"] == serde_json::json!(true) {
                    repeats += 1;
                }
            }
            Err(_) => return (n, repeats),
        }
    }
    (names.len(), repeats)
}

#[tokio::test]
async fn keyed_enqueues_sent_again_after_a_sigkill_are_done_exactly_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("jobs.db");
    let db_path = db.to_str().context("utf-8 path")?.to_owned();
    let env = [("PINNED_DB_PATH", db_path.as_str()), ("JOBS_WORK_MS", "5")];
    let (mut child, address) = start_example("jobs", &env).await?;
    let base = format!("http://{address}");
    let client = reqwest::Client::new();

    // Each runner's enqueues go one after another; the process dies once a
    // fifth of the jobs were worked, so some enqueues are on their way.
    let runs = (0..RUNNERS).map(|runner| {
        let (client, base) = (client.clone(), base.clone());
        async move { enqueue_keyed(&client, &base, &format!("r{runner}"), &names(runner)).await }
    });
    let all = futures_util::future::join_all(runs);
    let killer = {
        let (client, base) = (client.clone(), base.clone());
        let child = &mut child;
        async move {
            let _ = wait("a fifth of the jobs worked", || {
                let (client, base) = (client.clone(), base.clone());
                async move {
                    let mut worked = 0;
                    for runner in 0..RUNNERS {
                        worked += done(&client, &base, &format!("r{runner}"))
                            .await
                            .map_or(0, |d| d.len());
                    }
                    Ok((worked >= RUNNERS * JOBS / 5).then_some(()))
                }
            })
            .await;
            let _ = child.start_kill();
        }
    };
    let (before, ()) = tokio::join!(all, killer);
    child.wait().await?;
    let sent_before: usize = before.iter().map(|(n, _)| n).sum();
    anyhow::ensure!(
        sent_before < RUNNERS * JOBS,
        "every enqueue was answered before the kill: nothing was cut short"
    );

    // The client does not know which of its enqueues landed: it sends them
    // all again, with the same keys, to the restarted process.
    let (mut child, address) = start_example("jobs", &env).await?;
    let base = format!("http://{address}");
    let again = (0..RUNNERS).map(|runner| {
        let (client, base) = (client.clone(), base.clone());
        async move { enqueue_keyed(&client, &base, &format!("r{runner}"), &names(runner)).await }
    });
    let after = futures_util::future::join_all(again).await;
    let repeats: usize = after.iter().map(|(_, r)| r).sum();
    for (runner, (sent, _)) in after.iter().enumerate() {
        assert_eq!(*sent, JOBS, "runner r{runner}: every enqueue answered");
    }
    assert!(
        repeats >= sent_before,
        "every enqueue answered before the kill is a repeat now ({repeats} < {sent_before})"
    );
    eprintln!(
        "{sent_before} enqueues answered before the kill; {repeats} of the {} sent again were repeats",
        RUNNERS * JOBS
    );
    let store = SqliteStore::open(&db, SqliteOptions::default()).await?;
    drained("every job worked", &store).await?;
    for runner in 0..RUNNERS {
        assert_eq!(
            done(&client, &base, &format!("r{runner}")).await?,
            names(runner),
            "runner r{runner}: each job once, in order"
        );
    }
    child.start_kill()?;
    child.wait().await?;
    Ok(())
}
