//! The sockets one node holds, by id, and what each needs beside its task:
//! tags, attachment and outbox.
//!
//! Owns the table and the per-socket outbox with its bound; never reads or
//! writes a connection (the socket's task does, [`super::socket`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::value::RawValue;
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message;

use super::publish::Relay;
use crate::metrics::Metrics;

/// Default deadline for a held socket's event to be answered 2xx by an
/// owner (its wake deadline); past it the client is closed with 1013.
pub const DEFAULT_EVENT_DEADLINE: Duration = Duration::from_secs(30);
/// Default bound on a held socket's client messages waiting while one
/// event is in flight; one more closes the client with 1013.
pub const DEFAULT_BUFFER: usize = 256;
/// Default bound on a held socket's messages queued to its client; one
/// more closes the client with 1013.
pub const DEFAULT_OUTBOX: usize = 1_024;
/// The close code when a bound or deadline ends a held socket.
pub const CLOSE_TRY_AGAIN_LATER: u16 = 1013;

/// The bounds and deadline of held sockets.
#[derive(Clone, Copy, Debug)]
pub struct HeldSettings {
    /// [`DEFAULT_EVENT_DEADLINE`].
    pub event_deadline: Duration,
    /// [`DEFAULT_BUFFER`].
    pub buffer: usize,
    /// [`DEFAULT_OUTBOX`].
    pub outbox: usize,
}

impl Default for HeldSettings {
    fn default() -> Self {
        Self {
            event_deadline: DEFAULT_EVENT_DEADLINE,
            buffer: DEFAULT_BUFFER,
            outbox: DEFAULT_OUTBOX,
        }
    }
}

/// What a held socket's task writes to its client.
#[derive(Debug)]
pub enum Outgoing {
    /// A message.
    Message(Message),
    /// A close frame (the last thing written).
    Close(u16, String),
}

/// The counters held sockets move.
#[derive(Clone, Debug)]
pub struct HeldMetrics {
    pub(crate) open: Gauge,
    pub(crate) events: Counter,
    pub(crate) retries: Counter,
    pub(crate) sends: Counter,
}

/// One socket this node holds.
pub struct HeldSocket {
    /// Its id (offered to the worker, named in every event).
    pub id: Box<str>,
    /// `/<ns>/<id>`, the id decoded.
    pub key: Box<str>,
    tags: Box<[Box<str>]>,
    attachment: Mutex<Option<Box<RawValue>>>,
    outbox: Mutex<VecDeque<Outgoing>>,
    /// The outbox gained something.
    pub(crate) ready: Notify,
    max_outbox: usize,
}

impl std::fmt::Debug for HeldSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldSocket")
            .field("id", &self.id)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl HeldSocket {
    /// Its tags.
    pub fn tags(&self) -> Vec<String> {
        self.tags.iter().map(|tag| tag.to_string()).collect()
    }

    /// Whether it carries `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|mine| &**mine == tag)
    }

    /// Its attachment as last heard.
    pub fn attachment(&self) -> Option<Box<RawValue>> {
        self.attachment.lock().clone()
    }

    /// Replaces its attachment.
    pub fn set_attachment(&self, attachment: Box<RawValue>) {
        *self.attachment.lock() = Some(attachment);
    }

    /// Queues `outgoing` for the client; `false` when the outbox was full
    /// (the client is then closed with 1013: it does not read).
    pub fn push(&self, outgoing: Outgoing) -> bool {
        let taken = {
            let mut outbox = self.outbox.lock();
            if outbox.len() >= self.max_outbox {
                outbox.clear();
                outbox.push_back(Outgoing::Close(
                    CLOSE_TRY_AGAIN_LATER,
                    "client too slow: outbox full".into(),
                ));
                false
            } else {
                outbox.push_back(outgoing);
                true
            }
        };
        self.ready.notify_one();
        taken
    }

    /// What is queued, in order.
    pub(crate) fn take_outbox(&self) -> VecDeque<Outgoing> {
        std::mem::take(&mut *self.outbox.lock())
    }
}

/// Every socket this node holds, by id.
pub struct HeldSockets {
    /// This node's part of every socket id: random per process.
    node: Box<str>,
    next: AtomicU64,
    by_key: Mutex<HashMap<Box<str>, Vec<Arc<HeldSocket>>>>,
    /// The other nodes, when placement runs on Redis (`super::relay`).
    relay: OnceLock<Relay>,
    /// The bounds and deadline.
    pub settings: HeldSettings,
    pub(crate) metrics: HeldMetrics,
}

impl std::fmt::Debug for HeldSockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldSockets")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl HeldSockets {
    /// An empty table for the node `node` (its part of socket ids).
    pub fn new(node: String, settings: HeldSettings, metrics: &Metrics) -> Self {
        Self {
            node: node.into_boxed_str(),
            next: AtomicU64::new(1),
            by_key: Mutex::new(HashMap::new()),
            relay: OnceLock::new(),
            settings,
            metrics: HeldMetrics {
                open: metrics.held_sockets.clone(),
                events: metrics.held_events.clone(),
                retries: metrics.held_event_retries.clone(),
                sends: metrics.held_sends.clone(),
            },
        }
    }

    /// This node's part of socket ids.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Publishes this node's sends to the other nodes through `relay` from
    /// now on (once; a second relay is ignored).
    pub fn relay_through(&self, relay: Relay) {
        let _ = self.relay.set(relay);
    }

    /// The other nodes' entry, when there are others.
    pub fn relay(&self) -> Option<&Relay> {
        self.relay.get()
    }

    /// A fresh socket id: `<node>-<n>`.
    pub fn mint_id(&self) -> String {
        format!(
            "{}-{}",
            self.node,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Adds a socket of `key` (`/<ns>/<id>`).
    pub fn add(
        &self,
        id: &str,
        key: &str,
        tags: Vec<String>,
        attachment: Option<Box<RawValue>>,
    ) -> Arc<HeldSocket> {
        let socket = Arc::new(HeldSocket {
            id: id.into(),
            key: key.into(),
            tags: tags.into_iter().map(String::into_boxed_str).collect(),
            attachment: Mutex::new(attachment),
            outbox: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            max_outbox: self.settings.outbox.max(1),
        });
        self.by_key
            .lock()
            .entry(key.into())
            .or_default()
            .push(socket.clone());
        self.metrics.open.inc();
        socket
    }

    /// Takes `socket` out of the table.
    pub fn remove(&self, socket: &HeldSocket) {
        let mut by_key = self.by_key.lock();
        let Some(sockets) = by_key.get_mut(&socket.key) else {
            return;
        };
        let before = sockets.len();
        sockets.retain(|held| held.id != socket.id);
        if sockets.len() < before {
            self.metrics.open.dec();
        }
        if sockets.is_empty() {
            by_key.remove(&socket.key);
        }
    }

    /// The sockets of `key`: socket `socket` when given, else those with
    /// `tag` when given, else every one.
    pub fn select(
        &self,
        key: &str,
        socket: Option<&str>,
        tag: Option<&str>,
    ) -> Vec<Arc<HeldSocket>> {
        let by_key = self.by_key.lock();
        let Some(sockets) = by_key.get(key) else {
            return Vec::new();
        };
        sockets
            .iter()
            .filter(|held| socket.is_none_or(|id| &*held.id == id))
            .filter(|held| tag.is_none_or(|tag| held.has_tag(tag)))
            .cloned()
            .collect()
    }

    /// How many sockets this node holds.
    pub fn len(&self) -> usize {
        self.by_key.lock().values().map(Vec::len).sum()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.by_key.lock().is_empty()
    }

    /// Counts `n` sends queued.
    pub fn count_sends(&self, n: usize) {
        self.metrics.sends.inc_by(n as u64);
    }
}
