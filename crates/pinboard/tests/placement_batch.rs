//! The Redis store's claim batching (Redis on `127.0.0.1:6379`): ops that
//! share one script call are answered each on its own, exactly as one by
//! one (a conflict or a failing op touches no other), the owner indexes and
//! the unsettled set end as the ops in turn would leave them, and a batch
//! Redis never answers, or whose connection is cut, answers every caller
//! within the deadline.
//!
//! The tests run on the current-thread runtime: ops started together by
//! one `join_all` are all queued before the batcher's task runs, so they
//! leave as one batch (checked through `batch_stats`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture, FutureExt as _};
use pinboard::clock::Now;
use pinboard::placement::{
    Batching, ClaimOutcome, Generation, InstanceKey, Placement, PlacementStore, RedisStore,
    StoreError, WorkerRecord,
};
use redis::AsyncCommands as _;
use test_support::until;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const NS: &str = "/c";
const FLOOR: u64 = 1_000_000;

fn rec(sid: &str) -> WorkerRecord {
    support::record(sid, NS)
}

fn now() -> Now {
    support::fixed_now()
}

fn key(id: &str) -> InstanceKey<'_> {
    InstanceKey::new(NS, id)
}

/// One batched call's answer, whichever kind.
#[derive(Debug)]
enum Answer {
    Claim(Result<ClaimOutcome, StoreError>),
    Settle(Result<bool, StoreError>),
}

fn claim<'a>(
    store: &'a RedisStore,
    gen: &'a Generation,
    id: &'a str,
    candidate: Option<&'a str>,
    stale: Option<(&'a str, u64)>,
) -> BoxFuture<'a, Answer> {
    async move {
        Answer::Claim(
            store
                .resolve_or_claim(key(id), candidate, stale, FLOOR, gen, now())
                .await,
        )
    }
    .boxed()
}

fn settle<'a>(
    store: &'a RedisStore,
    id: &'a str,
    sid: &'a str,
    epoch: u64,
) -> BoxFuture<'a, Answer> {
    async move { Answer::Settle(store.settle(key(id), sid, epoch).await) }.boxed()
}

/// A claim's outcome, failing the test on anything else.
async fn outcome_of(op: BoxFuture<'_, Answer>) -> ClaimOutcome {
    match op.await {
        Answer::Claim(Ok(o)) => o,
        other => panic!("claim answered {other:?}"),
    }
}

fn claimed(sid: &str, epoch: u64) -> ClaimOutcome {
    ClaimOutcome::Claimed(
        Placement {
            session_id: sid.into(),
            epoch,
        },
        None,
    )
}

/// A claim that took a row `from` owned.
fn moved(sid: &str, epoch: u64, from: &str) -> ClaimOutcome {
    ClaimOutcome::Claimed(
        Placement {
            session_id: sid.into(),
            epoch,
        },
        Some(from.into()),
    )
}

fn owned(sid: &str, epoch: u64) -> ClaimOutcome {
    ClaimOutcome::Owned(Placement {
        session_id: sid.into(),
        epoch,
    })
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(test_support::SHARED_REDIS)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis on 127.0.0.1:6379")
}

/// A store on the shared Redis (or `url`), one batch in flight at a time,
/// with `s1` and `s2` registered and the generation opened.
async fn store(url: &str, prefix: &str, deadline: Duration) -> (RedisStore, Generation) {
    let batching = Batching {
        max_in_flight: 1,
        deadline,
        ..Batching::default()
    };
    let store = RedisStore::connect_with(url, prefix, batching)
        .await
        .expect("connect");
    let gen = store
        .open_generation(&Generation::new("g", 0))
        .await
        .expect("generation");
    for sid in ["s1", "s2"] {
        store
            .put_worker(&rec(sid), 60_000, now())
            .await
            .expect("put");
    }
    (store, gen)
}

#[tokio::test]
async fn a_batch_answers_each_op_as_one_by_one_would() {
    let prefix = support::redis_prefix("batch-ops");
    let (store, gen) = store(test_support::SHARED_REDIS, &prefix, Duration::from_secs(10)).await;
    // Set up, one call at a time: `taken` owned by s1; `was` served
    // (settled) and released by s1 (kept for its grace, with a TTL);
    // `orphan` tagged by s3, which is then removed; a row of the wrong type.
    store
        .put_worker(&rec("s3"), 60_000, now())
        .await
        .expect("put");
    for (id, sid) in [("taken", "s1"), ("was", "s1"), ("orphan", "s3")] {
        let op = claim(&store, &gen, id, Some(sid), None);
        assert_eq!(outcome_of(op).await, claimed(sid, FLOOR));
    }
    assert!(store.settle(key("was"), "s1", FLOOR).await.expect("settle"));
    assert!(store
        .release(key("was"), "s1", None)
        .await
        .expect("release"));
    assert!(store
        .tag(key("orphan"), "s3", None, "t")
        .await
        .expect("tag"));
    assert!(store.remove_worker("s3").await.expect("remove"));
    let mut r = redis().await;
    let row = |id: &str| format!("{prefix}p:{NS}/{id}");
    let _: () = r.set(row("bad"), "not a hash").await.expect("set");
    let other_gen = Generation("another".into());

    let before = store.batch_stats();
    let answers = join_all([
        // Two new ids, and one claimed twice: the first wins.
        claim(&store, &gen, "n1", Some("s1"), None),
        claim(&store, &gen, "n2", Some("s2"), None),
        claim(&store, &gen, "dup", Some("s1"), None),
        claim(&store, &gen, "dup", Some("s2"), None),
        // `dup` refused by s1 (stale at its epoch): s2 takes it over.
        claim(&store, &gen, "dup", Some("s2"), Some(("s1", FLOOR))),
        // Conflicts: owned, no candidate, gone candidate, other generation.
        claim(&store, &gen, "taken", Some("s2"), None),
        claim(&store, &gen, "n3", None, None),
        claim(&store, &gen, "n3", Some("s9"), None),
        claim(&store, &other_gen, "n3", Some("s1"), None),
        // A row of the wrong type fails alone.
        claim(&store, &gen, "bad", Some("s1"), None),
        // A released row and an orphan are taken over above their epoch.
        claim(&store, &gen, "was", Some("s2"), None),
        claim(&store, &gen, "orphan", Some("s2"), None),
        // Settles: stale ones change nothing, the current one settles.
        settle(&store, "dup", "s1", FLOOR),
        settle(&store, "dup", "s2", FLOOR + 1),
        settle(&store, "n1", "s1", FLOOR + 7),
        settle(&store, "taken", "s1", FLOOR),
    ])
    .await;
    let after = store.batch_stats();
    assert_eq!(
        (after.batches - before.batches, after.ops - before.ops),
        (1, answers.len() as u64),
        "one batch carried every op"
    );
    let outcome = |i: usize| match &answers[i] {
        Answer::Claim(Ok(o)) => o.clone(),
        other => panic!("op {i}: {other:?}"),
    };
    let settled = |i: usize| match &answers[i] {
        Answer::Settle(Ok(b)) => *b,
        other => panic!("op {i}: {other:?}"),
    };
    assert_eq!(outcome(0), claimed("s1", FLOOR));
    assert_eq!(outcome(1), claimed("s2", FLOOR));
    assert_eq!(outcome(2), claimed("s1", FLOOR));
    assert_eq!(outcome(3), owned("s1", FLOOR));
    assert_eq!(outcome(4), moved("s2", FLOOR + 1, "s1"));
    assert_eq!(outcome(5), owned("s1", FLOOR));
    assert_eq!(outcome(6), ClaimOutcome::Vacant);
    assert_eq!(outcome(7), ClaimOutcome::CandidateGone);
    assert_eq!(outcome(8), ClaimOutcome::GenerationLost(Some(gen.clone())));
    assert!(
        matches!(&answers[9], Answer::Claim(Err(StoreError::Redis(e))) if e.to_string().contains("WRONGTYPE")),
        "the wrong-type row fails on its own: {:?}",
        answers[9]
    );
    assert_eq!(outcome(10), claimed("s2", FLOOR + 1), "released: no owner");
    assert_eq!(outcome(11), moved("s2", FLOOR + 1, "s3"));
    assert!(!settled(12), "s1 no longer owns dup");
    assert!(settled(13));
    assert!(!settled(14), "n1 is not at that epoch");
    assert!(settled(15));

    // The sets end as the ops in turn leave them.
    let members = |set: String| {
        let mut r = r.clone();
        async move {
            let mut m: Vec<String> = r.smembers(set).await.expect("smembers");
            m.sort();
            m
        }
    };
    let names = |ids: &[&str]| {
        ids.iter()
            .map(|id| format!("{NS}/{id}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        members(format!("{prefix}o:s1")).await,
        names(&["n1", "taken"])
    );
    assert_eq!(
        members(format!("{prefix}o:s2")).await,
        names(&["dup", "n2", "orphan", "was"])
    );
    assert!(members(format!("{prefix}o:s3")).await.is_empty());
    assert_eq!(
        members(format!("{prefix}unsettled")).await,
        names(&["n1", "n2", "orphan", "was"])
    );
    for id in ["was", "orphan"] {
        let got: (Option<String>, Option<String>, Option<String>, i64) = redis::pipe()
            .hget(row(id), "s")
            .hget(row(id), "e")
            .hget(row(id), "t")
            .pttl(row(id))
            .query_async(&mut r)
            .await
            .expect("row");
        assert_eq!(
            got,
            (Some("s2".into()), Some((FLOOR + 1).to_string()), None, -1),
            "{id} owned again: no tag, no TTL"
        );
    }
    let bad: String = r.get(row("bad")).await.expect("get");
    assert_eq!(bad, "not a hash", "the failed op wrote nothing");
    support::redis_wipe(&prefix).await;
}

#[tokio::test]
async fn a_batch_cut_by_a_redis_failure_answers_every_caller() {
    let prefix = support::redis_prefix("batch-cut");
    let relay = Relay::start().await;
    let (store, gen) = store(&relay.url(), &prefix, Duration::from_secs(30)).await;
    relay.set(Mode::Hold);
    let before = store.batch_stats();
    let ids: Vec<String> = (0..20).map(|i| format!("cut-{i}")).collect();
    let ops = ids
        .iter()
        .map(|id| claim(&store, &gen, id, Some("s1"), None))
        .chain([settle(&store, "cut-0", "s1", FLOOR)]);
    let cut = async {
        until("the batch to be sent", Duration::from_secs(10), || {
            store.batch_stats().batches > before.batches
        })
        .await;
        relay.set(Mode::Cut);
    };
    let started = tokio::time::Instant::now();
    let (answers, ()) = tokio::join!(join_all(ops), cut);
    assert_eq!(store.batch_stats().batches - before.batches, 1);
    for (i, answer) in answers.iter().enumerate() {
        assert!(
            matches!(
                answer,
                Answer::Claim(Err(StoreError::Redis(_)))
                    | Answer::Settle(Err(StoreError::Redis(_)))
            ),
            "op {i} answered {answer:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "answered by the cut, not the deadline"
    );
    support::redis_wipe(&prefix).await;
}

#[tokio::test]
async fn a_batch_redis_never_answers_times_out_for_every_caller() {
    let prefix = support::redis_prefix("batch-hold");
    let relay = Relay::start().await;
    let deadline = Duration::from_millis(300);
    let (store, gen) = store(&relay.url(), &prefix, deadline).await;
    relay.set(Mode::Hold);
    let ids: Vec<String> = (0..10).map(|i| format!("held-{i}")).collect();
    let started = tokio::time::Instant::now();
    let answers = join_all(
        ids.iter()
            .map(|id| claim(&store, &gen, id, Some("s1"), None)),
    )
    .await;
    for (i, answer) in answers.iter().enumerate() {
        assert!(
            matches!(answer, Answer::Claim(Err(StoreError::Timeout(_)))),
            "op {i} answered {answer:?}"
        );
    }
    assert!(started.elapsed() >= deadline);
    // Answers flow again: the store goes on (the late answers of the held
    // batch are matched to it and dropped).
    relay.set(Mode::Pass);
    let op = claim(&store, &gen, "after", Some("s1"), None);
    assert_eq!(outcome_of(op).await, claimed("s1", FLOOR));
    relay.set(Mode::Cut);
    support::redis_wipe(&prefix).await;
}

/// What the relay does with Redis' answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Passes them on.
    Pass,
    /// Keeps them (requests still reach Redis): nothing is answered.
    Hold,
    /// Closes every connection it relays.
    Cut,
}

/// A TCP relay to the shared Redis whose answers can be held or cut.
struct Relay {
    addr: std::net::SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
}

impl Relay {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mode = Arc::new(watch::Sender::new(Mode::Pass));
        let modes = mode.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect("127.0.0.1:6379").await else {
                    continue;
                };
                tokio::spawn(relay(client, server, modes.subscribe()));
            }
        });
        Self { addr, mode }
    }

    fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

/// Copies both ways until either side closes or the mode is `Cut`;
/// answers wait while it is `Hold`.
async fn relay(client: TcpStream, server: TcpStream, mut mode: watch::Receiver<Mode>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut up = [0u8; 16 * 1024];
    let mut down = [0u8; 16 * 1024];
    loop {
        let current = *mode.borrow_and_update();
        if current == Mode::Cut {
            return;
        }
        tokio::select! {
            n = client_read.read(&mut up) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => if server_write.write_all(&up[..n]).await.is_err() { return },
            },
            n = server_read.read(&mut down), if current == Mode::Pass => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => if client_write.write_all(&down[..n]).await.is_err() { return },
            },
            changed = mode.changed() => if changed.is_err() { return },
        }
    }
}
