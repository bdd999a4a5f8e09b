//! Superseding: a second worker with the same hostname and a higher epoch
//! takes over; the first stops registering and aborts its instances.

mod support;

use std::time::Duration;

use support::{client, get_json, pinboard, rust_worker, stats, wait_workers, workers};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_epoch_worker_of_the_same_hostname_takes_over() {
    let pb = pinboard(&[]);
    let first = rust_worker(
        &pb.url,
        &[("PINNED_HOSTNAME", "shop"), ("FLEET_EPOCH", "1")],
    );
    let c = client();
    let rows = wait_workers(&c, &pb.url, 1).await;
    let first_session = rows[0]["sessionId"].clone();
    for i in 0..20 {
        get_json(
            &c,
            &format!("{}/counter/s-{i}/hit", pb.url),
            Duration::from_secs(5),
        )
        .await;
    }
    assert_eq!(
        stats(&c, &first).await["instances"]
            .as_array()
            .map(Vec::len),
        Some(20)
    );

    let second = rust_worker(
        &pb.url,
        &[("PINNED_HOSTNAME", "shop"), ("FLEET_EPOCH", "2")],
    );
    // The first learns it was superseded, aborts everything, and stops
    // registering: only the second stays registered.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let rows = workers(&c, &pb.url).await;
        let first_stats = stats(&c, &first).await;
        let first_empty = first_stats["instances"]
            .as_array()
            .is_some_and(Vec::is_empty);
        if rows.len() == 1 && rows[0]["sessionId"] != first_session && first_empty {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no takeover: {rows:?} {first_stats}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The ids now answer from the second worker, with fresh state.
    for i in 0..20 {
        let body = get_json(
            &c,
            &format!("{}/counter/s-{i}/hit", pb.url),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(body["count"], 1, "{body}");
    }
    assert_eq!(
        stats(&c, &second).await["instances"]
            .as_array()
            .map(Vec::len),
        Some(20)
    );
    // And it stays superseded: still not registered a while later.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(workers(&c, &pb.url).await.len(), 1);
}
