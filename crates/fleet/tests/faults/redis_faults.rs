//! The shared placement store failing under load, on a private
//! `redis-server`: wiped (`FLUSHALL`), restarted empty, paused
//! (`CLIENT PAUSE` for longer than a lease). Two pinboard nodes where the
//! store's loss matters: one has routed every id, the other has not, and
//! the load alternates between them. Both workers stay live throughout, so
//! after a wipe or a restart no id may move and no instance may lose its
//! memory (the checker's [`Memory::Kept`](super::checker::Memory::Kept)):
//! a wiped store is rebuilt from re-registrations (the generation check and
//! the quarantine), never by placing an id afresh. A pause longer than a
//! lease is another matter: every lease lapses during it, so ids may move
//! (as after any lapse), but no acknowledged write is lost.

use std::time::Duration;

use super::load::NO_RETRY_AFTER;
use super::support::RedisServer;
use super::support::{client, eventually, pinboard, wait_workers, Proc};
use super::{Scene, LEASE, PINBOARD_ARGS};
use test_support::metric;

/// Two nodes on `redis` with a real quarantine (one lease TTL).
fn two_nodes(redis: &RedisServer) -> (Proc, Proc) {
    two_nodes_quarantined(redis, LEASE)
}

/// Two nodes on `redis` whose `--quarantine-ms` is `quarantine`.
fn two_nodes_quarantined(redis: &RedisServer, quarantine: Duration) -> (Proc, Proc) {
    let quarantine = quarantine.as_millis().to_string();
    let mut args = vec![
        "--redis-url",
        redis.url.as_str(),
        "--quarantine-ms",
        quarantine.as_str(),
    ];
    args.extend_from_slice(&PINBOARD_ARGS);
    (
        pinboard().args(&args).start(),
        pinboard().args(&args).start(),
    )
}

/// `/readyz` status.
async fn readyz(pb: &str) -> u16 {
    match client().get(format!("{pb}/readyz")).send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// Waits until a node noticed the store's loss (its `/readyz` answers 503
/// for the quarantine, one lease long), so the scenario's traffic spans the
/// rebuild rather than ending before the loss was seen.
async fn noticed(one: &Proc, two: &Proc) {
    eventually("a node to notice the store's loss", LEASE * 3, || async {
        (readyz(&one.url).await == 503 || readyz(&two.url).await == 503).then_some(())
    })
    .await;
}

/// Starts two workers, one on each node, waits for readiness and warms
/// the load.
async fn warmed(scene: &Scene, one: &Proc, two: &Proc) -> (Proc, Proc, super::load::Load) {
    warmed_with(scene, one, two, &[]).await
}

/// As [`warmed`], the second worker with `b_env` too.
async fn warmed_with(
    scene: &Scene,
    one: &Proc,
    two: &Proc,
    b_env: &[(&str, &str)],
) -> (Proc, Proc, super::load::Load) {
    let a = scene.worker(&one.url, &[]);
    let b = scene.worker(&two.url, b_env);
    wait_workers(&client(), &one.url, 2).await;
    for node in [one, two] {
        eventually("the cold-start quarantine to end", LEASE * 5, || async {
            (readyz(&node.url).await == 200).then_some(())
        })
        .await;
    }
    let (load, _) = scene.load(&[&one.url, &two.url]);
    load.warm(Duration::from_secs(10)).await;
    (a, b, load)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_under_load_moves_no_id_and_loses_no_write() {
    let redis = RedisServer::start();
    let scene = Scene::new("flushall", 12).await;
    let (one, two) = two_nodes(&redis);
    let (_a, _b, load) = warmed(&scene, &one, &two).await;
    load.rounds(3, LEASE * 4).await;

    redis.flushall().await;
    // The quarantine, the workers' re-registration, then service again.
    noticed(&one, &two).await;
    for node in [&one, &two] {
        eventually("the store-loss quarantine to end", LEASE * 3, || async {
            (readyz(&node.url).await == 200).then_some(())
        })
        .await;
    }
    load.rounds(3, LEASE * 4).await;
    let summary = scene.finish_keeping_memory("flushall", load).await;
    assert_eq!(
        summary.moved_ids, 0,
        "an id moved between live workers: {summary:?}"
    );
}

/// The reproduction: 20 ids, a zero `--quarantine-ms`, and one
/// worker beating four times slower than the other, so after the wipe one
/// worker is back well before the other. The late one's ids must wait for
/// it (503 + `Retry-After`), not go to the early one: a live owner that
/// re-registers keeps every instance, with its memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_without_a_quarantine_keeps_every_live_instance() {
    let redis = RedisServer::start();
    let scene = Scene::new("flushall-q0", 20).await;
    let (one, two) = two_nodes_quarantined(&redis, Duration::ZERO);
    let (_a, _b, load) = warmed_with(&scene, &one, &two, &[("FLEET_HEARTBEAT_MS", "600")]).await;
    load.rounds(3, LEASE * 4).await;

    redis.flushall().await;
    // No quarantine was asked for, so `/readyz` need not say so: the
    // count of losses does.
    eventually(
        "both nodes to notice the store's loss",
        LEASE * 3,
        || async {
            let mut noticed = 0;
            for node in [&one, &two] {
                noticed += metric(&client(), &node.url, "pinboard_store_losses_total").await;
            }
            (noticed >= 2).then_some(())
        },
    )
    .await;
    for node in [&one, &two] {
        eventually("the store-loss quarantine to end", LEASE * 3, || async {
            (readyz(&node.url).await == 200).then_some(())
        })
        .await;
    }
    load.rounds(3, LEASE * 4).await;
    let summary = scene.finish_keeping_memory("flushall-q0", load).await;
    assert_eq!(
        summary.moved_ids, 0,
        "an id moved between live workers: {summary:?}"
    );
    // Every call the wipe cost was refused as retryable, with the time to
    // wait: a 503 with `Retry-After`, never a 502, a 504 or a bare 503.
    for kind in summary.failure_kinds.keys() {
        assert!(
            kind.starts_with("503") && !kind.contains(NO_RETRY_AFTER),
            "flushall-q0: a call failed otherwise than 503 + Retry-After: {summary:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_under_load_moves_no_id_and_loses_no_write() {
    let mut redis = RedisServer::start();
    let scene = Scene::new("redis-restart", 12).await;
    let (one, two) = two_nodes(&redis);
    let (_a, _b, load) = warmed(&scene, &one, &two).await;
    load.rounds(3, LEASE * 4).await;

    redis.restart();
    noticed(&one, &two).await;
    for node in [&one, &two] {
        eventually("readiness after the restart", LEASE * 3, || async {
            (readyz(&node.url).await == 200).then_some(())
        })
        .await;
    }
    load.rounds(3, LEASE * 4).await;
    let summary = scene.finish_keeping_memory("redis-restart", load).await;
    assert_eq!(
        summary.moved_ids, 0,
        "an id moved between live workers: {summary:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_longer_than_a_lease_is_survived() {
    let redis = RedisServer::start();
    let scene = Scene::new("redis-pause", 8).await;
    let (one, two) = two_nodes(&redis);
    let (_a, _b, load) = warmed(&scene, &one, &two).await;
    load.rounds(3, LEASE * 4).await;

    let pause = LEASE * 2;
    redis.client_pause(pause).await;
    // Readiness says the store does not answer (liveness stays up).
    eventually("/readyz to report the paused store", pause, || async {
        (readyz(&one.url).await == 503).then_some(())
    })
    .await;
    let health = client()
        .get(format!("{}/healthz", one.url))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    for node in [&one, &two] {
        eventually("readiness after the pause", pause + LEASE * 3, || async {
            (readyz(&node.url).await == 200).then_some(())
        })
        .await;
    }
    load.rounds(5, LEASE * 4).await;
    scene.finish("redis-pause", load).await;
}
