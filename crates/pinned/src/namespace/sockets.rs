//! Hibernatable sockets: the namespace's table of socket sets, one per id,
//! which outlives the instance records. A socket accepted into its
//! instance's set belongs to the id, not to the instance: the instance can
//! be evicted (hibernated) while its sockets stay open here, and the next
//! event on one of them activates the id again on this worker.
//!
//! This module owns the sets, their bounds (per instance, per worker), the
//! per-socket handle objects get ([`Socket`]) and the placement an id keeps
//! while only its sockets are here. It never reads or writes a connection:
//! [`socket_task`](super::socket_task) does, one task per socket.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes};
use axum::response::{IntoResponse, Response};
use dashmap::DashMap;
use http::StatusCode;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;

use super::Namespace;

/// Default bound on the sockets one instance holds open.
pub const DEFAULT_MAX_SOCKETS_PER_INSTANCE: usize = 32_768;
/// Default bound on the hibernatable sockets one worker holds open, all
/// namespaces together.
pub const DEFAULT_MAX_SOCKETS: usize = 100_000;
/// Default bound on the messages one socket buffers while its instance
/// wakes (or handles its previous message).
pub const DEFAULT_SOCKET_BUFFER: usize = 256;
/// Default deadline for an instance to wake for a socket's event.
pub const DEFAULT_WAKE_DEADLINE: Duration = Duration::from_secs(30);
/// Default bound on a socket's attachment, serialized (JSON), in bytes.
pub const DEFAULT_MAX_ATTACHMENT: usize = 2_048;
/// Default bound on the messages queued to be sent on one socket.
pub const DEFAULT_SOCKET_OUTBOX: usize = 1_024;
/// Tags one socket may carry, at most.
pub const MAX_SOCKET_TAGS: usize = 10;
/// Bytes one socket tag may hold, at most.
pub const MAX_SOCKET_TAG_LEN: usize = 256;

/// How long a closing worker waits for its sockets' close frames to be
/// written: a socket task's own bound on one write to its client.
const CLOSE_DEADLINE: Duration = Duration::from_secs(10);

/// Close code when a bound ends a socket: its buffer or outbox overflowed,
/// or its instance did not wake in time (RFC 6455's "try again later").
pub const CLOSE_TRY_AGAIN_LATER: u16 = 1013;

/// The hibernatable sockets of one namespace: their bounds, deadlines and
/// auto-response ([`HostOptions::sockets`](crate::HostOptions::sockets)).
///
/// ```
/// use std::time::Duration;
/// use pinned::ws::SocketOptions;
///
/// let sockets = SocketOptions::default()
///     .max_per_instance(1_000)
///     .wake_deadline(Duration::from_secs(10))
///     .auto_response("ping", "pong");
/// let host = pinned::HostOptions::default().sockets(sockets);
/// # let _ = host;
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct SocketOptions {
    pub(crate) max_per_instance: usize,
    pub(crate) buffer: usize,
    pub(crate) wake_deadline: Duration,
    pub(crate) max_attachment: usize,
    pub(crate) outbox: usize,
    pub(crate) auto_response: Option<(Utf8Bytes, Utf8Bytes)>,
    pub(crate) survive_moves: bool,
}

impl Default for SocketOptions {
    fn default() -> Self {
        Self {
            max_per_instance: DEFAULT_MAX_SOCKETS_PER_INSTANCE,
            buffer: DEFAULT_SOCKET_BUFFER,
            wake_deadline: DEFAULT_WAKE_DEADLINE,
            max_attachment: DEFAULT_MAX_ATTACHMENT,
            outbox: DEFAULT_SOCKET_OUTBOX,
            auto_response: None,
            survive_moves: false,
        }
    }
}

impl SocketOptions {
    /// Sockets one instance holds open at most (default 32 768); one more
    /// is refused with 503 before the handshake.
    pub fn max_per_instance(mut self, max: usize) -> Self {
        self.max_per_instance = max;
        self
    }

    /// Messages one socket buffers while its instance wakes or handles the
    /// socket's previous message (default 256); one more closes the socket
    /// with 1013 `too many messages while the instance wakes`.
    pub fn buffer(mut self, messages: usize) -> Self {
        self.buffer = messages.max(1);
        self
    }

    /// How long an event waits for its instance to activate (default 30 s);
    /// past it the socket is closed with 1013 `instance did not wake in
    /// time`.
    pub fn wake_deadline(mut self, deadline: Duration) -> Self {
        self.wake_deadline = deadline;
        self
    }

    /// Bytes a socket's attachment may take, serialized as JSON (default
    /// 2 048); a larger one is refused ([`SocketError::AttachmentTooLarge`]).
    pub fn max_attachment(mut self, bytes: usize) -> Self {
        self.max_attachment = bytes;
        self
    }

    /// Messages queued to be sent on one socket at most (default 1 024): a
    /// client that does not read falls behind by this much, then its socket
    /// is closed with 1013 and further sends fail with
    /// [`SocketError::OutboxFull`].
    pub fn outbox(mut self, messages: usize) -> Self {
        self.outbox = messages.max(1);
        self
    }

    /// Answers the text message `request` with `reply` on every socket of
    /// the namespace without activating (or even touching) the instance:
    /// a keep-alive ping costs no wake-up. Off by default.
    pub fn auto_response(mut self, request: impl Into<String>, reply: impl Into<String>) -> Self {
        self.auto_response = Some((request.into().into(), reply.into().into()));
        self
    }

    /// Sockets that survive moves and deploys: behind pinboard, a socket
    /// this namespace accepts is held by pinboard, which delivers its
    /// events to whichever worker owns the id when they happen. A drain,
    /// a wind-down, a new deployment or a crash of the owner then never
    /// closes it: the id is placed again and the next event goes to the
    /// new owner. Off by default; without pinboard (dev mode) sockets are
    /// the worker's as without it. See the sockets chapter of the guide for
    /// the exchange and its limits.
    pub fn survive_moves(mut self) -> Self {
        self.survive_moves = true;
        self
    }
}

/// Why a socket could not be accepted, or a send or attachment failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// The attachment serializes to more than the namespace's bound.
    #[error("socket attachment is {size} bytes, over the bound of {max}")]
    AttachmentTooLarge {
        /// Its serialized size.
        size: usize,
        /// [`SocketOptions::max_attachment`].
        max: usize,
    },
    /// The attachment does not serialize.
    #[error("socket attachment does not serialize: {0}")]
    Attachment(#[from] serde_json::Error),
    /// Too many tags, or one too long.
    #[error("a socket takes at most {MAX_SOCKET_TAGS} tags of at most {MAX_SOCKET_TAG_LEN} bytes")]
    Tags,
    /// The instance holds its bound of sockets already.
    #[error("instance holds {max} sockets, its bound; retry")]
    InstanceFull {
        /// [`SocketOptions::max_per_instance`].
        max: usize,
    },
    /// The worker holds its bound of sockets already.
    #[error("worker holds {max} sockets, its bound; retry")]
    WorkerFull {
        /// [`Options::max_sockets`](crate::Options::max_sockets).
        max: usize,
    },
    /// The socket's outbox is full: its client does not read.
    #[error("socket outbox full ({max} messages): its client does not read")]
    OutboxFull {
        /// [`SocketOptions::outbox`].
        max: usize,
    },
    /// The socket is closed (or closing).
    #[error("socket closed")]
    Closed,
    /// The instance is closing or its worker draining: no new sockets.
    #[error("instance closing; retry")]
    Closing,
}

impl IntoResponse for SocketError {
    /// 413 for an attachment over its bound, 400 for bad tags, 503 with
    /// `Retry-After: 1` at a socket bound or while closing, 500 otherwise;
    /// `{"detail": …}` as every worker answer.
    fn into_response(self) -> Response {
        let status = match &self {
            Self::AttachmentTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Tags => StatusCode::BAD_REQUEST,
            Self::InstanceFull { .. } | Self::WorkerFull { .. } | Self::Closing => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Attachment(_) | Self::OutboxFull { .. } | Self::Closed => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let mut response = crate::response::detail(status, &self.to_string());
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

/// One message a socket's client sent, as its object receives it.
#[derive(Debug)]
#[non_exhaustive]
pub struct SocketMessage {
    /// The event's sequence number on its socket: 1 for the first event,
    /// one more for each next one (messages and the close alike). Events
    /// reach the object in this order; an object that deduplicates keeps
    /// the last number it handled.
    pub seq: u64,
    /// The message (text or binary; pings and pongs are answered by the
    /// worker and never delivered).
    pub message: Message,
}

/// The end of a socket, as its object hears it.
#[derive(Debug)]
#[non_exhaustive]
pub struct SocketClose {
    /// The event's sequence number (see [`SocketMessage::seq`]).
    pub seq: u64,
    /// The client's close code (1005 when it sent none, 1006 when the
    /// connection dropped without a close frame).
    pub code: u16,
    /// The client's close reason.
    pub reason: String,
}

/// A socket's event, as the namespace hands it to the object.
#[derive(Debug)]
pub(crate) enum SocketEvent {
    Message(SocketMessage),
    Close(SocketClose),
}

/// What a socket's task has to send.
#[derive(Default)]
pub(crate) struct Outbox {
    pub(crate) queue: VecDeque<Message>,
    /// A close asked for by the object (sent after the queue).
    pub(crate) close: Option<CloseFrame>,
    /// The socket is gone: sends fail.
    pub(crate) closed: bool,
}

/// One open socket's shared part: what its task and every [`Socket`]
/// handle see. Small on purpose: it is most of a hibernated socket's
/// memory beside the connection itself.
pub(crate) struct SocketShared {
    pub(crate) number: u64,
    tags: Box<[Box<str>]>,
    attachment: Mutex<Option<Box<[u8]>>>,
    pub(crate) outbox: Mutex<Outbox>,
    /// Wakes the socket's task when the outbox gained something.
    pub(crate) ready: Notify,
    /// The last event number handed out.
    pub(crate) seq: AtomicU64,
    max_attachment: u32,
    max_outbox: u32,
}

impl SocketShared {
    /// Queues `message`; the socket's task sends it.
    fn push(&self, message: Message) -> Result<(), SocketError> {
        {
            let mut outbox = self.outbox.lock();
            if outbox.closed || outbox.close.is_some() {
                return Err(SocketError::Closed);
            }
            if outbox.queue.len() >= self.max_outbox as usize {
                // The client stopped reading: it is closed rather than
                // allowed to hold memory without a bound.
                outbox.close = Some(CloseFrame {
                    code: CLOSE_TRY_AGAIN_LATER,
                    reason: Utf8Bytes::from_static("client too slow: outbox full"),
                });
                drop(outbox);
                self.ready.notify_one();
                return Err(SocketError::OutboxFull {
                    max: self.max_outbox as usize,
                });
            }
            outbox.queue.push_back(message);
        }
        self.ready.notify_one();
        Ok(())
    }

    fn close(&self, code: u16, reason: &str) {
        {
            let mut outbox = self.outbox.lock();
            if outbox.closed || outbox.close.is_some() {
                return;
            }
            outbox.close = Some(CloseFrame {
                code,
                reason: Utf8Bytes::from(reason),
            });
        }
        self.ready.notify_one();
    }

    fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|mine| &**mine == tag)
    }
}

/// An open hibernatable socket of an instance, as its object sees it: in
/// the socket events of [`Object`](crate::Object), and from
/// [`Context::sockets`](crate::Context::sockets). A cheap handle (one
/// `Arc`); the socket stays open however many handles are dropped.
///
/// Sends are queued and return at once; the worker writes them in order.
#[derive(Clone)]
pub struct Socket {
    pub(crate) transport: Transport,
}

/// Where a socket's connection is.
#[derive(Clone)]
pub(crate) enum Transport {
    /// On this worker (its task writes it).
    Local(Arc<SocketShared>),
    /// Held at pinboard (`survive_moves`): sends go to pinboard.
    Held(Arc<super::held_sockets::HeldSocket>),
}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Socket")
            .field("number", &self.number())
            .field("held", &self.held_id())
            .finish_non_exhaustive()
    }
}

impl Socket {
    pub(crate) fn local(shared: Arc<SocketShared>) -> Self {
        Self {
            transport: Transport::Local(shared),
        }
    }

    pub(crate) fn held(held: Arc<super::held_sockets::HeldSocket>) -> Self {
        Self {
            transport: Transport::Held(held),
        }
    }

    /// pinboard's id of a socket it holds
    /// ([`SocketOptions::survive_moves`]); `None` for a socket on this
    /// worker. Unlike [`number`](Self::number), it is the same on every
    /// worker that owns the id.
    pub fn held_id(&self) -> Option<&str> {
        match &self.transport {
            Transport::Local(_) => None,
            Transport::Held(held) => Some(&held.id),
        }
    }
}

impl Socket {
    /// The socket's number, unique within its namespace on this worker for
    /// the worker's life.
    pub fn number(&self) -> u64 {
        match &self.transport {
            Transport::Local(shared) => shared.number,
            Transport::Held(held) => held.number,
        }
    }

    /// The tags it was accepted with.
    pub fn tags(&self) -> impl Iterator<Item = &str> {
        let tags = match &self.transport {
            Transport::Local(shared) => &shared.tags[..],
            Transport::Held(held) => held.tags(),
        };
        tags.iter().map(|tag| &**tag)
    }

    /// Whether it carries `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        match &self.transport {
            Transport::Local(shared) => shared.has_tag(tag),
            Transport::Held(held) => held.has_tag(tag),
        }
    }

    /// The sequence number of the last event handed out on this socket
    /// (for a held socket: the last one delivered to this worker).
    pub fn last_seq(&self) -> u64 {
        match &self.transport {
            Transport::Local(shared) => shared.seq.load(Ordering::SeqCst),
            Transport::Held(held) => held.seq.load(Ordering::SeqCst),
        }
    }

    /// Its attachment: `None` when it has none.
    ///
    /// # Errors
    ///
    /// When the stored attachment does not deserialize as `T`.
    pub fn attachment<T: DeserializeOwned>(&self) -> Result<Option<T>, serde_json::Error> {
        let stored = match &self.transport {
            Transport::Local(shared) => shared.attachment.lock().clone(),
            Transport::Held(held) => held.attachment_bytes(),
        };
        stored
            .as_deref()
            .map(serde_json::from_slice::<T>)
            .transpose()
    }

    /// Replaces its attachment: it survives hibernation (it is kept with
    /// the socket, not with the instance), and for a held socket moves
    /// (pinboard keeps it).
    ///
    /// # Errors
    ///
    /// When `value` does not serialize or serializes to more than
    /// [`SocketOptions::max_attachment`] bytes; the old attachment stays.
    pub fn set_attachment<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), SocketError> {
        match &self.transport {
            Transport::Local(shared) => {
                let bytes = encode_attachment(value, shared.max_attachment as usize)?;
                *shared.attachment.lock() = Some(bytes);
                Ok(())
            }
            Transport::Held(held) => {
                let bytes = encode_attachment(value, held.max_attachment as usize)?;
                held.set_attachment(bytes)
            }
        }
    }

    /// Queues `message` to be sent.
    ///
    /// # Errors
    ///
    /// [`SocketError::Closed`] once the socket closed;
    /// [`SocketError::OutboxFull`] when its client fell a whole outbox
    /// behind (the socket is then closed with 1013), or for a held socket
    /// when the namespace's queue of sends to pinboard is full.
    pub fn send(&self, message: impl Into<Message>) -> Result<(), SocketError> {
        match &self.transport {
            Transport::Local(shared) => shared.push(message.into()),
            Transport::Held(held) => held.send(message.into()),
        }
    }

    /// Closes the socket with `code` and `reason` (after what is queued).
    /// No close event is delivered for a close the object asked for.
    pub fn close(&self, code: u16, reason: &str) {
        match &self.transport {
            Transport::Local(shared) => shared.close(code, reason),
            Transport::Held(held) => held.close(code, reason),
        }
    }

    /// Whether the socket is still open (no close sent or received).
    pub fn is_open(&self) -> bool {
        match &self.transport {
            Transport::Local(shared) => {
                let outbox = shared.outbox.lock();
                !outbox.closed && outbox.close.is_none()
            }
            Transport::Held(held) => held.is_open(),
        }
    }
}

/// Serializes an attachment within its bound.
pub(crate) fn encode_attachment<T: Serialize + ?Sized>(
    value: &T,
    max: usize,
) -> Result<Box<[u8]>, SocketError> {
    bounded_attachment(serde_json::to_vec(value)?, max)
}

/// An attachment's JSON, within its bound.
pub(crate) fn bounded_attachment(bytes: Vec<u8>, max: usize) -> Result<Box<[u8]>, SocketError> {
    if bytes.len() > max {
        return Err(SocketError::AttachmentTooLarge {
            size: bytes.len(),
            max,
        });
    }
    Ok(bytes.into_boxed_slice())
}

/// The sockets of one id.
#[derive(Default)]
pub(crate) struct SocketSet {
    members: Mutex<HashMap<u64, Arc<SocketShared>>>,
    /// The placement epoch the id served at when a socket was last
    /// accepted: a wake-up activates at it.
    epoch: Mutex<Option<u64>>,
}

impl SocketSet {
    pub(crate) fn epoch(&self) -> Option<u64> {
        *self.epoch.lock()
    }

    /// Notes the epoch the id's instance served at last (a hibernating
    /// instance may have adopted a newer one than its sockets saw).
    pub(crate) fn note_epoch(&self, epoch: Option<u64>) {
        let mut mine = self.epoch.lock();
        if epoch > *mine {
            *mine = epoch;
        }
    }
}

/// What a socket is accepted with.
pub(crate) struct Accepting {
    pub(crate) tags: Vec<Box<str>>,
    pub(crate) attachment: Option<Box<[u8]>>,
    pub(crate) epoch: Option<u64>,
}

/// The namespace's sockets.
pub(crate) struct Sockets {
    sets: DashMap<Box<str>, Arc<SocketSet>>,
    next: AtomicU64,
    /// Sockets open in the whole worker (shared by its namespaces).
    worker_open: Arc<AtomicUsize>,
    worker_max: usize,
    /// No new sockets (the worker is closing).
    shut: AtomicBool,
    /// Woken whenever a socket leaves, for a closing worker that waits
    /// for its close frames to be written ([`Sockets::all_closed`]).
    left: Notify,
}

impl Sockets {
    pub(crate) fn new(worker_open: Arc<AtomicUsize>, worker_max: usize) -> Self {
        Self {
            sets: DashMap::new(),
            next: AtomicU64::new(1),
            worker_open,
            worker_max,
            left: Notify::new(),
            shut: AtomicBool::new(false),
        }
    }

    /// Whether `id` has a socket open.
    pub(crate) fn has(&self, id: &str) -> bool {
        self.sets.contains_key(id)
    }

    /// The ids with a socket open.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.sets.iter().map(|set| set.key().to_string()).collect()
    }

    pub(crate) fn set(&self, id: &str) -> Option<Arc<SocketSet>> {
        self.sets.get(id).map(|set| set.value().clone())
    }

    /// The open sockets of `id`, those carrying `tag` if given.
    pub(crate) fn list(&self, id: &str, tag: Option<&str>) -> Vec<Socket> {
        let Some(set) = self.set(id) else {
            return Vec::new();
        };
        let members = set.members.lock();
        let mut sockets: Vec<Socket> = members
            .values()
            .filter(|shared| tag.is_none_or(|tag| shared.has_tag(tag)))
            .map(|shared| Socket::local(shared.clone()))
            .collect();
        sockets.sort_unstable_by_key(Socket::number);
        sockets
    }

    /// Adds a socket to `id`'s set, within the bounds.
    pub(crate) fn reserve(
        &self,
        id: &str,
        options: &SocketOptions,
        accepting: Accepting,
    ) -> Result<Arc<SocketShared>, SocketError> {
        if self.shut.load(Ordering::SeqCst) {
            return Err(SocketError::Closing);
        }
        if accepting.tags.len() > MAX_SOCKET_TAGS
            || accepting
                .tags
                .iter()
                .any(|tag| tag.len() > MAX_SOCKET_TAG_LEN)
        {
            return Err(SocketError::Tags);
        }
        if self.worker_open.fetch_add(1, Ordering::SeqCst) >= self.worker_max {
            self.worker_open.fetch_sub(1, Ordering::SeqCst);
            return Err(SocketError::WorkerFull {
                max: self.worker_max,
            });
        }
        let shared = Arc::new(SocketShared {
            number: self.next.fetch_add(1, Ordering::Relaxed),
            tags: accepting.tags.into_boxed_slice(),
            attachment: Mutex::new(accepting.attachment),
            outbox: Mutex::new(Outbox::default()),
            ready: Notify::new(),
            seq: AtomicU64::new(0),
            max_attachment: u32::try_from(options.max_attachment).unwrap_or(u32::MAX),
            max_outbox: u32::try_from(options.outbox).unwrap_or(u32::MAX),
        });
        // Under the entry's lock: a set is removed only when empty, under
        // the same lock, so a socket is never added to a removed set.
        let entry = self.sets.entry(Box::from(id)).or_default();
        let set = entry.value();
        let mut members = set.members.lock();
        if members.len() >= options.max_per_instance {
            drop(members);
            drop(entry);
            self.worker_open.fetch_sub(1, Ordering::SeqCst);
            self.drop_if_empty(id);
            return Err(SocketError::InstanceFull {
                max: options.max_per_instance,
            });
        }
        members.insert(shared.number, shared.clone());
        if accepting.epoch.is_some() {
            *set.epoch.lock() = accepting.epoch;
        }
        Ok(shared)
    }

    /// Takes socket `number` out of `id`'s set; `Some(epoch)` when that
    /// left the id without sockets (its set is gone), with the epoch its
    /// placement was kept at.
    pub(crate) fn remove(&self, id: &str, number: u64) -> Option<Option<u64>> {
        let set = self.set(id)?;
        if set.members.lock().remove(&number).is_some() {
            self.worker_open.fetch_sub(1, Ordering::SeqCst);
        }
        let epoch = set.epoch();
        let dropped = self.drop_if_empty(id);
        self.left.notify_waiters();
        dropped.then_some(epoch)
    }

    /// Waits until every socket has left (each one's task wrote its close
    /// frame, or gave up on a client that does not read), at most
    /// [`CLOSE_DEADLINE`]: a closing worker that exited at once would cut
    /// the close frames it just queued, and its clients would see a reset
    /// instead of the code that tells them to reconnect.
    pub(crate) async fn all_closed(&self) {
        let until = tokio::time::Instant::now() + CLOSE_DEADLINE;
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if self.sets.is_empty() {
                return;
            }
            if tokio::time::timeout_at(until, left).await.is_err() {
                return;
            }
        }
    }

    fn drop_if_empty(&self, id: &str) -> bool {
        self.sets
            .remove_if(id, |_, set| set.members.lock().is_empty())
            .is_some()
    }

    /// Closes every socket of `id` with `code` and `reason`.
    pub(crate) fn close_id(&self, id: &str, code: u16, reason: &str) {
        if let Some(set) = self.set(id) {
            for shared in set.members.lock().values() {
                shared.close(code, reason);
            }
        }
    }

    /// Closes every socket; with `shut`, accepts no more.
    pub(crate) fn close_all(&self, code: u16, reason: &str, shut: bool) {
        if shut {
            self.shut.store(true, Ordering::SeqCst);
        }
        let sets: Vec<Arc<SocketSet>> = self.sets.iter().map(|set| set.value().clone()).collect();
        for set in sets {
            for shared in set.members.lock().values() {
                shared.close(code, reason);
            }
        }
    }

    /// Whether the namespace takes no new sockets.
    pub(crate) fn is_shut(&self) -> bool {
        self.shut.load(Ordering::SeqCst)
    }
}

impl Namespace {
    /// A socket of `id` closed: it leaves the set, and when it was the last
    /// one of an id with no instance record (hibernated), the placement
    /// the sockets kept is released.
    pub(crate) fn socket_gone(self: &Arc<Self>, id: &str, number: u64) {
        self.metrics.sockets_open.dec();
        let Some(epoch) = self.sockets.remove(id, number) else {
            return;
        };
        // A closing worker deregisters: no release per id.
        if self.slot(id).is_none()
            && self.options.release_placement_on_idle
            && !self.sockets.is_shut()
        {
            let host = self.clone();
            let id = id.to_owned();
            super::spawn_detached(&self.domain.clone(), async move {
                super::teardown::release_placement(&host, &id, epoch).await;
            });
        }
    }
}
