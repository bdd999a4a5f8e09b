//! A private `redis-server`, for suites that wipe the whole store
//! (`FLUSHALL`), restart it, pause it, or count the commands pinboard sends
//! (`INFO commandstats`) without touching, or being disturbed by, the
//! shared Redis on 6379.
//!
//! Redis cannot bind port 0 and report it (`--port 0` turns TCP off), so
//! this is the one starter that picks a port for its child: a port the
//! kernel just handed out and released. When another process took it in
//! between, the server fails to bind and exits, and the start is retried
//! on a fresh port; a server that started is the only listener on its
//! port, so no test ever talks to another test's Redis.

use std::process::Command;
use std::time::Duration;

use super::Proc;

/// Starts tried before giving up (each fails only when its port was taken).
const ATTEMPTS: usize = 5;

/// A running private Redis (no persistence), killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    proc: Proc,
    port: u16,
    /// `redis://127.0.0.1:<port>/0`.
    pub url: String,
}

impl RedisServer {
    /// Starts one and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When `redis-server` is missing, or fails five times.
    pub fn start() -> Self {
        let mut last = None;
        for _ in 0..ATTEMPTS {
            let port = released_port();
            match spawn(port) {
                Ok(proc) => {
                    return Self {
                        proc,
                        port,
                        url: format!("redis://127.0.0.1:{port}/0"),
                    }
                }
                Err(exited) => last = Some(exited),
            }
        }
        panic!(
            "redis-server failed to start {ATTEMPTS} times; the last: {}",
            last.map_or_else(String::new, |e| e.to_string())
        );
    }

    /// SIGKILL, then a new empty server on the same port: every connection
    /// breaks and the data is gone, as in a crash. The port must be the
    /// same (pinboard keeps its URL), so this start is not retried; the
    /// port was ours a moment ago, and nothing else is handed ports.
    ///
    /// # Panics
    ///
    /// When the new server does not start.
    pub fn restart(&mut self) {
        self.proc.kill();
        self.proc = spawn(self.port).unwrap_or_else(|exited| panic!("{exited}"));
    }

    /// Its process (for signals, its pid, its log).
    pub fn process(&self) -> &Proc {
        &self.proc
    }

    /// SIGSTOP: Redis freezes (connections stay open, nothing answers).
    pub fn pause(&self) {
        self.proc.pause();
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.proc.resume();
    }

    /// A connection for the test's own commands.
    ///
    /// # Panics
    ///
    /// When it does not answer.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis connect")
    }

    /// Runs `args` (a command and its arguments), ignoring the answer.
    ///
    /// # Panics
    ///
    /// When the command fails.
    pub async fn command(&self, args: &[&str]) {
        let _: redis::Value = redis::cmd(args[0])
            .arg(&args[1..])
            .query_async(&mut self.conn().await)
            .await
            .unwrap_or_else(|e| panic!("redis {args:?}: {e}"));
    }

    /// `FLUSHALL`: the store loses everything at once.
    pub async fn flushall(&self) {
        self.command(&["FLUSHALL"]).await;
    }

    /// `CLIENT PAUSE <ms> ALL`: every client's commands wait for
    /// `how_long`, connections stay open.
    pub async fn client_pause(&self, how_long: Duration) {
        self.command(&["CLIENT", "PAUSE", &how_long.as_millis().to_string(), "ALL"])
            .await;
    }

    /// Keys matching `pattern` (`KEYS`).
    ///
    /// # Panics
    ///
    /// When Redis does not answer.
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut self.conn().await)
            .await
            .expect("keys")
    }

    /// Number of keys held (`DBSIZE`).
    ///
    /// # Panics
    ///
    /// When Redis does not answer.
    pub async fn dbsize(&self) -> u64 {
        redis::cmd("DBSIZE")
            .query_async(&mut self.conn().await)
            .await
            .expect("dbsize")
    }

    /// How many times `command` (lowercase, e.g. `evalsha`) ran so far,
    /// from `INFO commandstats`.
    ///
    /// # Panics
    ///
    /// When Redis does not answer.
    pub async fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn().await)
            .await
            .expect("info");
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("calls"))
    }
}

/// A port the kernel handed out and took back: free a moment ago, and not
/// one another starter is handed (they all bind port 0 themselves).
fn released_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

/// `redis-server` on `port`, ready once it logs that it accepts
/// connections (to stdout: no log file is set); an error when it exits
/// first, as when the port is taken.
fn spawn(port: u16) -> Result<Proc, super::Exited> {
    let mut command = Command::new("redis-server");
    command
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--port")
        .arg(port.to_string());
    let url = format!("redis://127.0.0.1:{port}/0");
    Proc::try_spawn(command, "redis-server", |line| {
        line.contains("Ready to accept connections")
            .then(|| url.clone())
    })
}
