//! Placement shared through Redis: two pinboard nodes behave as one, and
//! epochs stay strictly increasing after Redis lost pinboard's keys.

mod support;

use std::time::Duration;

use support::{
    client, eventually, get_json, pinboard, python_worker, redis_prefix, redis_wipe, wait_workers,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_sharing_redis_keep_one_instance_across_1000_requests() {
    let prefix = redis_prefix("two-nodes");
    let n1 = pinboard().shared_redis(&prefix).start();
    let n2 = pinboard().shared_redis(&prefix).start();
    // Workers register with different nodes; both nodes see both.
    let _a = python_worker(&n1.url).start();
    let _b = python_worker(&n2.url).start();
    let c = client();
    wait_workers(&c, &n1.url, 2).await;
    wait_workers(&c, &n2.url, 2).await;

    let first = get_json(
        &c,
        &format!("{}/counter/shared/hit", n1.url),
        Duration::from_secs(10),
    )
    .await;
    let instance = first["instance"].clone();
    for i in 2..=1000 {
        let node = if i % 2 == 0 { &n2.url } else { &n1.url };
        let v: serde_json::Value = c
            .get(format!("{node}/counter/shared/hit"))
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        assert_eq!(v["instance"], instance, "request {i} via {node}: {v}");
        assert_eq!(v["count"], i);
    }
    // New ids raced from both nodes still get one owner each.
    for i in 0..10 {
        let id = format!("race-{i}");
        let (u1, u2) = (
            format!("{}/counter/{id}/hit", n1.url),
            format!("{}/counter/{id}/hit", n2.url),
        );
        let (x, y) = tokio::join!(
            get_json(&c, &u1, Duration::from_secs(5)),
            get_json(&c, &u2, Duration::from_secs(5)),
        );
        assert_eq!(x["instance"], y["instance"], "{id}: {x} vs {y}");
    }
    redis_wipe(&prefix).await;
}

async fn epoch_of(c: &reqwest::Client, node: &str, id: &str) -> u64 {
    let v = get_json(
        c,
        &format!("{node}/counter/{id}/headers"),
        Duration::from_secs(10),
    )
    .await;
    v["headers"]["pinboard-epoch"]
        .as_str()
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| panic!("no epoch in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_increase_strictly_even_after_redis_lost_the_keys() {
    let prefix = redis_prefix("epochs");
    let mut n1 = pinboard().shared_redis(&prefix).start();
    let _w = python_worker(&n1.url).start();
    let c = client();
    wait_workers(&c, &n1.url, 1).await;
    let before = epoch_of(&c, &n1.url, "ep").await;
    let released_before = epoch_of(&c, &n1.url, "ep2").await;

    // Redis restarted empty, and the pinboard process is new as well.
    n1.kill();
    redis_wipe(&prefix).await;
    let n2 = pinboard().shared_redis(&prefix).start();
    let _w2 = python_worker(&n2.url).start();
    wait_workers(&c, &n2.url, 1).await;
    let after = epoch_of(&c, &n2.url, "ep").await;
    assert!(after > before, "epoch went from {before} to {after}");
    let after2 = epoch_of(&c, &n2.url, "ep2").await;
    assert!(
        after2 > released_before,
        "epoch went from {released_before} to {after2}"
    );
    redis_wipe(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reclaims_its_ids_after_redis_lost_its_session() {
    let prefix = redis_prefix("reclaim");
    let n1 = pinboard().shared_redis(&prefix).start();
    let _w = python_worker(&n1.url).start();
    let c = client();
    wait_workers(&c, &n1.url, 1).await;
    let first = get_json(
        &c,
        &format!("{}/counter/keep/hit", n1.url),
        Duration::from_secs(10),
    )
    .await;
    let before = epoch_of(&c, &n1.url, "keep").await;

    redis_wipe(&prefix).await;
    // The worker's next heartbeat answers `reregister`; it re-registers with
    // its instances, which it gets back (same process, same instance).
    wait_workers(&c, &n1.url, 1).await;
    let e = eventually(
        "the placement to be re-minted",
        Duration::from_secs(10),
        || async {
            let e = epoch_of(&c, &n1.url, "keep").await;
            (e != before).then_some(e)
        },
    )
    .await;
    assert!(e > before, "epoch went from {before} to {e}");
    let v = get_json(
        &c,
        &format!("{}/counter/keep/hit", n1.url),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        v["instance"], first["instance"],
        "the instance survived the reclaim"
    );
    redis_wipe(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seen_id_resolves_without_redis() {
    let prefix = redis_prefix("cache");
    let pb = pinboard()
        .shared_redis(&prefix)
        .args(&["--lease-ttl-ms", "60000"])
        .start();
    let (w, _) = support::fake::fake(&pb.url, "w", support::fake::Mode::Serve).await;
    let c = client();
    let url = format!("{}/counter/seen/hit", pb.url);
    assert_eq!(c.get(&url).send().await.expect("send").status(), 200);
    // Redis forgets everything: the seen id still routes from the local
    // cache, while an unseen id has nowhere to go.
    redis_wipe(&prefix).await;
    for _ in 0..20 {
        assert_eq!(c.get(&url).send().await.expect("send").status(), 200);
    }
    assert_eq!(w.hits.load(std::sync::atomic::Ordering::SeqCst), 21);
    let res = c
        .get(format!("{}/counter/unseen/hit", pb.url))
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 503);
}
