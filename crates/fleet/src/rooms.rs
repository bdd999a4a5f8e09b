//! A room whose sockets survive moves (`SocketOptions::survive_moves`): the
//! held-socket fleet tests' object. Each message `m<n>` on a socket is
//! answered on that socket with `ack <seq> m<n>` (the event's sequence
//! number beside what was said, so a client checks delivery and order
//! itself); `POST /broadcast` sends its body to every socket of the room
//! `POST /tell` with `<socket> <text>` sends the text to that one socket
//! (pinboard's socket id), and `GET /seen` lists the last sequence number this instance handled
//! per socket (pinboard's socket id).

use std::collections::BTreeMap;

use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use parking_lot::Mutex;
use pinned::ws::{
    Accept, Message, Socket, SocketError, SocketMessage, SocketOptions, WebSocketUpgrade,
};
use pinned::{BoxError, Call, Context, HostOptions, Object, This};

/// The room: what it heard, per socket.
#[derive(Default)]
pub struct Room {
    seen: Mutex<BTreeMap<String, u64>>,
}

impl Object for Room {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Room::default())
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/ws", get(join))
            .route("/broadcast", post(broadcast))
            .route("/tell", post(tell))
            .route("/seen", get(seen))
    }

    async fn on_socket_message(
        &self,
        _ctx: &Context,
        socket: &Socket,
        said: SocketMessage,
    ) -> Result<(), BoxError> {
        let Message::Text(text) = said.message else {
            return Ok(());
        };
        let name = socket
            .held_id()
            .map_or_else(|| socket.number().to_string(), str::to_owned);
        self.seen.lock().insert(name, said.seq);
        socket.send(format!("ack {} {}", said.seq, text.as_str()))?;
        Ok(())
    }
}

/// The room's hosting: sockets held by pinboard, `ping` answered `pong`.
pub fn hosting() -> HostOptions {
    HostOptions::default().sockets(
        SocketOptions::default()
            .auto_response("ping", "pong")
            .survive_moves(),
    )
}

async fn join(ws: WebSocketUpgrade) -> Result<Response, SocketError> {
    ws.accept(Accept::new().tag("members"))
}

async fn broadcast(call: Call, body: String) -> Json<serde_json::Value> {
    let reached = call.ctx().broadcast(Some("members"), body);
    Json(serde_json::json!({ "reached": reached }))
}

async fn tell(call: Call, body: String) -> Json<serde_json::Value> {
    let (to, text) = body.split_once(' ').unwrap_or((body.as_str(), ""));
    let told = call
        .ctx()
        .sockets(None)
        .into_iter()
        .find(|socket| socket.held_id() == Some(to))
        .is_some_and(|socket| socket.send(text.to_owned()).is_ok());
    Json(serde_json::json!({ "told": told }))
}

async fn seen(this: This<Room>) -> Json<BTreeMap<String, u64>> {
    Json(this.seen.lock().clone())
}
