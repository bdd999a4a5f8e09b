//! WebSockets that keep their instance in flight.
//!
//! [`WebSocketUpgrade`] wraps axum's extractor: an accepted socket counts as
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

/// Extractor for a WebSocket handshake on an instance route.
pub struct WebSocketUpgrade {
    inner: axum_ws::WebSocketUpgrade,
    slot: Arc<Record>,
}

impl<S: Send + Sync> FromRequestParts<S> for WebSocketUpgrade {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let slot = Admitted::of(&parts.extensions)
            .map(|admitted| admitted.call.ctx.slot().clone())
            .ok_or_else(|| NotAnInstanceRoute("pinned::ws::WebSocketUpgrade").into_response())?;
        let inner = axum_ws::WebSocketUpgrade::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self { inner, slot })
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
