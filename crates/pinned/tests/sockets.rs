//! Hibernatable sockets, over real loopback sockets: an instance's socket
//! set survives the instance's eviction, a message wakes it, a broadcast
//! reaches every socket, the auto-response never wakes it, attachments
//! survive hibernation, and every bound refuses with a clear error.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Query;
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::{SinkExt, StreamExt};
use pinned::ws::{
    Accept, Socket, SocketClose, SocketError, SocketMessage, SocketOptions, WebSocketUpgrade,
};
use pinned::{BoxError, Call, Context, HostOptions, Object, Options};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use support::{eventually, start, TestWorker};
use test_support::metrics;
use tokio_tungstenite::tungstenite;

type Client =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What the room's hooks saw, shared through the worker's state.
#[derive(Default)]
struct Seen {
    activations: AtomicU64,
    stops: AtomicU64,
    closes: AtomicU64,
    last_close_seq: AtomicU64,
}

#[derive(Clone)]
struct Hooks(Arc<Seen>);

struct Room {
    hooks: Hooks,
}

#[derive(Serialize, Deserialize)]
struct Member {
    name: String,
}

#[derive(Deserialize)]
struct Join {
    name: Option<String>,
    tag: Option<String>,
}

impl Object for Room {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        let hooks = ctx.state::<Hooks>().ok_or("no hooks")?;
        hooks.0.activations.fetch_add(1, Ordering::SeqCst);
        Ok(Room { hooks })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/ws", get(join))
            .route(
                "/members",
                get(|call: Call| async move {
                    Json(json!({ "members": call.ctx().sockets(None).len() }))
                }),
            )
            .route(
                "/broadcast",
                post(|call: Call, body: String| async move {
                    Json(json!({ "sent": call.ctx().broadcast(None, body) }))
                }),
            )
    }

    async fn on_socket_message(
        &self,
        ctx: &Context,
        socket: &Socket,
        message: SocketMessage,
    ) -> Result<(), BoxError> {
        let pinned::ws::Message::Text(text) = &message.message else {
            return Ok(());
        };
        let text = text.as_str();
        if let Some(rest) = text.strip_prefix("all:") {
            ctx.broadcast(None, rest.to_owned());
        } else if let Some(name) = text.strip_prefix("setname:") {
            socket.set_attachment(&Member {
                name: name.to_owned(),
            })?;
            socket.send("ok")?;
        } else if text == "burst" {
            // Three sends in one turn: the socket's task writes nothing
            // until the handler returns, so an outbox of two overflows.
            let sent: Vec<bool> = (0..3)
                .map(|n| socket.send(format!("burst {n}")).is_ok())
                .collect();
            assert_eq!(sent, [true, true, false]);
        } else if text == "who" {
            let member: Option<Member> = socket.attachment()?;
            let name = member.map_or_else(|| "nobody".to_owned(), |member| member.name);
            socket.send(format!("{name} {}", message.seq))?;
        } else {
            socket.send(format!("{} {text}", message.seq))?;
        }
        Ok(())
    }

    async fn on_socket_close(
        &self,
        _ctx: &Context,
        _socket: &Socket,
        close: SocketClose,
    ) -> Result<(), BoxError> {
        self.hooks.0.closes.fetch_add(1, Ordering::SeqCst);
        self.hooks
            .0
            .last_close_seq
            .store(close.seq, Ordering::SeqCst);
        Ok(())
    }

    async fn on_stop(&self, _ctx: &Context) -> Result<(), BoxError> {
        self.hooks.0.stops.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn join(
    ws: WebSocketUpgrade,
    Query(join): Query<Join>,
) -> Result<axum::response::Response, SocketError> {
    let mut accept = Accept::new();
    if let Some(tag) = join.tag {
        accept = accept.tag(tag);
    }
    if let Some(name) = join.name {
        accept = accept.attachment(&Member { name });
    }
    ws.accept(accept)
}

/// A 200 ms idle timeout swept every 50 ms: an instance with only sockets
/// hibernates within a fraction of a second.
fn quick(sockets: SocketOptions) -> HostOptions {
    HostOptions::default()
        .idle_timeout(Duration::from_millis(200))
        .sweep_interval(Duration::from_millis(50))
        .sockets(sockets)
}

async fn room(sockets: SocketOptions, options: Options) -> (TestWorker, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let worker = start(
        options
            .state(Hooks(seen.clone()))
            .host_with::<Room>("/room", quick(sockets)),
    )
    .await;
    (worker, seen)
}

fn ws_url(worker: &TestWorker, path: &str) -> String {
    worker.url(path).replace("http://", "ws://")
}

async fn connect(url: &str) -> Client {
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async(url),
    )
    .await
    .expect("connect in time")
    .expect("connect")
    .0
}

/// The status and body of a refused upgrade.
async fn refused(url: &str) -> (u16, String) {
    match tokio_tungstenite::connect_async(url).await {
        Err(tungstenite::Error::Http(response)) => (
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned(),
        ),
        Err(other) => panic!("expected an HTTP refusal, got {other}"),
        Ok(_) => panic!("expected a refusal, the socket was accepted"),
    }
}

async fn next_text(client: &mut Client) -> String {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), client.next())
            .await
            .expect("a message in time")
            .expect("socket open")
            .expect("message");
        match message {
            tungstenite::Message::Text(text) => return text.to_string(),
            tungstenite::Message::Close(frame) => panic!("closed: {frame:?}"),
            _ => continue,
        }
    }
}

async fn say(client: &mut Client, text: &str) {
    client
        .send(tungstenite::Message::text(text))
        .await
        .expect("send");
}

/// A metric's value in the worker's exposition (0 when absent).
fn metric(worker: &TestWorker, name: &str) -> f64 {
    metrics::parse(&worker.worker.metrics())
        .sample(name)
        .unwrap_or(0.0)
}

/// Waits until the room's only instance hibernated: evicted (its
/// `on_stop` ran `stops` times, no record left) while its sockets stay.
async fn wait_hibernated(worker: &TestWorker, seen: &Seen, stops: u64) {
    eventually(
        "the instance hibernated",
        Duration::from_secs(20),
        || async {
            let gone = worker.resident().await.is_empty();
            (gone && seen.stops.load(Ordering::SeqCst) >= stops).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_sockets_outlive_their_instance_wake_it_and_hear_a_broadcast() {
    const SOCKETS: usize = 1_000;
    let (worker, seen) = room(SocketOptions::default(), Options::new()).await;
    let scrape = || metrics::parse(&worker.worker.metrics());
    let fresh = scrape();
    let url = ws_url(&worker, "/room/r1/ws");
    let mut clients: Vec<Client> = futures_util::stream::iter(0..SOCKETS)
        .map(|_| connect(&url))
        .buffered(32)
        .collect()
        .await;
    assert_eq!(clients.len(), SOCKETS);
    assert_eq!(
        metrics::moved(&fresh, &scrape(), "pinned_sockets_open"),
        SOCKETS as f64
    );

    // Only sockets: the instance is evicted while all of them stay open.
    wait_hibernated(&worker, &seen, 1).await;
    assert_eq!(seen.activations.load(Ordering::SeqCst), 1);
    assert_eq!(
        metrics::moved(&fresh, &scrape(), "pinned_instance_hibernations"),
        1.0
    );
    assert_eq!(metric(&worker, "pinned_sockets_open"), SOCKETS as f64);
    assert_eq!(metric(&worker, "pinned_active_instances"), 0.0);

    // A message on one socket activates the id again and is delivered:
    // its broadcast reaches all 1 000.
    say(&mut clients[500], "all:hello").await;
    let heard = futures_util::future::join_all(
        clients
            .iter_mut()
            .map(|client| async move { next_text(client).await }),
    )
    .await;
    assert!(
        heard.iter().all(|text| text == "hello"),
        "{:?}",
        &heard[..3]
    );
    assert_eq!(seen.activations.load(Ordering::SeqCst), 2);
    assert_eq!(
        metrics::moved(&fresh, &scrape(), "pinned_socket_wakes"),
        1.0
    );

    // The woken instance lists its sockets, and broadcasts from a request.
    let members: Value = worker
        .get("/room/r1/members")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(members["members"], SOCKETS);
    let sent: Value = worker
        .client
        .post(worker.url("/room/r1/broadcast"))
        .body("from a request")
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!(sent["sent"], SOCKETS);
    for client in &mut clients {
        assert_eq!(next_text(client).await, "from a request");
    }

    // A client's close reaches the object, after its messages, in order.
    let mut leaving = clients.pop().expect("a client");
    say(&mut leaving, "one").await;
    assert_eq!(next_text(&mut leaving).await, "1 one");
    leaving.close(None).await.expect("close");
    eventually("the close event", Duration::from_secs(10), || async {
        (seen.closes.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    assert_eq!(seen.last_close_seq.load(Ordering::SeqCst), 2);
    eventually(
        "the socket left the set",
        Duration::from_secs(10),
        || async { (metric(&worker, "pinned_sockets_open") == (SOCKETS - 1) as f64).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn the_auto_response_is_answered_without_waking_the_instance() {
    let sockets = SocketOptions::default().auto_response("ping", "pong");
    let (worker, seen) = room(sockets, Options::new()).await;
    let fresh = metrics::parse(&worker.worker.metrics());
    let mut client = connect(&ws_url(&worker, "/room/a1/ws?name=ada")).await;
    wait_hibernated(&worker, &seen, 1).await;

    say(&mut client, "ping").await;
    assert_eq!(next_text(&mut client).await, "pong");
    assert_eq!(seen.activations.load(Ordering::SeqCst), 1);
    let answered = metrics::parse(&worker.worker.metrics());
    assert_eq!(
        metrics::moved(&fresh, &answered, "pinned_socket_auto_responses"),
        1.0
    );
    assert!(worker.resident().await.is_empty());

    // The ping was never an event: the first one is number 1.
    say(&mut client, "who").await;
    assert_eq!(next_text(&mut client).await, "ada 1");
    assert_eq!(seen.activations.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_attachment_survives_hibernation() {
    let (worker, seen) = room(SocketOptions::default(), Options::new()).await;
    let mut client = connect(&ws_url(&worker, "/room/b1/ws?name=ada")).await;
    say(&mut client, "who").await;
    assert_eq!(next_text(&mut client).await, "ada 1");
    say(&mut client, "setname:grace").await;
    assert_eq!(next_text(&mut client).await, "ok");

    wait_hibernated(&worker, &seen, 1).await;
    say(&mut client, "who").await;
    assert_eq!(next_text(&mut client).await, "grace 3");
    assert_eq!(seen.activations.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn bounds_refuse_with_clear_errors() {
    let sockets = SocketOptions::default()
        .max_per_instance(2)
        .max_attachment(64);
    let (worker, _seen) = room(sockets, Options::new().max_sockets(3)).await;

    // An attachment over its bound: 413 before the handshake.
    let long = "x".repeat(100);
    let (status, body) = refused(&ws_url(&worker, &format!("/room/c1/ws?name={long}"))).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("over the bound of 64"), "{body}");

    // Too many tags' worth of bytes in one tag: 400.
    let tag = "t".repeat(300);
    let (status, body) = refused(&ws_url(&worker, &format!("/room/c1/ws?tag={tag}"))).await;
    assert_eq!(status, 400, "{body}");

    // Per instance: the third socket of c1 is refused.
    let _a = connect(&ws_url(&worker, "/room/c1/ws")).await;
    let _b = connect(&ws_url(&worker, "/room/c1/ws")).await;
    let (status, body) = refused(&ws_url(&worker, "/room/c1/ws")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("instance holds 2 sockets"), "{body}");

    // Per worker: three in all, whatever the id.
    let _c = connect(&ws_url(&worker, "/room/c2/ws")).await;
    let (status, body) = refused(&ws_url(&worker, "/room/c2/ws")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("worker holds 3 sockets"), "{body}");

    // A closed socket gives its place back.
    drop(_c);
    eventually("the place given back", Duration::from_secs(10), || async {
        (metric(&worker, "pinned_sockets_open") == 2.0).then_some(())
    })
    .await;
    let _d = connect(&ws_url(&worker, "/room/c2/ws")).await;
}

/// An object whose activation takes longer than the wake deadline.
struct Sleepy;

impl Object for Sleepy {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        let hooks = ctx.state::<Hooks>().ok_or("no hooks")?;
        // The first activation is quick; every later one never ends (it
        // is dropped with the worker), longer than any wake deadline.
        if hooks.0.activations.fetch_add(1, Ordering::SeqCst) > 0 {
            std::future::pending::<()>().await;
        }
        Ok(Sleepy)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/ws",
            get(|ws: WebSocketUpgrade| async move { ws.accept(Accept::new()) }),
        )
    }

    async fn on_stop(&self, ctx: &Context) -> Result<(), BoxError> {
        if let Some(hooks) = ctx.state::<Hooks>() {
            hooks.0.stops.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// Waits for the close frame `client` receives (at most 10 s).
async fn close_frame(client: &mut Client) -> tungstenite::protocol::CloseFrame {
    let frame = loop {
        match tokio::time::timeout(Duration::from_secs(10), client.next())
            .await
            .expect("closed in time")
        {
            Some(Ok(tungstenite::Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    frame.expect("a close frame with a code")
}

async fn sleepy(sockets: SocketOptions) -> (TestWorker, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let worker = start(
        Options::new()
            .state(Hooks(seen.clone()))
            .host_with::<Sleepy>("/sleepy", quick(sockets)),
    )
    .await;
    (worker, seen)
}

#[tokio::test]
async fn messages_past_the_buffer_while_the_instance_wakes_close_the_socket_1013() {
    let sockets = SocketOptions::default()
        .buffer(2)
        .wake_deadline(Duration::from_secs(30));
    let (worker, seen) = sleepy(sockets).await;
    let mut client = connect(&ws_url(&worker, "/sleepy/s2/ws")).await;
    wait_hibernated(&worker, &seen, 1).await;
    // The first wakes the instance (an activation that never ends); two
    // wait in the buffer; the fourth is one too many.
    for n in 0..4 {
        say(&mut client, &format!("m{n}")).await;
    }
    let frame = close_frame(&mut client).await;
    assert_eq!(u16::from(frame.code), 1013);
    assert_eq!(
        frame.reason.as_str(),
        "too many messages while the instance wakes"
    );
}

#[tokio::test]
async fn a_full_outbox_fails_the_send_and_closes_the_socket_1013() {
    let (worker, _seen) = room(SocketOptions::default().outbox(2), Options::new()).await;
    let mut client = connect(&ws_url(&worker, "/room/o1/ws")).await;
    say(&mut client, "burst").await;
    assert_eq!(next_text(&mut client).await, "burst 0");
    assert_eq!(next_text(&mut client).await, "burst 1");
    let frame = close_frame(&mut client).await;
    assert_eq!(u16::from(frame.code), 1013);
    assert_eq!(frame.reason.as_str(), "client too slow: outbox full");
    assert_eq!(
        metric(
            &worker,
            "pinned_callback_failures_total{hook=\"on_socket_message\"}"
        ),
        0.0
    );
}

#[tokio::test]
async fn a_drain_closes_hibernated_sockets_1012() {
    let (worker, seen) = room(SocketOptions::default(), Options::new()).await;
    let mut client = connect(&ws_url(&worker, "/room/d1/ws")).await;
    wait_hibernated(&worker, &seen, 1).await;
    worker.worker.drain(Some(Duration::from_secs(5))).await;
    let frame = close_frame(&mut client).await;
    assert_eq!(u16::from(frame.code), 1012);
    eventually("the socket gone", Duration::from_secs(10), || async {
        (metric(&worker, "pinned_sockets_open") == 0.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_wake_past_its_deadline_closes_the_socket_1013() {
    let sockets = SocketOptions::default().wake_deadline(Duration::from_millis(300));
    let (worker, seen) = sleepy(sockets).await;
    let mut client = connect(&ws_url(&worker, "/sleepy/s1/ws")).await;
    wait_hibernated(&worker, &seen, 1).await;
    say(&mut client, "wake up").await;
    let frame = close_frame(&mut client).await;
    assert_eq!(u16::from(frame.code), 1013);
    assert_eq!(frame.reason.as_str(), "instance did not wake in time");
}

/// What the scripted pinboard heard.
#[derive(Default)]
struct Script {
    registers: parking_lot::Mutex<Vec<Value>>,
    releases: parking_lot::Mutex<Vec<Value>>,
    /// Answer the next heartbeat `409 {"reregister": true}`.
    forget: std::sync::atomic::AtomicBool,
}

async fn scripted_pinboard() -> (String, Arc<Script>) {
    use axum::extract::State;
    let script = Arc::new(Script::default());
    let app = Router::new()
        .route(
            "/registry/register",
            post(|State(script): State<Arc<Script>>, Json(body): Json<Value>| async move {
                let mut registers = script.registers.lock();
                registers.push(body);
                script.forget.store(false, Ordering::SeqCst);
                Json(json!({ "sessionId": format!("s{}", registers.len()), "expiresInMs": 60_000 }))
            }),
        )
        .route(
            "/registry/heartbeat",
            post(|State(script): State<Arc<Script>>| async move {
                if script.forget.load(Ordering::SeqCst) {
                    (http::StatusCode::CONFLICT, Json(json!({ "reregister": true })))
                } else {
                    (http::StatusCode::OK, Json(json!({ "expiresInMs": 60_000 })))
                }
            }),
        )
        .route(
            "/registry/release",
            post(|State(script): State<Arc<Script>>, Json(body): Json<Value>| async move {
                script.releases.lock().push(body);
                Json(json!({}))
            }),
        )
        .with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, script)
}

#[tokio::test]
async fn a_hibernated_id_keeps_its_placement_until_its_last_socket_closes() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let (pinboard, script) = scripted_pinboard().await;
    let seen = Arc::new(Seen::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let worker = Options::new()
        .state(Hooks(seen.clone()))
        .host_with::<Room>("/room", quick(SocketOptions::default()))
        .pinboard(&pinboard, "t", &url)
        .heartbeat_interval(Duration::from_millis(50))
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("options");
    let router = worker.router();
    worker.start();
    tokio::spawn(async move { axum::serve(listener, router).await });
    eventually("the registration", Duration::from_secs(10), || async {
        worker.registration()?.session_id.filter(|s| s == "s1")
    })
    .await;

    // The handshake arrives as pinboard forwards it: attested, at epoch 7.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let mut request = format!("{}/room/p1/ws", url.replace("http://", "ws://"))
        .into_client_request()
        .expect("request");
    let token = pinned_wire::attestation::mint(worker.secret(), "s1", now, None, None);
    request
        .headers_mut()
        .insert("pinboard-attestation", token.parse().expect("header"));
    request
        .headers_mut()
        .insert("pinboard-epoch", "7".parse().expect("header"));
    let (mut client, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("connect");

    // Hibernated: no release, and the id is still listed as placed here.
    let test = TestWorker {
        url: url.clone(),
        worker: worker.clone(),
        client: reqwest::Client::new(),
    };
    wait_hibernated(&test, &seen, 1).await;
    assert!(
        script.releases.lock().is_empty(),
        "{:?}",
        script.releases.lock()
    );
    script.forget.store(true, Ordering::SeqCst);
    let again = eventually("the re-registration", Duration::from_secs(10), || async {
        script.registers.lock().get(1).cloned()
    })
    .await;
    assert_eq!(again["instances"]["/room"], json!(["p1"]), "{again}");

    // A message wakes it at its epoch.
    say(&mut client, "hi").await;
    assert_eq!(next_text(&mut client).await, "1 hi");

    // Its last socket closes: the instance, idle and without sockets, is
    // evicted and its placement released at epoch 7.
    client.close(None).await.expect("close");
    let released = eventually("the release", Duration::from_secs(10), || async {
        script.releases.lock().first().cloned()
    })
    .await;
    assert_eq!(released[0]["id"], "p1", "{released}");
    assert_eq!(released[0]["epoch"], "7", "{released}");
}
