//! Placement on a real Redis Cluster (3 masters, one replica each, started
//! here): two pinboard processes with Python reference workers behave as
//! one; two stores (two nodes) agree on one owner per id in every virtual
//! shard, a flushed master quarantines only its shards, a killed master
//! fails over without losing an acknowledged claim, and vacated rows
//! expire.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures_util::future::join_all;
use pinboard::clock::Now;
use pinboard::placement::{
    shard_of, Batching, ClaimOutcome, ClusterSettings, ClusterStore, Generation, InstanceKey,
    PlacementStore, ReclaimOutcome, StoreError, WorkerRecord, SHARDS,
};
use test_support::{eventually, unique, RedisCluster, NODE_TIMEOUT_MS};

const NS: &str = "/counter";
const TTL_MS: u64 = 60_000;

fn now() -> Now {
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Now {
        wall_ms,
        mono_ms: wall_ms,
    }
}

fn settings() -> ClusterSettings {
    ClusterSettings {
        // `WAIT` gets half of this: a replica on a loaded 2-core machine
        // can lag past a second and a half, which is not what these tests are about.
        batching: Batching {
            deadline: Duration::from_secs(10),
            ..Batching::default()
        },
        wait_replicas: 1,
        quarantine_ms: 0,
        loss_quarantine_ms: 2_000,
        row_grace_ms: 60_000,
    }
}

async fn store(cluster: &RedisCluster, prefix: &str, settings: ClusterSettings) -> ClusterStore {
    let urls: Vec<&str> = cluster.url.split(',').collect();
    ClusterStore::connect(&urls, prefix, settings)
        .await
        .expect("connect to the cluster")
}

fn record(sid: &str) -> WorkerRecord {
    WorkerRecord {
        session_id: sid.into(),
        advertise_url: format!("http://127.0.0.1:1/{sid}"),
        namespaces: vec![NS.into()],
        headroom: 100,
        ..Default::default()
    }
}

/// Opens both stores' generations (the first writes, the second joins).
async fn open(stores: &[&ClusterStore]) -> Generation {
    let proposal = Generation::new(&unique(), 0);
    let mut held = None;
    for s in stores {
        held = Some(s.open_generation(&proposal).await.expect("open"));
    }
    held.expect("a store")
}

async fn claim(
    s: &ClusterStore,
    id: &str,
    candidate: &str,
    generation: &Generation,
) -> Result<ClaimOutcome, StoreError> {
    s.resolve_or_claim(
        InstanceKey::new(NS, id),
        Some(candidate),
        None,
        now().wall_ms * 1000,
        generation,
        now(),
    )
    .await
}

/// One id per shard, the first found.
fn one_id_per_shard() -> Vec<String> {
    let mut ids: Vec<Option<String>> = vec![None; SHARDS];
    let mut i = 0;
    while ids.iter().any(Option::is_none) {
        let id = format!("id-{i}");
        let n = shard_of(InstanceKey::new(NS, &id));
        ids[n].get_or_insert(id);
        i += 1;
    }
    ids.into_iter().flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pinboards_on_a_cluster_keep_one_instance_per_id() {
    let cluster = RedisCluster::start(3, 1).await;
    let args = ["--redis-cluster-url", cluster.url.as_str()];
    let n1 = support::pinboard().args(&args).start();
    let n2 = support::pinboard().args(&args).start();
    let _a = support::python_worker(&n1.url).start();
    let _b = support::python_worker(&n2.url).start();
    let c = support::client();
    support::wait_workers(&c, &n1.url, 2).await;
    support::wait_workers(&c, &n2.url, 2).await;
    // 16 ids (over many shards), each hit alternately through both nodes:
    // one instance per id, its count going on.
    let mut seen: HashMap<String, serde_json::Value> = HashMap::new();
    for round in 1..=10u64 {
        for i in 0..16 {
            let id = format!("e2e-{i}");
            let node = if (round + i) % 2 == 0 {
                &n1.url
            } else {
                &n2.url
            };
            let v = support::get_json(
                &c,
                &format!("{node}/counter/{id}/hit"),
                Duration::from_secs(10),
            )
            .await;
            let instance = seen
                .entry(id.clone())
                .or_insert_with(|| v["instance"].clone());
            assert_eq!(&v["instance"], instance, "{id} via {node}: {v}");
            assert_eq!(v["count"], round, "{id}: {v}");
        }
    }
    // New ids raced from both nodes get one owner each.
    for i in 0..10 {
        let id = format!("race-{i}");
        let (u1, u2) = (
            format!("{}/counter/{id}/hit", n1.url),
            format!("{}/counter/{id}/hit", n2.url),
        );
        let (x, y) = tokio::join!(
            support::get_json(&c, &u1, Duration::from_secs(10)),
            support::get_json(&c, &u2, Duration::from_secs(10)),
        );
        assert_eq!(x["instance"], y["instance"], "{id}: {x} vs {y}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_agree_on_one_owner_per_id_in_every_shard() {
    let cluster = RedisCluster::start(3, 1).await;
    let prefix = format!("{}:", unique());
    let (a, b) = (
        store(&cluster, &prefix, settings()).await,
        store(&cluster, &prefix, settings()).await,
    );
    let generation = open(&[&a, &b]).await;
    a.put_worker(&record("wa"), TTL_MS, now())
        .await
        .expect("put");
    b.put_worker(&record("wb"), TTL_MS, now())
        .await
        .expect("put");

    // 256 ids, each raced by both nodes for different candidates.
    let ids: Vec<String> = (0..256).map(|i| format!("race-{i}")).collect();
    let shards: BTreeSet<usize> = ids
        .iter()
        .map(|id| shard_of(InstanceKey::new(NS, id)))
        .collect();
    assert!(
        shards.len() > 48,
        "the ids cover most shards: {}",
        shards.len()
    );
    let races = ids.iter().map(|id| {
        let (a, b, g) = (&a, &b, &generation);
        async move {
            let (x, y) = tokio::join!(claim(a, id, "wa", g), claim(b, id, "wb", g));
            (id.clone(), x.expect("claim a"), y.expect("claim b"))
        }
    });
    let mut owners = HashMap::new();
    for (id, x, y) in join_all(races).await {
        let (won, other) = match (&x, &y) {
            (ClaimOutcome::Claimed(p, _), ClaimOutcome::Owned(q))
            | (ClaimOutcome::Owned(q), ClaimOutcome::Claimed(p, _)) => (p.clone(), q.clone()),
            other => panic!("{id}: one claim wins, the other finds it owned: {other:?}"),
        };
        assert_eq!(won, other, "{id}: both nodes name one owner at one epoch");
        owners.insert(id, won);
    }
    // Both nodes read the same rows afterwards, from any shard.
    for (id, p) in &owners {
        for s in [&a, &b] {
            let row = s
                .placement(InstanceKey::new(NS, id), now())
                .await
                .expect("row")
                .expect("a row");
            assert_eq!(&row.placement, p, "{id}");
            assert!(row.live);
        }
    }
    let listed = a.list_placements(now()).await.expect("list");
    assert_eq!(listed.len(), owners.len(), "every shard lists its rows");

    // Release (never settled: dropped), then a new claim mints above.
    let id = &ids[0];
    let p = &owners[id];
    assert!(a
        .release(InstanceKey::new(NS, id), &p.session_id, Some(p.epoch))
        .await
        .expect("release"));
    match claim(&b, id, "wb", &generation).await.expect("claim") {
        ClaimOutcome::Claimed(q, _) => assert!(q.epoch > p.epoch, "{q:?} after {p:?}"),
        other => panic!("{other:?}"),
    }
    // wb holds it now: it is not wa's to reclaim.
    owners.remove(id);
    // A re-registration of wa as wa2 keeps each id at its epoch.
    a.put_worker(&record("wa2"), TTL_MS, now())
        .await
        .expect("put");
    for (id, p) in owners.iter().filter(|(_, p)| p.session_id == "wa").take(20) {
        let got = a
            .reclaim(InstanceKey::new(NS, id), "wa2", &["wa"], 0, now())
            .await
            .expect("reclaim");
        assert_eq!(
            got,
            ReclaimOutcome::Reclaimed(pinboard::placement::Placement {
                session_id: "wa2".into(),
                epoch: p.epoch
            }),
            "{id}"
        );
    }
}

/// Every shard quarantined on `s`, by number.
fn quarantined(s: &ClusterStore) -> BTreeSet<usize> {
    (0..SHARDS)
        .filter(|n| s.shard_quarantine_left_ms(*n) > 0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_opening_an_empty_store_at_once_quarantine_no_shard() {
    // Two nodes started together on an empty cluster (every deployment's
    // first start, and each fault test's): each proposes its own
    // generation. The one that loses the store-wide race must not take
    // the shards the winner has not written yet for shards that lost
    // their data (it wrote loss generations into them and kept them from
    // placing for a loss window: the first request of each id through it
    // answered 503 "pinboard is starting").
    let cluster = RedisCluster::start(3, 1).await;
    for round in 0..4 {
        let prefix = format!("{}:", unique());
        let (a, b) = (
            store(&cluster, &prefix, settings()).await,
            store(&cluster, &prefix, settings()).await,
        );
        let (pa, pb) = (Generation::new(&unique(), 0), Generation::new(&unique(), 0));
        let (ha, hb) = tokio::join!(a.open_generation(&pa), b.open_generation(&pb));
        let (ha, hb) = (ha.expect("open a"), hb.expect("open b"));
        assert_eq!(ha, hb, "round {round}: one store-wide generation");
        for s in [&a, &b] {
            assert_eq!(
                quarantined(s),
                BTreeSet::new(),
                "round {round}: a cold start is no shard's loss"
            );
        }
        for n in 0..SHARDS {
            assert_eq!(
                a.shard_generation(n),
                b.shard_generation(n),
                "round {round}: shard {n}"
            );
        }
        // A node joining the opened store finds every shard's generation.
        let c = store(&cluster, &prefix, settings()).await;
        c.open_generation(&Generation::new(&unique(), 0))
            .await
            .expect("open c");
        assert_eq!(quarantined(&c), BTreeSet::new(), "round {round}");
    }

    // What a joining node must still see: a shard that lost its data
    // while no node ran (its master flushed) is quarantined, alone.
    let prefix = format!("{}:", unique());
    let a = store(&cluster, &prefix, settings()).await;
    open(&[&a]).await;
    let global = cluster
        .master_of(&format!("{prefix}{{g}}gen"))
        .await
        .expect("a master for {g}");
    let victim = *cluster
        .masters()
        .await
        .iter()
        .find(|m| **m != global)
        .expect("another master");
    let mut lost = BTreeSet::new();
    for n in 0..SHARDS {
        if cluster.master_of(&format!("{prefix}{{s{n}}}gen")).await == Some(victim) {
            lost.insert(n);
        }
    }
    assert!(!lost.is_empty(), "the victim serves shards");
    cluster.flushall(victim).await;
    let c = store(&cluster, &prefix, settings()).await;
    c.open_generation(&Generation::new(&unique(), 0))
        .await
        .expect("open c");
    assert_eq!(quarantined(&c), lost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_master_quarantines_only_its_shards_and_epochs_keep_rising() {
    let cluster = RedisCluster::start(3, 1).await;
    let prefix = format!("{}:", unique());
    let (a, b) = (
        store(&cluster, &prefix, settings()).await,
        store(&cluster, &prefix, settings()).await,
    );
    let generation = open(&[&a, &b]).await;
    a.put_worker(&record("w1"), TTL_MS, now())
        .await
        .expect("put");
    let ids = one_id_per_shard();
    let mut epochs = HashMap::new();
    for id in &ids {
        match claim(&a, id, "w1", &generation).await.expect("claim") {
            ClaimOutcome::Claimed(p, _) => epochs.insert(id.clone(), p.epoch),
            other => panic!("{id}: {other:?}"),
        };
    }
    // The master serving shard 0's tag; the shards it serves.
    let victim = cluster
        .master_of(&format!("{prefix}{{s0}}gen"))
        .await
        .expect("a master for s0");
    let mut lost = BTreeSet::new();
    for n in 0..SHARDS {
        if cluster.master_of(&format!("{prefix}{{s{n}}}gen")).await == Some(victim) {
            lost.insert(n);
        }
    }
    assert!(!lost.is_empty() && lost.len() < SHARDS, "{lost:?}");
    let before: Vec<Option<Generation>> = (0..SHARDS).map(|n| a.shard_generation(n)).collect();
    cluster.flushall(victim).await;

    // Node b notices through its periodic check, node a through a claim.
    b.generation().await.expect("check");
    for (n, before) in before.iter().enumerate() {
        let quarantined = b.shard_quarantine_left_ms(n) > 0;
        assert_eq!(quarantined, lost.contains(&n), "shard {n}");
        assert_eq!(
            b.shard_generation(n) != *before,
            lost.contains(&n),
            "shard {n}"
        );
    }
    for id in &ids {
        let n = shard_of(InstanceKey::new(NS, id));
        let fresh = format!("{id}-new");
        // A new id in the same shard (the shard is the id's, not the name's).
        let fresh = (0..)
            .map(|i| format!("{fresh}{i}"))
            .find(|f| shard_of(InstanceKey::new(NS, f)) == n)
            .expect("an id");
        let got = claim(&a, &fresh, "w1", &generation).await;
        if lost.contains(&n) {
            assert!(
                matches!(got, Ok(ClaimOutcome::ShardLost { quarantine_left_ms }) if quarantine_left_ms > 0),
                "shard {n}: {got:?}"
            );
        } else {
            assert!(
                matches!(got, Ok(ClaimOutcome::Claimed(..))),
                "shard {n}: {got:?}"
            );
        }
    }
    // The worker's next heartbeat finds its liveness gone in the lost
    // shards: it must re-register.
    assert_eq!(
        a.renew_worker("w1", 100, false, TTL_MS, now())
            .await
            .expect("renew"),
        None
    );
    // It re-registers as w2 and reclaims: ids of lost shards get an epoch
    // above the old one, the others keep theirs.
    a.put_worker(&record("w2"), TTL_MS, now())
        .await
        .expect("put");
    for id in &ids {
        let n = shard_of(InstanceKey::new(NS, id));
        let got = b
            .reclaim(
                InstanceKey::new(NS, id),
                "w2",
                &["w1"],
                now().wall_ms * 1000,
                now(),
            )
            .await
            .expect("reclaim");
        let ReclaimOutcome::Reclaimed(p) = got else {
            panic!("{id}: {got:?}")
        };
        if lost.contains(&n) {
            assert!(
                p.epoch > epochs[id],
                "{id}: {} after {}",
                p.epoch,
                epochs[id]
            );
        } else {
            assert_eq!(p.epoch, epochs[id], "{id}");
        }
    }
    // After the loss window the lost shards place again (each node asks
    // its floor once first).
    let id = ids
        .iter()
        .find(|id| lost.contains(&shard_of(InstanceKey::new(NS, id))))
        .expect("an id of a lost shard");
    let fresh = (0..)
        .map(|i| format!("{id}-after{i}"))
        .find(|f| shard_of(InstanceKey::new(NS, f)) == shard_of(InstanceKey::new(NS, id)))
        .expect("an id");
    eventually(
        "the lost shard to place again",
        Duration::from_secs(10),
        || async {
            match claim(&a, &fresh, "w2", &generation).await {
                Ok(ClaimOutcome::Claimed(..)) => Some(()),
                _ => None,
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacated_rows_expire_in_every_shard() {
    let cluster = RedisCluster::start(3, 0).await;
    let prefix = format!("{}:", unique());
    let s = store(
        &cluster,
        &prefix,
        ClusterSettings {
            wait_replicas: 0,
            row_grace_ms: 300,
            ..settings()
        },
    )
    .await;
    let generation = open(&[&s]).await;
    s.put_worker(&record("gone"), TTL_MS, now())
        .await
        .expect("put");
    let ids = one_id_per_shard();
    for id in &ids {
        assert!(matches!(
            claim(&s, id, "gone", &generation).await,
            Ok(ClaimOutcome::Claimed(..))
        ));
    }
    assert!(s.remove_worker("gone").await.expect("remove"));
    let handled = s.expire_placements(1_000, now()).await.expect("expire");
    assert_eq!(
        handled,
        ids.len(),
        "every shard handed its rows their grace"
    );
    eventually("the rows to be gone", Duration::from_secs(10), || async {
        let mut left = 0;
        for id in &ids {
            if s.placement(InstanceKey::new(NS, id), now())
                .await
                .ok()?
                .is_some()
            {
                left += 1;
            }
        }
        (left == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_over_without_losing_an_acknowledged_claim() {
    // Two replicas per master: after the failover the promoted one still
    // has a replica to WAIT for, so its shards place again on their own.
    let mut cluster = RedisCluster::start(3, 2).await;
    let prefix = format!("{}:", unique());
    let s = store(&cluster, &prefix, settings()).await;
    let generation = open(&[&s]).await;
    s.put_worker(&record("w"), TTL_MS, now())
        .await
        .expect("put");
    let victim = cluster
        .master_of(&format!("{prefix}{{s0}}gen"))
        .await
        .expect("a master for s0");
    let mut acked: HashMap<String, u64> = HashMap::new();
    let mut refused = 0;
    let mut killed_at = None;
    let mut resumed_after = None;
    let give_up = tokio::time::Instant::now() + Duration::from_millis(NODE_TIMEOUT_MS * 8);
    // Claims in every shard, one round of 64 after another; the master
    // dies after the fifth round.
    let mut round = 0;
    while resumed_after.is_none() && tokio::time::Instant::now() < give_up {
        if round == 5 {
            cluster.kill(victim);
            killed_at = Some(tokio::time::Instant::now());
        }
        let ids: Vec<String> = one_id_per_shard()
            .into_iter()
            .map(|id| format!("{id}-r{round}"))
            .collect();
        let answers = join_all(ids.iter().map(|id| claim(&s, id, "w", &generation))).await;
        let mut all_ok = true;
        for (id, got) in ids.iter().zip(answers) {
            match got {
                Ok(ClaimOutcome::Claimed(p, _)) => {
                    acked.insert(id.clone(), p.epoch);
                }
                Ok(other) => panic!("{id}: {other:?}"),
                Err(_) => {
                    refused += 1;
                    all_ok = false;
                }
            }
        }
        if let (Some(at), true) = (killed_at, all_ok) {
            if round > 5 {
                resumed_after = Some(at.elapsed());
            }
        }
        round += 1;
    }
    let resumed_after = resumed_after.expect("placement resumed in every shard");
    assert!(refused > 0, "the dead master's shards refused for a while");
    eprintln!(
        "placement resumed {resumed_after:?} after the kill; {refused} claims refused meanwhile"
    );
    // Every acknowledged claim survived the failover.
    for (id, epoch) in &acked {
        let row = s
            .placement(InstanceKey::new(NS, id), now())
            .await
            .expect("read")
            .unwrap_or_else(|| panic!("{id}: its acknowledged claim was lost"));
        assert_eq!(row.placement.epoch, *epoch, "{id}");
    }
}
