//! A send outside a tray handler is not gated by default; awaiting the
//! write's `Receipt` before it is the gate. The guide's transcript room,
//! over real loopback sockets, with its store's second write failing
//! unapplied: the line of that write reaches nobody (the failure aborts
//! the instance, whose sockets close with 1012), the next line after the
//! clients reconnect is heard, and the store holds it and not the lost one.
//! With the broadcast made before the await, the lost line is heard.

mod support;

use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use pinned::pinned_store::{FailingStore, InstanceKey, MemoryStore, StateStore};
use pinned::tray::{Fields, Log, Tray, TrayCtx, TrayHandler, Trays};
use pinned::ws::{Accept, Message, Socket, SocketMessage, WebSocketUpgrade};
use pinned::{BoxError, Context, Object, Options};
use support::{start, PATIENCE};
use tokio_tungstenite::tungstenite;

/// The room's transcript: state only, no items.
#[derive(Default)]
struct Transcript {
    lines: Log<String>,
}

impl Tray for Transcript {
    const NAME: &'static str = "transcript";
    type Item = ();
    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("lines", &mut self.lines);
    }
    fn head(&self) -> Option<()> {
        None
    }
    fn ack(&mut self, _: &()) {}
}

struct Room;

impl Object for Room {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Room)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/ws",
            get(|ws: WebSocketUpgrade| async move { ws.accept(Accept::new()) }),
        )
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Transcript>()
    }

    async fn on_socket_message(
        &self,
        ctx: &Context,
        _socket: &Socket,
        said: SocketMessage,
    ) -> Result<(), BoxError> {
        let Message::Text(text) = said.message else {
            return Ok(());
        };
        let transcript = ctx.tray::<Transcript>().await?;
        let line = text.to_string();
        let stored = line.clone();
        let (_position, receipt) = transcript.update(move |room| room.lines.append(stored))?;
        receipt.await?;
        ctx.broadcast(None, line);
        Ok(())
    }
}

impl TrayHandler<Transcript> for Room {
    async fn handle(&self, _ctx: TrayCtx<Transcript>, _: ()) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Every row of room `r`, as one JSON text.
async fn rows(store: &MemoryStore) -> String {
    let rows = store
        .list(InstanceKey::new("/rooms", "r"), 0, None, None)
        .await
        .expect("memory store read");
    rows.iter()
        .map(|row| serde_json::Value::Object(row.doc.clone()).to_string())
        .collect()
}

type Client =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next text the client hears, or `None` for a close (with its code).
async fn heard(client: &mut Client) -> Result<String, Option<u16>> {
    loop {
        let next = tokio::time::timeout(PATIENCE, client.next())
            .await
            .expect("a frame in time")
            .expect("the socket open")
            .expect("a frame");
        match next {
            tungstenite::Message::Text(text) => return Ok(text.to_string()),
            tungstenite::Message::Close(frame) => return Err(frame.map(|f| f.code.into())),
            _ => {}
        }
    }
}

async fn connect(url: &str) -> Client {
    tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(url))
        .await
        .expect("connect in time")
        .expect("connect")
        .0
}

#[tokio::test]
async fn a_send_after_an_awaited_receipt_never_tells_of_a_failed_write() {
    let inner = Arc::new(MemoryStore::new());
    // The store's second write (the line "lost") fails unapplied.
    let store = Arc::new(FailingStore::new(inner.clone(), 2, false));
    let worker = start(Options::new().host::<Room>("/rooms").store(store.clone())).await;
    let url = format!("{}/rooms/r/ws", worker.url.replace("http://", "ws://"));
    let mut speaker = connect(&url).await;
    let mut listener = connect(&url).await;

    speaker
        .send(tungstenite::Message::text("first"))
        .await
        .expect("send");
    assert_eq!(heard(&mut listener).await, Ok("first".to_owned()));
    assert!(rows(&inner).await.contains("\"first\""));

    // The failed write aborts the instance, which closes its sockets with
    // 1012 (clients reconnect): the listener hears that, never "lost".
    speaker
        .send(tungstenite::Message::text("lost"))
        .await
        .expect("send");
    assert_eq!(heard(&mut listener).await, Err(Some(1012)));
    assert!(store.failed());

    let mut speaker = connect(&url).await;
    let mut listener = connect(&url).await;
    speaker
        .send(tungstenite::Message::text("kept"))
        .await
        .expect("send");
    assert_eq!(heard(&mut listener).await, Ok("kept".to_owned()));
    let held = rows(&inner).await;
    assert!(held.contains("\"kept\""), "heard, so stored: {held}");
    assert!(!held.contains("\"lost\""), "{held}");
    worker.worker.close().await;
}
