//! Held sockets on several pinboard nodes sharing one Redis: a room's
//! clients connect through two nodes, its owner (registered with one of
//! them) broadcasts, and every client hears it, whichever node holds its
//! socket; a send to one socket held by the other node reaches it; a node
//! that dies drops only its own sockets (the other node's keep theirs and
//! keep hearing broadcasts, and the dropped clients reconnect through the
//! node that lives); and a lost relay subscription is made again.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use parking_lot::Mutex;
use serde_json::Value;
use support::{
    client, pinboard, redis_prefix, room_seen, rust_worker, until, wait_workers, RedisServer,
};
use test_support::metrics;
use tokio_tungstenite::tungstenite::Message;

/// What one client heard, and how its socket ended if it did.
#[derive(Default)]
struct Log {
    heard: Vec<String>,
    ended: Option<String>,
}

struct Client {
    log: Arc<Mutex<Log>>,
    sink: futures_util::stream::SplitSink<
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        Message,
    >,
}

impl Client {
    fn heard(&self, text: &str) -> bool {
        self.log.lock().heard.iter().any(|got| got == text)
    }

    fn ended(&self) -> Option<String> {
        self.log.lock().ended.clone()
    }
}

async fn connect(pb: &str, room: &str) -> Client {
    let url = format!("{}/rooms/{room}/ws", pb.replacen("http", "ws", 1));
    let (ws, _) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("connect");
    let (sink, mut stream) = ws.split();
    let log: Arc<Mutex<Log>> = Arc::default();
    let reader = log.clone();
    tokio::spawn(async move {
        let ended = loop {
            match stream.next().await {
                Some(Ok(Message::Text(text))) => reader.lock().heard.push(text.to_string()),
                Some(Ok(Message::Close(frame))) => break format!("close {frame:?}"),
                Some(Ok(_)) => {}
                Some(Err(e)) => break format!("error {e}"),
                None => break "stream ended".to_owned(),
            }
        };
        reader.lock().ended = Some(ended);
    });
    Client { log, sink }
}

async fn connect_many(pb: &str, room: &str, n: usize) -> Vec<Client> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(connect(pb, room).await);
    }
    clients
}

/// Subscribers of the relay's channel on the Redis at `url`.
async fn subscribers(url: &str, channel: &str) -> i64 {
    let Ok(client) = redis::Client::open(url) else {
        return -1;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return -1;
    };
    let answer: redis::RedisResult<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut conn)
        .await;
    answer.map_or(-1, |(_, n)| n)
}

async fn wait_subscribers(url: &str, channel: &str, n: i64) {
    test_support::eventually(
        &format!("{n} subscribers of {channel}"),
        Duration::from_secs(30),
        || async { (subscribers(url, channel).await == n).then_some(()) },
    )
    .await;
}

async fn wait_held(c: &reqwest::Client, pb: &str, n: f64) {
    test_support::eventually(
        &format!("{pb} to hold {n} sockets"),
        Duration::from_secs(30),
        || async {
            let now = metrics::scrape(c, pb).await.value("pinboard_held_sockets");
            (now == n).then_some(())
        },
    )
    .await;
}

/// Broadcasts `text` to `room` through `pb` and waits until every one of
/// `clients` heard it.
async fn broadcast_reaches(
    c: &reqwest::Client,
    pb: &str,
    room: &str,
    clients: &[&Client],
    text: &str,
) {
    let r = c
        .post(format!("{pb}/rooms/{room}/broadcast"))
        .body(text.to_owned())
        .send()
        .await
        .expect("broadcast");
    assert!(r.status().is_success(), "broadcast: {}", r.status());
    until(
        &format!("{text} to reach all {} sockets", clients.len()),
        Duration::from_secs(30),
        || clients.iter().all(|client| client.heard(text)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_reaches_held_sockets_on_every_node_and_a_dead_node_drops_only_its_own() {
    let prefix = redis_prefix("held-nodes");
    let channel = format!("{prefix}held:sends");
    let a = pinboard().shared_redis(&prefix).name("held-node-a").start();
    let mut b = pinboard().shared_redis(&prefix).name("held-node-b").start();
    let _worker = rust_worker(&a.url)
        .env("FLEET_ROOMS_NS", "/rooms")
        .name("held-nodes-worker")
        .start();
    let c = client();
    wait_workers(&c, &a.url, 1).await;
    wait_workers(&c, &b.url, 1).await;
    wait_subscribers(test_support::SHARED_REDIS, &channel, 2).await;

    let on_a = connect_many(&a.url, "r0", 5).await;
    let on_b = connect_many(&b.url, "r0", 5).await;
    wait_held(&c, &a.url, 5.0).await;
    wait_held(&c, &b.url, 5.0).await;
    let before_a = metrics::scrape(&c, &a.url).await;
    let before_b = metrics::scrape(&c, &b.url).await;

    // The owner sends through A, its node; B's sockets hear it through the
    // relay. Asked through either node.
    let everyone: Vec<&Client> = on_a.iter().chain(&on_b).collect();
    broadcast_reaches(&c, &b.url, "r0", &everyone, "asked-through-b").await;
    broadcast_reaches(&c, &a.url, "r0", &everyone, "asked-through-a").await;
    let after_a = metrics::scrape(&c, &a.url).await;
    let after_b = metrics::scrape(&c, &b.url).await;
    assert!(metrics::moved(&before_a, &after_a, "pinboard_held_relay_publications") >= 2.0);
    assert!(metrics::moved(&before_b, &after_b, "pinboard_held_relay_deliveries") >= 2.0);

    // A send to one socket, held by B, made through A.
    let mut solo = connect(&b.url, "solo").await;
    solo.sink.send(Message::text("m1")).await.expect("m1");
    until("the solo socket's ack", Duration::from_secs(30), || {
        solo.heard("ack 1 m1")
    })
    .await;
    let seen = room_seen(&c, &a.url, "solo").await;
    let id = seen
        .as_object()
        .and_then(|seen| seen.keys().next())
        .expect("the solo socket's id")
        .clone();
    let told: Value = c
        .post(format!("{}/rooms/solo/tell", a.url))
        .body(format!("{id} just-you"))
        .send()
        .await
        .expect("tell")
        .json()
        .await
        .expect("tell json");
    assert_eq!(told["told"], true, "{told}");
    until(
        "the told text to reach the solo socket",
        Duration::from_secs(30),
        || solo.heard("just-you"),
    )
    .await;

    // B dies: its clients lose their sockets, A's keep theirs and keep
    // hearing broadcasts; B's clients reconnect through A.
    b.kill();
    until(
        "B's clients to see their sockets end",
        Duration::from_secs(30),
        || on_b.iter().all(|client| client.ended().is_some()),
    )
    .await;
    let survivors: Vec<&Client> = on_a.iter().collect();
    broadcast_reaches(&c, &a.url, "r0", &survivors, "after-b-died").await;
    let back = connect_many(&a.url, "r0", 5).await;
    wait_held(&c, &a.url, 10.0).await;
    let all: Vec<&Client> = on_a.iter().chain(&back).collect();
    broadcast_reaches(&c, &a.url, "r0", &all, "after-reconnecting").await;
    for (i, client) in on_a.iter().enumerate() {
        assert_eq!(client.ended(), None, "A's client {i} lost its socket");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_relay_subscription_is_made_again() {
    // A private Redis: the test kills every subscriber's connection on it.
    let redis = RedisServer::start();
    let channel = "pinboard:held:sends";
    let a = pinboard().redis(&redis.url).name("relay-loss-a").start();
    let b = pinboard().redis(&redis.url).name("relay-loss-b").start();
    let _worker = rust_worker(&a.url)
        .env("FLEET_ROOMS_NS", "/rooms")
        .name("relay-loss-worker")
        .start();
    let c = client();
    wait_workers(&c, &a.url, 1).await;
    wait_workers(&c, &b.url, 1).await;
    wait_subscribers(&redis.url, channel, 2).await;
    let on_a = connect_many(&a.url, "r0", 3).await;
    let on_b = connect_many(&b.url, "r0", 3).await;
    wait_held(&c, &b.url, 3.0).await;
    let everyone: Vec<&Client> = on_a.iter().chain(&on_b).collect();
    broadcast_reaches(&c, &a.url, "r0", &everyone, "before-the-loss").await;

    let before_b = metrics::scrape(&c, &b.url).await;
    let mut conn = redis.conn().await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .expect("client kill");
    assert_eq!(killed, 2, "both nodes' subscriptions");
    metrics::wait_moved(
        &c,
        &b.url,
        &before_b,
        "pinboard_held_relay_subscription_losses",
        Duration::from_secs(30),
    )
    .await;
    wait_subscribers(&redis.url, channel, 2).await;
    broadcast_reaches(&c, &a.url, "r0", &everyone, "after-the-loss").await;
    assert!(
        b.log_text().contains("the relay lost its subscription"),
        "the loss is logged"
    );
    for client in &everyone {
        assert_eq!(client.ended(), None);
    }
}
