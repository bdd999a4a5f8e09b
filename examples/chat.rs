//! A chat room per id: every client of `/chat/<room>/ws` hears every
//! message sent to that room, for as long as the room has a socket open.
//!
//! On SIGTERM the worker drains: every room hears it at once
//! (`wind_down_started`) and closes its sockets with 1012 "service
//! restart", so clients reconnect elsewhere and the process exits in
//! milliseconds instead of waiting out the 30 s drain deadline.
//!
//! ```text
//! PORT=8080 cargo run --example chat
//! websocat ws://localhost:8080/chat/lobby/ws
//! curl localhost:8080/chat/lobby/members
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::routing::get;
use axum::{Json, Router};
use futures_util::{SinkExt, StreamExt};
use pinned::ws::{Message, WebSocketUpgrade, CLOSE_SERVICE_RESTART};
use pinned::{BoxError, Call, Context, Object, Options, This};
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// Messages a slow member may fall behind before it skips ahead.
const BACKLOG: usize = 64;

pub(crate) struct Room {
    messages: broadcast::Sender<String>,
    members: AtomicUsize,
}

impl Object for Room {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Room {
            messages: broadcast::channel(BACKLOG).0,
            members: AtomicUsize::new(0),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/ws", get(join))
            .route("/members", get(members))
    }
}

async fn members(room: This<Room>) -> Json<Value> {
    Json(json!({ "members": room.members.load(Ordering::SeqCst) }))
}

async fn join(room: This<Room>, call: Call, ws: WebSocketUpgrade) -> axum::response::Response {
    let ctx = call.ctx().clone();
    ws.on_upgrade(move |socket| async move {
        room.members.fetch_add(1, Ordering::SeqCst);
        let mut heard = room.messages.subscribe();
        let mut closer = socket.clone();
        let (mut outgoing, mut incoming) = socket.split();
        let winding_down = ctx.wind_down_started();
        tokio::pin!(winding_down);
        loop {
            tokio::select! {
                _ = &mut winding_down => {
                    let _ = closer.close(CLOSE_SERVICE_RESTART, "server restarting").await;
                    break;
                }
                said = incoming.next() => match said {
                    Some(Ok(Message::Text(text))) => {
                        let _ = room.messages.send(text.to_string());
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                },
                message = heard.recv() => match message {
                    Ok(text) => {
                        if outgoing.send(Message::text(text)).await.is_err() {
                            break;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        room.members.fetch_sub(1, Ordering::SeqCst);
    })
}

#[tokio::main]
async fn main() -> Result<(), pinned::ServeError> {
    // Text or JSON (`PINNED_LOG_FORMAT`, `--log-format`) on stderr, no
    // colours unless it is a terminal; `RUST_LOG` filters (default info).
    pinned::logging::init();
    pinned::serve(Options::from_env().host::<Room>("/chat")).await
}
