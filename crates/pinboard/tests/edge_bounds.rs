//! Bounds of pinboard's own HTTP server, against the real process: at the
//! connection cap the connection idle longest is closed to admit a new
//! one, and one in the middle of a head, a request or an upgrade never is;
//! with none idle a connection over the cap is closed on arrival while the
//! open ones keep being served, and `/healthz` answers on a fresh
//! connection as soon as one leaves; the cap follows the open-file limit,
//! so connections can never exhaust descriptors and starve `accept`; when
//! descriptors run out all the same, a failed accept is counted and
//! accepting resumes once one is free.

mod support;

use std::time::Duration;

use support::raw::{
    connect, metric, raw_worker, read_reply, wait_closed, Act, Answer, Ended, Gate, Seen,
};
use support::{eventually, pinboard, Proc};
use test_support::metrics::{self, Scrape};
use test_support::sockets::{
    admitted, answer, closed_within, idle_after, mid_head, request, scrape_once,
};
use test_support::PATIENCE;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: pinboard\r\n\r\n";
/// [`HEAD`] without its blank line: a head in progress.
const HALF_HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: pinboard\r\n";

/// `/healthz` on a fresh connection: `true` if it answered 200, `false`
/// if the connection was closed without an answer.
async fn healthz_on_fresh_connection(pb: &Proc) -> bool {
    let mut s = connect(pb.addr()).await;
    if s.write_all(HEAD).await.is_err() {
        return false;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return false,
            Ok(Ok(n)) => {
                got.extend_from_slice(&buf[..n]);
                if got.starts_with(b"HTTP/1.1 200") {
                    return true;
                }
                if got.len() >= 12 {
                    panic!("unexpected answer {:?}", String::from_utf8_lossy(&got));
                }
            }
            Err(_) => panic!("no answer and no close within 5 s"),
        }
    }
}

/// Waits until `/healthz` answers on a fresh connection.
async fn wait_healthz(pb: &Proc, patience: Duration) {
    eventually("/healthz to answer again", patience, || async {
        healthz_on_fresh_connection(pb).await.then_some(())
    })
    .await;
}

/// A scrape taken once pinboard holds no connection but the scrape's own
/// (the registration's client has gone): the connections a test opens
/// next are all it holds.
async fn alone(pb: &Proc) -> Scrape {
    eventually("pinboard to hold no other connection", PATIENCE, || async {
        let scrape = scrape_once(pb.addr()).await?;
        (scrape.value("pinboard_connections_open") == 1.0).then_some(scrape)
    })
    .await
}

/// An upgraded connection through `pb` to a worker that echoes: switched,
/// and echoing.
async fn upgraded(pb: &Proc) -> TcpStream {
    let mut s = connect(pb.addr()).await;
    let head =
        b"GET /counter/ws/x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
    let switched = request(&mut s, head, PATIENCE).await;
    assert_eq!(switched.map(|(status, _)| status), Some(101));
    assert_echoes(&mut s).await;
    s
}

/// `s` (upgraded) echoes what it is sent.
async fn assert_echoes(s: &mut TcpStream) {
    s.write_all(b"ping").await.expect("write");
    let mut echo = [0u8; 4];
    tokio::time::timeout(PATIENCE, s.read_exact(&mut echo))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&echo, b"ping");
}

/// The issue this closes: idle keep-alive connections (a browser's, a
/// pooled client's) filled the cap, and a new client was turned away for
/// the whole keep-alive timeout. Now the longest idle one makes room once
/// it has idled a second; the connections busy in a head, a request or an
/// upgrade, though older, are left alone and finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_the_longest_idle_connection_makes_room_and_busy_ones_stay() {
    let pb = pinboard()
        .args(&["--max-connections", "6", "--lease-ttl-ms", "60000"])
        .start();
    let (arrived, release) = (Gate::new(), Gate::new());
    let (a, r) = (arrived.clone(), release.clone());
    raw_worker(&pb.url, "reclaim", move |seen: &Seen, _| {
        if seen.request_line.contains("/ws/") {
            return Answer::SwitchEcho;
        }
        Answer::Script(vec![
            Act::Open(a.clone()),
            Act::Wait(r.clone()),
            Act::Write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nslow".to_vec()),
        ])
    })
    .await;
    let before = alone(&pb).await;

    // Oldest first: an upgraded connection, a request the worker holds, a
    // head in progress; then three idle keep-alive connections fill the cap.
    let mut switched = upgraded(&pb).await;
    let mut slow = connect(pb.addr()).await;
    slow.write_all(b"GET /counter/s/slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    arrived
        .pass_within(PATIENCE, "the slow request at the worker")
        .await;
    let mut half = mid_head(pb.addr(), HALF_HEAD).await;
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(idle_after(pb.addr(), HEAD).await);
    }

    // A new client is served (once the idle ones have idled a second, so
    // none was a pooled client about to send its next request)...
    let fresh = admitted(pb.addr(), HEAD).await;
    // ...in the place of the longest idle connection.
    assert!(
        closed_within(&mut idle[0], PATIENCE).await,
        "the longest idle connection is still open"
    );
    for s in &mut idle[1..] {
        let again = request(s, HEAD, PATIENCE).await;
        assert_eq!(again.map(|(status, _)| status), Some(200));
    }
    // The busy ones were never touched.
    assert_echoes(&mut switched).await;
    release.open();
    let slow_answer = answer(&mut slow, PATIENCE).await;
    assert_eq!(slow_answer, Some((200, b"slow".to_vec())));
    half.write_all(b"\r\n").await.expect("write");
    let finished = answer(&mut half, PATIENCE).await;
    assert_eq!(finished.map(|(status, _)| status), Some(200));

    drop((switched, slow, half, idle, fresh));
    let after = alone(&pb).await;
    // At least one: the scrapes waiting for the others to go may have
    // made room the same way.
    assert!(metrics::moved(&before, &after, "pinboard_connections_reclaimed") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_none_idle_a_connection_over_the_cap_is_closed_and_healthz_answers_once_one_leaves() {
    let pb = pinboard().args(&["--max-connections", "8"]).start();
    let mut open = Vec::new();
    for _ in 0..8 {
        open.push(mid_head(pb.addr(), HALF_HEAD).await);
    }
    // The ninth is accepted and closed at once, before any answer.
    let mut ninth = connect(pb.addr()).await;
    let (ended, got) = wait_closed(&mut ninth, Duration::from_secs(5)).await;
    assert_eq!(ended, Ended::Closed);
    assert!(got.is_empty(), "{got:?}");
    assert!(!healthz_on_fresh_connection(&pb).await);

    // The connections already open keep being served.
    for s in &mut open[..3] {
        s.write_all(b"\r\n").await.expect("write");
        assert_eq!(read_reply(s, Duration::from_secs(5)).await.status, 200);
    }

    // Two leave: a fresh connection is served again.
    open.truncate(6);
    wait_healthz(&pb, Duration::from_secs(5)).await;
    drop(open);
    wait_healthz(&pb, Duration::from_secs(5)).await;
    assert!(metric(&pb.url, "pinboard_connections_refused_total").await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_keeps_its_slot_until_it_closes() {
    let pb = pinboard()
        .args(&["--max-connections", "2", "--lease-ttl-ms", "60000"])
        .start();
    raw_worker(&pb.url, "echo", |_, _| Answer::SwitchEcho).await;
    alone(&pb).await;

    // The upgraded connection and a head in progress fill the cap.
    let upgraded = upgraded(&pb).await;
    let _half = mid_head(pb.addr(), HALF_HEAD).await;
    assert!(!healthz_on_fresh_connection(&pb).await);
    drop(upgraded);
    wait_healthz(&pb, Duration::from_secs(5)).await;
}

/// Whether the server has closed `s` (EOF or reset), without waiting.
fn closed_by_peer(s: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    !matches!(s.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_beyond_the_open_file_limit_never_starve_accept() {
    // 256 descriptors carry (256 - 64) / 2 = 96 client connections. The
    // header deadline is long: only the cap closes anything here.
    let pb = pinboard()
        .nofile(256)
        .args(&["--header-read-timeout-ms", "60000"])
        .name("pinboard-nofile")
        .start();
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(connect(pb.addr()).await);
    }
    // Those over the cap were closed (on arrival, or a silent one made room
    // for a newer one) until exactly the cap's worth is left.
    eventually("the cap's worth left open", PATIENCE, || async {
        let open = silent.iter().filter(|s| !closed_by_peer(s)).count();
        (open == 96).then_some(())
    })
    .await;
    // A client that speaks takes the place of a silent one.
    wait_healthz(&pb, Duration::from_secs(5)).await;
    drop(silent);

    let log = pb.log_text();
    assert!(
        log.contains("--max-connections lowered"),
        "the cap was not lowered: {log}"
    );
    assert!(
        !log.contains("accept failed"),
        "accept ran out of descriptors: {log}"
    );
}

/// The lowest descriptor number `pid` does not hold: the next one it
/// opens gets it.
fn lowest_free_fd(pid: u32) -> u64 {
    let held: std::collections::BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd table")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    (0..)
        .find(|fd| !held.contains(fd))
        .expect("a free descriptor")
}

/// Sets the soft open-file limit of the running process `pid`.
fn set_open_file_limit(pid: u32, soft: &str) {
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:")])
        .status()
        .expect("prlimit");
    assert!(status.success(), "prlimit --nofile={soft}: {status}");
}

/// The soft open-file limit of `pid`, as `/proc/<pid>/limits` writes it.
fn open_file_limit(pid: u32) -> String {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("open files line");
    let soft = line.split_whitespace().nth(3).expect("soft limit");
    soft.to_owned()
}

/// Descriptors can still run out under pinboard (the limit lowered under
/// the running process here): a failed accept is counted, the loop pauses
/// instead of spinning, and the waiting client is served once one is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_accept_is_counted_and_accepting_resumes_once_a_descriptor_frees() {
    let pb = pinboard().name("pinboard-emfile").start();
    let c = support::client();
    let before = metrics::scrape(&c, &pb.url).await;
    let limit = open_file_limit(pb.pid());
    // Every descriptor it may open taken: the next accept fails.
    set_open_file_limit(pb.pid(), &lowest_free_fd(pb.pid()).to_string());
    let mut waiting = connect(pb.addr()).await;
    waiting.write_all(HEAD).await.expect("write");
    eventually("a failed accept", Duration::from_secs(5), || async {
        pb.log_text().contains("accept failed").then_some(())
    })
    .await;
    set_open_file_limit(pb.pid(), &limit);
    let reply = read_reply(&mut waiting, Duration::from_secs(5)).await;
    assert_eq!(reply.status, 200);
    let after = metrics::scrape(&c, &pb.url).await;
    assert!(metrics::moved(&before, &after, "pinboard_accept_errors") >= 1.0);
}
