//! A frozen Redis (SIGSTOP: connections stay open, nothing answers) fails
//! every call of the Redis placement store within its deadline instead of
//! hanging it: the store's own calls (registration, heartbeats, worker and
//! placement reads, generation, sweeper and expiry queries, messages), and
//! through a pinboard process a heartbeat and an operator read. Each test
//! runs its own `redis-server`, so the freeze touches nothing else.

mod support;

use std::time::Duration;

use futures_util::future::{join_all, BoxFuture, FutureExt as _};
use pinboard::clock::Now;
use pinboard::placement::{
    Admission, Batching, Generation, InstanceKey, PlacementStore, RedisStore, StoreError,
    WorkerRecord,
};
use pinned_wire::registry::ControlMessage;
use support::{bearer, client, eventually, pinboard, RedisServer};
use tokio::time::{timeout, Instant};

/// The deadline the tests configure: short, so a lapse is quick to see.
const DEADLINE: Duration = Duration::from_millis(300);
/// How long a call may take on a frozen Redis before the test calls it a
/// hang: the deadline plus generous slack for a loaded machine.
const BOUND: Duration = DEADLINE.saturating_mul(3);

fn rec(sid: &str) -> WorkerRecord {
    support::record(sid, "/c")
}

fn now() -> Now {
    support::fixed_now()
}

/// Every non-batched call of the store, each named, answering only
/// whether it failed and how.
fn calls(store: &RedisStore) -> Vec<(&'static str, BoxFuture<'_, Result<(), StoreError>>)> {
    let key = InstanceKey::new("/c", "x");
    let record = rec("s1");
    let proposal = Generation::new("g2", 0);
    vec![
        (
            "put_worker",
            async move { store.put_worker(&record, 60_000, now()).await }.boxed(),
        ),
        (
            "renew_worker",
            async {
                store
                    .renew_worker("s1", 1, false, 60_000, now())
                    .await
                    .map(drop)
            }
            .boxed(),
        ),
        (
            "get_worker",
            async { store.get_worker("s1", now()).await.map(drop) }.boxed(),
        ),
        (
            "list_workers",
            async { store.list_workers(now()).await.map(drop) }.boxed(),
        ),
        (
            "set_server_drain",
            async { store.set_server_drain("s1", None, now()).await.map(drop) }.boxed(),
        ),
        (
            "push_message",
            async {
                let message = ControlMessage {
                    kind: "wind_down".into(),
                    id: "x".into(),
                    ns: Some("/c".into()),
                    deadline: None,
                    msg_id: None,
                };
                store.push_message("s1", message).await.map(drop)
            }
            .boxed(),
        ),
        (
            "pending_messages",
            async { store.pending_messages("s1", &[]).await.map(drop) }.boxed(),
        ),
        (
            "placement",
            async move { store.placement(key, now()).await.map(drop) }.boxed(),
        ),
        (
            "list_placements",
            async { store.list_placements(now()).await.map(drop) }.boxed(),
        ),
        (
            "release",
            async move { store.release(key, "s1", None).await.map(drop) }.boxed(),
        ),
        (
            "reclaim",
            async move { store.reclaim(key, "s1", &[], 1, now()).await.map(drop) }.boxed(),
        ),
        (
            "generation",
            async { store.generation().await.map(drop) }.boxed(),
        ),
        (
            "open_generation",
            async move { store.open_generation(&proposal).await.map(drop) }.boxed(),
        ),
        (
            "wake_candidates",
            async { store.wake_candidates(16, now()).await.map(drop) }.boxed(),
        ),
        (
            "expire_placements",
            async { store.expire_placements(16, now()).await.map(drop) }.boxed(),
        ),
        (
            "acquire_sweeper_lease",
            async {
                store
                    .acquire_sweeper_lease("t", 1_000, now())
                    .await
                    .map(drop)
            }
            .boxed(),
        ),
        (
            "remove_worker",
            async { store.remove_worker("s9").await.map(drop) }.boxed(),
        ),
        (
            "mark_superseded",
            async { store.mark_superseded("s1", "newer", 60_000, now()).await }.boxed(),
        ),
        (
            "superseded",
            async { store.superseded("s1", now()).await.map(drop) }.boxed(),
        ),
        (
            "deployment_version",
            async { store.deployment_version().await.map(drop) }.boxed(),
        ),
        (
            "admit_worker",
            async move {
                let newcomer = rec("s2");
                let admission = Admission {
                    record: &newcomer,
                    ttl_ms: 60_000,
                    expected_version: Some(0),
                    supersede: &[("s1".to_owned(), "newer".to_owned())],
                    superseded_ttl_ms: 60_000,
                    wind_down: &[("s3".to_owned(), 1)],
                };
                store.admit_worker(&admission, now()).await.map(drop)
            }
            .boxed(),
        ),
        (
            "tag",
            async move { store.tag(key, "s1", None, "t").await.map(drop) }.boxed(),
        ),
        (
            "renew_sweeper_lease",
            async {
                store
                    .renew_sweeper_lease("tok", 60_000, now())
                    .await
                    .map(drop)
            }
            .boxed(),
        ),
        (
            "release_sweeper_lease",
            async { store.release_sweeper_lease("tok").await.map(drop) }.boxed(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_call_on_a_frozen_redis_times_out_within_the_deadline() {
    let redis = RedisServer::start();
    let batching = Batching {
        deadline: DEADLINE,
        ..Batching::default()
    };
    let store = RedisStore::connect_with(&redis.url, "frozen:", batching)
        .await
        .expect("connect");
    store
        .open_generation(&Generation::new("g", 0))
        .await
        .expect("generation");
    store
        .put_worker(&rec("s1"), 60_000, now())
        .await
        .expect("put");

    redis.pause();
    let started = Instant::now();
    let named = calls(&store);
    let (names, futures): (Vec<_>, Vec<_>) = named.into_iter().unzip();
    let answers = timeout(BOUND, join_all(futures))
        .await
        .unwrap_or_else(|_| panic!("a store call hung on a frozen Redis past {BOUND:?}"));
    let took = started.elapsed();
    for (name, answer) in names.iter().zip(&answers) {
        assert!(
            matches!(answer, Err(StoreError::Timeout(d)) if *d == DEADLINE),
            "{name} answered {answer:?}"
        );
    }
    assert!(
        took >= DEADLINE,
        "answered after {took:?}: not by the deadline"
    );

    // Thawed, the same connection answers again (the late answers of the
    // lapsed calls are matched to them and dropped).
    redis.resume();
    let worker = timeout(BOUND, store.get_worker("s1", now()))
        .await
        .expect("answered after SIGCONT")
        .expect("store works again");
    assert_eq!(worker.map(|w| w.record.session_id).as_deref(), Some("s1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinboard_answers_503_on_a_frozen_redis_within_redis_timeout() {
    let redis = RedisServer::start();
    let ms = DEADLINE.as_millis().to_string();
    let pb = pinboard()
        .redis(&redis.url)
        .args(&["--redis-timeout-ms", &ms])
        .start();
    let c = client();
    // Serving only once it read the store's generation (a start that
    // cannot read it within the deadline exits).
    eventually("pinboard to be ready", Duration::from_secs(10), || async {
        let res = c.get(format!("{}/readyz", pb.url)).send().await.ok()?;
        (res.status() == 200).then_some(())
    })
    .await;

    redis.pause();
    let heartbeat = c
        .post(format!("{}/registry/heartbeat", pb.url))
        .header("authorization", bearer())
        .json(&serde_json::json!({"sessionId": "nobody", "headroom": 1}))
        .send();
    let placements = c
        .get(format!("{}/registry/placements", pb.url))
        .header("authorization", bearer())
        .send();
    let started = Instant::now();
    let (heartbeat, placements) = timeout(BOUND, async { tokio::join!(heartbeat, placements) })
        .await
        .unwrap_or_else(|_| panic!("pinboard hung on a frozen Redis past {BOUND:?}"));
    for (what, res) in [("heartbeat", heartbeat), ("placements", placements)] {
        let res = res.unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = res.status().as_u16();
        let body: serde_json::Value = res.json().await.unwrap_or_default();
        assert_eq!(status, 503, "{what}: {body}");
        assert_eq!(
            body["detail"].as_str(),
            Some("placement store unavailable: the store did not answer within 300ms"),
            "{what}: {body}"
        );
    }
    assert!(started.elapsed() >= DEADLINE);
    redis.resume();
}
