//! A loopback deployment for the control-plane benches: pinboard and the
//! bench's Rust counter worker run as child processes of the bench binary
//! (its `serve-pinboard` / `serve-worker` subcommands, [`Serve`]), the
//! Python reference worker runs under uvicorn, [`Operator`] talks to
//! pinboard's registry with the bearer token, and [`redis_wipe`] removes a
//! bench's Redis keys afterwards.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use pinned::{HostOptions, Options};
use pinned_fleet::counter::{process_token, Counter};
use serde_json::Value;
use tokio::time::Instant;

use crate::child::{self, Server, Spawn};

/// The deployment token every bench pinboard and worker shares.
pub const TOKEN: &str = "pinned-bench-token";

/// The namespace the counter is hosted under (Rust and Python alike).
pub const NAMESPACE: &str = "/counter";

/// The child-process subcommands a bench binary embeds (flattened into its
/// own subcommand enum).
#[derive(Debug, Subcommand)]
pub enum Serve {
    /// Run pinboard; everything after `--` is pinboard's own flags.
    ServePinboard {
        /// pinboard flags (`--listen`, `--token`, `--redis-url`, …).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the bench's Rust counter worker in control-plane mode.
    ServeWorker(WorkerArgs),
    /// Serve the counter object through a pinned worker on its own
    /// ([`crate::counters::serve_pinned`]).
    ServePinned {
        /// Instances (ids `r0` … `r<N-1>`) activated before listening.
        #[arg(long, default_value_t = 0)]
        resident: usize,
    },
    /// Serve the same handlers in a bare axum app
    /// ([`crate::counters::serve_bare`]).
    ServeBare {
        /// Counters (ids `r0` … `r<N-1>`) in the warm map before listening.
        #[arg(long, default_value_t = 0)]
        resident: usize,
    },
}

/// Flags of the Rust counter worker.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// pinboard base URL.
    #[arg(long)]
    pub pinboard_url: String,
    /// Deployment token.
    #[arg(long, default_value = TOKEN)]
    pub token: String,
    /// Heartbeat interval, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// Lease buffer (stop taking new ids this long before the lease ends), ms.
    #[arg(long, default_value_t = 2000)]
    pub lease_buffer_ms: u64,
    /// Most resident instances (the placement bench activates one per request).
    #[arg(long, default_value_t = 50_000_000)]
    pub max_instances: usize,
}

impl Serve {
    /// Runs the subcommand until SIGTERM / SIGINT (or SIGKILL).
    ///
    /// # Errors
    ///
    /// Bad flags, a port that cannot be bound, or a server failure.
    pub async fn run(&self) -> anyhow::Result<()> {
        // The benches' servers log as the binaries do (text or JSON from
        // `PINNED_LOG_FORMAT`, no colours into their log files), warnings
        // unless `RUST_LOG` asks for more.
        pinned::logging::LogSettings {
            default_filter: "warn".into(),
            ..pinned::logging::LogSettings::from_env_and_args(std::iter::empty())?
        }
        .init();
        match self {
            Serve::ServePinboard { args } => serve_pinboard(args).await,
            Serve::ServeWorker(args) => serve_worker(args).await,
            Serve::ServePinned { resident } => crate::counters::serve_pinned(*resident).await,
            Serve::ServeBare { resident } => crate::counters::serve_bare(*resident).await,
        }
    }
}

async fn serve_pinboard(args: &[String]) -> anyhow::Result<()> {
    let config = pinboard::Config::try_parse_from(
        std::iter::once("pinboard".to_owned()).chain(args.iter().cloned()),
    )?;
    let problems = config.validate();
    anyhow::ensure!(problems.is_empty(), "pinboard config: {problems:?}");
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    println!("pinboard listening on http://{}", listener.local_addr()?);
    pinboard::run(config, listener, pinned::shutdown_signal()).await?;
    Ok(())
}

/// Serves the counter in control-plane mode. Prints `secret <hex>`,
/// `process <token>` and then `… http://<addr>`.
async fn serve_worker(args: &WorkerArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .host_with::<Counter>(
            NAMESPACE,
            HostOptions::default().max_instances(args.max_instances),
        )
        .pinboard(
            args.pinboard_url.clone(),
            args.token.clone(),
            format!("http://{addr}"),
        )
        .heartbeat_interval(Duration::from_millis(args.heartbeat_ms))
        .lease_buffer(Duration::from_millis(args.lease_buffer_ms))
        .build()?;
    println!("secret {}", worker.secret());
    println!("process {}", process_token());
    println!("pinned worker listening on http://{addr}");
    pinned::serve(worker).listener(listener).await?;
    Ok(())
}

/// Starts pinboard from the bench binary `exe` on a free port, with the
/// bench token and `flags`; stderr goes to `log`.
///
/// # Errors
///
/// When it cannot start.
pub async fn start_pinboard(exe: &Path, flags: &[String], log: &Path) -> anyhow::Result<Server> {
    Spawn::new(exe)
        .args(["serve-pinboard", "--", "--listen", "127.0.0.1:0"])
        .args(["--token", TOKEN])
        .args(flags)
        .log(log)
        .start()
        .await
}

/// Starts the Rust counter worker from the bench binary `exe`, registered
/// with `pinboard_url`; stderr goes to `log`.
///
/// # Errors
///
/// When it cannot start.
pub async fn start_rust_worker(
    exe: &Path,
    pinboard_url: &str,
    heartbeat: Duration,
    lease_buffer: Duration,
    log: &Path,
) -> anyhow::Result<Server> {
    Spawn::new(exe)
        .args(["serve-worker", "--pinboard-url", pinboard_url])
        .args(["--heartbeat-ms", &heartbeat.as_millis().to_string()])
        .args(["--lease-buffer-ms", &lease_buffer.as_millis().to_string()])
        .log(log)
        .start()
        .await
}

/// Starts the Python reference worker (`app.py` in `app_dir` under
/// uvicorn, one process) on a free port, registered with `pinboard_url`.
///
/// # Errors
///
/// When it cannot start or never listens.
pub async fn start_python_worker(
    python: &Path,
    app_dir: &Path,
    pinboard_url: &str,
    heartbeat: Duration,
    lease_buffer: Duration,
    log: &Path,
) -> anyhow::Result<Server> {
    let addr = child::free_addr()?;
    Spawn::new(python)
        .args(["-m", "uvicorn", "app:app", "--host", "127.0.0.1"])
        .args(["--port", &addr.port().to_string(), "--log-level", "warning"])
        .args([std::ffi::OsStr::new("--app-dir"), app_dir.as_os_str()])
        .env("PINBOARD_URL", pinboard_url)
        .env("PINBOARD_TOKEN", TOKEN)
        .env("ADVERTISE_URL", format!("http://{addr}"))
        .env("HEARTBEAT_S", heartbeat.as_secs_f64().to_string())
        .env("LEASE_BUFFER_S", lease_buffer.as_secs_f64().to_string())
        .log(log)
        .listening_on(addr)
        .start()
        .await
}

/// An operator (and plain client) of one pinboard.
#[derive(Debug, Clone)]
pub struct Operator {
    http: reqwest::Client,
    url: String,
}

impl Operator {
    /// A client of the pinboard at `url`.
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built.
    pub fn new(url: impl Into<String>) -> anyhow::Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(10))
                .build()?,
            url: url.into(),
        })
    }

    /// `GET /registry/workers` rows.
    ///
    /// # Errors
    ///
    /// When pinboard does not answer 200 with JSON.
    pub async fn workers(&self) -> anyhow::Result<Vec<Value>> {
        let body = self.registry("/registry/workers").await?;
        Ok(body["workers"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until exactly `n` workers are live; returns their rows.
    ///
    /// # Errors
    ///
    /// When that does not happen within `patience`.
    pub async fn wait_workers(&self, n: usize, patience: Duration) -> anyhow::Result<Vec<Value>> {
        let deadline = Instant::now() + patience;
        loop {
            let rows = self.workers().await?;
            if rows.len() == n {
                return Ok(rows);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "expected {n} live workers after {patience:?}, have {}",
                rows.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The session id of the worker advertising `addr`, once registered.
    ///
    /// # Errors
    ///
    /// When it does not register within `patience`.
    pub async fn session_of(&self, addr: SocketAddr, patience: Duration) -> anyhow::Result<String> {
        let advertise = format!("http://{addr}");
        let deadline = Instant::now() + patience;
        loop {
            let rows = self.workers().await?;
            if let Some(session) = rows
                .iter()
                .find(|w| w["advertiseUrl"] == advertise.as_str())
                .and_then(|w| w["sessionId"].as_str())
            {
                return Ok(session.to_owned());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "worker {advertise} not registered after {patience:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The live placement of `(ns, id)`: `(sessionId, epoch)`.
    ///
    /// # Errors
    ///
    /// When pinboard does not answer.
    pub async fn placement(&self, ns: &str, id: &str) -> anyhow::Result<Option<(String, u64)>> {
        let body = self.registry("/registry/overview").await?;
        let rows = body["placements"].as_array().cloned().unwrap_or_default();
        Ok(rows.iter().find_map(|p| {
            let matches = p["ns"] == ns && p["id"] == id && p["live"] != false;
            let session = p["sessionId"].as_str()?;
            let epoch = match &p["epoch"] {
                Value::String(s) => s.parse().ok()?,
                other => other.as_u64()?,
            };
            matches.then(|| (session.to_owned(), epoch))
        }))
    }

    /// A client request through pinboard: `GET <pinboard><path>`, its status
    /// and JSON body (`Null` when the body is not JSON).
    ///
    /// # Errors
    ///
    /// Transport failures.
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        let res = self.http.get(format!("{}{path}", self.url)).send().await?;
        let status = res.status().as_u16();
        let body = res.bytes().await?;
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    /// `GET <path>` through pinboard until it answers 2xx (503s and
    /// transport errors are retried for up to `patience`).
    ///
    /// # Errors
    ///
    /// Any other status, or no success within `patience`.
    pub async fn get_ok(&self, path: &str, patience: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + patience;
        loop {
            let outcome = self.get(path).await;
            match outcome {
                Ok((status, body)) if (200..300).contains(&status) => return Ok(body),
                Ok((503, _)) | Err(_) if Instant::now() < deadline => {}
                Ok((status, body)) => anyhow::bail!("GET {path}: {status} {body}"),
                Err(error) => return Err(error.context(format!("GET {path}"))),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn registry(&self, path: &str) -> anyhow::Result<Value> {
        let res = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(TOKEN)
            .send()
            .await?
            .error_for_status()?;
        Ok(res.json().await?)
    }
}

/// A `Pinboard-Attestation` for the worker session `session_id`, minted
/// now with the worker's `secret` (valid for the next 30 s, plus the
/// worker's 30 s skew allowance).
pub fn attestation(secret: &str, session_id: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_secs_f64())
        .unwrap_or(0.0);
    pinned_wire::attestation::mint(secret, session_id, now, None, None)
}

/// A Redis key prefix no other run uses.
pub fn unique_prefix(bench: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    format!("pinned-bench:{bench}:{}:{nanos}:", std::process::id())
}

/// As [`redis_wipe`], on every master of the Redis Cluster whose nodes
/// are `urls` (comma-separated): a cluster refuses one `UNLINK` of keys
/// in several slots, so each key goes alone. Replicas are skipped (their
/// masters' deletes reach them).
///
/// # Errors
///
/// When a node cannot be reached or refuses.
pub async fn redis_cluster_wipe(urls: &str, prefix: &str) -> anyhow::Result<u64> {
    anyhow::ensure!(
        !prefix.is_empty() && !prefix.contains(['*', '?', '[', ']', '\\']),
        "refusing to wipe prefix {prefix:?}"
    );
    let mut deleted = 0;
    for url in urls.split(',').map(str::trim) {
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await
            .context("redis connect")?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
        if !matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            continue;
        }
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut conn)
                .await?;
            for key in keys {
                let n: u64 = redis::cmd("UNLINK")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await?;
                deleted += n;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(deleted)
}

/// Deletes every key under `prefix` in the Redis at `url`; returns how many.
///
/// # Errors
///
/// When Redis cannot be reached.
pub async fn redis_wipe(url: &str, prefix: &str) -> anyhow::Result<u64> {
    anyhow::ensure!(
        !prefix.is_empty() && !prefix.contains(['*', '?', '[', ']', '\\']),
        "refusing to wipe prefix {prefix:?}"
    );
    let client = redis::Client::open(url)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .context("redis connect")?;
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            let n: u64 = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut conn)
                .await?;
            deleted += n;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}
