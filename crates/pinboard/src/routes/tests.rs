//! The route directory's own tests: quarantine, the bounded cache, moves
//! and worlds, on the memory store and a hand-moved clock.

use std::sync::Arc;

use parking_lot::Mutex;

use super::*;
use crate::clock::{Clock, Now, SeededEntropy};
use crate::placement::{InstanceKey, MemoryStore, WorkerRecord};
use crate::world::{Scope, World};

const HOSTLESS: Scope<'static> = Scope::World(World::HOSTLESS);

struct FakeClock(Mutex<Now>);
impl Clock for FakeClock {
    fn now(&self) -> Now {
        *self.0.lock()
    }
}

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
    let clock = Arc::new(FakeClock(Mutex::new(Now {
        wall_ms: 5_000,
        mono_ms: 0,
    })));
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
