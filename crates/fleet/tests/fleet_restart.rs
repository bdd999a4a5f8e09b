//! A worker SIGKILLed and restarted at once on the same advertise URL: the
//! new process proves it answers at that URL when it registers, so the dead
//! session there is superseded on the spot. Its ids move (to the restarted
//! process, fresh, at higher epochs) as soon as it is back, instead of
//! answering `owner session changed; retry` until the dead session's lease
//! lapses; the operator's moves list says why.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{client, eventually, pinboard, rust_worker, wait_workers, TOKEN};
use tokio::time::Instant;

/// pinboard's lease here: long enough that waiting it out would show.
const LEASE: Duration = Duration::from_secs(8);

/// `GET <pb>/counter/<id>/hit`: the answer's `process` and `count` on 200.
async fn hit(c: &reqwest::Client, pb: &str, id: &str) -> Option<(String, u64)> {
    let res = c.get(format!("{pb}/counter/{id}/hit")).send().await.ok()?;
    if !res.status().is_success() {
        return None;
    }
    let body: Value = res.json().await.ok()?;
    Some((
        body["process"].as_str()?.to_owned(),
        body["count"].as_u64()?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_same_advertise_url_takes_its_ids_at_once() {
    let lease = LEASE.as_millis().to_string();
    let pb = pinboard().args(&["--lease-ttl-ms", &lease]).start();
    let c = client();
    // A port of its own, kept across the restart (so is the advertise URL).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let worker = || rust_worker(&pb.url).env("FLEET_PORT", &port);
    let mut crashed = worker().start();
    let before = wait_workers(&c, &pb.url, 1).await;
    let ghost = before[0]["sessionId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let ids: Vec<String> = (0..10).map(|i| format!("r-{i}")).collect();
    let mut first_process = String::new();
    for id in &ids {
        for _ in 0..3 {
            let (process, _) = eventually("a warm id", Duration::from_secs(10), || async {
                hit(&c, &pb.url, id).await
            })
            .await;
            first_process = process;
        }
    }

    crashed.kill();
    let killed = Instant::now();
    let restarted = worker().start();
    let back = killed.elapsed();
    for id in &ids {
        let (process, count) = eventually(
            "the id answering from the restarted process",
            LEASE,
            || async {
                hit(&c, &pb.url, id)
                    .await
                    .filter(|(process, _)| *process != first_process)
            },
        )
        .await;
        assert_eq!(count, 1, "{id}: a fresh instance");
        let _ = process;
    }
    let failover = killed.elapsed();
    eprintln!(
        "restart: process back after {back:?}, every id answering after {failover:?} (lease {LEASE:?})"
    );
    assert!(
        failover < LEASE / 2,
        "failover took {failover:?}: the dead session's lease ({LEASE:?}) was waited out"
    );
    // The moves list says they moved because the process was replaced.
    let moves: Value = c
        .get(format!("{}/registry/moves?limit=100", pb.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("moves")
        .json()
        .await
        .expect("moves json");
    let replaced: Vec<&str> = moves["moves"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["reason"] == "replaced" && m["from"] == ghost.as_str())
        .filter_map(|m| m["id"].as_str())
        .collect();
    for id in &ids {
        assert!(replaced.contains(&id.as_str()), "{id} not in {moves}");
    }
    drop(restarted);
}
