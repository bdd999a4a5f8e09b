//! `POST /<ns>/<id>/_pinned/sockets/event`: an event of a socket pinboard
//! holds (`pinned_wire::held`), delivered to the id's owner as a request
//! through the request stack (admitted, activated, in its turn, shielded),
//! and handed to the object as `on_socket_message` / `on_socket_close`.
//!
//! What the handler sends from its own task rides the answer (so an owner
//! that dies before answering loses none of it: the event comes again).
//!
//! Owns reading and checking the event and its answer; never
//! deduplicates (the object sees `seq`), and never authorizes it again:
//! the stack skips `authorize` for an event pinboard marked
//! ([`is_event`]), since it ran for the handshake.

use std::panic::AssertUnwindSafe;

use axum::extract::ws::Message;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine as _;
use futures_util::FutureExt;
use http::request::Parts;
use http::StatusCode;
use http_body_util::BodyExt;
use pinned_wire::held::{Event, EventAnswer, EventKind, EVENT_PATH, SOCKET_EVENT};

use crate::namespace::held_sockets::{capturing, raw};
use crate::namespace::sockets::{Socket, SocketClose, SocketEvent, SocketMessage};
use crate::namespace::{panic_message, Namespace};
use crate::object::call::Admitted;
use crate::response;

/// The largest event body read: a message of pinboard's bound (1 MiB),
/// base64, with its fields.
const MAX_EVENT_BODY: usize = 2 * 1024 * 1024;

/// The route, merged into every object's routes behind the stack.
pub(crate) fn route<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route(EVENT_PATH, axum::routing::post(event))
}

/// Whether the request is an event pinboard delivers to a namespace whose
/// sockets survive moves: only then is `authorize` skipped. Behind
/// pinboard only (every instance request is attested there, and pinboard
/// strips a client's `pinboard-*` fields).
pub(crate) fn is_event(host: &Namespace, parts: &Parts) -> bool {
    host.options.sockets.survive_moves
        && host.control.pinboard().is_some()
        && parts.uri.path() == EVENT_PATH
        && parts.headers.contains_key(SOCKET_EVENT)
}

fn bad(detail: &str) -> Response {
    response::detail(StatusCode::BAD_REQUEST, detail)
}

async fn event(request: Request) -> Response {
    let Some(admitted) = Admitted::of(request.extensions()).cloned() else {
        return response::internal_error();
    };
    let (parts, body) = request.into_parts();
    let slot = admitted.call.ctx.slot().clone();
    let host = slot.host.clone();
    if !is_event(&host, &parts) {
        return response::not_found();
    }
    let marked = parts
        .headers
        .get(SOCKET_EVENT)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let body = match http_body_util::Limited::new(body, MAX_EVENT_BODY)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return response::detail(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("event body over {MAX_EVENT_BODY} bytes, or cut short"),
            )
        }
    };
    let event: Event = match serde_json::from_slice(&body) {
        Ok(event) => event,
        Err(error) => return bad(&format!("malformed event: {error}")),
    };
    if event.socket != marked {
        return bad(&format!(
            "event names socket {:?}, its pinboard-socket-event field {marked:?}",
            event.socket
        ));
    }
    let options = &host.options.sockets;
    let attachment = event
        .attachment
        .as_ref()
        .map(|raw| raw.get().as_bytes().to_vec().into_boxed_slice());
    if let Some(bytes) = &attachment {
        if bytes.len() > options.max_attachment {
            return response::detail(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "socket attachment is {} bytes, over the bound of {}",
                    bytes.len(),
                    options.max_attachment
                ),
            );
        }
    }
    let socket_event = match (event.kind, event.data) {
        (EventKind::Text, Some(text)) => SocketEvent::Message(SocketMessage {
            seq: event.seq,
            message: Message::Text(text.into()),
        }),
        (EventKind::Binary, Some(data)) => {
            match base64::engine::general_purpose::STANDARD.decode(data) {
                Ok(bytes) => SocketEvent::Message(SocketMessage {
                    seq: event.seq,
                    message: Message::Binary(bytes.into()),
                }),
                Err(_) => return bad("\"data\" of a binary event is not base64"),
            }
        }
        (EventKind::Text | EventKind::Binary, None) => {
            return bad("a text or binary event carries \"data\"")
        }
        (EventKind::Close, _) => SocketEvent::Close(SocketClose {
            seq: event.seq,
            code: event.code.unwrap_or(1005),
            reason: event.reason.unwrap_or_default(),
        }),
    };
    let held = match host
        .held
        .learn(&slot.id, &event.socket, &event.tags, attachment, options)
    {
        Ok(held) => held,
        Err(error) => return error.into_response(),
    };
    held.seq
        .store(event.seq, std::sync::atomic::Ordering::SeqCst);
    held.attachment_set
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let closing = matches!(socket_event, SocketEvent::Close(_));
    let hook = if closing {
        "on_socket_close"
    } else {
        "on_socket_message"
    };
    let handler = (host.lifecycle.on_socket)(
        admitted.instance.clone(),
        slot.clone(),
        Socket::held(held.clone()),
        socket_event,
    );
    let (outcome, sends) = capturing(AssertUnwindSafe(handler).catch_unwind()).await;
    let error = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error.to_string()),
        Err(panic) => Some(panic_message(panic.as_ref())),
    };
    if let Some(error) = error {
        // As for a socket on this worker: logged and counted, and the
        // event answered, so pinboard does not deliver it forever.
        tracing::error!(namespace = %host.ns, id = %slot.id, %error, hook, "socket event handler failed");
        host.metrics.callback_failed(hook);
    }
    if closing {
        host.held.forget_socket(&slot.id, &event.socket);
    }
    let attachment = if held
        .attachment_set
        .swap(false, std::sync::atomic::Ordering::SeqCst)
    {
        held.attachment_bytes().and_then(|bytes| raw(&bytes).ok())
    } else {
        None
    };
    axum::Json(EventAnswer { attachment, sends }).into_response()
}
