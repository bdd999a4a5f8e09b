//! Hostile clients against pinboard while a well-behaved one keeps
//! calling: slowloris (heads dribbled a byte at a time), a connection flood
//! past the cap, and an id flood (thousands of random ids, far past what
//! the workers may hold). pinboard and the workers must keep serving the
//! well-behaved client, close what they cannot serve, and keep memory,
//! descriptors and placement rows bounded.

use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::support::RedisServer;
use super::support::{client, eventually, pinboard, wait_workers, Proc};
use super::{Scene, LEASE};

/// Longest a well-behaved id may go unanswered while pinboard is abused.
const SERVED_WITHIN: Duration = Duration::from_secs(3);

/// The abuse scenarios measure service, not lease timing: a longer lease
/// (6 s; heartbeats every second, a 2 s buffer) and a 5 s upstream
/// deadline, so that two busy cores delaying a heartbeat do not count as
/// an abuse getting through.
const ABUSE_PINBOARD_ARGS: [&str; 4] = ["--lease-ttl-ms", "6000", "--upstream-timeout-ms", "5000"];
const ABUSE_WORKER_ENV: [(&str, &str); 2] = [
    ("FLEET_HEARTBEAT_MS", "1000"),
    ("FLEET_LEASE_BUFFER_MS", "2000"),
];

/// Open descriptors of a process.
fn open_fds(p: &Proc) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", p.pid()))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Resident memory of a process, in kB.
fn rss_kb(p: &Proc) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", p.pid()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One slowloris connection: a request head sent one byte every 200 ms,
/// never finished. Answers how long pinboard kept it open (`None`: still
/// open after `patience`).
async fn slowloris(addr: &str, patience: Duration) -> Option<Duration> {
    let started = tokio::time::Instant::now();
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return Some(Duration::ZERO);
    };
    let head = b"GET /counter/slow/hit HTTP/1.1\r\nHost: pinboard\r\nX-Dribble: ";
    let mut buf = [0u8; 256];
    let mut sent = 0;
    while started.elapsed() < patience {
        let byte = head.get(sent).copied().unwrap_or(b'a');
        if s.write_all(&[byte]).await.is_err() {
            return Some(started.elapsed());
        }
        sent += 1;
        match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            // An answer (408/431) before the close is fine; keep reading.
            Ok(Ok(_)) | Err(_) => {}
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_and_a_connection_flood_leave_a_good_client_served() {
    let scene = Scene::new("slowloris", 8).await;
    let mut args = vec![
        "--max-connections",
        "200",
        "--header-read-timeout-ms",
        "1000",
        "--keep-alive-timeout-ms",
        "2000",
    ];
    args.extend_from_slice(&ABUSE_PINBOARD_ARGS);
    let pb = pinboard().args(&args).start();
    let _a = scene.worker(&pb.url, &ABUSE_WORKER_ENV);
    let _b = scene.worker(&pb.url, &ABUSE_WORKER_ENV);
    wait_workers(&client(), &pb.url, 2).await;
    let (load, _) = scene.load(&[&pb.url]);
    load.warm(Duration::from_secs(10)).await;
    let fds_before = open_fds(&pb);

    // 400 dribbling connections at once: twice the cap. Those over it are
    // closed on arrival, the others when their head runs out of time.
    let addr = pb.url.trim_start_matches("http://").to_owned();
    let patience = Duration::from_secs(8);
    let held: Vec<Option<Duration>> = stream::iter(0..400)
        .map(|_| slowloris(&addr, patience))
        .buffer_unordered(400)
        .collect()
        .await;
    let longest = held.iter().map(|h| h.unwrap_or(patience)).max();
    assert!(
        held.iter()
            .all(|h| h.is_some_and(|d| d < Duration::from_secs(4))),
        "a slowloris connection outlived the header deadline: longest {longest:?}"
    );
    // Descriptors come back to where they were.
    eventually(
        "pinboard's descriptors to settle",
        Duration::from_secs(5),
        || async { (open_fds(&pb) <= fds_before + 8).then_some(()) },
    )
    .await;
    load.rounds(3, LEASE * 4).await;
    let summary = scene.finish("slowloris", load).await;
    assert!(
        summary.longest_gap < SERVED_WITHIN,
        "the good client waited {:?}: {summary:?}",
        summary.longest_gap
    );
    assert_eq!(summary.failed, 0, "{summary:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_flood_leaves_a_good_client_served_and_rows_bounded() {
    const MAX_INSTANCES: usize = 100;
    const FLOOD: usize = 2_000;
    let redis = RedisServer::start();
    let scene = Scene::new("idflood", 8).await;
    let mut args = vec![
        "--redis-url",
        redis.url.as_str(),
        "--placement-grace-ms",
        "1000",
    ];
    args.extend_from_slice(&ABUSE_PINBOARD_ARGS);
    let pb = pinboard().args(&args).start();
    let max = MAX_INSTANCES.to_string();
    let mut env = ABUSE_WORKER_ENV.to_vec();
    env.push(("FLEET_MAX_INSTANCES", &max));
    let _a = scene.worker(&pb.url, &env);
    let _b = scene.worker(&pb.url, &env);
    wait_workers(&client(), &pb.url, 2).await;
    let (load, _) = scene.load(&[&pb.url]);
    load.warm(Duration::from_secs(10)).await;
    let rss_before = rss_kb(&pb);

    // Random ids, 16 at a time: each is placed, activated, and soon evicted
    // (least recently used first) to admit the next.
    let c = client();
    let statuses: Vec<u16> = stream::iter(0..FLOOD)
        .map(|_| {
            let c = c.clone();
            let url = format!(
                "{}/counter/flood-{:016x}/hit",
                pb.url,
                rand::random::<u64>()
            );
            async move {
                match c.get(url).send().await {
                    Ok(r) => r.status().as_u16(),
                    Err(e) => panic!("flood call: {e}"),
                }
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "unexpected answers to the flood: {:?}",
        statuses
            .iter()
            .filter(|s| **s != 200 && **s != 503)
            .collect::<Vec<_>>()
    );
    assert!(
        served > FLOOD / 2,
        "only {served} of {FLOOD} flood calls served"
    );

    // Rows: the workers' live instances, plus what was vacated within one
    // grace; once the grace passed, no more than the live instances and
    // the few keys of sessions and the generation.
    let bound = (2 * MAX_INSTANCES + 8 + 16) as u64;
    eventually(
        "placement rows to shrink to the live instances",
        Duration::from_secs(10),
        || async { (redis.dbsize().await <= bound).then_some(()) },
    )
    .await;
    let grown_kb = rss_kb(&pb).saturating_sub(rss_before);
    assert!(
        grown_kb < 64 * 1024,
        "pinboard grew {grown_kb} kB over the flood"
    );
    load.rounds(3, LEASE * 4).await;
    let summary = scene.finish("id-flood", load).await;
    assert!(
        summary.longest_gap < SERVED_WITHIN,
        "the good client waited {:?}: {summary:?}",
        summary.longest_gap
    );
    eprintln!("id-flood: {served}/{FLOOD} served, pinboard grew {grown_kb} kB");
}
