//! The chat example behind pinboard, as the README promises (issue 28
//! part 2): its sockets survive moves (`SocketOptions::survive_moves`), so
//! while the room's owner is drained with `pinboard drain <session>
//! --deadline 2s` its clients keep their sockets open and keep hearing
//! every message, now from the room's new owner.
//!
//! A real pinboard, two real chat workers, ten clients in two rooms: each
//! client speaks before and after the drain, and every message must reach
//! every client of its room; no client may see a close or an error.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use anyhow::{ensure, Context as _};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use support::{example_binary, overview, pinboard_binary, PATIENCE};
use test_support::{Pinboard, RustWorker, TOKEN};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const ROOMS: [&str; 2] = ["lobby", "games"];
const CLIENTS: usize = 10;

type Sink = SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Message>;

/// What one client's socket delivered, read by its own task.
#[derive(Default)]
struct Heard {
    texts: BTreeSet<String>,
    /// How the socket ended (a close frame, an error, its end), if it did.
    ended: Option<String>,
}

struct Client {
    room: &'static str,
    sink: Sink,
    heard: Arc<Mutex<Heard>>,
}

impl Client {
    async fn connect(pinboard: &str, room: &'static str) -> anyhow::Result<Self> {
        let url = format!("{}/chat/{room}/ws", pinboard.replacen("http", "ws", 1));
        let (socket, _) = tokio_tungstenite::connect_async(&url).await?;
        let (sink, mut stream) = socket.split();
        let heard: Arc<Mutex<Heard>> = Arc::default();
        let log = heard.clone();
        tokio::spawn(async move {
            let ended = loop {
                match stream.next().await {
                    Some(Ok(Message::Text(text))) => {
                        lock(&log).texts.insert(text.to_string());
                    }
                    Some(Ok(Message::Close(frame))) => break format!("close {frame:?}"),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break format!("error {e}"),
                    None => break "stream ended".to_owned(),
                }
            };
            lock(&log).ended = Some(ended);
        });
        Ok(Self { room, sink, heard })
    }
}

fn lock(heard: &Mutex<Heard>) -> std::sync::MutexGuard<'_, Heard> {
    heard.lock().unwrap_or_else(|e| e.into_inner())
}

/// Each client says `<round>-<i>`; waits until every client heard every
/// message of its room, failing at once when a socket ends.
async fn everyone_hears_everyone(clients: &mut [Client], round: &str) -> anyhow::Result<()> {
    for (i, client) in clients.iter_mut().enumerate() {
        client
            .sink
            .send(Message::text(format!("{round}-{i}")))
            .await?;
    }
    let expected = |room: &str| -> Vec<String> {
        (0..CLIENTS)
            .filter(|i| ROOMS[i % ROOMS.len()] == room)
            .map(|i| format!("{round}-{i}"))
            .collect()
    };
    let clients = &*clients;
    wait(
        &format!("every {round} message broadcast to its whole room"),
        || {
            let mut missing = 0;
            for (i, client) in clients.iter().enumerate() {
                let heard = lock(&client.heard);
                if let Some(ended) = &heard.ended {
                    anyhow::bail!("client {i} ({}) saw its socket end: {ended}", client.room);
                }
                missing += expected(client.room)
                    .iter()
                    .filter(|text| !heard.texts.contains(*text))
                    .count();
            }
            Ok((missing == 0).then_some(()))
        },
    )
    .await
}

/// Polls `check` until it answers `Some`, for at most [`PATIENCE`]; its
/// first error ends the wait with it.
async fn wait<T>(
    what: &str,
    mut check: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    test_support::eventually(what, PATIENCE, || std::future::ready(check().transpose())).await
}

/// The live owner's session of each chat room, from pinboard's overview.
async fn owners(client: &reqwest::Client, pinboard: &str) -> anyhow::Result<Vec<Option<String>>> {
    let overview = overview(client, pinboard).await?;
    let rows = overview["placements"].as_array().context("placements")?;
    Ok(ROOMS
        .iter()
        .map(|room| {
            rows.iter()
                .find(|row| row["ns"] == "/chat" && row["id"] == *room && row["live"] == true)
                .and_then(|row| row["sessionId"].as_str().map(str::to_owned))
        })
        .collect())
}

/// Worker `session`'s row of pinboard's worker list.
async fn worker_row(
    client: &reqwest::Client,
    pinboard: &str,
    session: &str,
) -> anyhow::Result<Value> {
    test_support::workers(client, pinboard, TOKEN)
        .await
        .into_iter()
        .find(|row| row["sessionId"] == session)
        .with_context(|| format!("no worker row for session {session}"))
}

#[tokio::test]
async fn chat_sockets_stay_open_and_hear_broadcasts_through_an_operator_drain() -> anyhow::Result<()>
{
    let pinboard = Pinboard::new(pinboard_binary().await?)
        .name("chat-drain-pinboard")
        .start();
    let chat = example_binary("chat").await?;
    let state = tempfile::tempdir()?;
    let worker = |name: &str| -> anyhow::Result<test_support::Proc> {
        let db = state.path().join(format!("{name}.db"));
        Ok(RustWorker::new(&chat, &pinboard.url)
            .on_any_port()
            .envs(&[
                ("DATABASE_URL", ""),
                ("PINNED_DB_PATH", db.to_str().context("temp path")?),
            ])
            .name(name)
            .start())
    };
    let _a = worker("chat-drain-a")?;
    let _b = worker("chat-drain-b")?;
    let http = reqwest::Client::new();
    let sessions: Vec<String> = test_support::wait_workers(&http, &pinboard.url, TOKEN, 2)
        .await
        .iter()
        .filter_map(|row| row["sessionId"].as_str().map(str::to_owned))
        .collect();
    ensure!(sessions.len() == 2, "two sessions: {sessions:?}");

    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        clients.push(Client::connect(&pinboard.url, ROOMS[i % ROOMS.len()]).await?);
    }
    everyone_hears_everyone(&mut clients, "before").await?;

    // The lobby's owner is the one drained; the other worker stays.
    let before = owners(&http, &pinboard.url).await?;
    let drained = before[0].clone().context("the lobby has no live owner")?;
    let other = sessions
        .iter()
        .find(|s| **s != drained)
        .context("the other session")?
        .clone();
    let out = tokio::process::Command::new(pinboard_binary().await?)
        .args(["drain", &drained, "--deadline", "2s"])
        .env("PINBOARD_URL", &pinboard.url)
        .env("PINBOARD_OPERATOR_TOKEN", TOKEN)
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "pinboard drain {drained} --deadline 2s: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The drain is done once the worker, draining, owns no instance: the
    // rooms it held were let go.
    let (http_ref, url) = (&http, &pinboard.url);
    test_support::eventually("the drained worker to own no room", PATIENCE, || {
        let drained = drained.clone();
        async move {
            let row = worker_row(http_ref, url, &drained).await.ok()?;
            (row["draining"] == true && row["instances"] == 0).then_some(())
        }
    })
    .await;
    ensure!(
        owners(&http, &pinboard.url)
            .await?
            .iter()
            .flatten()
            .all(|s| *s != drained),
        "a room still owned by the drained session"
    );

    // The same sockets keep talking, now to the rooms' new owner.
    everyone_hears_everyone(&mut clients, "after").await?;
    everyone_hears_everyone(&mut clients, "later").await?;
    let after = owners(&http, &pinboard.url).await?;
    ensure!(
        after
            .iter()
            .all(|owner| owner.as_deref() == Some(other.as_str())),
        "after the drain every room is owned by {other}: {after:?} (before: {before:?})"
    );
    for (i, client) in clients.iter().enumerate() {
        let heard = lock(&client.heard);
        ensure!(heard.ended.is_none(), "client {i}: {:?}", heard.ended);
    }
    Ok(())
}
