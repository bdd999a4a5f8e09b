//! The alarm / durable-wake sweeper against real Postgres (and Redis for the
//! two-node case): rows written with `pinned-store` are delivered as
//! `_alarm` / `_wake` to a fake worker through placement.
//!
//! Needs Postgres at `postgresql://postgres@127.0.0.1:5432/test` and Redis on
//! `127.0.0.1:6379`. Every test uses its own namespace and deletes its rows.

mod support;

use std::sync::Arc;
use std::time::Duration;

use pinned_store::{InstanceKey, PostgresOptions, PostgresStore, StateStore, TrayKey};
use serde_json::{json, Value};
use support::durable::{durable, durable_in, store, unique_ns, Durable, DATABASE_URL};
use support::{client, eventually, pinboard, redis_prefix, redis_wipe};
use test_support::metrics;
use tokio::time::Instant;

/// Sweep interval used by the suite (ms).
const INTERVAL_MS: u64 = 200;
/// Slack on top of one interval for the scan, the call and a 2-core machine
/// running the whole suite; well under the default 5 s interval, so a sweeper
/// that ignores its interval still fails.
const SLACK_MS: u64 = 1_800;

fn sweeper_args(interval: &str) -> Vec<&str> {
    vec![
        "--database-url",
        DATABASE_URL,
        "--sweep-interval-ms",
        interval,
        "--lease-ttl-ms",
        "60000",
    ]
}

fn doc(v: Value) -> pinned_store::Doc {
    v.as_object().cloned().expect("object")
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// Write a due alarm row `(ns, id, "pinned", "alarm")` at epoch 0.
async fn set_due_alarm(store: &impl StateStore, ns: &str, id: &str) {
    store
        .set_tray(
            InstanceKey::new(ns, id),
            TrayKey::new("pinned", "alarm"),
            false,
            doc(json!({"at": wall_ms() - 1000, "nonce": "n1"})),
            0,
        )
        .await
        .expect("set alarm");
}

async fn wait_calls(
    f: &Durable,
    suffix: &str,
    n: usize,
    patience: Duration,
) -> Vec<support::durable::Seen> {
    let what = format!("{n} calls to {suffix}");
    eventually(&what, patience, || async {
        let calls = f.calls_to(suffix);
        (calls.len() >= n).then_some(calls)
    })
    .await
}

fn header<'a>(s: &'a support::durable::Seen, name: &str) -> Option<&'a str> {
    s.headers.get(name).and_then(|v| v.to_str().ok())
}

fn assert_attested(s: &support::durable::Seen, secret: &str, session: &str) {
    let token = header(s, "pinboard-attestation").expect("attestation");
    let now = wall_ms() as f64 / 1000.0;
    let claims = pinned_wire::attestation::verify(token, secret, |aud| aud == session, now);
    assert!(
        claims.is_some(),
        "token {token} does not verify for {session}"
    );
    let epoch: u64 = header(s, "pinboard-epoch")
        .and_then(|e| e.parse().ok())
        .expect("epoch");
    assert!(epoch > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_alarm_is_posted_to_the_owner_with_the_proxy_secret_within_one_interval() {
    let ns = unique_ns("alarm");
    let pg = store().await;
    let pb = pinboard()
        .args(&sweeper_args(&INTERVAL_MS.to_string()))
        .start();
    let (f, session) = durable(&pb.url, &ns, pg.clone()).await;
    let before = metrics::scrape(&client(), &pb.url).await;

    let written = Instant::now();
    set_due_alarm(pg.as_ref(), &ns, "a1").await;
    // A due alarm in a namespace no worker hosts: a failure every lap.
    let unhosted = unique_ns("unhosted");
    set_due_alarm(pg.as_ref(), &unhosted, "nobody").await;
    let calls = wait_calls(&f, "/_alarm", 1, Duration::from_secs(5)).await;
    let first = &calls[0];
    let lag = first.at.duration_since(written);
    assert!(
        lag <= Duration::from_millis(INTERVAL_MS + SLACK_MS),
        "delivered {lag:?} after the row was written"
    );
    assert_eq!(first.path, format!("{ns}/a1/_alarm"));
    assert_eq!(
        header(first, "pinboard-proxy-secret"),
        Some(f.identity.secret.as_str())
    );
    assert_attested(first, &f.identity.secret, &session);

    // The fake deleted the row when it "fired": nothing more is posted.
    more_laps(&[&pb.url], 5).await;
    assert_eq!(
        f.calls_to("/_alarm").len(),
        1,
        "posted again after it fired"
    );
    let after = metrics::scrape(&client(), &pb.url).await;
    assert_eq!(after.value("pinboard_sweep_lease_held"), 1.0, "{after}");
    assert_eq!(
        metrics::moved(&before, &after, "pinboard_sweep_alarms_delivered"),
        1.0
    );
    assert!(metrics::moved(&before, &after, "pinboard_sweep_laps") >= 5.0);
    let last_lap = metrics::moved(&before, &after, "pinboard_sweep_last_lap_timestamp_ms");
    assert!(last_lap > 0.0);
    assert!(metrics::moved(&before, &after, "pinboard_sweep_failures") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_row_is_woken_with_an_attestation_and_never_the_proxy_secret() {
    let ns = unique_ns("wake");
    let pg = store().await;
    let pb = pinboard()
        .args(&sweeper_args(&INTERVAL_MS.to_string()))
        .start();
    let (f, session) = durable(&pb.url, &ns, pg.clone()).await;
    let before = metrics::scrape(&client(), &pb.url).await;

    pg.set_tray(
        InstanceKey::new(&ns, "m1"),
        TrayKey::singleton("inbox"),
        true,
        doc(json!({"~inbox": [1]})),
        0,
    )
    .await
    .expect("set marked");
    // An unmarked row of another id is not woken.
    pg.set_tray(
        InstanceKey::new(&ns, "quiet"),
        TrayKey::singleton("inbox"),
        false,
        doc(json!({})),
        0,
    )
    .await
    .expect("set unmarked");
    // A still-marked id is woken every lap until its row is unmarked.
    let calls = wait_calls(&f, "/_wake", 2, Duration::from_secs(5)).await;
    let woken = metrics::scrape(&client(), &pb.url).await;
    assert!(metrics::moved(&before, &woken, "pinboard_sweep_wakes") >= 2.0);
    for c in &calls {
        assert_eq!(c.path, format!("{ns}/m1/_wake"));
        assert_eq!(header(c, "pinboard-proxy-secret"), None);
        assert_attested(c, &f.identity.secret, &session);
    }
    // Unmarked: the sweeper stops waking it.
    pg.set_tray(
        InstanceKey::new(&ns, "m1"),
        TrayKey::singleton("inbox"),
        false,
        doc(json!({})),
        0,
    )
    .await
    .expect("unmark");
    more_laps(&[&pb.url], 2).await;
    let settled = f.calls_to("/_wake").len();
    more_laps(&[&pb.url], 4).await;
    assert_eq!(f.calls_to("/_wake").len(), settled, "woken after unmarking");
    assert!(f.calls_to("/_alarm").is_empty());
}

/// Two worlds serve one namespace: the hostless one and `shop.test`. Rows a
/// `shop.test` worker wrote (its store stamps `hostname`) are woken, and
/// their alarms fired, on the `shop.test` worker only; with eight ids and a
/// worker of each world as candidates, a sweeper placing in any world sends
/// some to the hostless one (all eight land right by chance once in 256).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_a_hostname_world_are_woken_in_that_world_only() {
    let ns = unique_ns("worlds");
    let plain = store().await;
    let shop_store = Arc::new(
        PostgresStore::open(
            DATABASE_URL,
            PostgresOptions {
                hostname: "shop.test".into(),
                ..PostgresOptions::default()
            },
        )
        .await
        .expect("postgres"),
    );
    let pb = pinboard()
        .args(&sweeper_args(&INTERVAL_MS.to_string()))
        .start();
    let (hostless, _) = durable_in(&pb.url, &ns, plain.clone(), None).await;
    let (shop, _) = durable_in(&pb.url, &ns, shop_store.clone(), Some("shop.test")).await;

    let ids: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    for id in &ids {
        shop_store
            .set_tray(
                InstanceKey::new(&ns, id),
                TrayKey::singleton("inbox"),
                true,
                doc(json!({"~inbox": [1]})),
                0,
            )
            .await
            .expect("set marked");
    }
    set_due_alarm(shop_store.as_ref(), &ns, "s0").await;
    eventually(
        "every marked id woken on the shop.test worker",
        Duration::from_secs(10),
        || async {
            let woken: std::collections::BTreeSet<String> = shop
                .calls_to("/_wake")
                .iter()
                .map(|c| c.path.clone())
                .collect();
            (woken.len() == ids.len()).then_some(())
        },
    )
    .await;
    wait_calls(&shop, "/_alarm", 1, Duration::from_secs(5)).await;
    more_laps(&[&pb.url], 2).await;
    let strays: Vec<String> = hostless
        .calls
        .lock()
        .iter()
        .map(|c| c.path.clone())
        .collect();
    assert!(
        strays.is_empty(),
        "rows of shop.test reached the hostless world: {strays:?}"
    );
}

/// Waits until the nodes at `urls` ran `n` more sweeper laps between them
/// (laps count while holding the lease): the window in which a sweeper
/// that should not call again would have.
async fn more_laps(urls: &[&str], n: u64) {
    let laps = "pinboard_sweep_laps_total";
    test_support::metric_grows(&client(), urls, laps, n, Duration::from_secs(10)).await;
}

async fn lease_held(url: &str) -> bool {
    let Ok(res) = client().get(format!("{url}/metrics")).send().await else {
        return false;
    };
    res.text()
        .await
        .is_ok_and(|t| t.lines().any(|l| l == "pinboard_sweep_lease_held 1"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_redis_post_each_due_alarm_once_and_hand_over_when_the_holder_dies() {
    let ns = unique_ns("two");
    let prefix = redis_prefix("sweeper");
    let pg = store().await;
    let interval = INTERVAL_MS.to_string();
    let mut n1 = pinboard()
        .shared_redis(&prefix)
        .args(&sweeper_args(&interval))
        .start();
    let mut n2 = pinboard()
        .shared_redis(&prefix)
        .args(&sweeper_args(&interval))
        .start();
    let (f, _) = durable(&n1.url, &ns, pg.clone()).await;

    set_due_alarm(pg.as_ref(), &ns, "a1").await;
    wait_calls(&f, "/_alarm", 1, Duration::from_secs(5)).await;
    // Many laps later, still exactly one post.
    more_laps(&[&n1.url, &n2.url], 6).await;
    assert_eq!(f.calls_to("/_alarm").len(), 1);
    let (h1, h2) = (lease_held(&n1.url).await, lease_held(&n2.url).await);
    assert!(h1 ^ h2, "exactly one node holds the lease: {h1} {h2}");

    // The holder dies without releasing: the other node takes over within
    // the lease TTL (three intervals) and delivers the next alarm once.
    let (holder, other) = if h1 { (&mut n1, &n2) } else { (&mut n2, &n1) };
    let standby = metrics::scrape(&client(), &other.url).await;
    holder.kill();
    set_due_alarm(pg.as_ref(), &ns, "a2").await;
    let calls = wait_calls(&f, "a2/_alarm", 1, Duration::from_secs(5)).await;
    assert_eq!(calls.len(), 1);
    let taken = metrics::scrape(&client(), &other.url).await;
    assert_eq!(
        metrics::moved(&standby, &taken, "pinboard_sweep_lease_held"),
        1.0
    );
    more_laps(&[&other.url], 4).await;
    assert_eq!(f.calls_to("/_alarm").len(), 2, "each alarm posted once");
    redis_wipe(&prefix).await;
}
