//! Settled placements on both stores (memory and Redis on
//! `127.0.0.1:6379`): a row reports `settled` only once its owner answered
//! at its current epoch, a re-placement unsettles it, and a stale settle
//! (another owner or epoch) changes nothing. Orphans show as not live, and
//! both orphans and unsettled rows are the sweeper's wake candidates.

mod support;

use pinboard::clock::Now;
use pinboard::placement::{
    ClaimOutcome, Generation, InstanceKey, MemoryStore, PlacementStore, RedisStore, WorkerRecord,
};

fn rec(sid: &str) -> WorkerRecord {
    support::record(sid, "/c")
}

fn at(mono_ms: u64) -> Now {
    Now {
        wall_ms: 1_800_000_000_000 + mono_ms,
        mono_ms,
    }
}

async fn claim<S: PlacementStore>(store: &S, gen: &Generation, sid: &str, floor: u64) -> u64 {
    match store
        .resolve_or_claim(
            InstanceKey::new("/c", "a"),
            Some(sid),
            None,
            floor,
            gen,
            at(0),
        )
        .await
        .expect("claim")
    {
        ClaimOutcome::Claimed(p, _) => p.epoch,
        other => panic!("expected a claim, got {other:?}"),
    }
}

async fn settled_contract<S: PlacementStore>(store: S) {
    let gen = store
        .open_generation(&Generation::new("g", 0))
        .await
        .expect("generation");
    store
        .put_worker(&rec("s1"), 60_000, at(0))
        .await
        .expect("put");
    store
        .put_worker(&rec("s2"), 60_000, at(0))
        .await
        .expect("put");
    assert!(store
        .placement(InstanceKey::new("/c", "a"), at(0))
        .await
        .expect("read")
        .is_none());

    let e1 = claim(&store, &gen, "s1", 1000).await;
    let row = store
        .placement(InstanceKey::new("/c", "a"), at(0))
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.placement.session_id, "s1");
    assert_eq!(row.placement.epoch, e1);
    assert!(row.live);
    assert!(!row.settled, "a fresh claim is not settled");
    assert_eq!(wake(&store).await, ["a"], "an unsettled row needs a wake");

    assert!(!store
        .settle(InstanceKey::new("/c", "a"), "s2", e1)
        .await
        .expect("settle"));
    assert!(!store
        .settle(InstanceKey::new("/c", "a"), "s1", e1 + 1)
        .await
        .expect("settle"));
    assert!(
        !store
            .placement(InstanceKey::new("/c", "a"), at(0))
            .await
            .expect("read")
            .expect("row")
            .settled
    );
    assert!(store
        .settle(InstanceKey::new("/c", "a"), "s1", e1)
        .await
        .expect("settle"));
    assert!(
        store
            .placement(InstanceKey::new("/c", "a"), at(0))
            .await
            .expect("read")
            .expect("row")
            .settled
    );
    let listed = store.list_placements(at(0)).await.expect("list");
    assert!(listed.iter().any(|r| r.id == "a" && r.settled && r.live));

    // The owner goes: the row is an orphan; re-placed, it is unsettled again.
    store.remove_worker("s1").await.expect("remove");
    let listed = store.list_placements(at(0)).await.expect("list");
    assert!(
        listed.iter().any(|r| r.id == "a" && !r.live),
        "the orphan is listed as not live: {listed:?}"
    );
    assert_eq!(wake(&store).await, ["a"], "an orphan needs a wake");
    // Upkeep hands the orphan its grace (Redis: out of the owner index);
    // the sweeper still finds it.
    store.expire_placements(100, at(0)).await.expect("expire");
    assert_eq!(
        wake(&store).await,
        ["a"],
        "an orphan after upkeep needs a wake"
    );
    let e2 = claim(&store, &gen, "s2", 1000).await;
    assert!(e2 > e1);
    let row = store
        .placement(InstanceKey::new("/c", "a"), at(0))
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.placement.session_id, "s2");
    assert!(!row.settled, "a re-placement is not settled");
    assert!(!store
        .settle(InstanceKey::new("/c", "a"), "s1", e1)
        .await
        .expect("settle"));
    assert_eq!(wake(&store).await, ["a"]);
    assert!(store
        .settle(InstanceKey::new("/c", "a"), "s2", e2)
        .await
        .expect("settle"));
    assert!(
        store
            .placement(InstanceKey::new("/c", "a"), at(0))
            .await
            .expect("read")
            .expect("row")
            .settled
    );
    assert!(
        wake(&store).await.is_empty(),
        "settled at the new owner: nothing to wake"
    );
}

async fn wake<S: PlacementStore>(store: &S) -> Vec<String> {
    store
        .wake_candidates(8, at(0))
        .await
        .expect("wake candidates")
        .into_iter()
        .map(|(ns, id)| {
            assert_eq!(ns, "/c");
            id
        })
        .collect()
}

#[tokio::test]
async fn memory_store_settles_at_the_current_owner_and_epoch_only() {
    settled_contract(MemoryStore::new()).await;
}

#[tokio::test]
async fn redis_store_settles_at_the_current_owner_and_epoch_only() {
    let prefix = support::redis_prefix("settled");
    let store = RedisStore::connect("redis://127.0.0.1:6379/0", &prefix)
        .await
        .expect("redis on 127.0.0.1:6379");
    settled_contract(store).await;
    support::redis_wipe(&prefix).await;
}
