//! Settled placements on both stores (memory and Redis on
//! `127.0.0.1:6379`): a row reports `settled` only once its owner answered
//! at its current epoch, a re-placement unsettles it, and a stale settle
//! (another owner or epoch) changes nothing. Orphans show as not live, and
//! both orphans and unsettled rows are the sweeper's wake candidates. A
//! release keeps a settled row for its grace and deletes one never settled
//! at once; every later claim or reclaim, of any id, mints above the
//! deleted row's epoch.

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

/// The release contract (see the module doc); `rows` counts the
/// placement rows the store holds, in their grace or not.
async fn release_contract<S: PlacementStore, F: std::future::Future<Output = usize>>(
    store: &S,
    rows: impl Fn() -> F,
) {
    let gen = store
        .open_generation(&Generation::new("g", 0))
        .await
        .expect("generation");
    store
        .put_worker(&rec("s1"), 60_000, at(0))
        .await
        .expect("put");
    let key = |id| InstanceKey::new("/c", id);
    let claim_at = |id, floor| {
        let gen = &gen;
        async move {
            match store
                .resolve_or_claim(key(id), Some("s1"), None, floor, gen, at(0))
                .await
                .expect("claim")
            {
                ClaimOutcome::Claimed(p, _) => p.epoch,
                other => panic!("expected a claim, got {other:?}"),
            }
        }
    };
    // Served, then released: kept (with its epoch) for the grace.
    let served = claim_at("served", 1000).await;
    assert!(store
        .settle(key("served"), "s1", served)
        .await
        .expect("settle"));
    assert!(store
        .release(key("served"), "s1", Some(served))
        .await
        .expect("release"));
    assert_eq!(rows().await, 1, "a served row keeps its grace");
    // Never served (a refused or denied claim): gone at once.
    let denied = claim_at("denied", 5000).await;
    assert_eq!(rows().await, 2);
    assert!(!store
        .release(key("denied"), "s1", Some(denied + 1))
        .await
        .expect("release"));
    assert!(store
        .release(key("denied"), "s1", Some(denied))
        .await
        .expect("release"));
    assert_eq!(rows().await, 1, "the row never settled is deleted");
    assert!(store
        .placement(key("denied"), at(0))
        .await
        .expect("read")
        .is_none());
    // No epoch is handed out twice, though no row remembers it.
    assert_eq!(claim_at("denied", 1000).await, denied + 1);
    assert!(claim_at("fresh", 1000).await > denied);
    let reclaimed = match store
        .reclaim(key("other"), "s1", &[], 1000, at(0))
        .await
        .expect("reclaim")
    {
        pinboard::placement::ReclaimOutcome::Reclaimed(p) => p.epoch,
        other => panic!("expected a reclaim, got {other:?}"),
    };
    assert!(reclaimed > denied, "{reclaimed} after {denied}");
}

#[tokio::test]
async fn memory_store_settles_at_the_current_owner_and_epoch_only() {
    settled_contract(MemoryStore::new()).await;
}

#[tokio::test]
async fn memory_store_deletes_a_row_never_settled_at_its_release() {
    let store = MemoryStore::new();
    let count = &store;
    release_contract(&store, move || async move { count.rows() }).await;
}

#[tokio::test]
async fn redis_store_deletes_a_row_never_settled_at_its_release() {
    let prefix = support::redis_prefix("release");
    let store = RedisStore::connect("redis://127.0.0.1:6379/0", &prefix)
        .await
        .expect("redis on 127.0.0.1:6379");
    let pattern = format!("{prefix}p:*");
    release_contract(&store, || {
        let pattern = pattern.clone();
        async move {
            let mut conn = redis::Client::open(test_support::SHARED_REDIS)
                .expect("redis url")
                .get_multiplexed_async_connection()
                .await
                .expect("redis");
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut conn)
                .await
                .expect("keys");
            keys.len()
        }
    })
    .await;
    support::redis_wipe(&prefix).await;
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
