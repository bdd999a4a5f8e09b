//! Bounds of pinboard's own HTTP server, against the real process: a
//! connection over the cap is closed on arrival while the connections
//! already open keep being served, `/healthz` answers on a fresh connection
//! as soon as others close, and the cap follows the open-file limit, so
//! idle connections can never exhaust descriptors and starve `accept`;
//! when descriptors run out all the same, a failed accept is counted and
//! accepting resumes once one is free.

mod support;

use std::time::Duration;

use support::raw::{connect, metric, raw_worker, read_reply, wait_closed, Answer, Ended};
use support::{eventually, pinboard, Proc};
use test_support::metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: pinboard\r\n\r\n";

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

/// A connection that completed one request (so it is surely accepted and
/// counted) and stays open, idle.
async fn served_connection(pb: &Proc) -> TcpStream {
    let mut s = connect(pb.addr()).await;
    s.write_all(HEAD).await.expect("write");
    assert_eq!(read_reply(&mut s, Duration::from_secs(5)).await.status, 200);
    s
}

/// Sends `head` on fresh connections until one is not turned away at the
/// cap (connections that just closed leave it a moment later); returns it
/// with the first bytes of its answer.
async fn admitted(pb: &Proc, head: &[u8]) -> (TcpStream, Vec<u8>) {
    eventually(
        "admission under the cap",
        Duration::from_secs(5),
        || async {
            let mut s = connect(pb.addr()).await;
            s.write_all(head).await.ok()?;
            let mut buf = vec![0u8; 1024];
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .ok()?
                .ok()?;
            (n > 0).then(|| {
                buf.truncate(n);
                (s, buf)
            })
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_closed_and_healthz_answers_once_others_close() {
    let pb = pinboard().args(&["--max-connections", "8"]).start();
    let mut open = Vec::new();
    for _ in 0..8 {
        open.push(served_connection(&pb).await);
    }
    // The ninth is accepted and closed at once, before any answer.
    let mut ninth = connect(pb.addr()).await;
    let (ended, got) = wait_closed(&mut ninth, Duration::from_secs(5)).await;
    assert_eq!(ended, Ended::Closed);
    assert!(got.is_empty(), "{got:?}");
    assert!(!healthz_on_fresh_connection(&pb).await);

    // The connections already open keep being served.
    for s in &mut open[..3] {
        s.write_all(HEAD).await.expect("write");
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

    let (mut upgraded, answer) = admitted(
        &pb,
        b"GET /counter/ws/x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    )
    .await;
    assert!(
        answer.starts_with(b"HTTP/1.1 101") && answer.ends_with(b"\r\n\r\n"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
    upgraded.write_all(b"ping").await.expect("write");
    let mut echo = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), upgraded.read_exact(&mut echo))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&echo, b"ping");

    // The upgraded connection and one more fill the cap.
    let (_idle, answer) = admitted(&pb, HEAD).await;
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    assert!(!healthz_on_fresh_connection(&pb).await);
    drop(upgraded);
    wait_healthz(&pb, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_beyond_the_open_file_limit_never_starve_accept() {
    // 256 descriptors carry (256 - 64) / 2 = 96 client connections.
    let pb = pinboard().nofile(256).name("pinboard-nofile").start();
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(connect(pb.addr()).await);
    }
    // Accepts are in arrival order: once the last one is closed, every
    // connection has been either kept or closed.
    let last = idle.last_mut().expect("connections");
    assert_eq!(
        wait_closed(last, Duration::from_secs(5)).await.0,
        Ended::Closed
    );
    let mut still_open = 0;
    for s in &mut idle {
        let (ended, _) = wait_closed(s, Duration::from_millis(10)).await;
        still_open += usize::from(ended == Ended::Open);
    }
    assert_eq!(still_open, 96, "open connections at the cap");
    assert!(!healthz_on_fresh_connection(&pb).await);
    drop(idle);
    wait_healthz(&pb, Duration::from_secs(5)).await;

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
