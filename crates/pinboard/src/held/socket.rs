//! One held socket's task: it completes the client's side of the upgrade,
//! reads the client's messages (answering pings, and the namespace's
//! auto-response, itself), buffers them within their bound and delivers
//! them to the id's owner one at a time, in order, each retried until an
//! owner answers 2xx or the event deadline passes; it writes what the
//! owner sent.
//!
//! Never resolves an id: an event is a request through the [`Door`]. Never
//! closes the client for a move: only the client's close, a bound, the
//! event deadline or the owner's own close end it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use base64::Engine as _;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, SinkExt, StreamExt};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use pinned_wire::held::{Event, EventAnswer, EventKind, Sends};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::door::{Door, EventMark};
use super::fanout;
use super::registry::{HeldSocket, HeldSockets, Outgoing, CLOSE_TRY_AGAIN_LATER};

/// Bounds every write to the client and the wait for its connection after
/// the 101: a peer that does not read cannot hold the task.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// The read buffer of a held connection: allocated up front and kept while
/// the socket idles, so small (tungstenite's default is 128 KiB); a
/// frame's known length grows it as needed.
const READ_BUFFER: usize = 128;
/// The largest client message a held socket takes (an event carries it
/// base64 for binary): a larger one ends the socket (1009 from
/// tungstenite, then a close event with 1006).
const MAX_MESSAGE: usize = 1024 * 1024;
/// The largest owner answer to an event read.
const MAX_EVENT_ANSWER: usize = 64 * 1024;
/// The first pause before an event is tried again; doubled up to
/// [`MAX_RETRY_PAUSE`].
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// "Service restart": the owner does not take held events (a worker that
/// did not opt in took the id over): the client reconnects.
const CLOSE_SERVICE_RESTART: u16 = 1012;

/// What every event request of a socket carries: its target and the
/// client's world (`Host`, `Pinboard-Hostname`, `Pinboard-Env`). Kept for
/// the socket's life, so compact: the fields in one shared slice (a
/// `HeaderMap` would hold room for more).
#[derive(Clone, Debug)]
pub struct Template {
    /// `/<ns>/<id>/_pinned/sockets/event`, the id as the client sent it.
    pub uri: Uri,
    /// The fields naming the client's world.
    pub headers: Arc<[(HeaderName, HeaderValue)]>,
}

/// Everything a held socket's task needs.
pub struct Spawn {
    /// The proxy's entry.
    pub door: Arc<dyn Door>,
    /// The table the socket is in.
    pub sockets: Arc<HeldSockets>,
    /// The socket.
    pub socket: Arc<HeldSocket>,
    /// Its events' target and world.
    pub template: Template,
    /// The namespace's auto-response: `(request, reply)`.
    pub auto: Option<(String, String)>,
    /// Kept until the socket ends (its connection's slot under the cap).
    pub keep: Option<Arc<dyn Send + Sync>>,
}

/// How the task ended the socket itself.
struct Ended {
    code: u16,
    reason: &'static str,
}

/// Runs one held socket until it closes.
pub async fn run(spawn: Spawn, upgrade: hyper::upgrade::OnUpgrade) {
    let Spawn {
        door,
        sockets,
        socket,
        template,
        auto,
        keep,
    } = spawn;
    let _keep = keep;
    // The task lives as long as its socket: the futures it awaits rarely
    // (the hand-over, a write, the goodbye, the close's delivery) are
    // boxed, so its state stays the size of its idle wait.
    let upgraded = match Box::pin(tokio::time::timeout(WRITE_DEADLINE, upgrade)).await {
        Ok(Ok(upgraded)) => upgraded,
        _ => {
            sockets.remove(&socket);
            return;
        }
    };
    let config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let mut ws =
        WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await;
    let buffer = sockets.settings.buffer.max(1);
    let mut inbox: VecDeque<Event> = VecDeque::new();
    let mut seq = 0u64;
    let mut delivering: Option<BoxFuture<'static, Result<(), Ended>>> = None;
    let mut peer_closed: Option<(u16, String)> = None;
    let ended: Option<Ended> = loop {
        // What the owner sent goes out first, in order.
        let queued = socket.take_outbox();
        let mut goodbye = None;
        if !queued.is_empty() {
            let mut messages = Vec::with_capacity(queued.len());
            for outgoing in queued {
                match outgoing {
                    Outgoing::Message(message) => messages.push(message),
                    Outgoing::Close(code, reason) => {
                        goodbye = Some((code, reason));
                        break;
                    }
                }
            }
            if !messages.is_empty() && Box::pin(write_all(&mut ws, messages)).await.is_err() {
                peer_closed.get_or_insert((1006, String::new()));
            }
        }
        if let Some((code, reason)) = goodbye {
            Box::pin(say_goodbye(&mut ws, code, reason)).await;
            sockets.remove(&socket);
            return;
        }
        if delivering.is_none() {
            if let Some(event) = inbox.pop_front() {
                delivering = Some(
                    deliver(
                        door.clone(),
                        sockets.clone(),
                        socket.clone(),
                        template.clone(),
                        event,
                    )
                    .boxed(),
                );
            } else if let Some((code, reason)) = peer_closed.take() {
                seq += 1;
                let close = event(&socket, seq, EventKind::Close, None, Some((code, reason)));
                let _ = deliver(
                    door.clone(),
                    sockets.clone(),
                    socket.clone(),
                    template.clone(),
                    close,
                )
                .boxed()
                .await;
                break None;
            }
        }
        tokio::select! {
            biased;
            () = socket.ready.notified() => {}
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
            incoming = ws.next(), if peer_closed.is_none() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    if let Some((_, reply)) = auto.as_ref().filter(|(request, _)| *request == text.as_str()) {
                        socket.push(Outgoing::Message(Message::text(reply.clone())));
                        continue;
                    }
                    if inbox.len() >= buffer {
                        break Some(Ended { code: CLOSE_TRY_AGAIN_LATER, reason: "too many messages while the owner answers" });
                    }
                    seq += 1;
                    inbox.push_back(event(&socket, seq, EventKind::Text, Some(text.as_str().to_owned()), None));
                }
                Some(Ok(Message::Binary(bytes))) => {
                    if inbox.len() >= buffer {
                        break Some(Ended { code: CLOSE_TRY_AGAIN_LATER, reason: "too many messages while the owner answers" });
                    }
                    seq += 1;
                    let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
                    inbox.push_back(event(&socket, seq, EventKind::Binary, Some(data), None));
                }
                Some(Ok(Message::Close(frame))) => {
                    peer_closed = Some(frame.map_or((1005, String::new()), |frame| (u16::from(frame.code), frame.reason.as_str().to_owned())));
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    peer_closed = Some((1006, String::new()));
                }
            },
        }
    };
    if let Some(ended) = ended {
        tracing::debug!(target: "pinboard::held", socket = %socket.id, code = ended.code, reason = ended.reason, "closing a held socket");
        Box::pin(say_goodbye(&mut ws, ended.code, ended.reason.to_owned())).await;
    }
    sockets.remove(&socket);
}

type Client = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

fn event(
    socket: &HeldSocket,
    seq: u64,
    kind: EventKind,
    data: Option<String>,
    close: Option<(u16, String)>,
) -> Event {
    let (code, reason) = match close {
        Some((code, reason)) => (Some(code), Some(reason)),
        None => (None, None),
    };
    Event {
        socket: socket.id.to_string(),
        seq,
        kind,
        data,
        code,
        reason,
        tags: socket.tags(),
        attachment: None,
    }
}

async fn write_all(ws: &mut Client, messages: Vec<Message>) -> Result<(), ()> {
    let write = async {
        for message in messages {
            ws.feed(message).await.map_err(drop)?;
        }
        ws.flush().await.map_err(drop)
    };
    tokio::time::timeout(WRITE_DEADLINE, write)
        .await
        .map_err(drop)?
}

async fn say_goodbye(ws: &mut Client, code: u16, reason: String) {
    let frame = CloseFrame {
        code: CloseCode::from(code),
        reason: reason.into(),
    };
    let _ = tokio::time::timeout(WRITE_DEADLINE, ws.send(Message::Close(Some(frame)))).await;
}

/// Delivers `event` to the id's owner: tried until answered 2xx, or the
/// event deadline passes (1013), or the owner does not take held events
/// (404: 1012, so the client reconnects to whatever serves the id now).
async fn deliver(
    door: Arc<dyn Door>,
    sockets: Arc<HeldSockets>,
    socket: Arc<HeldSocket>,
    template: Template,
    mut event: Event,
) -> Result<(), Ended> {
    let deadline = Instant::now() + sockets.settings.event_deadline;
    let mut pause = FIRST_RETRY_PAUSE;
    let mark = HeaderValue::from_str(&socket.id).map_err(|_| Ended {
        code: 1011,
        reason: "socket id not a field value",
    })?;
    loop {
        // The attachment as the last answer or send left it.
        event.attachment = socket.attachment();
        let body = serde_json::to_vec(&event).unwrap_or_default();
        let mut request = Request::new(Body::from(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = template.uri.clone();
        let headers = request.headers_mut();
        for (name, value) in template.headers.iter() {
            headers.insert(name.clone(), value.clone());
        }
        request.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        request.extensions_mut().insert(EventMark(mark.clone()));
        let answer = tokio::time::timeout_at(deadline, door.serve(request)).await;
        let Ok(response) = answer else {
            return Err(timed_out(&socket));
        };
        let status = response.status();
        if status.is_success() {
            let body = tokio::time::timeout_at(
                deadline,
                http_body_util::Limited::new(response.into_body(), MAX_EVENT_ANSWER).collect(),
            )
            .await;
            if let Ok(Ok(body)) = body {
                if let Ok(answer) = serde_json::from_slice::<EventAnswer>(&body.to_bytes()) {
                    if let Some(attachment) = answer.attachment {
                        socket.set_attachment(attachment);
                    }
                    let sends = Sends {
                        sends: answer.sends,
                    };
                    match fanout::check(&sends) {
                        Ok(()) => {
                            fanout::deliver(&sockets, &sends);
                        }
                        Err(error) => {
                            tracing::warn!(target: "pinboard::held", socket = %socket.id, %error, "an event's answer carried bad sends; dropped");
                        }
                    }
                }
            }
            sockets.metrics.events.inc();
            return Ok(());
        }
        if status == StatusCode::NOT_FOUND {
            tracing::debug!(target: "pinboard::held", socket = %socket.id, "the id's owner does not take held events");
            return Err(Ended {
                code: CLOSE_SERVICE_RESTART,
                reason: "service restart",
            });
        }
        tracing::debug!(target: "pinboard::held", socket = %socket.id, seq = event.seq, status = status.as_u16(), "event not taken; trying again");
        sockets.metrics.retries.inc();
        if Instant::now() + pause >= deadline {
            return Err(timed_out(&socket));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

fn timed_out(socket: &HeldSocket) -> Ended {
    tracing::warn!(target: "pinboard::held", socket = %socket.id, key = %socket.key, "no owner took a held socket's event in time");
    Ended {
        code: CLOSE_TRY_AGAIN_LATER,
        reason: "no owner answered in time",
    }
}
