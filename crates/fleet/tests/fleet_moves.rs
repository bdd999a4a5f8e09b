//! The operator's "what moved" list after failures, as an operator reads
//! it: the real `pinboard moves --json` command against a real pinboard
//! with real workers.
//!
//! - A worker SIGKILLed while it holds ids: clients keep asking for them
//!   (each retry first meets `owner unreachable`, then pinboard's cached
//!   route is dropped) until its lease lapses and they answer from the
//!   survivor; every one of them is then listed as moved from the killed
//!   session to the survivor with reason `lease_lapsed`.
//! - A worker drained by the operator with ids it then releases (each
//!   closes when the drain's deadline comes): their next requests place
//!   them on the other worker, listed with reason `drain`.
//! - An id the operator winds down on a worker that takes no new ids
//!   (drained without a deadline): the worker releases it, and its next
//!   request places it on the other worker, listed with reason
//!   `wind_down`.
//! - A worker killed and the placement store (a private Redis) wiped
//!   before its lease lapsed: the survivor re-registers and reclaims its
//!   own ids (no move), the dead worker's are placed on it after the
//!   store-loss quarantine, listed with reason `store_loss`.
//! - A worker killed while it holds ids nobody asks for again: pinboard's
//!   sweeper wakes them on the survivor, listed as lease lapses made `by`
//!   the sweeper.

mod support;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use pinned_store::conformance::{database_url, unique_ns, PostgresCleanup};
use serde_json::{json, Value};
use support::{client, eventually, pinboard, rust_worker, wait_workers, Proc, RedisServer, TOKEN};

/// How long a failover may take: the fleet pinboard's 2 s lease, its
/// refresh and the clients' retries, with room for a loaded machine.
const FAILOVER: Duration = Duration::from_secs(20);

/// The fleet worker's namespace unless `FLEET_NS` names another.
const COUNTER: &str = "/counter";

/// `GET <pb><ns>/<id>/hit`: the answering process on 200.
async fn hit(c: &reqwest::Client, pb: &str, ns: &str, id: &str) -> Option<String> {
    let res = c.get(format!("{pb}{ns}/{id}/hit")).send().await.ok()?;
    if !res.status().is_success() {
        return None;
    }
    let body: Value = res.json().await.ok()?;
    body["process"].as_str().map(str::to_owned)
}

/// The process token a worker puts in every answer.
async fn process_of(c: &reqwest::Client, worker: &Proc) -> String {
    c.get(format!("{}/fleet/process", worker.url))
        .send()
        .await
        .expect("process token")
        .text()
        .await
        .expect("process token body")
}

/// The session each worker registered, by advertise URL.
async fn sessions(c: &reqwest::Client, pb: &str) -> HashMap<String, String> {
    wait_workers(c, pb, 2)
        .await
        .iter()
        .filter_map(|w| {
            Some((
                w["advertiseUrl"].as_str()?.trim_end_matches('/').to_owned(),
                w["sessionId"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// Asks for ids in `ns` until each was answered at least once by each
/// worker process in `want` (a new id goes to either worker, weighted by
/// headroom); returns each id's process.
async fn spread(c: &reqwest::Client, pb: &str, ns: &str, want: &[&str]) -> HashMap<String, String> {
    eventually("ids on both workers", Duration::from_secs(20), || async {
        let mut owners = HashMap::new();
        for i in 0..24 {
            let id = format!("m-{i}");
            let process = hit(c, pb, ns, &id).await?;
            owners.insert(id, process);
        }
        want.iter()
            .all(|p| owners.values().any(|o| o == p))
            .then_some(owners)
    })
    .await
}

/// `pinboard moves --json` (the real command, this package's pinboard
/// binary) against `pb`: its moves.
fn moves_command(pb: &str) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-pinboard"))
        .args(["moves", "--limit", "256", "--json"])
        .env("PINBOARD_URL", pb)
        .env("PINBOARD_OPERATOR_TOKEN", TOKEN)
        .output()
        .expect("run pinboard moves");
    assert!(
        out.status.success(),
        "pinboard moves: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).expect("--json output parses");
    answer["moves"].as_array().cloned().unwrap_or_default()
}

/// The ids of `owners` answered by `process`.
fn held_by(owners: &HashMap<String, String>, process: &str) -> Vec<String> {
    owners
        .iter()
        .filter(|(_, p)| *p == process)
        .map(|(id, _)| id.clone())
        .collect()
}

/// What every test starts from: one pinboard, two workers, ids in `ns`
/// spread over both. Each test then applies its cause to `from`, and its
/// ids are expected to move to `to`.
struct Scene {
    c: reqwest::Client,
    pb: Proc,
    ns: String,
    /// The worker the cause strikes.
    from: Proc,
    /// The worker left standing.
    to: Proc,
    from_session: String,
    /// `to`'s session as the moves name it (a test whose cause makes it
    /// re-register sets the new one).
    to_session: String,
    to_process: String,
    /// The ids `from` answered for.
    held: Vec<String>,
    /// The ids `to` answered for.
    kept: Vec<String>,
}

impl Scene {
    /// Starts `from`, then `to`, with `worker` behind `pb` and spreads ids
    /// in `ns` over both.
    async fn start(pb: Proc, ns: &str, worker: impl Fn(&str) -> Proc) -> Self {
        let c = client();
        let from = worker(&pb.url);
        let to = worker(&pb.url);
        let by_url = sessions(&c, &pb.url).await;
        let from_process = process_of(&c, &from).await;
        let to_process = process_of(&c, &to).await;
        let owners = spread(&c, &pb.url, ns, &[&from_process, &to_process]).await;
        Self {
            from_session: by_url[&from.url].clone(),
            to_session: by_url[&to.url].clone(),
            held: held_by(&owners, &from_process),
            kept: held_by(&owners, &to_process),
            ns: ns.to_owned(),
            c,
            pb,
            from,
            to,
            to_process,
        }
    }

    /// `ids` asked for until each answers from `to`.
    async fn answered_by_to(&self, ids: &[String]) {
        for id in ids {
            eventually(
                "the id answering from the other worker",
                FAILOVER,
                || async {
                    hit(&self.c, &self.pb.url, &self.ns, id)
                        .await
                        .filter(|p| *p == self.to_process)
                },
            )
            .await;
        }
    }

    /// `POST /registry/push` with `body`, answered 200.
    async fn push(&self, body: Value) {
        let answer = self
            .c
            .post(format!("{}/registry/push", self.pb.url))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .expect("push");
        assert_eq!(answer.status(), 200, "{:?}", answer.text().await);
    }

    /// The moves `pinboard moves --json` lists now.
    fn moves(&self) -> Vec<Value> {
        moves_command(&self.pb.url)
    }

    /// Checks that each of `ids` is listed once in `moves`, from `from` to
    /// `to`, with `reason`, made `by`.
    fn assert_listed(&self, moves: &[Value], ids: &[String], reason: &str, by: &str) {
        for id in ids {
            let listed: Vec<&Value> = moves
                .iter()
                .filter(|m| m["ns"] == self.ns.as_str() && m["id"] == id.as_str())
                .collect();
            assert_eq!(listed.len(), 1, "{id}: {listed:?} in {moves:#?}");
            let m = listed[0];
            assert_eq!(
                (&m["from"], &m["to"], &m["reason"], &m["by"]),
                (
                    &json!(self.from_session),
                    &json!(self.to_session),
                    &json!(reason),
                    &json!(by)
                ),
                "{id}: {m}"
            );
        }
    }
}

/// A fleet worker behind `pb`, hosting [`COUNTER`].
fn counter_worker(pb: &str) -> Proc {
    rust_worker(pb).start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_workers_ids_are_listed_as_lease_lapses() {
    let mut s = Scene::start(pinboard().start(), COUNTER, counter_worker).await;
    assert!(s.moves().is_empty(), "first placements are no moves");

    s.from.kill();
    s.answered_by_to(&s.held).await;
    s.assert_listed(&s.moves(), &s.held, "lease_lapsed", "request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_workers_released_ids_are_listed_as_drains() {
    let s = Scene::start(pinboard().start(), COUNTER, counter_worker).await;

    // Drained with a short deadline: at it, the worker closes what it
    // holds and releases each id to pinboard.
    s.push(json!({"type": "drain", "sessionId": s.from_session, "deadline": 0.5}))
        .await;
    s.answered_by_to(&s.held).await;
    s.assert_listed(&s.moves(), &s.held, "drain", "request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_wound_down_is_listed_as_a_wind_down() {
    let s = Scene::start(pinboard().start(), COUNTER, counter_worker).await;
    let id = std::slice::from_ref(&s.held[0]);

    // It takes no new ids (so the id cannot come back to it) but keeps
    // serving the ones it has, then is asked to wind this one down now.
    s.push(json!({"type": "drain", "sessionId": s.from_session, "deadline": null}))
        .await;
    s.push(json!({"type": "wind_down", "sessionId": s.from_session, "ns": COUNTER, "id": id[0], "deadline": 0}))
        .await;
    s.answered_by_to(id).await;
    s.assert_listed(&s.moves(), id, "wind_down", "request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_the_store_lost_with_their_owner_are_listed_as_store_losses() {
    let redis = RedisServer::start();
    let pb = pinboard().redis(&redis.url).start();
    let mut s = Scene::start(pb, COUNTER, counter_worker).await;

    // The owner dies, and the store loses everything while its lease
    // still ran: nothing in the store says where its ids were.
    s.from.kill();
    redis.flushall().await;
    s.answered_by_to(&s.held).await;
    // The survivor re-registered (the store forgot its session too).
    s.to_session = eventually("the survivor's new session", FAILOVER, || async {
        support::workers(&s.c, &s.pb.url)
            .await
            .iter()
            .find(|w| w["advertiseUrl"] == s.to.url.as_str())
            .and_then(|w| w["sessionId"].as_str().map(str::to_owned))
            .filter(|session| *session != s.to_session)
    })
    .await;
    for id in &s.kept {
        assert_eq!(
            hit(&s.c, &s.pb.url, COUNTER, id).await.as_ref(),
            Some(&s.to_process)
        );
    }
    let moves = s.moves();
    s.assert_listed(&moves, &s.held, "store_loss", "request");
    for id in &s.kept {
        assert!(
            !moves.iter().any(|m| m["id"] == id.as_str()),
            "{id} was reclaimed by its own process: {moves:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_the_sweeper_wakes_elsewhere_are_listed_as_its_moves() {
    let ns = unique_ns("moves-swept");
    let _cleanup = PostgresCleanup::new(&ns);
    let db = database_url();
    let pb = pinboard()
        .args(&["--database-url", &db, "--sweep-interval-ms", "200"])
        .start();
    let mut s = Scene::start(pb, &ns, |pb| {
        rust_worker(pb)
            .env("FLEET_NS", &ns)
            .env("FLEET_DATABASE_URL", &db)
            .start()
    })
    .await;

    // Nobody asks for them again: once the lease lapsed, the sweeper
    // wakes them (orphans) on the survivor.
    s.from.kill();
    let moves = eventually("the sweeper to re-place every id", FAILOVER, || async {
        let moves = s.moves();
        s.held
            .iter()
            .all(|id| {
                moves
                    .iter()
                    .any(|m| m["ns"] == ns.as_str() && m["id"] == id.as_str())
            })
            .then_some(moves)
    })
    .await;
    s.assert_listed(&moves, &s.held, "lease_lapsed", "sweeper");
}
