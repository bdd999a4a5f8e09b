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

/// `GET <pb>/counter/<id>/hit`: the answering process on 200.
async fn hit(c: &reqwest::Client, pb: &str, id: &str) -> Option<String> {
    hit_in(c, pb, COUNTER, id).await
}

/// `GET <pb><ns>/<id>/hit`: the answering process on 200.
async fn hit_in(c: &reqwest::Client, pb: &str, ns: &str, id: &str) -> Option<String> {
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

/// Asks for `ids` until each was answered at least once by each worker
/// process in `want` (a new id goes to either worker, weighted by
/// headroom); returns each id's process.
async fn spread(c: &reqwest::Client, pb: &str, want: &[&str]) -> HashMap<String, String> {
    spread_in(c, pb, COUNTER, want).await
}

/// As [`spread`], in namespace `ns`.
async fn spread_in(
    c: &reqwest::Client,
    pb: &str,
    ns: &str,
    want: &[&str],
) -> HashMap<String, String> {
    eventually("ids on both workers", Duration::from_secs(20), || async {
        let mut owners = HashMap::new();
        for i in 0..24 {
            let id = format!("m-{i}");
            let process = hit_in(c, pb, ns, &id).await?;
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

/// What a test expects of each move of its ids.
struct Expected<'a> {
    ns: &'a str,
    from: &'a str,
    to: &'a str,
    reason: &'a str,
    by: &'a str,
}

/// Checks that each of `ids` is listed once, as `want` says.
fn assert_moved(moves: &[Value], ids: &[String], want: &Expected<'_>) {
    for id in ids {
        let listed: Vec<&Value> = moves
            .iter()
            .filter(|m| m["ns"] == want.ns && m["id"] == id.as_str())
            .collect();
        assert_eq!(listed.len(), 1, "{id}: {listed:?} in {moves:#?}");
        let m = listed[0];
        assert_eq!(
            (&m["from"], &m["to"], &m["reason"], &m["by"]),
            (
                &json!(want.from),
                &json!(want.to),
                &json!(want.reason),
                &json!(want.by)
            ),
            "{id}: {m}"
        );
    }
}

/// The ids of `owners` answered by `process`.
fn held_by(owners: &HashMap<String, String>, process: &str) -> Vec<String> {
    owners
        .iter()
        .filter(|(_, p)| *p == process)
        .map(|(id, _)| id.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_workers_ids_are_listed_as_lease_lapses() {
    let pb = pinboard().start();
    let c = client();
    let mut killed = rust_worker(&pb.url).start();
    let survivor = rust_worker(&pb.url).start();
    let by_url = sessions(&c, &pb.url).await;
    let (killed_session, survivor_session) = (&by_url[&killed.url], &by_url[&survivor.url]);
    let killed_process = process_of(&c, &killed).await;
    let survivor_process = process_of(&c, &survivor).await;
    let owners = spread(&c, &pb.url, &[&killed_process, &survivor_process]).await;
    let held = held_by(&owners, &killed_process);
    assert!(
        moves_command(&pb.url).is_empty(),
        "first placements are no moves"
    );

    killed.kill();
    for id in &held {
        eventually("the id answering from the survivor", FAILOVER, || async {
            hit(&c, &pb.url, id)
                .await
                .filter(|p| *p == survivor_process)
        })
        .await;
    }
    assert_moved(
        &moves_command(&pb.url),
        &held,
        &Expected {
            ns: COUNTER,
            from: killed_session,
            to: survivor_session,
            reason: "lease_lapsed",
            by: "request",
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_workers_released_ids_are_listed_as_drains() {
    let pb = pinboard().start();
    let c = client();
    let drained = rust_worker(&pb.url).start();
    let other = rust_worker(&pb.url).start();
    let by_url = sessions(&c, &pb.url).await;
    let (drained_session, other_session) = (&by_url[&drained.url], &by_url[&other.url]);
    let drained_process = process_of(&c, &drained).await;
    let other_process = process_of(&c, &other).await;
    let owners = spread(&c, &pb.url, &[&drained_process, &other_process]).await;
    let held = held_by(&owners, &drained_process);

    // Drained with a short deadline: at it, the worker closes what it
    // holds and releases each id to pinboard.
    let answer = c
        .post(format!("{}/registry/push", pb.url))
        .bearer_auth(TOKEN)
        .json(&json!({"type": "drain", "sessionId": drained_session, "deadline": 0.5}))
        .send()
        .await
        .expect("push");
    assert_eq!(answer.status(), 200, "{:?}", answer.text().await);
    for id in &held {
        eventually(
            "the id answering from the other worker",
            FAILOVER,
            || async { hit(&c, &pb.url, id).await.filter(|p| *p == other_process) },
        )
        .await;
    }
    assert_moved(
        &moves_command(&pb.url),
        &held,
        &Expected {
            ns: COUNTER,
            from: drained_session,
            to: other_session,
            reason: "drain",
            by: "request",
        },
    );
}

/// `POST /registry/push` with `body`, answered 200.
async fn push(c: &reqwest::Client, pb: &str, body: Value) {
    let answer = c
        .post(format!("{pb}/registry/push"))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("push");
    assert_eq!(answer.status(), 200, "{:?}", answer.text().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_wound_down_is_listed_as_a_wind_down() {
    let pb = pinboard().start();
    let c = client();
    let wound = rust_worker(&pb.url).start();
    let other = rust_worker(&pb.url).start();
    let by_url = sessions(&c, &pb.url).await;
    let (wound_session, other_session) = (&by_url[&wound.url], &by_url[&other.url]);
    let wound_process = process_of(&c, &wound).await;
    let other_process = process_of(&c, &other).await;
    let owners = spread(&c, &pb.url, &[&wound_process, &other_process]).await;
    let held = held_by(&owners, &wound_process);
    let id = &held[0];

    // It takes no new ids (so the id cannot come back to it) but keeps
    // serving the ones it has, then is asked to wind this one down now.
    push(
        &c,
        &pb.url,
        json!({"type": "drain", "sessionId": wound_session, "deadline": null}),
    )
    .await;
    push(
        &c,
        &pb.url,
        json!({"type": "wind_down", "sessionId": wound_session, "ns": COUNTER, "id": id, "deadline": 0}),
    )
    .await;
    eventually(
        "the id answering from the other worker",
        FAILOVER,
        || async { hit(&c, &pb.url, id).await.filter(|p| *p == other_process) },
    )
    .await;
    assert_moved(
        &moves_command(&pb.url),
        std::slice::from_ref(id),
        &Expected {
            ns: COUNTER,
            from: wound_session,
            to: other_session,
            reason: "wind_down",
            by: "request",
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_the_store_lost_with_their_owner_are_listed_as_store_losses() {
    let redis = RedisServer::start();
    let pb = pinboard().redis(&redis.url).start();
    let c = client();
    let mut lost = rust_worker(&pb.url).start();
    let kept = rust_worker(&pb.url).start();
    let by_url = sessions(&c, &pb.url).await;
    let lost_session = by_url[&lost.url].clone();
    let kept_before = by_url[&kept.url].clone();
    let lost_process = process_of(&c, &lost).await;
    let kept_process = process_of(&c, &kept).await;
    let owners = spread(&c, &pb.url, &[&lost_process, &kept_process]).await;
    let held = held_by(&owners, &lost_process);
    let reclaimed = held_by(&owners, &kept_process);

    // The owner dies, and the store loses everything while its lease
    // still ran: nothing in the store says where its ids were.
    lost.kill();
    redis.flushall().await;
    for id in &held {
        eventually("the id answering from the survivor", FAILOVER, || async {
            hit(&c, &pb.url, id).await.filter(|p| *p == kept_process)
        })
        .await;
    }
    // The survivor re-registered (the store forgot its session too).
    let kept_now = eventually("the survivor's new session", FAILOVER, || async {
        support::workers(&c, &pb.url)
            .await
            .iter()
            .find(|w| w["advertiseUrl"] == kept.url.as_str())
            .and_then(|w| w["sessionId"].as_str().map(str::to_owned))
            .filter(|s| *s != kept_before)
    })
    .await;
    for id in &reclaimed {
        assert_eq!(hit(&c, &pb.url, id).await, Some(kept_process.clone()));
    }
    let moves = moves_command(&pb.url);
    assert_moved(
        &moves,
        &held,
        &Expected {
            ns: COUNTER,
            from: &lost_session,
            to: &kept_now,
            reason: "store_loss",
            by: "request",
        },
    );
    for id in &reclaimed {
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
    let c = client();
    let worker = || {
        rust_worker(&pb.url)
            .env("FLEET_NS", &ns)
            .env("FLEET_DATABASE_URL", &db)
            .start()
    };
    let mut killed = worker();
    let survivor = worker();
    let by_url = sessions(&c, &pb.url).await;
    let (killed_session, survivor_session) = (&by_url[&killed.url], &by_url[&survivor.url]);
    let killed_process = process_of(&c, &killed).await;
    let survivor_process = process_of(&c, &survivor).await;
    let owners = spread_in(&c, &pb.url, &ns, &[&killed_process, &survivor_process]).await;
    let held = held_by(&owners, &killed_process);

    // Nobody asks for them again: once the lease lapsed, the sweeper
    // wakes them (orphans) on the survivor.
    killed.kill();
    let moves = eventually("the sweeper to re-place every id", FAILOVER, || async {
        let moves = moves_command(&pb.url);
        held.iter()
            .all(|id| {
                moves
                    .iter()
                    .any(|m| m["ns"] == ns.as_str() && m["id"] == id.as_str())
            })
            .then_some(moves)
    })
    .await;
    assert_moved(
        &moves,
        &held,
        &Expected {
            ns: &ns,
            from: killed_session,
            to: survivor_session,
            reason: "lease_lapsed",
            by: "sweeper",
        },
    );
}
