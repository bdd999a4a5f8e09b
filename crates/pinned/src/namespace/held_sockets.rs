//! Held sockets, the worker's side (`pinned_wire::held`): sockets pinboard
//! holds for a namespace that opted in
//! ([`SocketOptions::survive_moves`](super::sockets::SocketOptions::survive_moves)).
//! The client's connection ends at pinboard, so a move of the id never
//! closes it; its events arrive as requests to whichever worker owns the id
//! then, and what the object sends goes back to pinboard.
//!
//! This module owns the sockets an instance has heard of (accepted here,
//! or named by an event: bounded per id, forgotten when the instance
//! goes) and the namespace's queue of sends to pinboard, flushed in order
//! by one task. It never reads a connection, and never closes a held
//! socket for a move: a drain or a wind-down leaves them to the next owner.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::ws::Message;
use base64::Engine as _;
use dashmap::DashMap;
use parking_lot::Mutex;
use pinned_wire::held::{Close, Send, Sends, MAX_SENDS_PER_CALL};
use serde_json::value::RawValue;
use tokio::sync::Notify;

use super::sockets::{SocketError, SocketOptions, MAX_SOCKET_TAGS, MAX_SOCKET_TAG_LEN};
use crate::plane::pinboard::Plane;

tokio::task_local! {
    /// The sends of the event being handled: they ride its answer
    /// ([`pinned_wire::held::EventAnswer::sends`]) instead of the queue.
    static EVENT_SENDS: std::cell::RefCell<Vec<Send>>;
}

/// Runs `handler` (an event's), answering what it sent on held sockets
/// from its own task (a task it spawns sends through the queue).
pub(crate) async fn capturing<F: std::future::Future>(handler: F) -> (F::Output, Vec<Send>) {
    EVENT_SENDS
        .scope(std::cell::RefCell::new(Vec::new()), async move {
            let output = handler.await;
            let sends = EVENT_SENDS.with(|sends| std::mem::take(&mut *sends.borrow_mut()));
            (output, sends)
        })
        .await
}

/// Default bound on the sends a namespace queues for pinboard; one more
/// fails with [`SocketError::OutboxFull`].
pub const DEFAULT_HELD_SEND_QUEUE: usize = 65_536;

/// One socket pinboard holds, as the worker knows it.
pub(crate) struct HeldSocket {
    /// pinboard's id for it.
    pub(crate) id: Box<str>,
    /// Its number on this worker (handed out when first heard of).
    pub(crate) number: u64,
    ns: Arc<str>,
    owner: Arc<str>,
    tags: Box<[Box<str>]>,
    attachment: Mutex<Option<Box<[u8]>>>,
    /// Set by `set_attachment` during an event: its answer carries it.
    pub(crate) attachment_set: AtomicBool,
    pub(crate) seq: AtomicU64,
    closed: AtomicBool,
    pub(crate) max_attachment: u32,
    sender: Arc<HeldSender>,
}

impl HeldSocket {
    pub(crate) fn tags(&self) -> &[Box<str>] {
        &self.tags
    }

    pub(crate) fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|mine| &**mine == tag)
    }

    pub(crate) fn attachment_bytes(&self) -> Option<Box<[u8]>> {
        self.attachment.lock().clone()
    }

    /// Replaces the attachment, here and at pinboard.
    pub(crate) fn set_attachment(&self, bytes: Box<[u8]>) -> Result<(), SocketError> {
        let raw = raw(&bytes)?;
        *self.attachment.lock() = Some(bytes);
        self.attachment_set.store(true, Ordering::SeqCst);
        self.sender.push(Send {
            attachment: Some(raw),
            ..self.to_me()
        })
    }

    pub(crate) fn send(&self, message: Message) -> Result<(), SocketError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(SocketError::Closed);
        }
        let mut send = self.to_me();
        if !set_message(&mut send, message) {
            return Ok(());
        }
        self.sender.push(send)
    }

    pub(crate) fn close(&self, code: u16, reason: &str) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.sender.push(Send {
            close: Some(Close {
                code,
                reason: reason.to_owned(),
            }),
            ..self.to_me()
        });
    }

    pub(crate) fn is_open(&self) -> bool {
        !self.closed.load(Ordering::SeqCst)
    }

    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn to_me(&self) -> Send {
        Send {
            ns: self.ns.to_string(),
            id: self.owner.to_string(),
            socket: Some(self.id.to_string()),
            ..Send::default()
        }
    }
}

/// `message` into `send`; `false` for a ping, pong or close (never sent
/// through pinboard: it answers pings itself, and a close is
/// [`HeldSocket::close`]).
fn set_message(send: &mut Send, message: Message) -> bool {
    match message {
        Message::Text(text) => send.text = Some(text.to_string()),
        Message::Binary(bytes) => {
            send.binary = Some(base64::engine::general_purpose::STANDARD.encode(&bytes));
        }
        Message::Ping(_) | Message::Pong(_) | Message::Close(_) => return false,
    }
    true
}

/// An attachment's JSON as a raw value.
pub(crate) fn raw(bytes: &[u8]) -> Result<Box<RawValue>, SocketError> {
    let text = String::from_utf8(bytes.to_vec())
        .map_err(|_| SocketError::Attachment(serde::de::Error::custom("not UTF-8")))?;
    RawValue::from_string(text).map_err(SocketError::Attachment)
}

/// The namespace's sends to pinboard, in order, flushed by one task.
pub(crate) struct HeldSender {
    queue: Mutex<VecDeque<Send>>,
    ready: Notify,
    max: usize,
    started: AtomicBool,
    plane: Option<Arc<Plane>>,
    domain: crate::time::Domain,
}

impl HeldSender {
    fn push(self: &Arc<Self>, send: Send) -> Result<(), SocketError> {
        let mut send = Some(send);
        let _ = EVENT_SENDS.try_with(|sends| {
            let mut sends = sends.borrow_mut();
            if sends.len() < MAX_SENDS_PER_CALL {
                if let Some(send) = send.take() {
                    sends.push(send);
                }
            }
        });
        let Some(send) = send else {
            return Ok(());
        };
        {
            let mut queue = self.queue.lock();
            if queue.len() >= self.max {
                return Err(SocketError::OutboxFull { max: self.max });
            }
            queue.push_back(send);
        }
        if !self.started.swap(true, Ordering::SeqCst) {
            let sender = self.clone();
            crate::task::spawn_detached(&self.domain, async move { sender.flush().await });
        }
        self.ready.notify_one();
        Ok(())
    }

    /// Sends what is queued, a call at a time, in order, for the worker's
    /// life. A call pinboard does not take after the registration's
    /// retries is dropped (logged): its sockets' clients miss it.
    async fn flush(self: Arc<Self>) {
        let Some(plane) = self.plane.clone() else {
            return;
        };
        loop {
            let batch: Vec<Send> = {
                let mut queue = self.queue.lock();
                let n = queue.len().min(MAX_SENDS_PER_CALL);
                queue.drain(..n).collect()
            };
            if batch.is_empty() {
                self.ready.notified().await;
                continue;
            }
            let n = batch.len();
            if !plane.send_to_held(&Sends { sends: batch }).await {
                tracing::warn!(
                    sends = n,
                    "pinboard did not take sends to held sockets; dropped"
                );
            }
        }
    }
}

/// The held sockets of one namespace's instances, by id.
pub(crate) struct HeldSockets {
    ns: Arc<str>,
    known: DashMap<Box<str>, HashMap<Box<str>, Arc<HeldSocket>>>,
    next: AtomicU64,
    sender: Arc<HeldSender>,
}

impl HeldSockets {
    pub(crate) fn new(ns: &str, plane: Option<Arc<Plane>>, domain: crate::time::Domain) -> Self {
        Self {
            ns: Arc::from(ns),
            known: DashMap::new(),
            next: AtomicU64::new(1),
            sender: Arc::new(HeldSender {
                queue: Mutex::new(VecDeque::new()),
                ready: Notify::new(),
                max: DEFAULT_HELD_SEND_QUEUE,
                started: AtomicBool::new(false),
                plane,
                domain,
            }),
        }
    }

    /// The socket `socket` of `id`, learnt now if new (with `tags` and
    /// `attachment`), within the per-instance bound.
    pub(crate) fn learn(
        &self,
        id: &str,
        socket: &str,
        tags: &[String],
        attachment: Option<Box<[u8]>>,
        options: &SocketOptions,
    ) -> Result<Arc<HeldSocket>, SocketError> {
        if tags.len() > MAX_SOCKET_TAGS || tags.iter().any(|tag| tag.len() > MAX_SOCKET_TAG_LEN) {
            return Err(SocketError::Tags);
        }
        let mut known = self.known.entry(Box::from(id)).or_default();
        if let Some(held) = known.get(socket) {
            if let Some(bytes) = attachment {
                *held.attachment.lock() = Some(bytes);
            }
            return Ok(held.clone());
        }
        if known.len() >= options.max_per_instance {
            return Err(SocketError::InstanceFull {
                max: options.max_per_instance,
            });
        }
        let held = Arc::new(HeldSocket {
            id: Box::from(socket),
            number: self.next.fetch_add(1, Ordering::Relaxed),
            ns: self.ns.clone(),
            owner: Arc::from(id),
            tags: tags.iter().map(|tag| Box::from(tag.as_str())).collect(),
            attachment: Mutex::new(attachment),
            attachment_set: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            max_attachment: u32::try_from(options.max_attachment).unwrap_or(u32::MAX),
            sender: self.sender.clone(),
        });
        known.insert(Box::from(socket), held.clone());
        Ok(held)
    }

    /// The held sockets `id` has heard of, those with `tag` if given.
    pub(crate) fn list(&self, id: &str, tag: Option<&str>) -> Vec<Arc<HeldSocket>> {
        let Some(known) = self.known.get(id) else {
            return Vec::new();
        };
        let mut sockets: Vec<Arc<HeldSocket>> = known
            .values()
            .filter(|held| held.is_open() && tag.is_none_or(|tag| held.has_tag(tag)))
            .cloned()
            .collect();
        sockets.sort_unstable_by_key(|held| held.number);
        sockets
    }

    /// Sends `message` to every socket of `id` pinboard holds (with `tag`
    /// if given): one send, fanned out by pinboard, also to sockets this
    /// instance has not heard of.
    pub(crate) fn broadcast(
        &self,
        id: &str,
        tag: Option<&str>,
        message: Message,
    ) -> Result<(), SocketError> {
        let mut send = Send {
            ns: self.ns.to_string(),
            id: id.to_owned(),
            tag: tag.map(str::to_owned),
            ..Send::default()
        };
        if !set_message(&mut send, message) {
            return Ok(());
        }
        self.sender.push(send)
    }

    /// Socket `socket` of `id` closed: forgotten.
    pub(crate) fn forget_socket(&self, id: &str, socket: &str) {
        if let Some(mut known) = self.known.get_mut(id) {
            if let Some(held) = known.remove(socket) {
                held.mark_closed();
            }
        }
        self.known.remove_if(id, |_, known| known.is_empty());
    }

    /// `id`'s instance went: what it heard of is forgotten (the sockets
    /// stay open at pinboard; the next owner hears of them as they speak).
    pub(crate) fn forget(&self, id: &str) {
        self.known.remove(id);
    }
}
