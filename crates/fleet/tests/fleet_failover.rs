//! SIGKILL a Rust worker: its ids answer from the others within one lease
//! TTL plus a second, with fresh state; the restarted process registers
//! fresh and only gets new ids.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::{client, get_json, pinboard, rust_worker, wait_workers, workers};
use tokio::time::Instant;

const LEASE_TTL: Duration = Duration::from_millis(2000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_ids_move_within_a_lease_and_the_restart_gets_new_ids() {
    let pb = pinboard().start();
    let mut fleet = vec![rust_worker(&pb.url).start(), rust_worker(&pb.url).start()];
    let c = client();
    let before = wait_workers(&c, &pb.url, 2).await;
    let mut owner = HashMap::new();
    for i in 0..200 {
        let body = get_json(
            &c,
            &format!("{}/counter/f-{i}/hit", pb.url),
            Duration::from_secs(5),
        )
        .await;
        owner.insert(i, body["process"].as_str().unwrap_or_default().to_owned());
    }
    let victim_process = owner[&0].clone();
    let victim_ids: Vec<usize> = owner
        .iter()
        .filter(|(_, p)| **p == victim_process)
        .map(|(i, _)| *i)
        .collect();
    assert!(
        victim_ids.len() > 20,
        "{} ids on the victim",
        victim_ids.len()
    );
    // Which fleet entry is the victim: ask each worker's stats.
    let mut victim = None;
    for (n, worker) in fleet.iter().enumerate() {
        let stats = support::stats(&c, worker).await;
        let rows = stats["instances"].as_array().cloned().unwrap_or_default();
        if rows.iter().any(|row| row["id"] == "f-0") {
            victim = Some(n);
        }
    }
    let victim = victim.expect("victim worker");
    fleet[victim].kill();
    let killed = Instant::now();

    // Every id of the victim is asked for at once, each until it answers.
    let answers = futures_util::future::join_all(victim_ids.iter().map(|i| {
        let (c, url) = (c.clone(), format!("{}/counter/f-{i}/hit", pb.url));
        async move {
            let body = get_json(&c, &url, LEASE_TTL * 3).await;
            (body, killed.elapsed())
        }
    }))
    .await;
    let mut slowest = Duration::ZERO;
    for (body, elapsed) in answers {
        slowest = slowest.max(elapsed);
        assert_ne!(body["process"].as_str(), Some(victim_process.as_str()));
        assert_eq!(body["count"], 1, "fresh state after the move: {body}");
    }
    assert!(
        slowest <= LEASE_TTL + Duration::from_secs(1),
        "last moved id answered {slowest:?} after the kill"
    );

    // The restarted process is a new client with a new session...
    fleet.push(rust_worker(&pb.url).start());
    let after = wait_workers(&c, &pb.url, 2).await;
    let old_sessions: Vec<_> = before.iter().map(|w| w["sessionId"].clone()).collect();
    let old_clients: Vec<_> = before.iter().map(|w| w["clientId"].clone()).collect();
    let fresh = after
        .iter()
        .find(|w| !old_sessions.contains(&w["sessionId"]))
        .expect("a new session");
    assert!(!old_clients.contains(&fresh["clientId"]));
    // ...that holds none of the old ids (they stay where they moved)...
    for i in 0..200 {
        let body = get_json(
            &c,
            &format!("{}/counter/f-{i}/peek", pb.url),
            Duration::from_secs(5),
        )
        .await;
        assert!(
            body["count"].as_u64() >= Some(1),
            "f-{i} lost its state: {body}"
        );
    }
    // ...and gets new ids.
    let rows = workers(&c, &pb.url).await;
    let mut restarted_new = 0;
    let restarted_process = {
        let mut found = String::new();
        for i in 0..200 {
            let body = get_json(
                &c,
                &format!("{}/counter/n-{i}/hit", pb.url),
                Duration::from_secs(5),
            )
            .await;
            let process = body["process"].as_str().unwrap_or_default().to_owned();
            if !owner.values().any(|p| *p == process) {
                restarted_new += 1;
                found = process;
            }
        }
        found
    };
    assert!(
        restarted_new > 20,
        "restarted worker got {restarted_new} new ids ({rows:?})"
    );
    assert!(!owner.values().any(|p| *p == restarted_process));
}
