//! The placement store as a Redis Cluster failing under load: one master's
//! data flushed, one master killed. Two pinboard nodes on a private
//! cluster started here, real Rust workers with a Postgres state store,
//! the suite's load and checker. Both workers stay live throughout, so no
//! id may move and no instance may lose its memory
//! ([`Memory::Kept`](super::checker::Memory::Kept)), and no acknowledged
//! durable write may be lost.

use std::time::Duration;

use super::support::{client, eventually, pinboard, wait_workers, Proc};
use super::{Scene, LEASE, PINBOARD_ARGS};
use test_support::{RedisCluster, NODE_TIMEOUT_MS};

/// Two nodes on `cluster` with `extra` flags.
fn two_nodes(cluster: &RedisCluster, extra: &[&str]) -> (Proc, Proc) {
    let mut args = vec!["--redis-cluster-url", cluster.url.as_str()];
    args.extend_from_slice(extra);
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

/// A pinboard counter from `/metrics` (0 when absent).
async fn counter(pb: &str, name: &str) -> u64 {
    test_support::metric(&client(), pb, name).await
}

/// Starts two workers, one on each node, waits for readiness and warms
/// the load.
async fn warmed(
    scene: &Scene,
    one: &Proc,
    two: &Proc,
    patience: Duration,
) -> (Proc, Proc, super::load::Load) {
    let a = scene.worker(&one.url, &[]);
    let b = scene.worker(&two.url, &[]);
    wait_workers(&client(), &one.url, 2).await;
    for node in [one, two] {
        eventually("the cold-start quarantine to end", patience, || async {
            (readyz(&node.url).await == 200).then_some(())
        })
        .await;
    }
    let (load, _) = scene.load(&[&one.url, &two.url]);
    load.warm(Duration::from_secs(20)).await;
    // Two nodes opened one empty cluster together: no shard was taken for
    // lost (it would refuse new ids through one node for a lease TTL, and
    // the first call of half the ids would fail).
    for node in [one, two] {
        let log = node.log_text();
        let losses: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("quarantined as a loss"))
            .collect();
        assert!(
            losses.is_empty(),
            "a cold start was taken for a shard's loss: {losses:#?}"
        );
    }
    (a, b, load)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_cluster_master_quarantines_only_its_shards_and_moves_no_id() {
    let cluster = RedisCluster::start(3, 1).await;
    let scene = Scene::new("cluster-flush", 24).await;
    let quarantine = LEASE.as_millis().to_string();
    let (one, two) = two_nodes(&cluster, &["--quarantine-ms", &quarantine]);
    let (_a, _b, load) = warmed(&scene, &one, &two, LEASE * 5).await;
    load.rounds(3, LEASE * 4).await;

    // A master that does not hold the `{g}` tag: its shards alone lose
    // their data (the store-wide generation stays).
    let global = cluster
        .master_of("pinboard:{g}gen")
        .await
        .expect("a master for {g}");
    let masters = cluster.masters().await;
    let victim = *masters
        .iter()
        .find(|m| **m != global)
        .expect("another master");
    let c = client();
    let sessions = |rows: Vec<serde_json::Value>| -> Vec<String> {
        rows.iter()
            .filter_map(|w| w["sessionId"].as_str().map(str::to_owned))
            .collect()
    };
    let before = sessions(super::support::workers(&c, &one.url).await);
    assert_eq!(before.len(), 2, "{before:?}");
    cluster.flushall(victim).await;
    // The workers' next heartbeats find their sessions gone from the
    // flushed shards and re-register; the nodes stay ready throughout
    // (only the flushed shards hold new ids back) and count no loss of
    // the whole store.
    eventually("both workers to re-register", LEASE * 5, || async {
        let now = sessions(super::support::workers(&c, &one.url).await);
        (now.len() == 2 && now.iter().all(|s| !before.contains(s))).then_some(())
    })
    .await;
    for node in [&one, &two] {
        assert_eq!(
            readyz(&node.url).await,
            200,
            "a shard's loss is not the node's"
        );
        assert_eq!(counter(&node.url, "pinboard_store_losses_total").await, 0);
    }
    load.rounds(3, LEASE * 6).await;
    let summary = scene.finish_keeping_memory("cluster-flush", load).await;
    assert_eq!(
        summary.moved_ids, 0,
        "an id moved between live workers: {summary:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cluster_master_fails_over_under_load_and_loses_no_write() {
    // Two replicas a master: the promoted one still has a replica to WAIT
    // for. A lease longer than the failover (node timeout, election, the
    // client's topology refresh), so no worker lapses meanwhile.
    let mut cluster = RedisCluster::start(3, 2).await;
    let scene = Scene::new("cluster-kill", 24).await;
    let lease = Duration::from_millis(NODE_TIMEOUT_MS * 4);
    let lease_ms = lease.as_millis().to_string();
    let (one, two) = two_nodes(
        &cluster,
        &["--lease-ttl-ms", &lease_ms, "--quarantine-ms", "0"],
    );
    let (_a, _b, load) = warmed(&scene, &one, &two, LEASE * 5).await;
    load.rounds(3, LEASE * 4).await;

    let victim = cluster
        .master_of("pinboard:{s0}gen")
        .await
        .expect("a master for s0");
    let killed = tokio::time::Instant::now();
    cluster.kill(victim);
    assert!(
        cluster
            .settled(Duration::from_millis(NODE_TIMEOUT_MS * 6), 3)
            .await,
        "the cluster promoted a replica"
    );
    // Placement resumes: every id answers again, within the failover time
    // plus one lease.
    load.rounds(2, Duration::from_millis(NODE_TIMEOUT_MS * 3) + lease)
        .await;
    eprintln!(
        "cluster-kill: every id answered twice more {:?} after the kill",
        killed.elapsed()
    );
    load.rounds(2, Duration::from_millis(NODE_TIMEOUT_MS * 3) + lease)
        .await;
    let summary = scene.finish_keeping_memory("cluster-kill", load).await;
    assert_eq!(
        summary.moved_ids, 0,
        "an id moved between live workers: {summary:?}"
    );
    // Every id was placed before the kill: a warm request needs no store
    // call (the worker view read before the kill serves on through it), so
    // the failover fails none of them.
    assert_eq!(
        summary.failed, 0,
        "a warm request failed with the store: {summary:?}"
    );
}
