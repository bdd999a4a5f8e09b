//! Sockets that survive moves and deploys (`SocketOptions::survive_moves`):
//! clients connected through pinboard to a room whose sockets pinboard
//! holds keep them open, and keep being answered and hearing broadcasts,
//! while the rooms' owner is drained for a new worker (a deploy) and that
//! worker is then SIGKILLed and another takes over (a failover).
//!
//! Each client sends `m1`, `m2`, … throughout, one at a time; the room
//! answers each on its socket with `ack <seq> m<n>`, so the client checks
//! that every message reached the object at least once, in order, with
//! the event's sequence number equal to its own count.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use parking_lot::Mutex;
use support::{client, pinboard, room_seen, rust_worker, until_explained, wait_workers};
use test_support::metrics;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

/// Sockets per room.
const PER_ROOM: usize = 10;

#[derive(Default)]
struct Log {
    /// Text messages received, in order, with when.
    received: Vec<(Instant, String)>,
    /// How the socket ended, if it did.
    ended: Option<String>,
    /// When each `m<n>` was sent (index n-1).
    sent_at: Vec<Instant>,
    /// The longest wait for an ack.
    longest: Duration,
}

struct Client {
    room: usize,
    log: Arc<Mutex<Log>>,
}

impl Client {
    fn acks(&self) -> usize {
        self.log
            .lock()
            .received
            .iter()
            .filter(|(_, text)| text.starts_with("ack "))
            .count()
    }

    fn heard(&self, text: &str) -> bool {
        self.log.lock().received.iter().any(|(_, got)| got == text)
    }
}

async fn connect(
    pb: &str,
    room: usize,
    pace: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (Client, tokio::task::JoinHandle<()>) {
    let url = format!("{}/rooms/r{room}/ws", pb.replacen("http", "ws", 1));
    let (ws, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("connect");
    let (mut sink, mut stream) = ws.split();
    let log: Arc<Mutex<Log>> = Arc::default();
    let heard = Arc::new(Notify::new());
    {
        let (log, heard) = (log.clone(), heard.clone());
        tokio::spawn(async move {
            loop {
                match stream.next().await {
                    Some(Ok(Message::Text(text))) => {
                        log.lock().received.push((Instant::now(), text.to_string()));
                        heard.notify_waiters();
                    }
                    Some(Ok(Message::Close(frame))) => {
                        log.lock().ended = Some(format!("close {frame:?}"));
                        break;
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        log.lock().ended = Some(format!("error {e}"));
                        break;
                    }
                    None => {
                        log.lock().ended = Some("stream ended".into());
                        break;
                    }
                }
                heard.notify_waiters();
            }
            heard.notify_waiters();
        });
    }
    let sender = {
        let (log, heard) = (log.clone(), heard.clone());
        tokio::spawn(async move {
            // Each client sends at most one message per `pace` (and the
            // next only once the last was answered): the load's rate.
            let mut ticks = tokio::time::interval(pace);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0usize;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                ticks.tick().await;
                n += 1;
                let text = format!("m{n}");
                let sent = Instant::now();
                log.lock().sent_at.push(sent);
                if sink.send(Message::text(text.clone())).await.is_err() {
                    return;
                }
                // The ack, within the event deadline and some.
                let deadline = sent + Duration::from_secs(45);
                loop {
                    let waiting = heard.notified();
                    {
                        let log = log.lock();
                        if log
                            .received
                            .iter()
                            .any(|(_, got)| got.ends_with(&format!(" {text}")))
                        {
                            break;
                        }
                        if log.ended.is_some() {
                            return;
                        }
                    }
                    if tokio::time::timeout_at(deadline, waiting).await.is_err() {
                        return;
                    }
                }
                let waited = sent.elapsed();
                {
                    let mut log = log.lock();
                    log.longest = log.longest.max(waited);
                }
            }
        })
    };
    (Client { room, log }, sender)
}

async fn every_client_acked_more(clients: &[Client], what: &str, more: usize) {
    let marks: Vec<usize> = clients.iter().map(Client::acks).collect();
    let behind = || -> Vec<usize> {
        clients
            .iter()
            .zip(&marks)
            .enumerate()
            .filter(|(_, (c, mark))| c.acks() < **mark + more)
            .map(|(i, _)| i)
            .collect()
    };
    until_explained(
        what,
        Duration::from_secs(60),
        || behind().is_empty(),
        || {
            let behind = behind();
            let ended = clients
                .iter()
                .filter(|c| c.log.lock().ended.is_some())
                .count();
            format!(
                "{} clients behind (first {:?}), {ended} ended",
                behind.len(),
                &behind[..behind.len().min(5)]
            )
        },
    )
    .await;
}

async fn broadcast_reaches_all(
    c: &reqwest::Client,
    pb: &str,
    clients: &[Client],
    rooms: usize,
    text: &str,
) {
    for room in 0..rooms {
        let r = c
            .post(format!("{pb}/rooms/r{room}/broadcast"))
            .body(text.to_owned())
            .send()
            .await
            .expect("broadcast");
        assert!(
            r.status().is_success(),
            "broadcast to r{room}: {}",
            r.status()
        );
    }
    let missing = || clients.iter().filter(|c| !c.heard(text)).count();
    until_explained(
        &format!("broadcast {text} to reach every socket"),
        Duration::from_secs(30),
        || missing() == 0,
        || format!("{} sockets have not heard it", missing()),
    )
    .await;
}

async fn survive(sockets: usize, pace: Duration) {
    let pb = pinboard().start();
    let worker = |name: &str| {
        rust_worker(&pb.url)
            .env("FLEET_ROOMS_NS", "/rooms")
            .env("FLEET_DRAIN_MS", "2000")
            .name(name)
    };
    let mut a = worker("held-a").start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;

    let before = metrics::scrape(&c, &pb.url).await;
    let rooms = sockets.div_ceil(PER_ROOM);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    let mut senders = Vec::new();
    for i in 0..sockets {
        let (client, sender) = connect(&pb.url, i % rooms, pace, stop.clone()).await;
        clients.push(client);
        senders.push(sender);
    }
    every_client_acked_more(&clients, "every socket answered through the first owner", 1).await;
    broadcast_reaches_all(&c, &pb.url, &clients, rooms, "b-first-owner").await;
    let holding = metrics::scrape(&c, &pb.url).await;
    assert_eq!(holding.value("pinboard_held_sockets"), sockets as f64);

    // A deploy: B registers, A is drained (SIGTERM) and exits.
    let mut b = worker("held-b").start();
    wait_workers(&c, &pb.url, 2).await;
    a.terminate();
    assert!(
        a.wait_exit(Duration::from_secs(20)).await.is_some(),
        "A exits after its drain"
    );
    every_client_acked_more(&clients, "every socket answered after the drain", 2).await;
    broadcast_reaches_all(&c, &pb.url, &clients, rooms, "b-after-drain").await;

    // A failover: B is SIGKILLed, A' registers and takes the rooms over.
    b.kill();
    let _a2 = worker("held-a2").start();
    every_client_acked_more(&clients, "every socket answered after the failover", 2).await;
    broadcast_reaches_all(&c, &pb.url, &clients, rooms, "b-after-failover").await;

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for sender in senders {
        sender.await.expect("sender");
    }
    let mut longest = Duration::ZERO;
    let mut last_sent: Vec<Vec<u64>> = vec![Vec::new(); rooms];
    for (i, client) in clients.iter().enumerate() {
        let log = client.log.lock();
        assert_eq!(log.ended, None, "client {i} saw its socket end");
        longest = longest.max(log.longest);
        // Every ack names the event's seq and the message: seq == n (the
        // socket's own count), in order, each message at least once.
        let mut next = 1usize;
        for (_, text) in log.received.iter().filter(|(_, t)| t.starts_with("ack ")) {
            let mut parts = text.split(' ');
            let seq: usize = parts.nth(1).and_then(|s| s.parse().ok()).expect("seq");
            let n: usize = parts
                .next()
                .and_then(|m| m.strip_prefix('m'))
                .and_then(|n| n.parse().ok())
                .expect("n");
            assert_eq!(seq, n, "client {i}: event seq {seq} for its message m{n}");
            assert!(
                n == next || n + 1 == next,
                "client {i}: ack of m{n} after m{}",
                next - 1
            );
            next = n + 1;
        }
        let sent = log.sent_at.len();
        assert!(
            next > sent,
            "client {i}: m{sent} sent, acks only up to m{}",
            next - 1
        );
        last_sent[client.room].push(sent as u64);
    }
    // The last owner heard every socket of each room, up to its last message.
    for (room, sent) in last_sent.iter_mut().enumerate() {
        let seen = room_seen(&c, &pb.url, &format!("r{room}")).await;
        let mut heard: Vec<u64> = seen
            .as_object()
            .expect("seen map")
            .values()
            .map(|v| v.as_u64().expect("seq"))
            .collect();
        heard.sort_unstable();
        sent.sort_unstable();
        assert_eq!(
            &heard, sent,
            "room r{room}: the last owner's seqs per socket"
        );
    }
    let after = metrics::scrape(&c, &pb.url).await;
    let moved = |family| metrics::moved(&before, &after, family);
    assert_eq!(moved("pinboard_held_sockets"), sockets as f64);
    assert!(moved("pinboard_held_socket_events") >= sockets as f64 * 5.0);
    assert!(moved("pinboard_held_socket_sends") >= sockets as f64 * 5.0);
    assert!(
        moved("pinboard_held_socket_event_retries") >= 1.0,
        "events waited for the failover"
    );
    eprintln!("held sockets: {sockets} sockets, longest pause a client saw: {longest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_sockets_survive_a_drain_and_a_failover() {
    survive(50, Duration::from_millis(200)).await;
}

/// The figure: 1 000 sockets (100 rooms), each client sending
/// about once a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_held_sockets_survive_a_drain_and_a_failover() {
    survive(1_000, Duration::from_secs(1)).await;
}
