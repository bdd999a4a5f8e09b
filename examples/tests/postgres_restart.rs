//! A real Postgres restart under tray work and alarms: a private cluster
//! (`initdb` + `pg_ctl`, started by this test) holds the state of a jobs
//! worker and a reminder worker behind a real pinboard (whose sweeper and
//! epoch mark read it too). While clients keep admitting jobs and alarms
//! come due, the cluster is stopped with `pg_ctl stop -m immediate` (a
//! crash: every connection drops, no checkpoint) and started again. After
//! it, every acknowledged admission is done exactly once and in order, no
//! job is done twice, every alarm set fires and leaves no row behind, and
//! both workers carried on in the same processes, their pools reconnecting
//! by themselves.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::jobs::wait;
use support::{example_binary, pinboard_binary};
use test_support::{Pinboard, PostgresCluster, Proc, RustWorker, TOKEN};

const RUNNERS: usize = 4;
const REMINDERS: usize = 4;

/// One runner's client: admits `<id>/<n>` for n = 0, 1, … one at a time
/// until `stop`, each name tried once; answers the names acknowledged.
async fn admit_until(
    client: reqwest::Client,
    pb: String,
    id: String,
    stop: Arc<AtomicBool>,
    acknowledged: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
) -> Vec<String> {
    let mut acks = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let name = format!("{id}/{n}");
        n += 1;
        let answer = client
            .post(format!("{pb}/runners/{id}/enqueue"))
            .json(&json!({ "name": name }))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        let ok = match answer {
            Ok(response) if response.status() == 200 => {
                response.json::<Value>().await.ok() == Some(json!({ "admitted": name }))
            }
            _ => false,
        };
        if ok {
            acks.push(name);
            acknowledged.fetch_add(1, Ordering::SeqCst);
        } else {
            refused.fetch_add(1, Ordering::SeqCst);
            // Not a hot loop while the database is down.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    acks
}

/// Sets reminder `id`'s alarm `seconds` from now through pinboard; whether
/// the worker acknowledged it (durable).
async fn set_reminder(client: &reqwest::Client, pb: &str, id: &str, seconds: u64) -> bool {
    let answer = client
        .post(format!("{pb}/reminder/{id}/in?seconds={seconds}"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    match answer {
        Ok(response) if response.status() == 200 => {
            response.json::<Value>().await.ok() == Some(json!({ "ok": true }))
        }
        _ => false,
    }
}

/// A client of the private cluster, outside every worker.
async fn admin(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Each runner's stored `done` list, and whether any of their rows is
/// still marked.
async fn runners(
    url: &str,
    ids: &[String],
) -> anyhow::Result<(HashMap<String, Vec<String>>, bool)> {
    let db = admin(url).await?;
    let rows = db
        .query(
            "SELECT id, marked, doc->'done' FROM pinned_tray_index \
             WHERE ns = '/runners' AND tray_ns = 'jobs' AND tray_id = '~'",
            &[],
        )
        .await?;
    let mut done = HashMap::new();
    let mut marked = false;
    for row in rows {
        let id: String = row.get(0);
        if !ids.contains(&id) {
            continue;
        }
        marked |= row.get::<_, bool>(1);
        let list: Option<Value> = row.get(2);
        done.insert(id, serde_json::from_value(list.unwrap_or(json!([])))?);
    }
    Ok((done, marked))
}

/// How many alarm rows of `/reminder` are left.
async fn alarm_rows(url: &str) -> anyhow::Result<i64> {
    let db = admin(url).await?;
    let row = db
        .query_one(
            "SELECT count(*) FROM pinned_tray_index \
             WHERE ns = '/reminder' AND tray_ns = 'pinned' AND tray_id = 'alarm'",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

fn worker(binary: std::path::PathBuf, pb: &str, db: &str, name: &str) -> Proc {
    RustWorker::new(binary, pb)
        .on_any_port()
        .envs(&[
            ("DATABASE_URL", db),
            ("JOBS_WORK_MS", "10"),
            ("RUST_LOG", "info"),
        ])
        .name(name)
        .start()
}

async fn live_sessions(client: &reqwest::Client, pb: &str) -> anyhow::Result<Vec<String>> {
    let mut sessions: Vec<String> = test_support::workers(client, pb, TOKEN)
        .await
        .iter()
        .filter_map(|w| w["sessionId"].as_str().map(str::to_owned))
        .collect();
    sessions.sort();
    Ok(sessions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_loses_no_acknowledged_job_repeats_none_and_every_alarm_fires(
) -> anyhow::Result<()> {
    let cluster = PostgresCluster::start();
    let db = cluster.url.clone();
    let pinboard = Pinboard::new(pinboard_binary().await?)
        .args(&["--database-url", &db, "--sweep-interval-ms", "200"])
        .name("pg-restart-pinboard")
        .start();
    let pb = pinboard.url.clone();
    let client = reqwest::Client::new();
    let mut jobs = worker(example_binary("jobs").await?, &pb, &db, "pg-restart-jobs");
    let mut reminders = worker(
        example_binary("reminder").await?,
        &pb,
        &db,
        "pg-restart-reminder",
    );
    test_support::wait_workers(&client, &pb, TOKEN, 2).await;
    let sessions = live_sessions(&client, &pb).await?;

    // Alarms due while the database will be down and after it.
    let tag = format!("{}-{}", std::process::id(), rand::random::<u32>());
    let reminder_ids: Vec<String> = (0..REMINDERS).map(|n| format!("r-{tag}-{n}")).collect();
    for (n, id) in reminder_ids.iter().enumerate() {
        let seconds = 1 + u64::try_from(n % 3)?;
        anyhow::ensure!(
            set_reminder(&client, &pb, id, seconds).await,
            "reminder {id} refused before the restart"
        );
    }

    let runner_ids: Vec<String> = (0..RUNNERS).map(|n| format!("j-{tag}-{n}")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let loads: Vec<_> = runner_ids
        .iter()
        .map(|id| {
            tokio::spawn(admit_until(
                client.clone(),
                pb.clone(),
                id.clone(),
                stop.clone(),
                acknowledged.clone(),
                refused.clone(),
            ))
        })
        .collect();
    let at_least = |counter: &Arc<AtomicUsize>, n: usize| {
        let counter = counter.clone();
        move || {
            let counter = counter.clone();
            async move { Ok((counter.load(Ordering::SeqCst) >= n).then_some(())) }
        }
    };
    wait("admissions under way", at_least(&acknowledged, 20)).await?;

    // The crash: every connection of both workers and of pinboard drops.
    cluster.stop_immediate();
    let refused_before = refused.load(Ordering::SeqCst);
    wait(
        "admissions refused while the database is down",
        at_least(&refused, refused_before + RUNNERS),
    )
    .await?;
    cluster.start_again();
    let after_restart = acknowledged.load(Ordering::SeqCst);
    wait(
        "admissions acknowledged again after the restart",
        at_least(&acknowledged, after_restart + 20),
    )
    .await?;
    // A reminder set after the restart fires too.
    let late = format!("r-{tag}-late");
    wait("a reminder set after the restart", || async {
        Ok(set_reminder(&client, &pb, &late, 1).await.then_some(()))
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    let mut acks = HashMap::new();
    for (id, load) in runner_ids.iter().zip(loads) {
        acks.insert(id.clone(), load.await?);
    }

    // Everything admitted drains, with no request.
    let done = wait("every runner drained", || async {
        let (done, marked) = runners(&db, &runner_ids).await?;
        Ok((!marked && done.len() == RUNNERS).then_some(done))
    })
    .await?;
    let mut total = 0;
    for id in &runner_ids {
        let done = &done[id];
        for name in &acks[id] {
            let times = done.iter().filter(|d| *d == name).count();
            anyhow::ensure!(times == 1, "{name} acknowledged, done {times} times");
        }
        let order: Vec<usize> = done
            .iter()
            .map(|name| name.rsplit('/').next().and_then(|n| n.parse().ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow::anyhow!("a name not of {id}: {done:?}"))?;
        anyhow::ensure!(
            order.windows(2).all(|w| w[0] < w[1]),
            "{id}: done out of order or twice: {done:?}"
        );
        total += done.len();
    }
    eprintln!(
        "postgres restart: {} admissions acknowledged, {} refused, {total} done",
        acknowledged.load(Ordering::SeqCst),
        refused.load(Ordering::SeqCst)
    );

    // Every alarm fired, and its row is gone.
    wait("every alarm fired and its row deleted", || async {
        Ok((alarm_rows(&db).await? == 0).then_some(()))
    })
    .await?;
    let log = reminders.log_text();
    for id in reminder_ids.iter().chain(std::iter::once(&late)) {
        anyhow::ensure!(
            log.contains(&format!("reminder {id} is due")),
            "reminder {id} never fired; the worker's log:\n{log}"
        );
    }

    // The same processes, the same sessions: nothing was restarted.
    anyhow::ensure!(jobs.wait_exit(Duration::from_millis(10)).await.is_none());
    anyhow::ensure!(reminders
        .wait_exit(Duration::from_millis(10))
        .await
        .is_none());
    anyhow::ensure!(
        live_sessions(&client, &pb).await? == sessions,
        "a worker registered again"
    );
    Ok(())
}
