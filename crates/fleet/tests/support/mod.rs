//! Fleet harness: real `pinboard` processes (`fleet-pinboard`, the
//! pinboard binary's entry point), Rust workers (`fleet-worker`) and
//! Python reference workers (uvicorn + pinboard's test app), on free
//! loopback ports, killed on drop. Signals go through `kill(1)`.
//!
//! The Python interpreter comes from `PINNED_PY` (default: the workspace's
//! `.venv/bin/python`); a missing interpreter fails the test.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Deployment token of every test.
pub const TOKEN: &str = "fleet-token";

fn log_file(name: &str) -> std::fs::File {
    let dir = std::env::temp_dir().join("pinned-fleet-tests");
    let _ = std::fs::create_dir_all(&dir);
    std::fs::File::create(dir.join(format!("{name}-{}.log", std::process::id()))).expect("log file")
}

/// A child process, killed on drop.
pub struct Proc {
    child: Child,
    /// Its base URL.
    pub url: String,
    /// The worker secret (Rust workers print it).
    pub secret: Option<String>,
}

impl Proc {
    /// Reads stdout until the `… http://addr` (or `https://`) line; keeps
    /// `secret <hex>`.
    fn spawn(mut command: Command, name: &str) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file(name)))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut secret = None;
        let url = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("{name} exited before printing its address"))
                .expect("read line");
            if let Some(hex) = line.strip_prefix("secret ") {
                secret = Some(hex.trim().to_owned());
            }
            if let Some(at) = line.find("https://").or_else(|| line.find("http://")) {
                break line[at..].trim().to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Self { child, url, secret }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP: the process freezes.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// SIGTERM: the worker drains and exits.
    pub fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Waits for the process to exit (at most `patience`).
    pub fn wait_exit(&mut self, patience: Duration) -> bool {
        let deadline = std::time::Instant::now() + patience;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.resume_quietly();
        self.kill9();
    }
}

impl Proc {
    fn resume_quietly(&self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.pid().to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

// The shared harness, under this module's old names.
#[allow(unused_imports)] // not every suite uses every helper
pub use test_support::{eventually, free_port, get_json, python, until_explained};

/// A unique Redis key prefix for one test.
pub fn redis_prefix(test: &str) -> String {
    format!("fleet-test:{test}:{}:{}:", std::process::id(), free_port())
}

/// Starts pinboard with `args` (defaults: memory store, 2 s lease, no
/// quarantine).
pub fn pinboard(args: &[&str]) -> Proc {
    let mut all = vec!["--listen", "127.0.0.1:0", "--token", TOKEN];
    for (flag, value) in [("--lease-ttl-ms", "2000"), ("--quarantine-ms", "0")] {
        if !args.contains(&flag) {
            all.extend([flag, value]);
        }
    }
    all.extend_from_slice(args);
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleet-pinboard"));
    command.args(&all).env("RUST_LOG", "info");
    Proc::spawn(command, "pinboard")
}

/// Starts pinboard on Redis under `prefix`.
pub fn pinboard_redis(prefix: &str, args: &[&str]) -> Proc {
    let mut all = vec![
        "--redis-url",
        "redis://127.0.0.1:6379/0",
        "--redis-prefix",
        prefix,
    ];
    all.extend_from_slice(args);
    pinboard(&all)
}

/// Starts a Rust worker against `pinboard` with extra environment. The
/// default heartbeat (300 ms) and lease buffer (500 ms) suit a 2 s lease.
pub fn rust_worker(pinboard: &str, env: &[(&str, &str)]) -> Proc {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleet-worker"));
    command
        .env("PINBOARD_URL", pinboard)
        .env("PINBOARD_TOKEN", TOKEN)
        .env("FLEET_HEARTBEAT_MS", "300")
        .env("FLEET_LEASE_BUFFER_MS", "500")
        .env("RUST_LOG", "info");
    for (key, value) in env {
        command.env(key, value);
    }
    Proc::spawn(command, "rust-worker")
}

/// Starts a Python reference worker (pinboard's test app) against
/// `pinboard`.
pub fn python_worker(pinboard: &str) -> Proc {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let app_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pinboard/tests/py");
    let mut command = Command::new(python());
    command
        .args(["-c", &format!(
            "import uvicorn; print('python worker listening on {url}', flush=True); \
             uvicorn.run('app:app', host='127.0.0.1', port={port}, log_level='warning', app_dir={app:?})",
            app = app_dir.display().to_string()
        )])
        .env("PINBOARD_URL", pinboard)
        .env("PINBOARD_TOKEN", TOKEN)
        .env("ADVERTISE_URL", &url)
        .env("HEARTBEAT_S", "0.3")
        .env("LEASE_BUFFER_S", "0.5");
    Proc::spawn(command, "python-worker")
}

/// A plain HTTP client with a pool big enough for the fleet tests.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(128)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

/// `GET /registry/workers` rows.
pub async fn workers(c: &reqwest::Client, pb: &str) -> Vec<Value> {
    test_support::workers(c, pb, TOKEN).await
}

/// Waits until `n` workers are registered (at most 30 s).
pub async fn wait_workers(c: &reqwest::Client, pb: &str, n: usize) -> Vec<Value> {
    test_support::wait_workers(c, pb, TOKEN, n).await
}

/// A worker's `/_pinned/stats`, authenticated with its secret.
pub async fn stats(c: &reqwest::Client, worker: &Proc) -> Value {
    c.get(format!("{}/_pinned/stats", worker.url))
        .header(
            "pinboard-proxy-secret",
            worker.secret.as_deref().expect("secret"),
        )
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("stats json")
}
