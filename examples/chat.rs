//! A chat room per id: every client of `/chat/<room>/ws` hears every
//! message sent to that room.
//!
//! The sockets are hibernatable: each joins its room's socket set, and the
//! room handles their messages as `Object::on_socket_message` (no task,
//! channel or `select!` loop per socket). A room where nobody spoke for the
//! idle timeout is evicted while its members stay connected; the next
//! message wakes it on this worker. A `ping` text is answered `pong`
//! without waking the room.
//!
//! Its sockets survive moves (`SocketOptions::survive_moves`): behind
//! pinboard, pinboard holds each client's socket and delivers its messages
//! to whichever worker owns the room, so a `pinboard drain <session>
//! --deadline 2s`, a deploy or a crash of the room's owner closes none of
//! them: the next message goes to the room's new owner. Served alone (dev
//! mode, as below) the sockets are the worker's: on SIGTERM it drains and
//! closes each at once with 1012 "service restart", so clients reconnect
//! and the process exits in milliseconds.
//!
//! ```text
//! PORT=8080 cargo run --example chat
//! websocat ws://localhost:8080/chat/lobby/ws
//! curl localhost:8080/chat/lobby/members
//! ```

use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use pinned::ws::{
    Accept, Message, Socket, SocketError, SocketMessage, SocketOptions, WebSocketUpgrade,
};
use pinned::{BoxError, Call, Context, HostOptions, Object, Options};
use serde_json::{json, Value};

pub(crate) struct Room;

impl Object for Room {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Room)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/ws", get(join))
            .route("/members", get(members))
    }

    async fn on_socket_message(
        &self,
        ctx: &Context,
        _socket: &Socket,
        said: SocketMessage,
    ) -> Result<(), BoxError> {
        if let Message::Text(text) = said.message {
            ctx.broadcast(None, Message::Text(text));
        }
        Ok(())
    }
}

/// The room's hosting: its sockets answer a `ping` without waking it, and
/// behind pinboard they survive moves of the room.
pub(crate) fn hosting() -> HostOptions {
    HostOptions::default().sockets(
        SocketOptions::default()
            .auto_response("ping", "pong")
            .survive_moves(),
    )
}

async fn members(call: Call) -> Json<Value> {
    Json(json!({ "members": call.ctx().sockets(None).len() }))
}

async fn join(ws: WebSocketUpgrade) -> Result<Response, SocketError> {
    ws.accept(Accept::new())
}

#[tokio::main]
async fn main() -> Result<(), pinned::ServeError> {
    // Text or JSON (`PINNED_LOG_FORMAT`, `--log-format`) on stderr, no
    // colours unless it is a terminal; `RUST_LOG` filters (default info).
    pinned::logging::init();
    pinned::serve(Options::from_env().host_with::<Room>("/chat", hosting())).await
}
