//! Trays taken over across languages on one Postgres database: the Python
//! reference (pinned 0.16.0) running the seed's Runner/Jobs app and the
//! Rust jobs example read and write the same rows, so either can die
//! mid-work and the other finishes its jobs, exactly once, in order.
//!
//! Needs Postgres at `PINNED_TEST_DATABASE_URL` and the reference venv at
//! `PINNED_PY` (both set by `scripts/test`); fails, never skips, without
//! them.

mod support;

use std::path::PathBuf;

use pinned::pinned_store::{InstanceKey, PostgresOptions, PostgresStore, StateStore};
use support::jobs::{done, enqueue, wait};
use support::start_example;
use test_support::{Proc, PythonWorker};

const JOBS: usize = 10;

/// Both tests run workers in local mode on one database, and the Rust jobs
/// example wakes every marked runner it finds there when it starts, the other
/// test's included: run side by side, one test's Rust worker takes the other
/// test's runner while its owner still works it, and fences that owner out
/// (seen as a 503 on an enqueue). One at a time, each test's worker meets only
/// the runners it is meant to take over.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn database_url() -> String {
    std::env::var("PINNED_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned())
}

/// The Python app in local mode, on the port its launcher bound.
fn start_python(work_ms: &str) -> anyhow::Result<Proc> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py");
    Ok(PythonWorker::local()
        .app(dir, "jobs_app:app")
        .envs(&[("DATABASE_URL", &database_url()), ("JOBS_WORK_MS", work_ms)])
        .name("jobs-python")
        .start())
}

/// Waits until `id` has between 1 and `JOBS - 1` jobs done (the moment to
/// kill the process serving it); answers how many.
async fn mid_work(client: &reqwest::Client, base: &str, id: &str) -> anyhow::Result<usize> {
    let worked = wait("a first job done", || async {
        let worked = done(client, base, id).await?.len();
        Ok((worked >= 1).then_some(worked))
    })
    .await?;
    anyhow::ensure!(worked < JOBS, "every job was done before the kill");
    Ok(worked)
}

fn names(id: &str) -> Vec<String> {
    (0..JOBS).map(|n| format!("{id}-{n}")).collect()
}

fn unique_id(side: &str) -> String {
    format!("{side}-{}-{}", std::process::id(), rand::random::<u32>())
}

#[tokio::test]
async fn a_rust_worker_finishes_the_jobs_a_python_worker_admitted_and_died_on() -> anyhow::Result<()>
{
    let _alone = ONE_AT_A_TIME.lock().await;
    let id = unique_id("py2rs");
    let client = reqwest::Client::new();
    let mut python = start_python("150")?;
    enqueue(&client, &python.url, &id, &names(&id)).await?;
    let worked = mid_work(&client, &python.url, &id).await?;
    python.kill();
    eprintln!("python killed with {worked} of {JOBS} jobs done");

    // The Rust worker wakes the marked row itself: no request until done.
    let url = database_url();
    let (mut rust, address) = start_example("jobs", &[("DATABASE_URL", url.as_str())]).await?;
    let base = format!("http://{address}");
    let store = PostgresStore::open(&url, PostgresOptions::default()).await?;
    wait(
        "the Rust worker to drain the Python worker's jobs",
        || async {
            // Local mode on both sides: every epoch is 0, so a read at 0 is
            // no fence to anyone.
            let marked = store
                .list(InstanceKey::new("/runners", &id), 0, None, Some(true))
                .await?;
            Ok(marked.is_empty().then_some(()))
        },
    )
    .await?;
    // The reference writes a handler's field edit and its ack separately: a
    // kill between the two leaves the job both recorded and still queued,
    // and its redelivery records it again (at least once). So the job in
    // flight at the kill may appear twice in a row; nothing else may.
    let mut finished = done(&client, &base, &id).await?;
    let len = finished.len();
    finished.dedup();
    assert!(
        len - finished.len() <= 1,
        "more than the job in flight repeated"
    );
    assert_eq!(finished, names(&id));
    rust.start_kill()?;
    rust.wait().await?;
    Ok(())
}

#[tokio::test]
async fn a_python_worker_finishes_the_jobs_a_rust_worker_admitted_and_died_on() -> anyhow::Result<()>
{
    let _alone = ONE_AT_A_TIME.lock().await;
    let id = unique_id("rs2py");
    let client = reqwest::Client::new();
    let url = database_url();
    let (mut rust, address) = start_example(
        "jobs",
        &[("DATABASE_URL", url.as_str()), ("JOBS_WORK_MS", "150")],
    )
    .await?;
    let base = format!("http://{address}");
    enqueue(&client, &base, &id, &names(&id)).await?;
    let worked = mid_work(&client, &base, &id).await?;
    rust.start_kill()?;
    rust.wait().await?;
    eprintln!("rust killed with {worked} of {JOBS} jobs done");

    // The reference resumes marked trays when the id activates: one read
    // activates it.
    let mut python = start_python("0")?;
    let base = python.url.clone();
    let finished = wait(
        "the Python worker to finish the Rust worker's jobs",
        || async {
            let finished = done(&client, &base, &id).await?;
            Ok((finished.len() >= JOBS).then_some(finished))
        },
    )
    .await?;
    assert_eq!(finished, names(&id));
    python.kill();
    Ok(())
}
