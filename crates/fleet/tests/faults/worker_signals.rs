//! A worker killed outright (SIGKILL) or frozen (SIGSTOP, later SIGCONT)
//! while it owns ids under load: its ids move to the survivor once its
//! lease lapses, at a higher epoch, with every acknowledged tally; a frozen
//! owner that wakes up never answers for an id that moved.

use std::time::Duration;

use super::support::{client, pinboard, wait_workers};
use super::{process_of, Scene, LEASE, PINBOARD_ARGS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_worker_moves_its_ids_with_their_tallies() {
    let scene = Scene::new("sigkill", 12).await;
    let pb = pinboard().args(&PINBOARD_ARGS).start();
    let mut a = scene.worker(&pb.url, &[]);
    let b = scene.worker(&pb.url, &[]);
    wait_workers(&client(), &pb.url, 2).await;
    let (a_token, b_token) = (process_of(&a).await, process_of(&b).await);
    let (load, _) = scene.load(&[&pb.url]);
    load.warm(Duration::from_secs(10)).await;
    // Both hold ids (a new id goes to either, weighted by headroom).
    load.until("both workers to hold ids", Duration::from_secs(5), |o| {
        o.values().any(|p| *p == a_token) && o.values().any(|p| *p == b_token)
    })
    .await;
    let moved = load.held_by(&a_token);
    load.rounds(3, LEASE * 4).await;

    a.kill();
    load.until("every id to answer from the survivor", LEASE * 4, |o| {
        o.values().all(|p| *p == b_token)
    })
    .await;
    load.rounds(3, LEASE * 4).await;
    let summary = scene.finish("sigkill", load).await;
    assert!(
        summary.moved_ids >= moved,
        "{summary:?}, {moved} ids on the killed worker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_then_sigcont_of_a_worker_never_lets_it_answer_for_a_moved_id() {
    let scene = Scene::new("sigstop", 12).await;
    let pb = pinboard().args(&PINBOARD_ARGS).start();
    let a = scene.worker(&pb.url, &[]);
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

    // Frozen: calls to its ids hang until pinboard's upstream deadline
    // (504), then its lease lapses and the ids move.
    a.pause();
    load.until("every id to answer from the survivor", LEASE * 4, |o| {
        o.values().all(|p| *p == b_token)
    })
    .await;
    // Thawed: it finds its lease gone; whatever it still had in flight
    // is fenced. The load keeps going while it re-registers.
    a.resume();
    wait_workers(&client(), &pb.url, 2).await;
    load.rounds(5, LEASE * 4).await;
    let summary = scene.finish("sigstop", load).await;
    assert!(
        summary.moved_ids >= moved,
        "{summary:?}, {moved} ids on the frozen worker"
    );
    assert!(summary.failed > 0, "the freeze was never seen: {summary:?}");
}
