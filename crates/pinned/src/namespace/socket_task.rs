//! One hibernatable socket's task: it reads the client's messages, answers
//! the auto-response, buffers the rest (bounded) and hands them to the
//! object one at a time, in order, entering the instance for each (which
//! activates an evicted id again); it writes what the object queued.
//!
//! The task holds no instance: between events the instance may be evicted
//! while the connection stays here. It never decides about placement:
//! leaving, it tells the namespace ([`Namespace::socket_gone`]), which does.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, SinkExt};
use pinned_wire::refusal::Refusal;

use super::sockets::{
    Socket, SocketClose, SocketEvent, SocketMessage, SocketShared, CLOSE_TRY_AGAIN_LATER,
};
use super::{panic_message, Admission, Namespace};

/// Bounds a close handshake and every write: a peer that does not read
/// cannot hold the task.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// Close code for "service restart, reconnect" (RFC 6455 registry).
const CLOSE_SERVICE_RESTART: u16 = 1012;
/// Close code for "going away" (the worker is shutting down).
const CLOSE_GOING_AWAY: u16 = 1001;

/// Keeps a socket in its id's set until dropped: with the task when the
/// socket ends, or with the upgrade callback when the handshake never
/// completes.
pub(crate) struct Membership {
    pub(crate) host: Arc<Namespace>,
    pub(crate) id: Arc<str>,
    pub(crate) shared: Arc<SocketShared>,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.shared.outbox.lock().closed = true;
        self.host.socket_gone(&self.id, self.shared.number);
    }
}

/// Why the task ended the socket itself.
struct Ended {
    code: u16,
    reason: Utf8Bytes,
}

impl Ended {
    fn new(code: u16, reason: &'static str) -> Self {
        Self {
            code,
            reason: Utf8Bytes::from_static(reason),
        }
    }
}

/// Runs one accepted socket until it closes.
pub(crate) async fn run(membership: Membership, mut socket: WebSocket) {
    let host = membership.host.clone();
    let shared = membership.shared.clone();
    let id = membership.id.clone();
    let buffer = host.options.sockets.buffer;
    let auto = host.options.sockets.auto_response.clone();
    let mut inbox: VecDeque<Message> = VecDeque::new();
    let mut delivering: Option<BoxFuture<'static, Result<(), Ended>>> = None;
    let mut peer_closed: Option<(u16, Utf8Bytes)> = None;
    let ended = loop {
        // What the object queued goes out first, whole, in order.
        let (queued, close) = {
            let mut outbox = shared.outbox.lock();
            (std::mem::take(&mut outbox.queue), outbox.close.take())
        };
        if !queued.is_empty() && write_all(&mut socket, queued).await.is_err() {
            peer_closed.get_or_insert((1006, Utf8Bytes::default()));
            shared.outbox.lock().closed = true;
        }
        if let Some(frame) = close {
            shared.outbox.lock().closed = true;
            say_goodbye(&mut socket, frame).await;
            return;
        }
        // The next event, one at a time; the close after every message
        // (also when a write found the peer gone, with nothing left to
        // read).
        if delivering.is_none() {
            if let Some(message) = inbox.pop_front() {
                let seq = next_seq(&shared);
                let event = SocketEvent::Message(SocketMessage { seq, message });
                delivering = Some(deliver(host.clone(), id.clone(), shared.clone(), event).boxed());
            } else if let Some((code, reason)) = peer_closed.take() {
                shared.outbox.lock().closed = true;
                if !host.sockets.is_shut() {
                    let seq = next_seq(&shared);
                    let event = SocketEvent::Close(SocketClose {
                        seq,
                        code,
                        reason: reason.to_string(),
                    });
                    let _ = deliver(host.clone(), id.clone(), shared.clone(), event).await;
                }
                break None;
            }
        }
        tokio::select! {
            biased;
            () = shared.ready.notified() => {}
            outcome = async {
                match delivering.as_mut() {
                    Some(delivery) => delivery.await,
                    None => std::future::pending().await,
                }
            }, if delivering.is_some() => {
                delivering = None;
                if let Err(ended) = outcome {
                    break Some(ended);
                }
            }
            incoming = socket.recv(), if peer_closed.is_none() => match incoming {
                Some(Ok(Message::Text(text)))
                    if auto.as_ref().is_some_and(|(request, _)| *request == text) =>
                {
                    if let Some((_, reply)) = &auto {
                        host.metrics.socket_auto_responses.inc();
                        shared.outbox.lock().queue.push_back(Message::Text(reply.clone()));
                    }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(frame))) => {
                    peer_closed = Some(frame.map_or((1005, Utf8Bytes::default()), |frame| (frame.code, frame.reason)));
                }
                Some(Ok(message)) => {
                    if inbox.len() >= buffer {
                        break Some(Ended::new(CLOSE_TRY_AGAIN_LATER, "too many messages while the instance wakes"));
                    }
                    inbox.push_back(message);
                }
                Some(Err(_)) | None => {
                    peer_closed = Some((1006, Utf8Bytes::default()));
                }
            },
        }
    };
    if let Some(ended) = ended {
        shared.outbox.lock().closed = true;
        tracing::debug!(namespace = %host.ns, id = %id, code = ended.code, reason = %ended.reason, "closing a socket");
        say_goodbye(
            &mut socket,
            CloseFrame {
                code: ended.code,
                reason: ended.reason,
            },
        )
        .await;
    }
    drop(membership);
}

fn next_seq(shared: &SocketShared) -> u64 {
    shared
        .seq
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        .saturating_add(1)
}

/// Writes `queued` and flushes once, within the write deadline.
async fn write_all(socket: &mut WebSocket, queued: VecDeque<Message>) -> Result<(), ()> {
    let write = async {
        for message in queued {
            socket.feed(message).await.map_err(drop)?;
        }
        socket.flush().await.map_err(drop)
    };
    tokio::time::timeout(WRITE_DEADLINE, write)
        .await
        .map_err(drop)?
}

async fn say_goodbye(socket: &mut WebSocket, frame: CloseFrame) {
    let _ = tokio::time::timeout(WRITE_DEADLINE, socket.send(Message::Close(Some(frame)))).await;
}

/// Hands one event to the object: enters the instance (activating the id
/// when it is not resident, within the wake deadline), takes a turn in
/// exclusive mode, and runs the object's socket method. A failing method
/// is logged and counted; the socket stays open.
async fn deliver(
    host: Arc<Namespace>,
    id: Arc<str>,
    shared: Arc<SocketShared>,
    event: SocketEvent,
) -> Result<(), Ended> {
    let epoch = host.sockets.set(&id).and_then(|set| set.epoch());
    let waking = host.resident_slot(&id).is_none();
    let wake = host.options.sockets.wake_deadline;
    let (busy, instance) = match tokio::time::timeout(wake, host.enter(&id, epoch)).await {
        Err(_) => {
            tracing::warn!(namespace = %host.ns, id = %id, "instance did not wake for a socket event in time");
            return Err(Ended::new(
                CLOSE_TRY_AGAIN_LATER,
                "instance did not wake in time",
            ));
        }
        Ok(Err(admission)) => return Err(refused(&admission)),
        Ok(Ok(entered)) => entered,
    };
    if waking {
        host.metrics.socket_wakes.inc();
    }
    let slot = busy.slot().clone();
    let _turn = match &slot.turn {
        None => None,
        Some(turn) => tokio::select! {
            biased;
            () = slot.cancelled() => return Ok(()),
            permit = turn.acquire() => permit.ok(),
        },
    };
    let hook = match &event {
        SocketEvent::Message(_) => "on_socket_message",
        SocketEvent::Close(_) => "on_socket_close",
    };
    let handler = (host.lifecycle.on_socket)(instance, slot.clone(), Socket::local(shared), event);
    let outcome = tokio::select! {
        outcome = AssertUnwindSafe(handler).catch_unwind() => outcome,
        () = slot.cancelled() => return Ok(()),
    };
    let error = match outcome {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(error)) => error.to_string(),
        Err(panic) => panic_message(panic.as_ref()),
    };
    tracing::error!(namespace = %host.ns, id = %id, %error, hook, "socket event handler failed");
    host.metrics.callback_failed(hook);
    drop(busy);
    Ok(())
}

/// How a socket ends when its instance cannot be entered.
fn refused(admission: &Admission) -> Ended {
    match admission {
        Admission::Refused(Refusal::Draining) => {
            Ended::new(CLOSE_SERVICE_RESTART, "service restart")
        }
        Admission::ShutDown => Ended::new(CLOSE_GOING_AWAY, "worker closing"),
        Admission::ActivationFailed => Ended::new(1011, "instance activation failed"),
        Admission::Paused => Ended::new(CLOSE_TRY_AGAIN_LATER, "instance paused"),
        Admission::Refused(_) => Ended::new(CLOSE_TRY_AGAIN_LATER, "instance unavailable; retry"),
    }
}
