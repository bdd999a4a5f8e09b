//! The jobs example as a fleet on Postgres: a real pinboard (with its
//! sweeper) and two jobs workers. SIGKILL the owner of runners mid-work;
//! with no further request, pinboard's sweeper wakes their marked rows on
//! the survivor, which finishes every job exactly once, in order.
//!
//! Needs Postgres at `PINNED_TEST_DATABASE_URL` (set by `scripts/test`).

mod support;

use std::collections::HashMap;

use anyhow::Context as _;
use pinned::pinned_store::{PostgresOptions, PostgresStore, StateStore};
use support::jobs::{done, enqueue, wait};
use support::{example_binary, overview, pinboard_binary};
use test_support::{Pinboard, Proc, RustWorker};

const RUNNERS: usize = 6;
const JOBS: usize = 12;

fn database_url() -> String {
    std::env::var("PINNED_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned())
}

/// pinboard on `127.0.0.1:0` with a 2 s lease and its sweeper on Postgres.
async fn start_pinboard() -> anyhow::Result<Proc> {
    Ok(Pinboard::new(pinboard_binary().await?)
        .args(&["--database-url", &database_url()])
        .args(&["--sweep-interval-ms", "200"])
        .name("jobs-fleet-pinboard")
        .start())
}

/// A jobs worker on `PORT=0`, advertising the port it bound (the
/// advertise URL's port 0); its `url` is the one it registered.
async fn start_worker(pinboard: &str) -> anyhow::Result<Proc> {
    Ok(RustWorker::new(example_binary("jobs").await?, pinboard)
        .on_any_port()
        .envs(&[("DATABASE_URL", &database_url()), ("JOBS_WORK_MS", "40")])
        .name("jobs-fleet-worker")
        .start())
}

/// The runners of this test (ids starting with `prefix`) with a marked
/// row, read unfenced (a fenced read would race the owners' epochs).
async fn marked(store: &PostgresStore, prefix: &str) -> anyhow::Result<Vec<String>> {
    let rows = store
        .marked_instances(Some(("/runners", prefix)), RUNNERS * 4)
        .await?;
    Ok(rows
        .into_iter()
        .filter(|m| m.ns == "/runners" && m.id.starts_with(prefix))
        .map(|m| m.id)
        .collect())
}

#[tokio::test]
async fn the_sweeper_moves_a_killed_owners_marked_runners_to_the_survivor() -> anyhow::Result<()> {
    let pinboard = start_pinboard().await?;
    let pb = pinboard.url.clone();
    let client = reqwest::Client::new();
    let mut workers = HashMap::new();
    for _ in 0..2 {
        let worker = start_worker(&pb).await?;
        workers.insert(worker.url.clone(), worker);
    }
    wait("two workers registered", || async {
        let live = overview(&client, &pb).await?["workers"]
            .as_array()
            .map_or(0, Vec::len);
        Ok((live == 2).then_some(()))
    })
    .await?;

    let tag = format!("{}-{}", std::process::id(), rand::random::<u32>());
    let ids: Vec<String> = (0..RUNNERS).map(|n| format!("fleet-{tag}-{n}")).collect();
    let admissions = ids.iter().map(|id| {
        let (client, pb) = (client.clone(), pb.clone());
        let names: Vec<String> = (0..JOBS).map(|job| format!("{id}/{job}")).collect();
        async move { enqueue(&client, &pb, id, &names).await }
    });
    for admitted in futures_util::future::join_all(admissions).await {
        admitted?;
    }

    // The owner of the first runner dies mid-work.
    let view = overview(&client, &pb).await?;
    let session = |id: &str| {
        view["placements"]
            .as_array()
            .and_then(|rows| rows.iter().find(|row| row["id"] == id))
            .and_then(|row| row["sessionId"].as_str())
            .map(str::to_owned)
    };
    let victim_session = session(&ids[0]).context("no placement for the first runner")?;
    let victim_url = view["workers"]
        .as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|row| row["sessionId"] == victim_session.as_str())
        })
        .and_then(|row| row["advertiseUrl"].as_str())
        .context("the victim's worker row")?
        .to_owned();
    let moved: Vec<&String> = ids
        .iter()
        .filter(|id| session(id).as_deref() == Some(victim_session.as_str()))
        .collect();
    let mut victim = workers.remove(&victim_url).context("the victim process")?;
    victim.kill();
    let store = PostgresStore::open(&database_url(), PostgresOptions::default()).await?;
    let prefix = format!("fleet-{tag}-");
    let unfinished = marked(&store, &prefix)
        .await?
        .iter()
        .filter(|id| moved.contains(id))
        .count();
    anyhow::ensure!(
        unfinished > 0,
        "the victim had finished every runner before the kill"
    );
    eprintln!(
        "killed the owner of {} runners, {unfinished} unfinished",
        moved.len()
    );

    // No request now: the sweeper wakes the marked rows on the survivor.
    wait(
        "the survivor to finish the killed owner's runners",
        || async { Ok(marked(&store, &prefix).await?.is_empty().then_some(())) },
    )
    .await?;
    for id in &ids {
        let expected: Vec<String> = (0..JOBS).map(|job| format!("{id}/{job}")).collect();
        assert_eq!(done(&client, &pb, id).await?, expected, "runner {id}");
    }
    Ok(())
}
