//! Superseding: a second worker with the same hostname and a higher epoch
//! takes over; the first stops registering and aborts its instances, and
//! the operator's moves list says its ids moved for the takeover.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{client, eventually, pinboard, rust_worker, stats, wait_workers, workers, TOKEN};

/// GET `url` in the `shop` hostname world (the workers' own) until it
/// answers 200; its body.
async fn get_shop(c: &reqwest::Client, url: &str) -> Value {
    let world = [("pinboard-hostname", "shop")];
    test_support::get_json_with(c, url, &world, Duration::from_secs(5)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_epoch_worker_of_the_same_hostname_takes_over() {
    let pb = pinboard().start();
    let first = rust_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "shop"), ("FLEET_EPOCH", "1")])
        .start();
    let c = client();
    let rows = wait_workers(&c, &pb.url, 1).await;
    let first_session = rows[0]["sessionId"].clone();
    for i in 0..20 {
        get_shop(&c, &format!("{}/counter/s-{i}/hit", pb.url)).await;
    }
    assert_eq!(
        stats(&c, &first).await["instances"]
            .as_array()
            .map(Vec::len),
        Some(20)
    );

    let second = rust_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "shop"), ("FLEET_EPOCH", "2")])
        .start();
    // The first learns it was superseded, aborts everything, and stops
    // registering: only the second stays registered.
    eventually("the takeover", Duration::from_secs(15), || async {
        let rows = workers(&c, &pb.url).await;
        let first_empty = stats(&c, &first).await["instances"]
            .as_array()
            .is_some_and(Vec::is_empty);
        (rows.len() == 1 && rows[0]["sessionId"] != first_session && first_empty).then_some(())
    })
    .await;
    // The ids now answer from the second worker, with fresh state.
    for i in 0..20 {
        let body = get_shop(&c, &format!("{}/counter/s-{i}/hit", pb.url)).await;
        assert_eq!(body["count"], 1, "{body}");
    }
    assert_eq!(
        stats(&c, &second).await["instances"]
            .as_array()
            .map(Vec::len),
        Some(20)
    );
    let second_session = workers(&c, &pb.url).await[0]["sessionId"].clone();
    let moves: Value = c
        .get(format!("{}/registry/moves?limit=100", pb.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("moves")
        .json()
        .await
        .expect("moves json");
    for i in 0..20 {
        let id = format!("s-{i}");
        let listed: Vec<&Value> = moves["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["id"] == id.as_str())
            .collect();
        assert_eq!(listed.len(), 1, "{id} in {moves}");
        assert_eq!(
            (&listed[0]["from"], &listed[0]["to"], &listed[0]["reason"]),
            (&first_session, &second_session, &Value::from("takeover")),
            "{id}"
        );
    }
    // And it stays superseded: heartbeats go on, it never registers again.
    let registrations = test_support::metric(&c, &pb.url, "pinboard_registrations_total").await;
    let beats = "pinboard_heartbeats_total";
    test_support::metric_grows(&c, &[&pb.url], beats, 3, Duration::from_secs(10)).await;
    assert_eq!(workers(&c, &pb.url).await.len(), 1);
    assert_eq!(
        test_support::metric(&c, &pb.url, "pinboard_registrations_total").await,
        registrations
    );
}
