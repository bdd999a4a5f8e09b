//! `pinboard sim-coprocess`: the real pinboard driven by the Python
//! reference's deterministic cluster simulation (`python -m pinned.sim.e2e`)
//! over JSON lines on stdin/stdout (`shared/spec/sim-coprocess.md`).
//!
//! Owns the protocol only: parsing requests, answering them, writing
//! effects. Every decision is made by the product's own parts, built with
//! [`App::from_parts`] over injected pieces: one [`MemoryStore`] shared by
//! all nodes (the "Redis" that `wipe` empties), the fake network
//! ([`net::SimNet`], an [`Exchange`](crate::outbound::Exchange)), virtual
//! time from each request's `now` ([`net::SimClock`]), randomness from each
//! request's `randomSeed` ([`net::SimEntropy`]) and the durable store
//! ([`net::SimDurable`]: activities index and epoch high-water mark).
//!
//! Never writes anything but protocol lines to stdout; logs go to stderr.
//! No timer calls a worker: sweeper laps run only on `sweep`, and each is
//! awaited to completion before its result is written.

pub mod net;

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;

use axum::body::Body;
use axum::Router;
use clap::Parser;
use http::{Method, Request};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower::ServiceExt;

use self::net::{EffectResult, SimClock, SimDurable, SimEntropy, SimNet};
use crate::app::{App, AppParts};
use crate::clock::{Entropy, EpochFloor};
use crate::config::Config;
use crate::outbound::Outbound;
use crate::placement::{InstanceKey, MemoryStore, PlacementStore};
use crate::proxy::{self, Inbound};
use crate::server;
use crate::sweeper::{SweepSettings, Sweeper};

/// The deployment token the simulated workers present.
const SIM_TOKEN: &str = "secret-token";

/// Why a request could not be answered (sent back as the `error`).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The line is not a request the protocol knows.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A call that needs `init` came first.
    #[error("not initialised")]
    NotInitialised,
    /// pinboard's own configuration was refused.
    #[error("config: {0}")]
    Config(String),
    /// The placement store failed.
    #[error("placement store: {0}")]
    Store(#[from] crate::placement::StoreError),
}

/// Protocol lines to stdout, one per call, flushed.
#[derive(Debug, Default)]
pub struct Output {
    lock: parking_lot::Mutex<()>,
}

impl Output {
    /// Write `value` as one line and flush.
    pub fn line(&self, value: &Value) {
        let _held = self.lock.lock();
        let mut out = std::io::stdout().lock();
        // A closed stdout means the sim is gone; the next read ends us.
        let _ = writeln!(out, "{value}");
        let _ = out.flush();
    }
}

/// One simulated pinboard node.
struct Node {
    app: Arc<App<MemoryStore>>,
    router: Router,
    sweeper: tokio::sync::Mutex<Sweeper<MemoryStore>>,
}

/// Everything the nodes share.
struct Sim {
    out: Arc<Output>,
    clock: Arc<SimClock>,
    entropy: Arc<SimEntropy>,
    durable: Arc<SimDurable>,
    world: Option<World>,
}

struct World {
    store: Arc<MemoryStore>,
    net: Arc<SimNet>,
    nodes: Vec<Arc<Node>>,
}

/// Runs the coprocess until `close` or the end of stdin.
pub fn main() -> ExitCode {
    // stdout carries the protocol: logs go to stderr, warnings unless
    // `RUST_LOG` asks for more, no colours into the sim's pipe.
    pinned_edge::logging::LogSettings {
        default_filter: "warn".into(),
        ..Default::default()
    }
    .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("pinboard sim-coprocess: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run());
    ExitCode::SUCCESS
}

async fn run() {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    // A plain thread reads stdin, so the runtime never blocks on it.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut sim = Sim {
        out: Arc::new(Output::default()),
        clock: Arc::new(SimClock::default()),
        entropy: Arc::new(SimEntropy::default()),
        durable: Arc::new(SimDurable::default()),
        world: None,
    };
    while let Some(line) = rx.recv().await {
        if line.trim().is_empty() {
            continue;
        }
        let msg: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(%e, "unparsable line from the sim");
                continue;
            }
        };
        if let Some(result) = msg.get("effectResult") {
            let id = msg.get("effectId").and_then(Value::as_u64).unwrap_or(0);
            let answered = sim.world.as_ref().is_some_and(|w| {
                w.net.answer(
                    id,
                    EffectResult {
                        status: result.get("status").and_then(Value::as_u64).unwrap_or(0) as u16,
                        body: result
                            .get("body")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                    },
                )
            });
            if !answered {
                tracing::error!(id, "effect result for no outstanding effect");
            }
            continue;
        }
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        if let Some(now) = msg.get("now").and_then(Value::as_u64) {
            sim.clock.advance(now);
        }
        if let Some(seed) = msg.get("randomSeed").and_then(Value::as_u64) {
            sim.entropy.reseed(seed);
        }
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        if method == "close" {
            sim.out.line(&json!({"id": id, "result": {}}));
            break;
        }
        match sim.request(method, &params).await {
            Ok(Reply::Now(result)) => sim.out.line(&json!({"id": id, "result": result})),
            Ok(Reply::Later(call)) => {
                let out = sim.out.clone();
                tokio::spawn(async move {
                    let line = match call.await {
                        Ok(result) => json!({"id": id, "result": result}),
                        Err(e) => json!({"id": id, "error": e.to_string()}),
                    };
                    out.line(&line);
                });
            }
            Err(e) => sim.out.line(&json!({"id": id, "error": e.to_string()})),
        }
    }
}

type Call = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Value, SimError>> + Send>>;

/// A request's answer: now (synchronous calls) or once its effects are
/// answered (data-plane fetches, sweeps).
enum Reply {
    Now(Value),
    Later(Call),
}

fn str_param<'a>(params: &'a Value, key: &str) -> Result<&'a str, SimError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| SimError::BadRequest(format!("missing {key}")))
}

impl Sim {
    fn world(&self) -> Result<&World, SimError> {
        self.world.as_ref().ok_or(SimError::NotInitialised)
    }

    fn node(&self, params: &Value) -> Result<Arc<Node>, SimError> {
        let world = self.world()?;
        let n = params.get("node").and_then(Value::as_u64).unwrap_or(0) as usize;
        world
            .nodes
            .get(n)
            .cloned()
            .ok_or_else(|| SimError::BadRequest(format!("no node {n}")))
    }

    async fn request(&mut self, method: &str, params: &Value) -> Result<Reply, SimError> {
        match method {
            "init" => {
                self.init(params).await?;
                Ok(Reply::Now(json!({})))
            }
            "setWorker" => {
                let origin = str_param(params, "origin")?;
                let up = str_param(params, "state")? == "up";
                let secret = params.get("secret").and_then(Value::as_str);
                self.world()?.net.set(origin, up, secret);
                Ok(Reply::Now(json!({})))
            }
            "fetch" => {
                let node = self.node(params)?;
                let req = http_request(params)?;
                let sync = req.uri().path().starts_with("/registry/");
                let call = async move { fetch(&node, req).await };
                if sync {
                    Ok(Reply::Now(call.await?))
                } else {
                    Ok(Reply::Later(Box::pin(call)))
                }
            }
            "sweep" => {
                let node = self.node(params)?;
                Ok(Reply::Later(Box::pin(async move {
                    node.sweeper.lock().await.lap_to_completion().await;
                    Ok(json!({}))
                })))
            }
            "syncActivities" => {
                let entries = params
                    .get("entries")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|e| {
                                Some((
                                    e.get("ns")?.as_str()?.to_owned(),
                                    e.get("id")?.as_str()?.to_owned(),
                                ))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                self.durable.sync(entries);
                Ok(Reply::Now(json!({})))
            }
            "servedActivities" => {
                let rows: Vec<Value> = self
                    .durable
                    .served()
                    .into_iter()
                    .map(|(ns, id)| json!({"ns": ns, "id": id}))
                    .collect();
                Ok(Reply::Now(json!({ "rows": rows })))
            }
            "placement" => {
                let world = self.world()?;
                let ns = str_param(params, "ns")?;
                let id = str_param(params, "id")?;
                let row = world
                    .store
                    .placement(InstanceKey::new(ns, id), self.clock_now())
                    .await?;
                Ok(Reply::Now(json!({
                    "row": row.map(|r| json!({
                        "sessionId": r.placement.session_id,
                        // Reported only once the owner answered at it.
                        "epoch": r.settled.then_some(r.placement.epoch),
                        "live": r.live,
                    }))
                })))
            }
            "overwritten" => {
                // Every placement write in the memory store is one
                // compare-and-set under its lock: no writer replaces a
                // value it has not read, so the audit finds nothing.
                self.world()?;
                Ok(Reply::Now(json!({ "fields": [] })))
            }
            "allowClockRollback" => Ok(Reply::Now(json!({}))),
            "wipe" => {
                self.world()?.store.wipe();
                Ok(Reply::Now(json!({})))
            }
            other => Err(SimError::BadRequest(format!("unknown method {other}"))),
        }
    }

    fn clock_now(&self) -> crate::clock::Now {
        use crate::clock::Clock;
        self.clock.now()
    }

    async fn init(&mut self, params: &Value) -> Result<(), SimError> {
        let mut config = Config::try_parse_from(["pinboard", "--token", SIM_TOKEN])
            .map_err(|e| SimError::Config(e.to_string()))?;
        if let Some(ttl) = params.get("leaseTtlMs").and_then(Value::as_u64) {
            config.lease_ttl_ms = ttl;
        }
        if let Some(limit) = params.get("sweepLimit").and_then(Value::as_u64) {
            config.sweep_limit = limit as usize;
        }
        let problems = config.validate();
        if !problems.is_empty() {
            return Err(SimError::Config(format!("{problems:?}")));
        }
        let origins = params
            .get("workers")
            .and_then(Value::as_array)
            .map(|ws| {
                ws.iter()
                    .filter_map(|w| w.get("origin")?.as_str().map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let nodes = params.get("nodes").and_then(Value::as_u64).unwrap_or(2) as usize;
        let store = Arc::new(MemoryStore::new().with_row_grace(config.placement_grace_ms()));
        let net = Arc::new(SimNet::new(self.out.clone(), origins));
        let mut built = Vec::with_capacity(nodes);
        for _ in 0..nodes {
            let app = Arc::new(App::from_parts(
                &config,
                AppParts {
                    store: store.clone(),
                    outbound: Outbound::Exchange(net.clone()),
                    clock: self.clock.clone(),
                    entropy: self.entropy.clone(),
                    floor: Arc::new(EpochFloor::with_durable(self.durable.clone())),
                },
            ));
            app.routes.open_generation().await?;
            let sweeper = Sweeper::with_activities(
                app.clone(),
                self.durable.clone(),
                SweepSettings::from(&config),
                self.entropy.token_hex(16),
            );
            built.push(Arc::new(Node {
                router: server::router(app.clone()),
                app,
                sweeper: tokio::sync::Mutex::new(sweeper),
            }));
        }
        self.world = Some(World {
            store,
            net,
            nodes: built,
        });
        Ok(())
    }
}

/// The `Host` of a simulated client's request that names none.
const SIM_HOST: &str = "pinboard.sim";

/// The `fetch` params as an HTTP request to a node.
fn http_request(params: &Value) -> Result<Request<Body>, SimError> {
    let method = params
        .get("httpMethod")
        .and_then(Value::as_str)
        .unwrap_or("GET");
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|e| SimError::BadRequest(e.to_string()))?;
    let path = str_param(params, "path")?;
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(headers) = params.get("headers").and_then(Value::as_object) {
        for (name, value) in headers {
            if let Some(value) = value.as_str() {
                builder = builder.header(name.as_str(), value);
            }
        }
    }
    // An HTTP/1.1 request carries a `Host` (the proxy answers 400 without
    // one, RFC 9112 §3.2): the simulated client names the node.
    let has_host = builder
        .headers_ref()
        .is_some_and(|h| h.contains_key(http::header::HOST));
    if !has_host {
        builder = builder.header(http::header::HOST, SIM_HOST);
    }
    let body = params
        .get("body")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    builder
        .body(Body::from(body))
        .map_err(|e| SimError::BadRequest(e.to_string()))
}

/// Serve `req` on a node as its accept loop would (control paths to the
/// router, everything else to the proxy); `{status, body}`.
async fn fetch(node: &Node, req: Request<Body>) -> Result<Value, SimError> {
    let res = if server::paths::ALL.contains(&req.uri().path()) {
        match node.router.clone().oneshot(req).await {
            Ok(res) => res,
            Err(never) => match never {},
        }
    } else {
        proxy::serve(&node.app, None, Inbound::Request(req), None).await
    };
    let status = res.status().as_u16();
    let body = res
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Ok(json!({
        "status": status,
        "body": String::from_utf8_lossy(&body),
    }))
}
