//! Placement rows are bounded: a claim the worker refused is handed back
//! and its row deleted, a released (served) row and the rows of an owner
//! that is gone expire after the row grace, in Redis (counted as keys in a
//! private Redis) and in memory (counted through the operator overview).
//! Ids are invented by the test, as a client flooding random ids would.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use serde_json::Value;
use support::fake::{beat, fake, Mode};
use support::RedisServer;
use support::{bearer, client, eventually, metric, pinboard};
use test_support::metrics;

/// GET `/counter/<prefix><i>/hit` for `i` in `0..n`, 32 at a time; returns
/// the statuses.
async fn flood(c: &reqwest::Client, pb: &str, prefix: &str, n: usize) -> Vec<u16> {
    stream::iter(0..n)
        .map(|i| {
            let req = c.get(format!("{pb}/counter/{prefix}{i}/hit"));
            async move { req.send().await.expect("send").status().as_u16() }
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// Keeps a fake worker's lease alive until the returned flag is cleared.
fn keep_alive(pb: &str, name: &'static str, session: &str) -> Arc<AtomicBool> {
    let alive = Arc::new(AtomicBool::new(true));
    let (pb, session, flag) = (pb.to_owned(), session.to_owned(), alive.clone());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(300));
        while flag.load(Ordering::SeqCst) {
            every.tick().await;
            if flag.load(Ordering::SeqCst) {
                assert_eq!(beat(&pb, name, &session).await, 200, "heartbeat");
            }
        }
    });
    alive
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_claims_leave_no_rows_in_redis() {
    let redis = RedisServer::start();
    let pb = pinboard()
        .redis(&redis.url)
        .args(&["--lease-ttl-ms", "60000", "--placement-grace-ms", "300"])
        .start();
    let c = client();
    // The only worker is full: it refuses every new id.
    let (w, _) = fake(&pb.url, "w", Mode::Full).await;
    let before = metrics::scrape(&c, &pb.url).await;
    let statuses = flood(&c, &pb.url, "garbage-", 2000).await;
    assert!(statuses.iter().all(|s| *s == 503), "{statuses:?}");
    assert_eq!(w.hits.load(Ordering::SeqCst), 2000);
    let after = metrics::scrape(&c, &pb.url).await;
    assert_eq!(
        metrics::moved(&before, &after, "pinboard_placements_rolled_back"),
        2000.0
    );
    // Each refused claim was handed back, and as it was never settled its
    // row went at once, although the worker that refused is alive.
    eventually(
        "the refused ids' rows to go",
        Duration::from_secs(10),
        || async { redis.keys("pinboard:p:*").await.is_empty().then_some(()) },
    )
    .await;
    assert!(redis.keys("pinboard:o:*").await.is_empty());
    // What stays is one generation, the dropped mark (the highest epoch of
    // a row so deleted), the worker's record and the set of workers.
    let mut left = redis.keys("pinboard:*").await;
    left.sort();
    assert_eq!(left.len(), 4, "{left:?}");
    assert!(left.contains(&"pinboard:dropped".to_owned()), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_released_ids_and_of_a_vanished_owner_expire_in_redis() {
    let redis = RedisServer::start();
    let pb = pinboard()
        .redis(&redis.url)
        .args(&["--lease-ttl-ms", "3000", "--placement-grace-ms", "500"])
        .start();
    let c = client();
    let (w, session) = fake(&pb.url, "w", Mode::Serve).await;
    let alive = keep_alive(&pb.url, "w", &session);
    let statuses = flood(&c, &pb.url, "random-", 1000).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(w.hits.load(Ordering::SeqCst), 1000);
    assert_eq!(redis.keys("pinboard:p:*").await.len(), 1000);
    // The overview lists them from the owner's index.
    let rows = overview_rows(&c, &pb.url).await;
    assert_eq!(rows.len(), 1000);
    assert!(rows
        .iter()
        .all(|r| r["live"] == true && r["sessionId"] == session.as_str()));

    // While the owner lives its rows have no TTL; a released one gets the grace.
    let mut conn = redis.conn().await;
    let ttl: i64 = redis::cmd("PTTL")
        .arg("pinboard:p:/counter/random-7")
        .query_async(&mut conn)
        .await
        .expect("pttl");
    assert_eq!(ttl, -1, "a live owner's row expires");
    let res = c
        .post(format!("{}/registry/release", pb.url))
        .header("authorization", bearer())
        .json(&serde_json::json!([
            {"sessionId": session, "namespace": "/counter", "id": "random-7"}
        ]))
        .send()
        .await
        .expect("release");
    assert_eq!(res.status(), 200);
    let ttl: i64 = redis::cmd("PTTL")
        .arg("pinboard:p:/counter/random-7")
        .query_async(&mut conn)
        .await
        .expect("pttl");
    assert!((1..=500).contains(&ttl), "released row PTTL {ttl}");
    eventually(
        "the released row to expire",
        Duration::from_secs(5),
        || async { (redis.keys("pinboard:p:*").await.len() == 999).then_some(()) },
    )
    .await;

    // The owner vanishes (no more heartbeats): its lease lapses, the next
    // expiry pass hands its rows the grace, and then they are gone.
    alive.store(false, Ordering::SeqCst);
    eventually(
        "the vanished owner's rows to expire",
        Duration::from_secs(20),
        || async { redis.keys("pinboard:p:*").await.is_empty().then_some(()) },
    )
    .await;
    assert!(redis.keys("pinboard:o:*").await.is_empty());
    assert!(redis.keys("pinboard:dead").await.is_empty());
    assert!(redis.keys("pinboard:w:*").await.is_empty());
    assert!(metric(&c, &pb, "pinboard_placement_rows_expired_total").await >= 999);
}

async fn overview_rows(c: &reqwest::Client, pb: &str) -> Vec<Value> {
    let v: Value = c
        .get(format!("{pb}/registry/overview"))
        .header("authorization", bearer())
        .send()
        .await
        .expect("overview")
        .json()
        .await
        .expect("overview json");
    v["placements"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_a_vanished_owner_are_removed_from_the_memory_store() {
    let pb = pinboard()
        .args(&["--lease-ttl-ms", "3000", "--placement-grace-ms", "500"])
        .start();
    let c = client();
    let (_w, session) = fake(&pb.url, "w", Mode::Serve).await;
    let alive = keep_alive(&pb.url, "w", &session);
    let before = metrics::scrape(&c, &pb.url).await;
    let statuses = flood(&c, &pb.url, "random-", 300).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(overview_rows(&c, &pb.url).await.len(), 300);
    alive.store(false, Ordering::SeqCst);
    // Lapsed: listed as not live for a while, then removed.
    eventually(
        "the rows to show their owner gone",
        Duration::from_secs(10),
        || async {
            let rows = overview_rows(&c, &pb.url).await;
            (!rows.is_empty() && rows.iter().all(|r| r["live"] == false)).then_some(())
        },
    )
    .await;
    eventually(
        "the rows to be removed",
        Duration::from_secs(20),
        || async { overview_rows(&c, &pb.url).await.is_empty().then_some(()) },
    )
    .await;
    let after = metrics::scrape(&c, &pb.url).await;
    assert!(metrics::moved(&before, &after, "pinboard_placement_rows_expired") >= 300.0);
}
