//! Sends between pinboard nodes that share one Redis: a worker sends
//! through the node it is registered with, but the sockets of an id may be
//! held by every node. The node that takes a send delivers to its own
//! sockets and PUBLISHes the send on one Redis channel
//! (`<prefix>held:sends`, the namespace inside the payload); every node
//! SUBSCRIBEs to it and delivers to the sockets it holds, skipping its own
//! publications. A send to one socket whose id names this node is not
//! published; one naming another node is only published.
//!
//! Owns the publisher task (one, so publications leave in the order they
//! were queued), the subscriber task (it reconnects with backoff after a
//! lost subscription: WARN, counted) and the payload's bound. Never
//! touches a connection to a client (it hands sends to [`super::fanout`])
//! and never reads placement: the relay has its own Redis connections.
//!
//! Pub/sub is at most once: a publication made while a node's subscription
//! is lost never reaches that node's sockets.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use pinned_wire::held::Sends;
use prometheus_client::metrics::counter::Counter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::publish::{Relay, Relayed, MAX_PUBLICATION, PUBLISH_QUEUE};
use super::registry::HeldSockets;

/// The first pause before a lost subscription is made again; doubled up to
/// [`MAX_RESUBSCRIBE_PAUSE`].
pub const FIRST_RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two subscription attempts.
pub const MAX_RESUBSCRIBE_PAUSE: Duration = Duration::from_secs(5);

/// Where the relay meets the other nodes.
#[derive(Clone, Debug)]
pub struct RelaySettings {
    /// Redis URLs, tried in turn (one server, or a cluster's seeds: a
    /// cluster carries a publication to every node's subscribers).
    pub urls: Vec<String>,
    /// The channel: `<prefix>held:sends`.
    pub channel: String,
    /// The longest wait for Redis: a connect, a publication, a ping; a
    /// silent subscription is pinged this often.
    pub deadline: Duration,
}

/// The counters the relay moves.
#[derive(Clone, Debug)]
pub struct RelayMetrics {
    /// Publications this node made.
    pub published: Counter,
    /// Publications of other nodes this node applied.
    pub received: Counter,
    /// Subscriptions lost (each then made again).
    pub losses: Counter,
}

/// Starts the relay of `sockets`' node: its publisher task (it ends when
/// `sockets` is dropped) and its subscriber task (it ends when `stop` turns
/// true), and hands `sockets` the entry its sends are published through.
pub fn spawn(
    sockets: &Arc<HeldSockets>,
    settings: RelaySettings,
    metrics: RelayMetrics,
    stop: watch::Receiver<bool>,
) -> (JoinHandle<()>, JoinHandle<()>) {
    let (queue, pending) = mpsc::channel(PUBLISH_QUEUE);
    sockets.relay_through(Relay::new(sockets.node(), queue));
    let publisher = tokio::spawn(publish_all(
        settings.clone(),
        metrics.published.clone(),
        pending,
    ));
    let subscriber = tokio::spawn(subscribe(sockets.clone(), settings, metrics, stop));
    (publisher, subscriber)
}

/// Publishes what is queued, in order, until the relay is dropped.
async fn publish_all(
    settings: RelaySettings,
    published: Counter,
    mut pending: mpsc::Receiver<Bytes>,
) {
    let mut conn: Option<ConnectionManager> = None;
    let mut failing = false;
    while let Some(payload) = pending.recv().await {
        if conn.is_none() {
            conn = connect_manager(&settings).await;
        }
        let Some(manager) = conn.as_mut() else {
            if !failing {
                tracing::warn!(target: "pinboard::held", "the relay cannot reach Redis: sends reach this node's sockets only");
                failing = true;
            }
            continue;
        };
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&settings.channel).arg(payload.as_ref());
        match tokio::time::timeout(settings.deadline, publish.query_async::<i64>(manager)).await {
            Ok(Ok(_)) => {
                published.inc();
                if failing {
                    tracing::info!(target: "pinboard::held", "the relay publishes again");
                    failing = false;
                }
            }
            Ok(Err(error)) => {
                if !failing {
                    tracing::warn!(target: "pinboard::held", %error, "a relay publication failed: it reaches this node's sockets only");
                    failing = true;
                }
            }
            Err(_) => {
                if !failing {
                    tracing::warn!(target: "pinboard::held", "a relay publication timed out: it reaches this node's sockets only");
                    failing = true;
                }
            }
        }
    }
}

async fn connect_manager(settings: &RelaySettings) -> Option<ConnectionManager> {
    for url in &settings.urls {
        let Ok(client) = redis::Client::open(url.as_str()) else {
            continue;
        };
        let config = ConnectionManagerConfig::new().set_connection_timeout(settings.deadline);
        let manager = tokio::time::timeout(
            settings.deadline,
            ConnectionManager::new_with_config(client, config),
        )
        .await;
        if let Ok(Ok(manager)) = manager {
            return Some(manager);
        }
    }
    None
}

/// Holds the subscription, applying other nodes' publications, and makes
/// it again (with backoff) whenever it is lost.
async fn subscribe(
    sockets: Arc<HeldSockets>,
    settings: RelaySettings,
    metrics: RelayMetrics,
    mut stop: watch::Receiver<bool>,
) {
    let mut pause = FIRST_RESUBSCRIBE_PAUSE;
    let mut subscribed_once = false;
    loop {
        let listened = tokio::select! {
            listened = listen(&sockets, &settings, &metrics, &mut pause) => listened,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        match listened {
            Listened::Lost(why) => {
                metrics.losses.inc();
                tracing::warn!(target: "pinboard::held", why = %why, retry_in_ms = pause.as_millis() as u64, "the relay lost its subscription: sends of other nodes miss this node's sockets until it is back");
            }
            Listened::NotMade(why) => {
                if subscribed_once {
                    tracing::debug!(target: "pinboard::held", why = %why, "the relay's subscription is not back yet");
                } else {
                    tracing::warn!(target: "pinboard::held", why = %why, "the relay cannot subscribe: sends of other nodes miss this node's sockets until it does");
                }
            }
        }
        subscribed_once = true;
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        pause = (pause * 2).min(MAX_RESUBSCRIBE_PAUSE);
    }
}

enum Listened {
    /// A subscription was made, then lost.
    Lost(String),
    /// None could be made.
    NotMade(String),
}

/// One subscription, from its making to its loss.
async fn listen(
    sockets: &HeldSockets,
    settings: &RelaySettings,
    metrics: &RelayMetrics,
    pause: &mut Duration,
) -> Listened {
    let mut last = String::from("no Redis URL");
    let mut made = None;
    for url in &settings.urls {
        match tokio::time::timeout(settings.deadline, subscribed(url, &settings.channel)).await {
            Ok(Ok(pubsub)) => {
                made = Some(pubsub);
                break;
            }
            Ok(Err(error)) => last = error.to_string(),
            Err(_) => last = format!("no answer within {:?}", settings.deadline),
        }
    }
    let Some(pubsub) = made else {
        return Listened::NotMade(last);
    };
    tracing::info!(target: "pinboard::held", channel = %settings.channel, "the relay subscribed");
    *pause = FIRST_RESUBSCRIBE_PAUSE;
    let (mut sink, mut stream) = pubsub.split();
    let mut ping = tokio::time::interval(settings.deadline);
    ping.tick().await;
    loop {
        tokio::select! {
            message = stream.next() => {
                let Some(message) = message else {
                    return Listened::Lost("the connection ended".into());
                };
                apply(sockets, metrics, message.get_payload_bytes());
            }
            _ = ping.tick() => {
                match tokio::time::timeout(settings.deadline, sink.ping::<redis::Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return Listened::Lost(error.to_string()),
                    Err(_) => return Listened::Lost(format!("no answer to a ping within {:?}", settings.deadline)),
                }
            }
        }
    }
}

async fn subscribed(url: &str, channel: &str) -> redis::RedisResult<redis::aio::PubSub> {
    let client = redis::Client::open(url)?;
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(channel).await?;
    Ok(pubsub)
}

/// Delivers another node's publication to this node's sockets.
fn apply(sockets: &HeldSockets, metrics: &RelayMetrics, payload: &[u8]) {
    if payload.len() > MAX_PUBLICATION {
        tracing::warn!(target: "pinboard::held", bytes = payload.len(), "a relay publication over the bound is ignored");
        return;
    }
    let Ok(relayed) = serde_json::from_slice::<Relayed>(payload) else {
        tracing::warn!(target: "pinboard::held", "a relay publication that is not one is ignored");
        return;
    };
    if relayed.from == sockets.node() {
        return;
    }
    let sends = Sends {
        sends: relayed.sends,
    };
    if let Err(error) = super::fanout::check(&sends) {
        tracing::warn!(target: "pinboard::held", %error, from = %relayed.from, "a relay publication with bad sends is ignored");
        return;
    }
    super::fanout::deliver_here(sockets, &sends);
    metrics.received.inc();
}
