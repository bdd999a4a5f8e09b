//! WebSockets: hibernatable sockets in the instance's socket set, or plain
//! sockets that keep their instance in flight.
//!
//! # Hibernatable sockets
//!
//! [`WebSocketUpgrade::accept`] puts the socket into its instance's socket
//! set, with tags and a small serde attachment ([`Accept`]); its events
//! reach the object as trait methods
//! ([`Object::on_socket_message`](crate::Object::on_socket_message),
//! [`Object::on_socket_close`](crate::Object::on_socket_close)), with the
//! instance and its context, instead of a task per socket. The socket does
//! not keep its instance in flight: an instance whose only work is open
//! sockets is evicted when idle (*hibernated*): its memory is released, its
//! sockets stay open on this worker and keep its placement here, and the
//! next message activates the id again and is delivered to it.
//! [`Context::sockets`](crate::Context::sockets) lists the sockets,
//! [`Context::broadcast`](crate::Context::broadcast) sends to them;
//! [`SocketOptions`] holds the bounds, the wake deadline and an
//! auto-response answered without waking the instance.
//!
//! ```
//! use axum::{routing::get, Router};
//! use pinned::ws::{Accept, Message, Socket, SocketError, SocketMessage, WebSocketUpgrade};
//! use pinned::{BoxError, Call, Context, Object, Routes};
//!
//! struct Room;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Member { name: String }
//!
//! impl Object for Room {
//!     async fn activate(_ctx: &Context) -> Result<Self, BoxError> { Ok(Room) }
//!
//!     fn routes() -> Routes<Self> {
//!         Router::new().route("/ws", get(join))
//!     }
//!
//!     async fn on_socket_message(&self, ctx: &Context, socket: &Socket, message: SocketMessage) -> Result<(), BoxError> {
//!         let member: Option<Member> = socket.attachment()?;
//!         let name = member.map_or_else(|| "someone".to_owned(), |m| m.name);
//!         if let Message::Text(text) = &message.message {
//!             ctx.broadcast(None, format!("{name}: {}", text.as_str()));
//!         }
//!         Ok(())
//!     }
//! }
//!
//! async fn join(ws: WebSocketUpgrade) -> Result<axum::response::Response, SocketError> {
//!     ws.accept(Accept::new().tag("members").attachment(&Member { name: "ada".into() }))
//! }
//! ```
//!
//! # Plain sockets
//!
//! [`WebSocketUpgrade::on_upgrade`] wraps axum's: an accepted socket counts as
//! an open stream of the instance until the callback returns, so idle
//! eviction and drain wait for it; when the instance is aborted (a drain or
//! wind-down deadline, `abort()`, worker close) the callback is dropped and
//! the socket closed with 1001 `instance closed`.
//!
//! ```
//! use axum::{routing::get, Router};
//! use pinned::ws::{Message, WebSocketUpgrade};
//!
//! fn routes() -> Router {
//!     Router::new().route(
//!         "/ws",
//!         get(|ws: WebSocketUpgrade| async move {
//!             ws.on_upgrade(|mut socket| async move {
//!                 while let Some(Ok(message)) = socket.recv().await {
//!                     if socket.send(message).await.is_err() {
//!                         break;
//!                     }
//!                 }
//!             })
//!         }),
//!     )
//! }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ws as axum_ws;
use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use http::request::Parts;
use parking_lot::Mutex;

pub use axum::extract::ws::{CloseFrame, Message, Utf8Bytes};

pub use crate::namespace::sockets::{
    Socket, SocketClose, SocketError, SocketMessage, SocketOptions, CLOSE_TRY_AGAIN_LATER,
    DEFAULT_MAX_ATTACHMENT, DEFAULT_MAX_SOCKETS, DEFAULT_MAX_SOCKETS_PER_INSTANCE,
    DEFAULT_SOCKET_BUFFER, DEFAULT_SOCKET_OUTBOX, DEFAULT_WAKE_DEADLINE, MAX_SOCKET_TAGS,
    MAX_SOCKET_TAG_LEN,
};

pub use crate::namespace::held_sockets::DEFAULT_HELD_SEND_QUEUE;

use crate::namespace::held_sockets::raw as raw_attachment;
use crate::namespace::socket_task::{self, Membership};
use crate::namespace::sockets::{bounded_attachment, Accepting};
use crate::namespace::Record;
use crate::object::call::Admitted;
use crate::object::call::NotAnInstanceRoute;

/// Close code sent to sockets still open when their instance is aborted.
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// Close code for "service restart, reconnect" (RFC 6455 registry): what a
/// socket loop sends when [`Context::wind_down_started`] fires, so clients
/// reconnect and pinboard places them on another worker.
///
/// [`Context::wind_down_started`]: crate::Context::wind_down_started
pub const CLOSE_SERVICE_RESTART: u16 = 1012;
/// Reason sent with [`CLOSE_GOING_AWAY`].
pub const CLOSE_REASON: &str = "instance closed";

/// Bounds the close handshake of an aborted socket, so a dead peer cannot
/// hold a closing instance.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The read buffer of a hibernatable socket's connection, in bytes: it is
/// allocated up front and kept while the socket idles, so it is small
/// (tungstenite's default is 128 KiB; 512 B cost 340 B more per socket in
/// `socket-bench` than this); a frame's known length grows it as needed.
const SOCKET_READ_BUFFER: usize = 128;

/// What a hibernatable socket is accepted with: its tags and attachment.
///
/// ```
/// # fn demo() {
/// use pinned::ws::Accept;
/// let accept = Accept::new().tag("room:lobby").tag("user:ada").attachment(&("ada", 7));
/// # let _ = accept;
/// # }
/// ```
#[derive(Default)]
#[must_use]
pub struct Accept {
    tags: Vec<Box<str>>,
    attachment: Option<Result<Vec<u8>, serde_json::Error>>,
}

impl Accept {
    /// No tags, no attachment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tag ([`Context::sockets`](crate::Context::sockets) and
    /// [`Context::broadcast`](crate::Context::broadcast) select by tag):
    /// at most [`MAX_SOCKET_TAGS`] of [`MAX_SOCKET_TAG_LEN`] bytes each.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tags.push(tag.into().into_boxed_str());
        self
    }

    /// Sets the attachment: any serde value, kept as JSON with the socket
    /// (so it survives hibernation), at most
    /// [`SocketOptions::max_attachment`] bytes. A value that does not
    /// serialize or is too large makes [`WebSocketUpgrade::accept`] fail.
    pub fn attachment<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Self {
        self.attachment = Some(serde_json::to_vec(value));
        self
    }
}

/// Extractor for a WebSocket handshake on an instance route.
pub struct WebSocketUpgrade {
    inner: axum_ws::WebSocketUpgrade,
    slot: Arc<Record>,
    /// pinboard's offer to hold the socket (`pinned_wire::held`): read
    /// only behind pinboard, where every instance request is attested
    /// and pinboard strips a client's copy.
    offer: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for WebSocketUpgrade {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let slot = Admitted::of(&parts.extensions)
            .map(|admitted| admitted.call.ctx.slot().clone())
            .ok_or_else(|| NotAnInstanceRoute("pinned::ws::WebSocketUpgrade").into_response())?;
        let offer = match slot.host.control.pinboard() {
            Some(_) => parts
                .headers
                .get(pinned_wire::held::SOCKET_OFFER)
                .and_then(|value| value.to_str().ok())
                .filter(|id| id.len() <= pinned_wire::held::MAX_SOCKET_ID_LEN)
                .map(str::to_owned),
            None => None,
        };
        let inner = axum_ws::WebSocketUpgrade::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self { inner, slot, offer })
    }
}

impl WebSocketUpgrade {
    /// Accepts one of the subprotocols the client offered, if any.
    #[must_use]
    pub fn protocols<I>(mut self, protocols: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<std::borrow::Cow<'static, str>>,
    {
        self.inner = self.inner.protocols(protocols);
        self
    }

    /// Completes the handshake and puts the socket into its instance's
    /// socket set, with `accept`'s tags and attachment: its events reach
    /// [`Object::on_socket_message`](crate::Object::on_socket_message) and
    /// [`Object::on_socket_close`](crate::Object::on_socket_close), and it
    /// does not keep the instance in flight (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// Before the handshake, so the client gets a plain HTTP answer (the
    /// error is an `IntoResponse`): [`SocketError::AttachmentTooLarge`]
    /// (413), [`SocketError::Tags`] (400), [`SocketError::InstanceFull`],
    /// [`SocketError::WorkerFull`] or [`SocketError::Closing`] (503,
    /// `Retry-After: 1`), [`SocketError::Attachment`] (500).
    pub fn accept(self, accept: Accept) -> Result<Response, SocketError> {
        let host = self.slot.host.clone();
        let options = &host.options.sockets;
        if self.slot.is_cancelled() || self.slot.winding_down() {
            return Err(SocketError::Closing);
        }
        let attachment = match accept.attachment {
            None => None,
            Some(Err(error)) => return Err(SocketError::Attachment(error)),
            Some(Ok(bytes)) => Some(bounded_attachment(bytes, options.max_attachment)?),
        };
        if let Some(offer) = self.offer.filter(|_| options.survive_moves) {
            return hold(&self.slot, &offer, accept.tags, attachment);
        }
        let shared = host.sockets.reserve(
            &self.slot.id,
            options,
            Accepting {
                tags: accept.tags,
                attachment,
                epoch: self.slot.epoch(),
            },
        )?;
        host.metrics.sockets_open.inc();
        // Dropped with the callback when the handshake never completes:
        // the reserved place is given back.
        let membership = Membership {
            host,
            id: std::sync::Arc::from(self.slot.id.as_str()),
            shared,
        };
        Ok(self
            .inner
            .read_buffer_size(SOCKET_READ_BUFFER)
            .on_upgrade(move |socket| socket_task::run(membership, socket)))
    }

    /// Whether pinboard offered to hold this socket: [`accept`](Self::accept)
    /// in a namespace whose sockets survive moves
    /// ([`SocketOptions::survive_moves`]) then leaves it to pinboard.
    pub fn held_by_pinboard(&self) -> bool {
        self.offer.is_some() && self.slot.host.options.sockets.survive_moves
    }

    /// Completes the handshake and runs `callback` with the socket, keeping
    /// the instance in flight until it returns.
    pub fn on_upgrade<F, Fut>(self, callback: F) -> Response
    where
        F: FnOnce(WebSocket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // Taken now, so the instance stays in flight between the 101 and
        // the upgraded connection; dropped with the callback if the upgrade
        // never completes.
        let entry = self.slot.hold_stream();
        let slot = self.slot;
        self.inner.on_upgrade(move |socket| async move {
            let _entry = entry;
            let socket = WebSocket {
                inner: Arc::new(Mutex::new(socket)),
            };
            let mut closer = socket.clone();
            tokio::select! {
                () = callback(socket) => {}
                () = slot.cancelled() => {
                    let _ = closer.close(CLOSE_GOING_AWAY, CLOSE_REASON).await;
                }
            }
        })
    }
}

/// Takes pinboard's offer: the socket is the instance's as a held one
/// (`pinned_wire::held`), and the answer asks pinboard to complete the
/// client's handshake and hold it.
fn hold(
    slot: &Arc<Record>,
    offer: &str,
    tags: Vec<Box<str>>,
    attachment: Option<Box<[u8]>>,
) -> Result<Response, SocketError> {
    let host = &slot.host;
    let options = &host.options.sockets;
    let tags: Vec<String> = tags.into_iter().map(String::from).collect();
    let raw = attachment.as_deref().map(raw_attachment).transpose()?;
    host.held
        .learn(&slot.id, offer, &tags, attachment, options)?;
    let body = pinned_wire::held::Hold {
        tags,
        attachment: raw,
        auto_response: options
            .auto_response
            .as_ref()
            .map(|(request, reply)| (request.to_string(), reply.to_string())),
    };
    let mut response = axum::Json(body).into_response();
    response.headers_mut().insert(
        pinned_wire::held::SOCKET_HELD,
        http::HeaderValue::from_static("1"),
    );
    Ok(response)
}

/// An accepted WebSocket of an instance: a `Stream` of messages and a
/// `Sink` for them. Clones share the socket (for a reader and a writer).
#[derive(Clone)]
pub struct WebSocket {
    inner: Arc<Mutex<axum_ws::WebSocket>>,
}

impl WebSocket {
    /// The next message; `None` once the socket closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: no message is lost if the future is dropped.
    pub async fn recv(&mut self) -> Option<Result<Message, axum::Error>> {
        self.next().await
    }

    /// Sends one message.
    ///
    /// # Errors
    ///
    /// Fails when the connection is gone.
    pub async fn send(&mut self, message: Message) -> Result<(), axum::Error> {
        SinkExt::send(self, message).await
    }

    /// Starts the close handshake with `code` and `reason`, waiting at most
    /// one second for the frame to go out (a frozen peer cannot hold the
    /// instance).
    ///
    /// # Errors
    ///
    /// Fails when the connection is gone or the frame could not be sent in
    /// time.
    pub async fn close(&mut self, code: u16, reason: &str) -> Result<(), axum::Error> {
        let frame = CloseFrame {
            code,
            reason: Utf8Bytes::from(reason),
        };
        match tokio::time::timeout(CLOSE_TIMEOUT, self.send(Message::Close(Some(frame)))).await {
            Ok(sent) => sent,
            Err(elapsed) => Err(axum::Error::new(elapsed)),
        }
    }
}

impl Stream for WebSocket {
    type Item = Result<Message, axum::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.lock().poll_next_unpin(cx)
    }
}

impl Sink<Message> for WebSocket {
    type Error = axum::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.lock().poll_ready_unpin(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        self.inner.lock().start_send_unpin(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.lock().poll_flush_unpin(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.lock().poll_close_unpin(cx)
    }
}
