//! Two Python workers: ids spread over both; SIGKILL one and its ids answer
//! from the survivor within one lease TTL plus a second, with fresh state.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::{client, get_json, pinboard, python_worker, wait_workers, LEASE_TTL_MS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_ids_move_to_the_survivor_with_fresh_state() {
    let pb = pinboard().start();
    let mut a = python_worker(&pb.url).start();
    let b = python_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 2).await;
    let pa = get_json(&c, &format!("{}/process", a.url), Duration::from_secs(5)).await["process"]
        .clone();
    let pb_proc = get_json(&c, &format!("{}/process", b.url), Duration::from_secs(5)).await
        ["process"]
        .clone();

    let mut owner: HashMap<String, serde_json::Value> = HashMap::new();
    for i in 0..24 {
        let id = format!("spread-{i}");
        let v = get_json(
            &c,
            &format!("{}/counter/{id}/hit", pb.url),
            Duration::from_secs(10),
        )
        .await;
        owner.insert(id, v);
    }
    let on_a: Vec<&String> = owner
        .iter()
        .filter(|(_, v)| v["process"] == pa)
        .map(|(k, _)| k)
        .collect();
    let on_b: Vec<&String> = owner
        .iter()
        .filter(|(_, v)| v["process"] == pb_proc)
        .map(|(k, _)| k)
        .collect();
    assert!(
        !on_a.is_empty() && !on_b.is_empty(),
        "ids did not spread: a={on_a:?} b={on_b:?}"
    );

    a.kill();
    let killed = tokio::time::Instant::now();
    let budget = Duration::from_millis(LEASE_TTL_MS + 1000);
    for id in &on_a {
        let v = get_json(&c, &format!("{}/counter/{id}/hit", pb.url), budget * 2).await;
        assert_eq!(v["process"], pb_proc, "{id} answered by {v}");
        assert_eq!(v["count"], 1, "{id} kept state across the crash: {v}");
        assert_ne!(v["instance"], owner[*id]["instance"]);
    }
    let took = killed.elapsed();
    assert!(
        took <= budget,
        "ids moved after {took:?} (budget {budget:?})"
    );

    // The survivor's own ids never moved.
    for id in &on_b {
        let v = get_json(
            &c,
            &format!("{}/counter/{id}/hit", pb.url),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(v["instance"], owner[*id]["instance"]);
        assert_eq!(v["count"], 2);
    }
}
