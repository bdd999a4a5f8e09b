//! Two pinboard nodes share one (private) Redis; each worker registers
//! with one of them, and the load alternates between both. SIGKILL of one
//! node: the survivor keeps serving, the worker that spoke to the dead node
//! lapses and its ids move to the other worker, with their tallies.

use std::time::Duration;

use super::support::RedisServer;
use super::support::{client, pinboard, wait_workers};
use super::{process_of, Scene, LEASE, PINBOARD_ARGS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_one_of_two_pinboard_nodes() {
    let redis = RedisServer::start();
    let scene = Scene::new("pbkill", 12).await;
    let mut args = vec!["--redis-url", redis.url.as_str()];
    args.extend_from_slice(&PINBOARD_ARGS);
    let one = pinboard().args(&args).start();
    let mut two = pinboard().args(&args).start();
    let a = scene.worker(&one.url, &[]);
    let b = scene.worker(&two.url, &[]);
    wait_workers(&client(), &one.url, 2).await;
    let (a_token, b_token) = (process_of(&a).await, process_of(&b).await);
    let (load, entrances) = scene.load(&[&one.url, &two.url]);
    load.warm(Duration::from_secs(10)).await;
    load.until("both workers to hold ids", Duration::from_secs(5), |o| {
        o.values().any(|p| *p == a_token) && o.values().any(|p| *p == b_token)
    })
    .await;
    let moved = load.held_by(&b_token);
    load.rounds(3, LEASE * 4).await;

    two.kill();
    // Clients find the dead node refusing connections and go to the
    // other one (as a load balancer's health check would).
    *entrances.lock().expect("entrances") = vec![one.url.clone()];
    load.until(
        "every id to answer from the worker of the live node",
        LEASE * 4,
        |o| o.values().all(|p| *p == a_token),
    )
    .await;
    load.rounds(3, LEASE * 4).await;
    let summary = scene.finish("pinboard-sigkill", load).await;
    assert!(
        summary.moved_ids >= moved,
        "{summary:?}, {moved} ids on the orphaned worker"
    );
}
