//! The route directory's own tests: quarantine, the bounded cache, moves
//! and worlds, on the memory store and a hand-moved clock.

use std::sync::Arc;

use super::*;
use crate::clock::fake::FakeClock;
use crate::clock::{Clock, SeededEntropy};
use crate::placement::{InstanceKey, MemoryStore, WorkerRecord};
use crate::world::{Scope, World};

const HOSTLESS: Scope<'static> = Scope::World(World::HOSTLESS);

fn rec(sid: &str, headroom: i64) -> WorkerRecord {
    WorkerRecord {
        session_id: sid.into(),
        client_id: "c".into(),
        secret: "s".into(),
        advertise_url: format!("http://{sid}.invalid:1"),
        namespaces: vec!["/c".into()],
        headroom,
        ..Default::default()
    }
}

async fn setup(quarantine_ms: u64) -> (Routes<MemoryStore>, Arc<FakeClock>, Arc<MemoryStore>) {
    setup_leased(quarantine_ms, quarantine_ms).await
}

/// As [`setup`], granting leases of `lease_ttl_ms`.
async fn setup_leased(
    quarantine_ms: u64,
    lease_ttl_ms: u64,
) -> (Routes<MemoryStore>, Arc<FakeClock>, Arc<MemoryStore>) {
    let clock = Arc::new(FakeClock::at(5_000));
    let store = Arc::new(MemoryStore::new());
    for sid in ["a", "b"] {
        store
            .put_worker(&rec(sid, 10), 10_000, clock.now())
            .await
            .expect("put");
    }
    let dir = Routes::new(
        store.clone(),
        clock.clone(),
        Arc::new(SeededEntropy::seeded(3)),
        Arc::new(EpochFloor::default()),
        RoutesSettings {
            refresh_ms: 0,
            quarantine_ms,
            lease_ttl_ms,
            route_capacity: 1000,
            unknown_session_ttl_ms: 1000,
            forced_refresh_interval_ms: 100,
            upstream_tls: None,
        },
        RoutesCounters::default(),
    );
    dir.open_generation().await.expect("generation");
    (dir, clock, store)
}

#[tokio::test]
async fn quarantine_blocks_new_placements_only() {
    let (dir, clock, store) = setup(1000).await;
    store
        .resolve_or_claim(
            InstanceKey::new("/c", "old"),
            Some("a"),
            None,
            1,
            &store.generation().await.expect("read").expect("opened"),
            clock.now(),
        )
        .await
        .expect("claim");
    assert!(dir
        .resolve("/c/old", "/c", "old", HOSTLESS, Avoid::default())
        .await
        .is_ok());
    assert!(matches!(
        dir.resolve("/c/new", "/c", "new", HOSTLESS, Avoid::default())
            .await,
        Err(ResolveError::Quarantined)
    ));
    clock.0.lock().mono_ms = 1000;
    let r = dir
        .resolve("/c/new", "/c", "new", HOSTLESS, Avoid::default())
        .await
        .expect("placed");
    assert_eq!(r.epoch, 5_000_000);
    assert!(dir.cached("/c/new").is_some());
}

#[tokio::test]
async fn a_store_loss_quarantines_for_a_lease_even_without_a_cold_start_quarantine() {
    let (dir, clock, store) = setup_leased(0, 3000).await;
    dir.resolve("/c/x", "/c", "x", HOSTLESS, Avoid::default())
        .await
        .expect("no cold-start quarantine");
    // The store loses everything; one worker is back (re-registered),
    // the other, which may hold ids, is not yet.
    store.wipe();
    store
        .put_worker(&rec("a", 10), 10_000, clock.now())
        .await
        .expect("put");
    for _ in 0..2 {
        assert!(matches!(
            dir.resolve("/c/y", "/c", "y", HOSTLESS, Avoid::default())
                .await,
            Err(ResolveError::Quarantined)
        ));
    }
    assert_eq!(dir.quarantine_left_ms(), 3000);
    clock.0.lock().mono_ms = 2999;
    clock.0.lock().wall_ms += 2999;
    assert!(matches!(
        dir.resolve("/c/y", "/c", "y", HOSTLESS, Avoid::default())
            .await,
        Err(ResolveError::Quarantined)
    ));
    clock.0.lock().mono_ms = 3000;
    clock.0.lock().wall_ms += 1;
    let placed = dir
        .resolve("/c/y", "/c", "y", HOSTLESS, Avoid::default())
        .await
        .expect("placed once every lease that could hold it has run out");
    assert_eq!(placed.worker.record.session_id, "a");
}

#[tokio::test]
async fn the_route_cache_stays_bounded_and_evicted_ids_resolve_from_the_store() {
    let (dir, _, _) = setup(0).await;
    let mut owners = std::collections::HashMap::new();
    for i in 0..5000 {
        let (key, id) = (format!("/c/i{i}"), format!("i{i}"));
        let route = dir
            .resolve(&key, "/c", &id, HOSTLESS, Avoid::default())
            .await
            .expect("placed");
        owners.insert(key, (route.worker.record.session_id.clone(), route.epoch));
    }
    // Capacity 1 000 in `setup`; quick_cache's bound is approximate.
    assert!(
        dir.cached_routes() <= 1100,
        "{} routes cached",
        dir.cached_routes()
    );
    for (key, (owner, epoch)) in &owners {
        let id = &key["/c/".len()..];
        let route = dir
            .resolve(key, "/c", id, HOSTLESS, Avoid::default())
            .await
            .expect("resolved");
        assert_eq!(
            (&route.worker.record.session_id, route.epoch),
            (owner, *epoch),
            "{key} moved"
        );
    }
}

#[tokio::test]
async fn excluding_every_host_leaves_no_worker() {
    let (dir, _, _) = setup(0).await;
    let all = ["a".to_owned(), "b".to_owned()];
    let err = dir
        .resolve(
            "/c/y",
            "/c",
            "y",
            HOSTLESS,
            Avoid {
                stale: None,
                exclude: &all,
                refresh: false,
            },
        )
        .await;
    assert!(matches!(err, Err(ResolveError::NoWorker)));
}

#[tokio::test]
async fn move_away_places_elsewhere_with_a_larger_epoch() {
    let (dir, _, _) = setup(0).await;
    let first = dir
        .resolve("/c/x", "/c", "x", HOSTLESS, Avoid::default())
        .await
        .expect("placed");
    let owner = first.worker.record.session_id.clone();
    let moved = dir
        .resolve(
            "/c/x",
            "/c",
            "x",
            HOSTLESS,
            Avoid {
                stale: Some((&owner, first.epoch)),
                exclude: std::slice::from_ref(&owner),
                refresh: false,
            },
        )
        .await
        .expect("moved");
    assert_ne!(moved.worker.record.session_id, owner);
    assert!(moved.epoch > first.epoch);
    // Only the excluded worker hosts the namespace: no worker.
    let err = dir
        .resolve(
            "/c/x",
            "/c",
            "x",
            HOSTLESS,
            Avoid {
                stale: Some((&moved.worker.record.session_id, moved.epoch)),
                exclude: std::slice::from_ref(&moved.worker.record.session_id),
                refresh: false,
            },
        )
        .await;
    assert!(err.is_ok(), "the other worker can take it back");
    assert!(matches!(
        dir.resolve("/z/x", "/z", "x", HOSTLESS, Avoid::default())
            .await,
        Err(ResolveError::NoWorker)
    ));
}

#[tokio::test]
async fn worlds_place_apart_and_ids_stay_global() {
    let (dir, clock, store) = setup(0).await;
    let mut app = rec("app", 1);
    app.hostname = Some("app".into());
    app.env = Some("staging".into());
    store
        .put_worker(&app, 10_000, clock.now())
        .await
        .expect("put");
    dir.workers_changed();
    let staging = Scope::World(World {
        hostname: Some("APP"),
        env: Some("staging"),
    });
    let production = Scope::World(World {
        hostname: Some("app"),
        env: Some("production"),
    });
    for i in 0..20 {
        let id = format!("h{i}");
        let key = format!("/c/{id}");
        let hostless = dir
            .resolve(&key, "/c", &id, HOSTLESS, Avoid::default())
            .await
            .expect("hostless");
        assert_ne!(hostless.worker.record.session_id, "app");
        // The same id from another world: its owner is elsewhere (cached
        // route and store read alike).
        assert!(matches!(
            dir.resolve(&key, "/c", &id, staging, Avoid::default())
                .await,
            Err(ResolveError::OtherWorld)
        ));
        dir.invalidate(&key);
        assert!(matches!(
            dir.resolve(&key, "/c", &id, staging, Avoid::default())
                .await,
            Err(ResolveError::OtherWorld)
        ));
        let id = format!("s{i}");
        let placed = dir
            .resolve(&format!("/c/{id}"), "/c", &id, staging, Avoid::default())
            .await
            .expect("staging");
        assert_eq!(placed.worker.record.session_id, "app");
    }
    match dir
        .resolve("/c/p", "/c", "p", production, Avoid::default())
        .await
    {
        Err(e @ ResolveError::NoWorkerInWorld(_)) => assert_eq!(
            e.to_string(),
            r#"no live worker serves this namespace for hostname "app" in env "production""#
        ),
        other => panic!("{other:?}"),
    }
    // The sweeper places anywhere.
    let any = dir
        .resolve("/c/s0", "/c", "s0", Scope::Any, Avoid::default())
        .await
        .expect("any");
    assert_eq!(any.worker.record.session_id, "app");
}

// Moves: every claim that takes an id from another session is recorded
// with why it left, whoever saw the owner go.

use crate::operator::moves::{MoveReason, MovedBy, REPLACED_REASON, TAKEOVER_REASON};

/// `(id, from, to, reason, by)` of every move recorded, oldest first.
fn moves_of(dir: &Routes<MemoryStore>) -> Vec<(String, String, String, MoveReason, MovedBy)> {
    let mut moves: Vec<_> = dir
        .counters
        .moves
        .recent(usize::MAX)
        .into_iter()
        .map(|m| (m.id, m.from, m.to, m.reason, m.by))
        .collect();
    moves.reverse();
    moves
}

fn moved(
    id: &str,
    from: &str,
    to: &str,
    reason: MoveReason,
) -> (String, String, String, MoveReason, MovedBy) {
    (id.into(), from.into(), to.into(), reason, MovedBy::Request)
}

/// Places `/c/<id>` on `on` (the other of `a`/`b` excluded) and caches
/// its route; returns its epoch.
async fn place_on(dir: &Routes<MemoryStore>, id: &str, on: &str) -> u64 {
    let other = [if on == "a" { "b" } else { "a" }.to_owned()];
    let route = dir
        .resolve(
            &format!("/c/{id}"),
            "/c",
            id,
            HOSTLESS,
            Avoid {
                exclude: &other,
                ..Avoid::default()
            },
        )
        .await
        .expect("placed");
    assert_eq!(route.worker.record.session_id, on);
    route.epoch
}

async fn resolve_id(dir: &Routes<MemoryStore>, id: &str) -> Arc<Route> {
    dir.resolve(&format!("/c/{id}"), "/c", id, HOSTLESS, Avoid::default())
        .await
        .expect("resolved")
}

/// Moves the clock on by `ms`, renewing `b` half way: `a`'s lease (as
/// long as `ms`) runs out.
async fn lapse_a(clock: &FakeClock, store: &MemoryStore, ms: u64) {
    let advance = |by: u64| {
        let mut now = clock.0.lock();
        now.mono_ms += by;
        now.wall_ms += by;
    };
    advance(ms / 2);
    store
        .renew_worker("b", 10, false, 10_000, clock.now())
        .await
        .expect("renew")
        .expect("b live");
    advance(ms - ms / 2);
}

#[tokio::test]
async fn ids_of_an_owner_whose_lease_lapsed_move_as_a_lease_lapse_cached_or_not() {
    let (dir, clock, store) = setup(0).await;
    place_on(&dir, "cached", "a").await;
    place_on(&dir, "dropped", "a").await;
    assert!(moves_of(&dir).is_empty(), "a first placement is no move");
    lapse_a(&clock, &store, 10_000).await;
    // As a client retrying through `owner unreachable` leaves it: no
    // route, and nothing said here about why.
    dir.invalidate("/c/dropped");
    for id in ["cached", "dropped"] {
        assert_eq!(resolve_id(&dir, id).await.worker.record.session_id, "b");
    }
    assert_eq!(
        moves_of(&dir),
        vec![
            moved("cached", "a", "b", MoveReason::LeaseLapsed),
            moved("dropped", "a", "b", MoveReason::LeaseLapsed),
        ]
    );
    // Resolving again is no second move.
    resolve_id(&dir, "cached").await;
    assert_eq!(moves_of(&dir).len(), 2);
}

#[tokio::test]
async fn an_owner_superseded_through_another_node_says_replaced_or_takeover() {
    let (dir, clock, store) = setup(0).await;
    place_on(&dir, "x", "a").await;
    place_on(&dir, "y", "b").await;
    // Another node superseded both; this node only sees them leave.
    let now = clock.now();
    for (session, reason) in [
        ("a", format!("{REPLACED_REASON} http://a.invalid:1")),
        ("b", format!("{TAKEOVER_REASON} 2 of hostname \"app\"")),
    ] {
        store
            .mark_superseded(session, &reason, 60_000, now)
            .await
            .expect("mark");
        store.remove_worker(session).await.expect("remove");
    }
    store
        .put_worker(&rec("c", 10), 10_000, now)
        .await
        .expect("put");
    for id in ["x", "y"] {
        assert_eq!(resolve_id(&dir, id).await.worker.record.session_id, "c");
    }
    assert_eq!(
        moves_of(&dir),
        vec![
            moved("x", "a", "c", MoveReason::Replaced),
            moved("y", "b", "c", MoveReason::Takeover),
        ]
    );
}

#[tokio::test]
async fn releases_say_idle_wind_down_or_drain_and_sessions_that_end_say_so() {
    let (dir, clock, store) = setup(0).await;
    let now = clock.now();
    for id in ["idle", "wound", "drained", "ended"] {
        place_on(&dir, id, "a").await;
    }
    dir.counters.moves.winding_down("/c/wound", "a");
    let release = |id: &'static str| {
        let store = store.clone();
        async move {
            assert!(store
                .release(InstanceKey::new("/c", id), "a", None)
                .await
                .expect("release"));
        }
    };
    for id in ["idle", "wound"] {
        dir.note_released([(format!("/c/{id}").as_str(), "a")])
            .await;
        release(id).await;
        dir.invalidate(&format!("/c/{id}"));
    }
    // Draining in this node's view when it lets go.
    store
        .set_server_drain("a", Some(crate::placement::DrainDeadline::Never), now)
        .await
        .expect("drain");
    dir.workers_changed();
    // Its first release comes before any request re-read the view.
    dir.note_released([("/c/drained", "a")]).await;
    release("drained").await;
    dir.invalidate("/c/drained");
    resolve_id(&dir, "ended").await;
    // Then it deregisters (a drain that ended), and another session ends
    // without one.
    store.remove_worker("a").await.expect("deregister");
    dir.forget_sessions(&["a".to_owned()]);
    for id in ["idle", "wound", "drained", "ended"] {
        assert_eq!(resolve_id(&dir, id).await.worker.record.session_id, "b");
    }
    assert_eq!(
        moves_of(&dir),
        vec![
            moved("idle", "a", "b", MoveReason::Released),
            moved("wound", "a", "b", MoveReason::WindDown),
            moved("drained", "a", "b", MoveReason::Drain),
            moved("ended", "a", "b", MoveReason::Drain),
        ]
    );
    place_on(&dir, "quiet", "b").await;
    store
        .put_worker(&rec("a", 10), 10_000, clock.now())
        .await
        .expect("a again");
    store.remove_worker("b").await.expect("deregister");
    dir.forget_sessions(&["b".to_owned()]);
    assert_eq!(
        resolve_id(&dir, "quiet").await.worker.record.session_id,
        "a"
    );
    assert_eq!(
        moves_of(&dir).last(),
        Some(&moved("quiet", "b", "a", MoveReason::SessionEnded))
    );
}

#[tokio::test]
async fn a_refusal_moves_the_id_as_a_refusal_or_a_drain() {
    let (dir, clock, store) = setup(0).await;
    for id in ["r", "d"] {
        place_on(&dir, id, "a").await;
    }
    let refuse = |id: &'static str, epoch: u64| {
        let dir = &dir;
        async move {
            let a = ["a".to_owned()];
            dir.resolve(
                &format!("/c/{id}"),
                "/c",
                id,
                HOSTLESS,
                Avoid {
                    stale: Some(("a", epoch)),
                    exclude: &a,
                    refresh: false,
                },
            )
            .await
            .expect("moved away")
        }
    };
    let epoch = dir.cached("/c/r").expect("cached").epoch;
    assert_eq!(refuse("r", epoch).await.worker.record.session_id, "b");
    store
        .set_server_drain(
            "a",
            Some(crate::placement::DrainDeadline::Never),
            clock.now(),
        )
        .await
        .expect("drain");
    dir.workers_changed();
    let epoch = dir.cached("/c/d").expect("cached").epoch;
    assert_eq!(refuse("d", epoch).await.worker.record.session_id, "b");
    assert_eq!(
        moves_of(&dir),
        vec![
            moved("r", "a", "b", MoveReason::Refusal),
            moved("d", "a", "b", MoveReason::Drain),
        ]
    );
}

#[tokio::test]
async fn ids_the_store_lost_under_an_owner_that_did_not_reclaim_them_move_as_a_store_loss() {
    let (dir, clock, store) = setup_leased(0, 3000).await;
    place_on(&dir, "lost", "a").await;
    place_on(&dir, "unanswered", "a").await;
    place_on(&dir, "reclaimed", "b").await;
    let old_epoch = dir.cached("/c/reclaimed").expect("cached").epoch;
    store.wipe();
    // A request found `a` unreachable and dropped its route before this
    // node noticed the loss.
    dir.lose_sight("/c/unanswered", "a");
    // The loss is noticed (the upkeep's check) before any owner is back.
    dir.check_generation().await.expect("check");
    // `b` re-registers as `b2` and reclaims what it holds; `a` never
    // comes back.
    let now = clock.now();
    store
        .put_worker(&rec("b2", 10), 10_000, now)
        .await
        .expect("put");
    store
        .reclaim(
            InstanceKey::new("/c", "reclaimed"),
            "b2",
            &["b"],
            old_epoch + 1,
            now,
        )
        .await
        .expect("reclaim");
    dir.forget_sessions(&["b".to_owned()]);
    {
        let mut now = clock.0.lock();
        now.mono_ms += 3000;
        now.wall_ms += 3000;
    }
    for id in ["lost", "unanswered", "reclaimed"] {
        assert_eq!(resolve_id(&dir, id).await.worker.record.session_id, "b2");
    }
    assert_eq!(
        moves_of(&dir),
        vec![
            moved("lost", "a", "b2", MoveReason::StoreLoss),
            moved("unanswered", "a", "b2", MoveReason::StoreLoss),
        ],
        "a reclaim by the same process is no move"
    );
}

#[tokio::test]
async fn a_sweeper_re_placement_says_so() {
    let (dir, clock, store) = setup(0).await;
    place_on(&dir, "orphan", "a").await;
    lapse_a(&clock, &store, 10_000).await;
    dir.invalidate("/c/orphan");
    let route = dir
        .resolve_as(
            MovedBy::Sweeper,
            "/c/orphan",
            "/c",
            "orphan",
            Scope::Any,
            Avoid::default(),
        )
        .await
        .expect("woken elsewhere");
    assert_eq!(route.worker.record.session_id, "b");
    assert_eq!(
        moves_of(&dir),
        vec![(
            "orphan".into(),
            "a".into(),
            "b".into(),
            MoveReason::LeaseLapsed,
            MovedBy::Sweeper
        )]
    );
}

#[tokio::test]
async fn a_failing_store_leaves_the_last_worker_view_serving_for_one_lease() {
    use crate::placement::gated::Gated;

    let clock = Arc::new(FakeClock::at(5_000));
    let store = Arc::new(Gated::new(MemoryStore::new()));
    store
        .put_worker(&rec("a", 10), 60_000, clock.now())
        .await
        .expect("put");
    let dir = Routes::new(
        store.clone(),
        clock.clone(),
        Arc::new(SeededEntropy::seeded(3)),
        Arc::new(EpochFloor::default()),
        RoutesSettings {
            refresh_ms: 500,
            quarantine_ms: 0,
            lease_ttl_ms: 10_000,
            route_capacity: 1000,
            unknown_session_ttl_ms: 1000,
            forced_refresh_interval_ms: 100,
            upstream_tls: None,
        },
        RoutesCounters::default(),
    );
    dir.open_generation().await.expect("generation");
    let placed = dir
        .resolve("/c/x", "/c", "x", HOSTLESS, Avoid::default())
        .await
        .expect("placed");
    let at = |ms: u64| clock.0.lock().mono_ms = ms;

    // The store stops answering; a warm id keeps resolving from the cache
    // through the view read before, well past the refresh interval.
    store.fail_listing(true);
    let reads = dir.counters.worker_reads.get();
    for ms in [600, 2_500, 9_900] {
        at(ms);
        let warm = dir
            .resolve("/c/x", "/c", "x", HOSTLESS, Avoid::default())
            .await
            .unwrap_or_else(|e| panic!("at {ms} ms: {e}"));
        assert!(Arc::ptr_eq(&warm, &placed), "the cached route");
    }
    assert!(
        dir.counters.worker_reads.get() > reads,
        "the view was re-read (and failed) meanwhile"
    );
    // A registration here marks the view changed: still served while the
    // store fails, as long as it is younger than a lease.
    dir.workers_changed();
    assert!(dir.view().await.is_ok(), "a marked view serves on");
    // Older than one lease TTL: no longer trusted.
    at(10_100);
    assert!(
        matches!(
            dir.resolve("/c/x", "/c", "x", HOSTLESS, Avoid::default())
                .await,
            Err(ResolveError::Store(_))
        ),
        "a view older than a lease is not served"
    );
    // The store answers again: so does everything.
    store.fail_listing(false);
    at(10_200);
    let again = dir
        .resolve("/c/x", "/c", "x", HOSTLESS, Avoid::default())
        .await
        .expect("resolves again");
    assert!(Arc::ptr_eq(&again, &placed));
}
