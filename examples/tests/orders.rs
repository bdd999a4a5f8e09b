//! The orders example as real processes: shops send every order they take
//! to a ledger object as a message. SIGKILL the process mid-flight (local
//! mode, SQLite) and restart it; and behind a real pinboard on Postgres
//! with two workers, SIGKILL the receiver's owner, then a sender's owner,
//! then drain the receiver's owner so the ledger moves. Every time, each
//! order is booked in the ledger exactly once, in the order taken.
//!
//! A kill from outside rarely lands between the ledger's admission write
//! and its answer, so one test aims there: the example's crash point
//! (`ORDERS_DIE_AFTER_BOOKING`) aborts the process right after a booking's
//! admission landed and before it is answered; after the restart its
//! sender delivers it again, and the ledger must answer a repeat.
//!
//! The fleet test needs Postgres at `PINNED_TEST_DATABASE_URL` (set by
//! `scripts/test`).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use pinned::pinned_store::{
    PostgresOptions, PostgresStore, SqliteOptions, SqliteStore, StateStore,
};
use serde_json::{json, Value};
use support::jobs::wait;
use support::{example_binary, overview, pinboard_binary, start_example, PATIENCE};
use test_support::{Pinboard, Proc, RustWorker};
use tokio::sync::Notify;

const SHOPS: usize = 3;
const ORDERS: u64 = 40;

/// Orders answered across the shops, and a signal each time another
/// fifth of them were.
#[derive(Default)]
struct Answered {
    count: AtomicUsize,
    fifth: Notify,
}

impl Answered {
    fn one(&self) {
        let total = SHOPS * ORDERS as usize;
        let count = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if count.is_multiple_of(total / 5) {
            self.fifth.notify_waiters();
        }
    }

    /// Waits until at least `fifths` fifths of the orders were answered.
    async fn reached(&self, fifths: usize) -> anyhow::Result<()> {
        let goal = SHOPS * ORDERS as usize * fifths / 5;
        tokio::time::timeout(PATIENCE * 2, async {
            loop {
                let notified = self.fifth.notified();
                if self.count.load(Ordering::SeqCst) >= goal {
                    return;
                }
                notified.await;
            }
        })
        .await
        .with_context(|| format!("{fifths} fifths of the orders answered in time"))
    }
}

/// Places order `n` of shop `id` into `ledger` at `base`, once: the
/// shop answers a repeat as it answered the first time.
async fn place(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    ledger: &str,
    n: u64,
) -> anyhow::Result<bool> {
    let answer: Value = client
        .post(format!("{base}/shops/{id}/orders"))
        .json(&json!({ "n": n, "ledger": ledger }))
        .timeout(Duration::from_secs(10))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    anyhow::ensure!(answer["placed"] == json!(n), "{answer}");
    Ok(answer["repeat"] == json!(true))
}

/// Places shop `id`'s orders one after another, each until answered
/// (a worker killed or draining answers nothing or 5xx for a while).
async fn place_all(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    ledger: &str,
    answered: &Answered,
) -> anyhow::Result<()> {
    for n in 1..=ORDERS {
        wait(&format!("order {n} of {id} answered"), || async {
            Ok(place(client, base, id, ledger, n).await.ok().map(|_| ()))
        })
        .await?;
        answered.one();
    }
    Ok(())
}

/// Places shop `id`'s orders until the first that is not answered (the
/// process died); answers how many were.
async fn place_until_gone(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    ledger: &str,
    answered: &Answered,
) -> u64 {
    for n in 1..=ORDERS {
        if place(client, base, id, ledger, n).await.is_err() {
            return n - 1;
        }
        answered.one();
    }
    ORDERS
}

/// The ledger's lines.
async fn lines(client: &reqwest::Client, base: &str, ledger: &str) -> anyhow::Result<Value> {
    Ok(client
        .get(format!("{base}/ledgers/{ledger}/lines"))
        .timeout(Duration::from_secs(10))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// Waits until the ledger holds a line per order, then asserts each
/// shop's orders are there once each, in the order taken.
async fn assert_booked_once_in_order(
    client: &reqwest::Client,
    base: &str,
    ledger: &str,
    shops: &[String],
) -> anyhow::Result<()> {
    let total = shops.len() * ORDERS as usize;
    let booked = wait("every order booked", || async {
        let Ok(answer) = lines(client, base, ledger).await else {
            return Ok(None);
        };
        let lines: Vec<String> = serde_json::from_value(answer["lines"].clone())?;
        Ok((lines.len() >= total && answer["waiting"] == 0).then_some(lines))
    })
    .await?;
    for shop in shops {
        let theirs: Vec<u64> = booked
            .iter()
            .filter_map(|line| line.strip_prefix(&format!("{shop}:")))
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let expected: Vec<u64> = (1..=ORDERS).collect();
        assert_eq!(theirs, expected, "shop {shop}: each order once, in order");
    }
    assert_eq!(booked.len(), total, "nothing else booked: {booked:?}");
    Ok(())
}

#[tokio::test]
async fn orders_sent_around_a_sigkill_are_booked_exactly_once_in_order() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("orders.db");
    let db_path = db.to_str().context("utf-8 path")?.to_owned();
    let env = [
        ("PINNED_DB_PATH", db_path.as_str()),
        ("ORDERS_WORK_MS", "5"),
    ];
    let (mut child, address) = start_example("orders", &env).await?;
    let base = format!("http://{address}");
    let client = reqwest::Client::new();
    let shops: Vec<String> = (0..SHOPS).map(|s| format!("s{s}")).collect();

    // Orders are placed side by side; the process dies once a fifth are
    // answered, with orders queued, being worked and messages on the way.
    let answered = Answered::default();
    let runs = shops
        .iter()
        .map(|id| place_until_gone(&client, &base, id, "main", &answered));
    let all = futures_util::future::join_all(runs);
    let killer = async {
        let reached = answered.reached(1).await;
        let _ = child.start_kill();
        reached
    };
    let (before, reached) = tokio::join!(all, killer);
    reached?;
    child.wait().await?;
    let placed: u64 = before.iter().sum();
    anyhow::ensure!(
        placed < SHOPS as u64 * ORDERS,
        "every order was answered before the kill: nothing was cut short"
    );
    let store = SqliteStore::open(&db, SqliteOptions::default()).await?;
    let marked = store.marked_instances(None, 100).await?;
    eprintln!(
        "{placed} orders answered before the kill; {} instances left marked",
        marked.len()
    );

    let (mut child, address) = start_example("orders", &env).await?;
    let base = format!("http://{address}");
    let again = Answered::default();
    for id in &shops {
        place_all(&client, &base, id, "main", &again).await?;
    }
    assert_booked_once_in_order(&client, &base, "main", &shops).await?;
    support::jobs::drained("every order sent and booked", &store).await?;
    child.start_kill()?;
    child.wait().await?;
    Ok(())
}

/// The booking whose admission write is the crash point.
const DIE_AFTER_BOOKING: u64 = 20;

#[tokio::test]
async fn a_booking_admitted_but_not_answered_before_a_crash_is_answered_as_a_repeat(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("orders.db");
    let db_path = db.to_str().context("utf-8 path")?.to_owned();
    let die_after = DIE_AFTER_BOOKING.to_string();
    let env = [
        ("PINNED_DB_PATH", db_path.as_str()),
        ("ORDERS_DIE_AFTER_BOOKING", die_after.as_str()),
    ];
    let (mut child, address) = start_example("orders", &env).await?;
    let base = format!("http://{address}");
    let client = reqwest::Client::new();
    let shops: Vec<String> = (0..SHOPS).map(|s| format!("s{s}")).collect();

    // Orders are placed side by side until the process is gone: it aborts
    // by itself once the ledger's admission of booking 20 has landed.
    let answered = Answered::default();
    let runs = shops
        .iter()
        .map(|id| place_until_gone(&client, &base, id, "main", &answered));
    let placed: u64 = futures_util::future::join_all(runs).await.iter().sum();
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .context("the process aborts at its crash point")??;
    {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(
            status.signal(),
            Some(6),
            "aborted (SIGABRT) at the crash point, not {status}"
        );
    }
    eprintln!("{placed} orders answered before the crash point");

    // Restarted without the crash point, every order is placed again (a
    // repeat for those answered before); the booking admitted but never
    // answered comes again, first of its shop's.
    let env = [("PINNED_DB_PATH", db_path.as_str())];
    let (mut child, address) = start_example("orders", &env).await?;
    let base = format!("http://{address}");
    let again = Answered::default();
    let runs = shops
        .iter()
        .map(|id| place_all(&client, &base, id, "main", &again));
    for shop in futures_util::future::join_all(runs).await {
        shop?;
    }
    assert_booked_once_in_order(&client, &base, "main", &shops).await?;
    let answer = lines(&client, &base, "main").await?;
    assert_eq!(
        answer["received"],
        json!(SHOPS as u64 * ORDERS),
        "each booking admitted once: {answer}"
    );
    let repeats = wait("the unanswered booking answered as a repeat", || async {
        let Some(scrape) = test_support::metrics::try_scrape(&client, &base).await else {
            return Ok(None);
        };
        let repeats = scrape.value(r#"pinned_tray_messages{side="received",outcome="repeat"}"#);
        Ok((repeats >= 1.0).then_some(repeats))
    })
    .await?;
    eprintln!("the restarted ledger answered {repeats} repeats");
    child.start_kill()?;
    child.wait().await?;
    Ok(())
}

/// Held by each test behind pinboard on Postgres: their pinboards sweep
/// one database, so one would wake the other's marked instances on its own
/// workers (fencing the other's out) if they ran side by side.
static POSTGRES_FLEET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn database_url() -> String {
    std::env::var("PINNED_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned())
}

/// pinboard on `127.0.0.1:0` with its sweeper on Postgres.
async fn start_pinboard() -> anyhow::Result<Proc> {
    Ok(Pinboard::new(pinboard_binary().await?)
        .args(&["--database-url", &database_url()])
        .args(&["--sweep-interval-ms", "200"])
        .name("orders-fleet-pinboard")
        .start())
}

/// An orders worker on `PORT=0`, advertising the port it bound.
async fn start_worker(pinboard: &str) -> anyhow::Result<Proc> {
    start_worker_with(pinboard, &[]).await
}

/// An orders worker as [`start_worker`], with `extra` set.
async fn start_worker_with(pinboard: &str, extra: &[(&str, &str)]) -> anyhow::Result<Proc> {
    Ok(RustWorker::new(example_binary("orders").await?, pinboard)
        .on_any_port()
        .envs(&[("DATABASE_URL", &database_url()), ("ORDERS_WORK_MS", "10")])
        .envs(extra)
        .name("orders-fleet-worker")
        .start())
}

/// The advertised URL of the worker among `live` that owns `id` now, once
/// it is placed there (a placement on a killed worker stays until its
/// lease runs out).
async fn owner(
    client: &reqwest::Client,
    pinboard: &str,
    id: &str,
    live: &[Proc],
) -> anyhow::Result<String> {
    wait(&format!("{id} placed"), || async {
        let view = overview(client, pinboard).await?;
        let session = view["placements"]
            .as_array()
            .and_then(|rows| rows.iter().find(|row| row["id"] == id))
            .and_then(|row| row["sessionId"].as_str())
            .map(str::to_owned);
        let Some(session) = session else {
            return Ok(None);
        };
        Ok(view["workers"]
            .as_array()
            .and_then(|rows| rows.iter().find(|row| row["sessionId"] == session.as_str()))
            .and_then(|row| row["advertiseUrl"].as_str())
            .filter(|url| live.iter().any(|worker| worker.url == *url))
            .map(str::to_owned))
    })
    .await
}

/// Takes the process advertised at `url` out of `workers`.
fn take(workers: &mut Vec<Proc>, url: &str) -> anyhow::Result<Proc> {
    let at = workers
        .iter()
        .position(|worker| worker.url == url)
        .context("the owner's process")?;
    Ok(workers.remove(at))
}

/// This test's instances (ids holding `tag`) with a marked row, read
/// unfenced.
async fn marked(store: &PostgresStore, tag: &str) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for ns in ["/ledgers", "/shops"] {
        let rows = store.marked_instances(Some((ns, "")), 1000).await?;
        ids.extend(
            rows.into_iter()
                .filter(|m| m.ns == ns && m.id.contains(tag))
                .map(|m| format!("{}/{}", m.ns, m.id)),
        );
    }
    Ok(ids)
}

#[tokio::test]
async fn across_two_workers_orders_survive_kills_of_either_side_and_a_move_of_the_ledger(
) -> anyhow::Result<()> {
    let _fleet = POSTGRES_FLEET.lock().await;
    let pinboard = start_pinboard().await?;
    let pb = pinboard.url.clone();
    let client = reqwest::Client::new();
    let mut workers: Vec<Proc> = Vec::new();
    for _ in 0..2 {
        workers.push(start_worker(&pb).await?);
    }
    let live = |n: usize| {
        let (client, pb) = (client.clone(), pb.clone());
        async move {
            wait(&format!("{n} workers registered"), || async {
                let live = overview(&client, &pb).await?["workers"]
                    .as_array()
                    .map_or(0, Vec::len);
                Ok((live == n).then_some(()))
            })
            .await
        }
    };
    live(2).await?;

    let tag = format!("{}-{}", std::process::id(), rand::random::<u32>());
    let ledger = format!("ledger-{tag}");
    let shops: Vec<String> = (0..SHOPS).map(|s| format!("shop-{tag}-{s}")).collect();
    let answered = Answered::default();
    let runs = shops
        .iter()
        .map(|id| place_all(&client, &pb, id, &ledger, &answered));
    let all = futures_util::future::join_all(runs);

    // Each fifth of the way, something happens to one side.
    let chaos = async {
        answered.reached(1).await?;
        let url = owner(&client, &pb, &ledger, &workers).await?;
        let mut victim = take(&mut workers, &url)?;
        victim.kill();
        eprintln!("killed the ledger's owner");
        workers.push(start_worker(&pb).await?);

        answered.reached(2).await?;
        let url = owner(&client, &pb, &shops[0], &workers).await?;
        let mut victim = take(&mut workers, &url)?;
        victim.kill();
        eprintln!("killed the first shop's owner");
        workers.push(start_worker(&pb).await?);

        answered.reached(3).await?;
        let url = owner(&client, &pb, &ledger, &workers).await?;
        let draining = take(&mut workers, &url)?;
        let replacement = start_worker(&pb).await?;
        draining.terminate();
        let mut draining = draining;
        anyhow::ensure!(
            draining.wait_exit(PATIENCE).await.is_some(),
            "the ledger's owner did not drain and exit"
        );
        eprintln!("drained the ledger's owner");
        workers.push(replacement);
        anyhow::Ok(())
    };
    let (placed, chaos) = tokio::join!(all, chaos);
    chaos?;
    for shop in placed {
        shop?;
    }
    live(2).await?;

    assert_booked_once_in_order(&client, &pb, &ledger, &shops).await?;
    let store = PostgresStore::open(&database_url(), PostgresOptions::default()).await?;
    wait("every row of the test at rest", || async {
        Ok(marked(&store, &tag).await?.is_empty().then_some(()))
    })
    .await?;
    // What the surviving workers saw (the killed ones' counts died with
    // them): how often a delivery failed and was retried, and how often a
    // letter came again and was answered as a repeat.
    let (mut retried, mut repeats) = (0.0, 0.0);
    for worker in &workers {
        if let Some(scrape) = test_support::metrics::try_scrape(&client, &worker.url).await {
            retried += scrape.value(r#"pinned_tray_messages{side="sent",outcome="retried"}"#);
            repeats += scrape.value(r#"pinned_tray_messages{side="received",outcome="repeat"}"#);
        }
    }
    eprintln!("surviving workers: {retried} deliveries retried, {repeats} repeats answered");
    // At rest, nothing more arrives.
    let answer = lines(&client, &pb, &ledger).await?;
    assert_eq!(
        answer["lines"].as_array().map(Vec::len),
        Some(SHOPS * ORDERS as usize)
    );
    Ok(())
}

#[tokio::test]
async fn across_two_workers_a_booking_whose_answer_died_with_the_ledgers_owner_is_a_repeat(
) -> anyhow::Result<()> {
    let _fleet = POSTGRES_FLEET.lock().await;
    let pinboard = start_pinboard().await?;
    let pb = pinboard.url.clone();
    let client = reqwest::Client::new();
    let tag = format!("{}-{}", std::process::id(), rand::random::<u32>());
    let ledger = format!("ledger-{tag}");
    let shops: Vec<String> = (0..SHOPS).map(|s| format!("shop-{tag}-{s}")).collect();

    // The first worker, alone, takes the ledger (with the first order);
    // it carries the crash point.
    let die_after = DIE_AFTER_BOOKING.to_string();
    let mut doomed =
        start_worker_with(&pb, &[("ORDERS_DIE_AFTER_BOOKING", die_after.as_str())]).await?;
    wait("the first worker registered", || async {
        let live = overview(&client, &pb).await?["workers"]
            .as_array()
            .map_or(0, Vec::len);
        Ok((live == 1).then_some(()))
    })
    .await?;
    wait("the first order placed", || async {
        Ok(place(&client, &pb, &shops[0], &ledger, 1).await.ok())
    })
    .await?;
    let url = owner(&client, &pb, &ledger, std::slice::from_ref(&doomed)).await?;
    anyhow::ensure!(url == doomed.url, "the ledger is on the first worker");
    let survivor = start_worker(&pb).await?;

    // Orders keep coming while the ledger's owner aborts once booking 20's
    // admission landed: its sender never got the answer.
    let answered = Answered::default();
    let runs = shops
        .iter()
        .map(|id| place_all(&client, &pb, id, &ledger, &answered));
    let all = futures_util::future::join_all(runs);
    let crash = async {
        let status = doomed.wait_exit(PATIENCE * 2).await;
        let status = status.context("the ledger's owner aborts at its crash point")?;
        use std::os::unix::process::ExitStatusExt as _;
        anyhow::ensure!(
            status.signal() == Some(6),
            "aborted (SIGABRT) at the crash point, not {status}"
        );
        eprintln!("the ledger's owner aborted at its crash point");
        anyhow::Ok(())
    };
    let (placed, crash) = tokio::join!(all, crash);
    crash?;
    for shop in placed {
        shop?;
    }

    assert_booked_once_in_order(&client, &pb, &ledger, &shops).await?;
    let answer = lines(&client, &pb, &ledger).await?;
    assert_eq!(
        answer["received"],
        json!(SHOPS as u64 * ORDERS),
        "each booking admitted once: {answer}"
    );
    // The ledger now lives on the survivor, the only worker left: it
    // answered the booking that came again.
    let repeats = wait("the unanswered booking answered as a repeat", || async {
        let Some(scrape) = test_support::metrics::try_scrape(&client, &survivor.url).await else {
            return Ok(None);
        };
        let repeats = scrape.value(r#"pinned_tray_messages{side="received",outcome="repeat"}"#);
        Ok((repeats >= 1.0).then_some(repeats))
    })
    .await?;
    eprintln!("the surviving worker answered {repeats} repeats");
    Ok(())
}
