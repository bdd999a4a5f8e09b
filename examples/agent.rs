//! Agent sessions: one session per id, as an AI agent service keeps them.
//! A session's conversation is a [`Log`] (an append costs the same at the
//! 10 000th turn as at the first), the user's messages wait in its tray's
//! inbox, and the tray's handler works each one (`AGENT_THINK_MS`
//! milliseconds, default 0, where a real agent would call its model) and
//! appends the reply, exactly once, in order, across crashes.
//!
//! A client that holds the session's WebSocket (`/sessions/<id>/ws`, a
//! hibernatable socket) is pushed each reply as it is produced, as JSON
//! `{"key": …, "text": …}`, through the tray's output gate
//! ([`TrayCtx::after_ack`]): a reply leaves only once the store holds it,
//! so a crash never leaves a client holding a reply the history lacks, and
//! none is pushed twice. A reply whose push a crash or a closed socket cut
//! off is in the history, where a reconnecting client reads it.
//!
//! ```text
//! PORT=8080 cargo run --example agent
//! websocat ws://localhost:8080/sessions/s1/ws
//! curl -X POST localhost:8080/sessions/s1/messages -H 'idempotency-key: m1' \
//!      -H 'content-type: application/json' -d '{"text":"hello"}'
//! curl 'localhost:8080/sessions/s1/history?from=0&limit=50'
//! ```
//!
//! Every message carries an `Idempotency-Key` (a client's message id): a
//! message sent again (a lost connection, pinboard's "never re-sent" 502)
//! is admitted once among the session's last 128 keys and answered
//! `"repeat": true`. The handlers answer errors with `?`: the library's
//! errors are responses of the reference's shape (`{"detail": …}`).
//!
//! Store: `DATABASE_URL` (Postgres) when set, else the SQLite file
//! `PINNED_DB_PATH` (default `pinned.db`). Local mode by default;
//! `PINBOARD_URL`, `PINBOARD_TOKEN` and `ADVERTISE_URL` put it behind
//! pinboard. `Log` is this library's own field kind, so the session's rows
//! are not the Python reference's.

use std::time::Duration;

use axum::extract::Query;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::pinned_store::StoreConfig;
use pinned::tray::{Fields, Log, Queue, Tray, TrayCtx, TrayError, TrayHandler, Trays};
use pinned::ws::{Accept, SocketError, WebSocketUpgrade};
use pinned::{BoxError, Context, Object, Options};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The longest message text taken, in bytes.
const MAX_TEXT: usize = 16 * 1024;
/// The most turns one history read answers.
const MAX_READ: u64 = 1000;

/// A user's message, waiting for its reply.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Message {
    /// The client's message id (its idempotency key).
    key: String,
    text: String,
}

/// One turn of the conversation.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Turn {
    /// `user` or `agent`.
    role: String,
    /// The message this turn is, or answers.
    key: String,
    text: String,
}

#[derive(Default)]
struct Session {
    inbox: Queue<Message>,
    history: Log<Turn>,
}

impl Tray for Session {
    const NAME: &'static str = "session";
    type Item = Message;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("inbox", &mut self.inbox);
        fields.field("history", &mut self.history);
    }

    fn head(&self) -> Option<Message> {
        self.inbox.front().cloned()
    }

    fn ack(&mut self, _message: &Message) {
        self.inbox.pop_front();
    }
}

struct Agent {
    think: Duration,
}

impl Object for Agent {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        let ms = std::env::var("AGENT_THINK_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0);
        Ok(Agent {
            think: Duration::from_millis(ms),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/messages", post(send))
            .route("/history", get(history))
            .route("/ws", get(watch))
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Session>()
    }
}

/// The agent's answer to `text`: a stand-in for a model call.
fn reply_to(text: &str) -> String {
    format!("you said {} words", text.split_whitespace().count())
}

impl TrayHandler<Session> for Agent {
    async fn handle(&self, ctx: TrayCtx<Session>, message: Message) -> Result<(), BoxError> {
        if !self.think.is_zero() {
            tokio::time::sleep(self.think).await;
        }
        let reply = Turn {
            role: "agent".into(),
            text: reply_to(&message.text),
            key: message.key,
        };
        let pushed = json!({ "key": reply.key, "text": reply.text }).to_string();
        // Lands in the same row write as the message's ack: a reply is in
        // the history exactly when its message has left the inbox.
        ctx.on_ack(move |session| {
            session.history.append(reply);
        });
        // Pushed only once that write landed: pushed from here, it could
        // reach a client and then be lost with a crash, and be pushed again
        // when the message is redelivered.
        let session = ctx.context().clone();
        ctx.after_ack(move || {
            session.broadcast(None, pushed);
        });
        Ok(())
    }
}

#[derive(Deserialize)]
struct Incoming {
    text: String,
}

/// A 400 with the reference's body shape.
fn bad_request(detail: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "detail": detail }))).into_response()
}

async fn send(ctx: Context, headers: HeaderMap, Json(incoming): Json<Incoming>) -> Response {
    let Some(key) = headers.get("idempotency-key") else {
        return bad_request("a message needs an Idempotency-Key header");
    };
    let Ok(key) = key.to_str() else {
        return bad_request("the Idempotency-Key header is not visible ASCII");
    };
    if incoming.text.len() > MAX_TEXT {
        return bad_request("the message text is longer than 16 KiB");
    }
    match admit(&ctx, key, incoming.text).await {
        Ok(answer) => Json(answer).into_response(),
        Err(error) => error.into_response(),
    }
}

/// Admits the message once per key: into the inbox, and as the user's turn
/// into the history, in one write.
async fn admit(ctx: &Context, key: &str, text: String) -> Result<Value, TrayError> {
    let session = ctx.tray::<Session>().await?;
    let message = Message {
        key: key.to_owned(),
        text,
    };
    let admission = session.admit_once(key, |session| {
        session.history.append(Turn {
            role: "user".into(),
            key: message.key.clone(),
            text: message.text.clone(),
        });
        session.inbox.push_back(message);
    })?;
    let repeat = admission.is_repeat();
    admission.receipt().await?;
    Ok(json!({ "admitted": key, "repeat": repeat }))
}

/// A client's socket: it hears every reply of the session from now on
/// (earlier ones are in the history). It says nothing the session reads.
async fn watch(ws: WebSocketUpgrade) -> Result<Response, SocketError> {
    ws.accept(Accept::new())
}

#[derive(Deserialize)]
struct Range {
    #[serde(default)]
    from: u64,
    #[serde(default = "default_limit")]
    limit: u64,
}

fn default_limit() -> u64 {
    100
}

async fn history(ctx: Context, Query(range): Query<Range>) -> Result<Json<Value>, TrayError> {
    let session = ctx.tray::<Session>().await?;
    let (read, end, waiting) = session.read(|session| {
        (
            session.history.from(range.from, range.limit.min(MAX_READ)),
            session.history.end(),
            session.inbox.len(),
        )
    });
    // Older pages come from the store, outside the tray's lock.
    let slice = read.await?;
    Ok(Json(json!({
        "first": slice.first,
        "turns": slice.entries,
        "end": end,
        "waiting": waiting,
    })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Text or JSON (`PINNED_LOG_FORMAT`, `--log-format`) on stderr, no
    // colours unless it is a terminal; `RUST_LOG` filters (default info).
    pinned::logging::init();
    let location = std::env::var("DATABASE_URL").ok();
    let file = std::env::var("PINNED_DB_PATH").unwrap_or_else(|_| "pinned.db".into());
    let store = StoreConfig::from_location(location.as_deref(), file)?
        .open()
        .await?;
    pinned::serve(Options::from_env().host::<Agent>("/sessions").store(store)).await?;
    Ok(())
}
