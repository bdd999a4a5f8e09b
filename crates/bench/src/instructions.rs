//! Instructions per request, the figure that does not depend on what else
//! the machine is doing: the server runs under `valgrind --tool=callgrind`
//! twice, once for a short and once for a long sequence of requests, and
//! the per-request cost is Δinstructions / Δrequests. Counting starts
//! after a warm-up request (`--instr-atstart=no`, then `callgrind_control
//! --instr=on`), so start-up is not counted at all; shutdown cancels out.
//!
//! The load comes from this process, one request at a time on one
//! keep-alive connection, so the generator never competes with the server
//! for a core it is measured on. Counts are user-space instructions of the
//! whole server process (all its threads), as callgrind totals them.
//!
//! [`per_request`] starts a self-contained server; [`per_request_with`]
//! leaves starting to the caller, for servers that need company and set-up
//! before they can answer (pinboard with a registered worker, nginx with
//! its upstream).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use http::Method;

use crate::child::{Server, Spawn};

/// The two run lengths.
#[derive(Clone, Copy, Debug)]
pub struct Lengths {
    /// Requests in the short run.
    pub short: usize,
    /// Requests in the long run.
    pub long: usize,
}

impl Default for Lengths {
    fn default() -> Self {
        Self {
            short: 2_000,
            long: 10_000,
        }
    }
}

/// Whether `valgrind` can be run here.
pub fn available() -> bool {
    std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Instructions per request of the server that `exe args` starts, for the
/// request `POST <path(i)>` (i = 0, 1, …).
///
/// # Errors
///
/// valgrind or the server fails, a request fails, or callgrind writes no
/// total.
pub async fn per_request(
    exe: &str,
    args: &[&str],
    path: impl Fn(usize) -> String,
    lengths: Lengths,
    scratch: &Path,
) -> anyhow::Result<f64> {
    let short = total(
        exe,
        args,
        &[],
        &path,
        lengths.short,
        &scratch.join("short.out"),
    )
    .await?;
    let long = total(
        exe,
        args,
        &[],
        &path,
        lengths.long,
        &scratch.join("long.out"),
    )
    .await?;
    anyhow::ensure!(lengths.long > lengths.short, "the long run must be longer");
    Ok((long as f64 - short as f64) / (lengths.long - lengths.short) as f64)
}

/// How a measured pinned worker logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logging {
    /// The bench's servers' default: warnings only, so nothing listens at
    /// `info` (as with no subscriber at all).
    Quiet,
    /// The examples' default (`RUST_LOG` unset, an `info` subscriber):
    /// `RUST_LOG=info`.
    Info,
}

impl Logging {
    /// The `RUST_LOG` the worker process gets.
    fn filter(self) -> &'static str {
        match self {
            Self::Quiet => "warn",
            Self::Info => "info",
        }
    }
}

impl std::fmt::Display for Logging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Quiet => "no subscriber",
            Self::Info => "info subscriber",
        })
    }
}

/// [`per_request`] for the bench's bare axum counter (`serve-bare`, quiet)
/// and for the pinned worker's (`serve-pinned`) once per entry of
/// `logging`, each started with `args` after its command and asked for
/// `bare_path(i)` / `pinned_path(i)`; the callgrind outputs go to
/// `scratch`'s `bare/` and `pinned-<n>/`. Answers the bare count and the
/// pinned ones, in `logging`'s order.
///
/// # Errors
///
/// As [`per_request`], or a folder cannot be made.
pub async fn bare_and_pinned(
    exe: &str,
    args: &[&str],
    (bare_path, pinned_path): (impl Fn(usize) -> String, impl Fn(usize) -> String),
    logging: &[Logging],
    lengths: Lengths,
    scratch: &Path,
) -> anyhow::Result<(f64, Vec<f64>)> {
    let bare = counted(
        exe,
        "serve-bare",
        args,
        Logging::Quiet,
        &bare_path,
        lengths,
        &scratch.join("bare"),
    )
    .await?;
    let mut pinned = Vec::with_capacity(logging.len());
    for (n, log) in logging.iter().enumerate() {
        let out = scratch.join(format!("pinned-{n}"));
        pinned.push(counted(exe, "serve-pinned", args, *log, &pinned_path, lengths, &out).await?);
    }
    Ok((bare, pinned))
}

/// [`per_request`] of `exe command args` logging as `log`, its callgrind
/// outputs in `out`.
async fn counted(
    exe: &str,
    command: &str,
    args: &[&str],
    log: Logging,
    path: &dyn Fn(usize) -> String,
    lengths: Lengths,
    out: &Path,
) -> anyhow::Result<f64> {
    anyhow::ensure!(lengths.long > lengths.short, "the long run must be longer");
    std::fs::create_dir_all(out)?;
    let env = [("RUST_LOG", log.filter())];
    let args: Vec<&str> = std::iter::once(command)
        .chain(args.iter().copied())
        .collect();
    let short = total(
        exe,
        &args,
        &env,
        path,
        lengths.short,
        &out.join("short.out"),
    )
    .await?;
    let long = total(exe, &args, &env, path, lengths.long, &out.join("long.out")).await?;
    Ok((long as f64 - short as f64) / (lengths.long - lengths.short) as f64)
}

/// Total instructions of one server run serving `requests` requests.
async fn total(
    exe: &str,
    args: &[&str],
    env: &[(&str, &str)],
    path: &dyn Fn(usize) -> String,
    requests: usize,
    out: &Path,
) -> anyhow::Result<u64> {
    let _ = std::fs::remove_file(out);
    let mut spawn = under_callgrind(out).arg_os(exe).args(args);
    for (key, value) in env {
        spawn = spawn.env(key, value);
    }
    let server = spawn.start().await?;
    let run = Run {
        server,
        company: Vec::new(),
    };
    let probe = |i| Probe {
        method: Method::POST,
        path: path(i),
        headers: Vec::new(),
    };
    measured(run, &probe, requests, out).await
}

/// `valgrind --tool=callgrind` writing its counts to `out`; the caller adds
/// the program and its arguments.
pub fn under_callgrind(out: &Path) -> Spawn {
    // Counting starts only after the warm-up request (see `measured`):
    // start-up varies by millions of instructions from run to run (tasks,
    // registration, first connections), which the Δ would not cancel.
    Spawn::new("valgrind")
        .args(["--tool=callgrind", "--quiet", "--instr-atstart=no"])
        .arg_os(format!("--callgrind-out-file={}", out.display()))
}

/// One request of a measured run.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Its method.
    pub method: Method,
    /// Its path (and query).
    pub path: String,
    /// Headers it carries.
    pub headers: Vec<(String, String)>,
}

/// A server started under callgrind (by [`under_callgrind`]) and ready to
/// answer, with the processes it needs (stopped after it).
#[derive(Debug)]
pub struct Run {
    /// The measured server.
    pub server: Server,
    /// Processes that keep it company (not measured).
    pub company: Vec<Server>,
}

/// Instructions per request for `probe(i)` (i = 0, 1, …) of the server
/// `start(out)` starts under callgrind with its counts going to `out`: the
/// Δ between a short and a long run, as [`per_request`]. The first request
/// of each run comes before the count (`start` may make it to warm up).
///
/// # Errors
///
/// `start` fails, a request fails, or callgrind writes no total.
pub async fn per_request_with<F, Fut>(
    start: F,
    probe: impl Fn(usize) -> Probe,
    lengths: Lengths,
    scratch: &Path,
) -> anyhow::Result<f64>
where
    F: Fn(PathBuf) -> Fut,
    Fut: Future<Output = anyhow::Result<Run>>,
{
    anyhow::ensure!(lengths.long > lengths.short, "the long run must be longer");
    let mut totals = Vec::with_capacity(2);
    for (requests, name) in [(lengths.short, "short.out"), (lengths.long, "long.out")] {
        let out = scratch.join(name);
        let _ = std::fs::remove_file(&out);
        let run = start(out.clone()).await?;
        totals.push(measured(run, &probe, requests, &out).await?);
    }
    Ok((totals[1] as f64 - totals[0] as f64) / (lengths.long - lengths.short) as f64)
}

/// Sends `requests` probes one at a time on one connection, stops the
/// server (callgrind writes its counts at exit), then its company, and
/// answers the total.
async fn measured(
    mut run: Run,
    probe: &impl Fn(usize) -> Probe,
    requests: usize,
    out: &Path,
) -> anyhow::Result<u64> {
    let mut connection = Connection::open(run.server.addr).await?;
    let warm_up = connection.exchange(&probe(0)).await?;
    anyhow::ensure!(warm_up.is_success(), "warm-up: {warm_up}");
    let pid = run.server.pid().context("the server has no pid")?;
    let on = tokio::process::Command::new("callgrind_control")
        .args(["--instr=on", &pid.to_string()])
        .output()
        .await
        .context("run callgrind_control")?;
    anyhow::ensure!(
        on.status.success(),
        "callgrind_control --instr=on {pid}: {}",
        String::from_utf8_lossy(&on.stderr)
    );
    for i in 0..requests {
        let status = connection.exchange(&probe(i)).await?;
        anyhow::ensure!(status.is_success(), "request {i}: {status}");
    }
    drop(connection);
    run.server.terminate(Duration::from_secs(120)).await?;
    for mut helper in run.company {
        let _ = helper.kill().await;
    }
    let text = std::fs::read_to_string(out)
        .with_context(|| format!("callgrind wrote no {}", out.display()))?;
    text.lines()
        .find_map(|line| {
            line.strip_prefix("summary: ")
                .or_else(|| line.strip_prefix("totals: "))
        })
        .and_then(|value| value.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .context("no instruction total in the callgrind output")
}

/// One keep-alive HTTP/1.1 connection that sends one request at a time and
/// reads each answer whole (`Content-Length` framed). Written out rather
/// than a pooled client: a pool may open a second connection when a
/// request goes out before the last answer's connection was handed back,
/// and every connection the server accepts is counted against the
/// requests.
struct Connection {
    stream: tokio::net::TcpStream,
    host: String,
    buf: Vec<u8>,
}

impl Connection {
    async fn open(addr: std::net::SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            host: addr.to_string(),
            buf: Vec::with_capacity(16 * 1024),
        })
    }

    /// Sends `probe` and reads its answer: the status.
    async fn exchange(&mut self, probe: &Probe) -> anyhow::Result<http::StatusCode> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = format!(
            "{} {} HTTP/1.1\r\nhost: {}\r\ncontent-length: 0\r\n",
            probe.method, probe.path, self.host
        );
        for (name, value) in &probe.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        self.stream.write_all(head.as_bytes()).await?;
        self.buf.clear();
        loop {
            let mut fields = [httparse::EMPTY_HEADER; 64];
            let mut response = httparse::Response::new(&mut fields);
            if let httparse::Status::Complete(len) = response.parse(&self.buf)? {
                let status = http::StatusCode::from_u16(response.code.unwrap_or(0))?;
                let length = response
                    .headers
                    .iter()
                    .find(|f| f.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|f| {
                        std::str::from_utf8(f.value)
                            .ok()?
                            .trim()
                            .parse::<usize>()
                            .ok()
                    })
                    .context("an answer without Content-Length")?;
                while self.buf.len() < len + length {
                    anyhow::ensure!(
                        self.stream.read_buf(&mut self.buf).await? > 0,
                        "the server closed the connection mid-answer"
                    );
                }
                anyhow::ensure!(self.buf.len() == len + length, "bytes after the answer");
                return Ok(status);
            }
            anyhow::ensure!(
                self.stream.read_buf(&mut self.buf).await? > 0,
                "the server closed the connection"
            );
        }
    }
}
