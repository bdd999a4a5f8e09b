//! A worker cut off from pinboard's registry but not from its clients:
//! its registry traffic goes through a [`Relay`](super::relay::Relay) the
//! test black-holes, while pinboard still reaches it to forward requests.
//! Its heartbeats go unanswered, so it must stop serving before its lease
//! lapses at pinboard, and pinboard moves its ids to the other worker: at
//! no time may both answer for one id.

use std::time::Duration;

use super::relay::Relay;
use super::support::{client, pinboard, wait_workers};
use super::{process_of, Scene, LEASE, PINBOARD_ARGS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_pinboard_gives_its_ids_up_cleanly() {
    let scene = Scene::new("partition", 12).await;
    let pb = pinboard().args(&PINBOARD_ARGS).start();
    let relay = Relay::start(&pb.url).await;
    let a = scene.worker(&relay.url, &[]);
    let b = scene.worker(&pb.url, &[]);
    wait_workers(&client(), &pb.url, 2).await;
    let (a_token, b_token) = (process_of(&a).await, process_of(&b).await);
    let (load, _) = scene.load(&[&pb.url]);
    load.warm(Duration::from_secs(10)).await;
    load.until("both workers to hold ids", Duration::from_secs(5), |o| {
        o.values().any(|p| *p == a_token) && o.values().any(|p| *p == b_token)
    })
    .await;
    let moved = load.held_by(&a_token);
    load.rounds(3, LEASE * 4).await;

    relay.cut();
    load.until(
        "every id to answer from the connected worker",
        LEASE * 4,
        |o| o.values().all(|p| *p == b_token),
    )
    .await;
    load.rounds(5, LEASE * 4).await;
    // Healed: the cut-off worker registers anew and serves again.
    relay.heal();
    wait_workers(&client(), &pb.url, 2).await;
    load.rounds(5, LEASE * 4).await;
    let summary = scene.finish("partition", load).await;
    assert!(
        summary.moved_ids >= moved,
        "{summary:?}, {moved} ids on the cut-off worker"
    );
}
