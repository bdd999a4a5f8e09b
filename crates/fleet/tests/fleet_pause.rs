//! A worker frozen (SIGSTOP) past its lease and resumed refuses to serve
//! until it re-registered, and never serves an id that moved meanwhile.

mod support;

use std::time::Duration;

use support::{client, eventually, get_json, pinboard, rust_worker, stats, wait_workers, workers};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_refuses_until_reregistered_and_keeps_off_moved_ids() {
    let pb = pinboard().start();
    let a = rust_worker(&pb.url).start();
    let c = client();
    let rows = wait_workers(&c, &pb.url, 1).await;
    let old_session = rows[0]["sessionId"].as_str().expect("session").to_owned();
    let a_process = get_json(
        &c,
        &format!("{}/counter/p-0/hit", pb.url),
        Duration::from_secs(5),
    )
    .await["process"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    for i in 1..50 {
        get_json(
            &c,
            &format!("{}/counter/p-{i}/hit", pb.url),
            Duration::from_secs(5),
        )
        .await;
    }
    let b = rust_worker(&pb.url).start();
    wait_workers(&c, &pb.url, 2).await;

    a.pause();
    // Past the 2 s lease A is gone from the registry and its ids move to B,
    // with fresh state.
    wait_workers(&c, &pb.url, 1).await;
    for i in 0..50 {
        let body = get_json(
            &c,
            &format!("{}/counter/p-{i}/hit", pb.url),
            Duration::from_secs(5),
        )
        .await;
        assert_ne!(
            body["process"].as_str(),
            Some(a_process.as_str()),
            "p-{i} served by the frozen worker"
        );
        assert_eq!(body["count"], 1);
    }
    a.resume();
    // Straight after waking, its old session's placements get nothing.
    let token = pinned_wire::attestation::mint(
        a.secret(),
        &old_session,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64(),
        None,
        None,
    );
    let direct = c
        .get(format!("{}/counter/p-0/peek", a.url))
        .header("pinboard-attestation", token)
        .send()
        .await
        .expect("direct");
    let status = direct.status().as_u16();
    let text = direct.text().await.unwrap_or_default();
    assert!(
        (status == 503 && text.contains("lease expired; not serving")) || status == 403,
        "the woken worker served: {status} {text}"
    );
    // It re-registers under a new session...
    eventually(
        "a re-registration under a new session",
        Duration::from_secs(10),
        || async {
            let rows = workers(&c, &pb.url).await;
            let new = rows.len() == 2
                && rows
                    .iter()
                    .all(|row| row["sessionId"] != old_session.as_str());
            new.then_some(())
        },
    )
    .await;
    // ...and the moved ids stay on B with their state.
    for i in 0..50 {
        let body = get_json(
            &c,
            &format!("{}/counter/p-{i}/hit", pb.url),
            Duration::from_secs(5),
        )
        .await;
        assert_ne!(body["process"].as_str(), Some(a_process.as_str()));
        assert_eq!(body["count"], 2, "p-{i}: {body}");
    }
    let a_stats = stats(&c, &a).await;
    assert_eq!(a_stats["reregistrations"], 1, "{a_stats}");
    let resident: Vec<_> = a_stats["instances"].as_array().cloned().unwrap_or_default();
    assert!(
        resident.is_empty(),
        "moved ids still resident on A: {resident:?}"
    );
    drop(b);
}
