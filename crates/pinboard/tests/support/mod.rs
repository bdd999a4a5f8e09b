//! Shared harness for pinboard's integration suites: spawns the real
//! `pinboard` binary and real Python reference workers (pinned 0.16.0 under
//! uvicorn) on free loopback ports, and kills them on drop.
//!
//! The Python interpreter comes from `PINNED_PY` (default: the workspace's
//! `.venv/bin/python`); a missing interpreter fails the test, it never skips.
#![allow(dead_code, unreachable_pub)]

pub mod durable;
pub mod fake;
pub mod raw;
pub mod redis_server;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Deployment token used by every test.
pub const TOKEN: &str = "test-token";
/// Lease TTL used by the suites (ms).
pub const LEASE_TTL_MS: u64 = 2000;

// The shared harness, under this module's old names.
#[allow(unused_imports)] // not every suite uses every helper
pub use test_support::{eventually, free_port, get_json, python};

/// A log file of its own for each process a test starts: tests of one
/// binary run in parallel, and one reading its pinboard's log must not see
/// another's.
fn log_path(name: &str) -> PathBuf {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join("pinboard-tests");
    std::fs::create_dir_all(&dir).expect("log dir");
    dir.join(format!("{name}-{}-{n}.log", std::process::id()))
}

fn log_file(name: &str) -> std::fs::File {
    std::fs::File::create(log_path(name)).expect("log file")
}

/// A running `pinboard` process.
pub struct Pinboard {
    child: Child,
    /// `http://127.0.0.1:<port>` (`https://` with `--tls-cert`).
    pub url: String,
    /// Its stderr (the log).
    pub log: PathBuf,
}

impl Pinboard {
    /// Start on the memory store with a 2 s lease and no quarantine.
    pub fn start(extra: &[&str]) -> Self {
        Self::launch(extra, None, "pinboard")
    }

    /// As [`start`](Self::start), under `ulimit -n <nofile>`, logging to a
    /// file of its own named after `name`.
    pub fn start_with_nofile(extra: &[&str], nofile: u64, name: &str) -> Self {
        Self::launch(extra, Some(nofile), name)
    }

    fn launch(extra: &[&str], nofile: Option<u64>, name: &str) -> Self {
        let ttl = LEASE_TTL_MS.to_string();
        let mut args = vec!["--listen", "127.0.0.1:0"];
        // Defaults the caller did not override.
        for (flag, value) in [
            ("--token", TOKEN),
            ("--lease-ttl-ms", ttl.as_str()),
            ("--quarantine-ms", "0"),
        ] {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        args.extend_from_slice(extra);
        let log = log_path(name);
        let bin = env!("CARGO_BIN_EXE_pinboard");
        let mut cmd = match nofile {
            None => Command::new(bin),
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(bin);
                c
            }
        };
        let mut child = cmd
            .args(&args)
            .env("RUST_LOG", "pinboard=debug,info")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).expect("log file")))
            .spawn()
            .expect("spawn pinboard");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read bound address");
        let url = line
            .trim()
            .strip_prefix("pinboard listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Self { child, url, log }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.url
            .strip_prefix("http://")
            .or_else(|| self.url.strip_prefix("https://"))
            .expect("http(s) url")
            .parse()
            .expect("socket address")
    }

    /// Send SIGTERM (a graceful shutdown).
    pub fn terminate(&self) {
        signal(self.child.id(), "TERM");
    }

    /// Wait for the process to exit, up to `patience`; `None` if it did not.
    pub async fn wait_exit(&mut self, patience: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Start on Redis under `prefix`.
    pub fn start_redis(prefix: &str, extra: &[&str]) -> Self {
        let mut args = vec![
            "--redis-url",
            "redis://127.0.0.1:6379/0",
            "--redis-prefix",
            prefix,
        ];
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    /// Start on the Redis at `url` (a private one, see [`redis_server`]),
    /// with the default key prefix.
    pub fn start_on(url: &str, extra: &[&str]) -> Self {
        let mut args = vec!["--redis-url", url];
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    /// The value of the metric `name` (a counter's `_total` line, or a
    /// gauge) on `GET /metrics`.
    pub async fn metric(&self, c: &reqwest::Client, name: &str) -> u64 {
        let text = c
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no metric {name} in {text}"))
            .trim()
            .parse()
            .expect("metric value")
    }

    /// Kill the process now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Pinboard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running Python reference worker (uvicorn + tests/py/app.py).
pub struct Worker {
    child: Child,
    /// `http://127.0.0.1:<port>`: its advertise URL.
    pub url: String,
}

impl Worker {
    /// Start a worker registering with `pinboard_url`.
    pub fn start(pinboard_url: &str) -> Self {
        Self::start_with(pinboard_url, &[])
    }

    /// Start a worker with extra environment.
    pub fn start_with(pinboard_url: &str, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let app_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py");
        let mut cmd = Command::new(python());
        cmd.args([
            "-m",
            "uvicorn",
            "app:app",
            "--host",
            "127.0.0.1",
            "--log-level",
            "warning",
        ])
        .arg("--port")
        .arg(port.to_string())
        .arg("--app-dir")
        .arg(&app_dir)
        .env("PINBOARD_URL", pinboard_url)
        .env("PINBOARD_TOKEN", TOKEN)
        .env("ADVERTISE_URL", &url)
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file(&format!("worker-{port}"))));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn python worker");
        Self { child, url }
    }

    /// SIGSTOP the worker (it freezes: no answers, no heartbeats).
    pub fn freeze(&self) {
        signal(self.child.id(), "STOP");
    }

    /// SIGCONT a frozen worker.
    pub fn thaw(&self) {
        signal(self.child.id(), "CONT");
    }

    /// SIGKILL the worker.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Send `SIG<name>` to `pid` (through `kill`, so the suites need no libc).
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}");
}

/// A plain HTTP client (no system proxy).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

/// `Authorization: Bearer <TOKEN>`.
pub fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// `GET /registry/workers` rows.
pub async fn workers(c: &reqwest::Client, pb: &str) -> Vec<Value> {
    test_support::workers(c, pb, TOKEN).await
}

/// Wait until `n` workers are registered; returns their rows.
pub async fn wait_workers(c: &reqwest::Client, pb: &str, n: usize) -> Vec<Value> {
    test_support::wait_workers(c, pb, TOKEN, n).await
}

/// GET `pb<path>` as JSON, retrying 503s for up to `patience`.
/// Hits `/counter/<prefix><i>/hit` through pinboard for `i` in `0..tries`
/// until one lands on the worker whose process token is `process`; answers
/// that id and its first answer.
pub async fn id_on(
    c: &reqwest::Client,
    pinboard: &str,
    process: &Value,
    prefix: &str,
    tries: usize,
) -> Option<(String, Value)> {
    for i in 0..tries {
        let id = format!("{prefix}{i}");
        let answer = get_json(
            c,
            &format!("{pinboard}/counter/{id}/hit"),
            Duration::from_secs(10),
        )
        .await;
        if answer["process"] == *process {
            return Some((id, answer));
        }
    }
    None
}

/// A unique Redis key prefix for one test.
pub fn redis_prefix(test: &str) -> String {
    format!(
        "pinboard-test:{test}:{}:{}:",
        std::process::id(),
        free_port()
    )
}

/// Delete every Redis key under `prefix` (a store that lost its data).
pub async fn redis_wipe(prefix: &str) {
    let client = redis::Client::open("redis://127.0.0.1:6379/0").expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connect");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .expect("keys");
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .expect("del");
    }
}
