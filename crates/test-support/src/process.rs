//! The processes the suites start: a child that learns its own address,
//! logs to a file of its own, takes signals, and dies with its handle.
//!
//! Every listener binds port 0 and reports the address it got on stdout (a
//! `… listening on <url>` line), so parallel tests never race for a port.
//! The starters ([`Pinboard`], [`RustWorker`], [`PythonWorker`],
//! [`RedisServer`]) are small builders over [`Proc::spawn`]; signals go
//! through `kill(1)`, so the suites need no libc.

mod pinboard;
mod postgres;
mod python_worker;
mod redis;
mod redis_cluster;
mod rust_worker;

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub use self::pinboard::{Pinboard, SHARED_REDIS};
pub use self::postgres::{PostgresCluster, ServerTls};
pub use self::python_worker::PythonWorker;
pub use self::redis::RedisServer;
pub use self::redis_cluster::{cpu_seconds as redis_cpu_seconds, RedisCluster, NODE_TIMEOUT_MS};
pub use self::rust_worker::RustWorker;

/// How long a child may take to report its address (a debug build on two
/// busy cores starts in well under a second; this only bounds a hang).
pub const READY_PATIENCE: Duration = Duration::from_secs(30);

/// A signal the suites send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: a graceful shutdown (a worker drains, pinboard stops).
    Term,
    /// SIGSTOP: the process freezes (no answers, no heartbeats, sockets
    /// stay open).
    Stop,
    /// SIGCONT: a frozen process runs again.
    Cont,
    /// SIGKILL: a crash.
    Kill,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Self::Term => "TERM",
            Self::Stop => "STOP",
            Self::Cont => "CONT",
            Self::Kill => "KILL",
        }
    }
}

/// A running child process, killed (SIGCONT first, so a frozen one dies
/// too) and reaped on drop.
///
/// Its stderr and its stdout go to [`log`](Self::log), a file of its own:
/// tests of one binary run in parallel, and one reading its process's log
/// must not see another's.
#[derive(Debug)]
pub struct Proc {
    child: Child,
    /// The address it reported (`http://127.0.0.1:<port>`, `https://…`,
    /// `redis://…`).
    pub url: String,
    /// Its log file (stderr and stdout).
    pub log: PathBuf,
    /// The lines it printed before its address (a Rust worker's
    /// `secret <hex>`).
    pub preamble: Vec<String>,
}

/// A child that exited before it reported its address.
#[derive(Debug)]
pub struct Exited {
    /// The name it was started under.
    pub name: String,
    /// How it ended.
    pub status: Option<ExitStatus>,
    /// Its log.
    pub log: String,
}

impl fmt::Display for Exited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self
            .status
            .map_or_else(|| "unknown status".to_owned(), |s| s.to_string());
        write!(
            f,
            "{} exited ({status}) before reporting its address; its log:\n{}",
            self.name, self.log
        )
    }
}

impl std::error::Error for Exited {}

/// The URL of a `… listening on <url>` line, as pinboard, the Rust worker
/// and the Python launcher print it.
pub fn listening_line(line: &str) -> Option<String> {
    let (_, url) = line.split_once("listening on ")?;
    Some(url.trim().to_owned())
}

impl Proc {
    /// Starts `command` as `name` (the log file's stem) and reads its stdout
    /// until `ready` recognises a line and answers the process's URL; the
    /// lines before it are kept as its [`preamble`](Self::preamble). The
    /// rest of its stdout is copied to its log.
    ///
    /// # Panics
    ///
    /// When it cannot be started, exits first, or is not ready within
    /// [`READY_PATIENCE`] (the panic carries its log).
    pub fn spawn(command: Command, name: &str, ready: impl FnMut(&str) -> Option<String>) -> Self {
        Self::try_spawn(command, name, ready).unwrap_or_else(|exited| panic!("{exited}"))
    }

    /// [`spawn`](Self::spawn), answering a child that exited before it was
    /// ready instead of panicking (a private Redis whose port was taken).
    ///
    /// # Errors
    ///
    /// [`Exited`] when it exits first.
    ///
    /// # Panics
    ///
    /// When it cannot be started or is not ready in time.
    pub fn try_spawn(
        mut command: Command,
        name: &str,
        mut ready: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, Exited> {
        let log = log_path(name);
        let stderr = append(&log);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name} ({:?}): {e}", command.get_program()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let lines = copy_lines(stdout, append(&log));
        let deadline = Instant::now() + READY_PATIENCE;
        let mut preamble = Vec::new();
        let url = loop {
            match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => match ready(&line) {
                    Some(url) => break url,
                    None => preamble.push(line),
                },
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Its stdout closed: it exited (or closed stdout, which
                    // none of ours do); reap it to tell.
                    let status = child.wait().ok();
                    return Err(Exited {
                        name: name.to_owned(),
                        status,
                        log: std::fs::read_to_string(&log).unwrap_or_default(),
                    });
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "{name} did not report its address within {READY_PATIENCE:?}; its log:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
            }
        };
        Ok(Self {
            child,
            url,
            log,
            preamble,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `127.0.0.1:<port>` of an `http(s)://` URL.
    ///
    /// # Panics
    ///
    /// When the URL is not `http(s)://<socket address>`.
    pub fn addr(&self) -> SocketAddr {
        self.url
            .strip_prefix("http://")
            .or_else(|| self.url.strip_prefix("https://"))
            .and_then(|rest| rest.trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| panic!("{} is not http(s)://<socket address>", self.url))
    }

    /// The worker secret a Rust worker prints (`secret <hex>`) before its
    /// address.
    ///
    /// # Panics
    ///
    /// When it printed none.
    pub fn secret(&self) -> &str {
        self.preamble
            .iter()
            .find_map(|line| line.strip_prefix("secret "))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no `secret <hex>` line before {}", self.url))
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal`.
    ///
    /// # Panics
    ///
    /// When `kill(1)` fails (the process is gone).
    pub fn signal(&self, signal: Signal) {
        let status = Command::new("kill")
            .arg(format!("-{}", signal.name()))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{} {}", signal.name(), self.pid());
    }

    /// SIGTERM: a graceful shutdown.
    pub fn terminate(&self) {
        self.signal(Signal::Term);
    }

    /// SIGSTOP: the process freezes.
    pub fn pause(&self) {
        self.signal(Signal::Stop);
    }

    /// SIGCONT: a frozen process runs again.
    pub fn resume(&self) {
        self.signal(Signal::Cont);
    }

    /// SIGKILL now, and reap (a crash). Idempotent.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (on tokio's clock) for the process to exit, at most
    /// `patience`; its status, or `None` if it still runs.
    ///
    /// # Panics
    ///
    /// When the process cannot be polled.
    pub async fn wait_exit(&mut self, patience: Duration) -> Option<ExitStatus> {
        let child = &mut self.child;
        crate::poll::poll(patience, || {
            std::future::ready(child.try_wait().expect("poll the child"))
        })
        .await
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Resume a frozen process first (quietly: it may be gone already),
        // so nothing is left stopped should the kill below fail.
        let _ = Command::new("kill")
            .args(["-CONT", &self.pid().to_string()])
            .stderr(Stdio::null())
            .status();
        self.kill();
    }
}

/// A log file of its own for each process a test starts:
/// `<tmp>/pinned-tests/<name>-<pid>-<n>.log`.
fn log_path(name: &str) -> PathBuf {
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join("pinned-tests");
    std::fs::create_dir_all(&dir).expect("log dir");
    dir.join(format!("{name}-{}-{n}.log", std::process::id()))
}

/// `path` opened for appending: the child's stderr and the copy of its
/// stdout both write to the log, each at its end.
fn append(path: &PathBuf) -> File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("log file {}: {e}", path.display()))
}

/// Copies `stdout`'s lines to `log` on a thread, and sends each one until
/// the receiver is dropped; the channel closes when the child's stdout
/// does. Draining keeps a chatty child from blocking on a full pipe.
fn copy_lines(
    stdout: impl std::io::Read + Send + 'static,
    mut log: File,
) -> mpsc::Receiver<String> {
    let (lines, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(log, "{line}");
            let _ = lines.send(line);
        }
    });
    seen
}

/// A token no other test uses, for Redis key prefixes, namespaces and
/// database names: this process's id, the time, and a counter.
pub fn unique() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() % 1_000_000_000);
    format!("{}-{micros}-{n}", std::process::id())
}

/// `http://127.0.0.1:<port>` where nothing listens, for a test that needs
/// an unreachable URL: a listener bound on port 0 and dropped at once.
/// Nothing is handed this port, so only a stray bind of port 0 could take
/// it in between (the kernel hands ports out in turn, so hardly ever).
///
/// # Panics
///
/// When no port can be bound.
pub fn unreachable_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port");
    format!("http://127.0.0.1:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    #[tokio::test]
    async fn reads_the_address_keeps_the_preamble_logs_and_stops() {
        let mut proc = Proc::spawn(
            sh(
                "echo secret 00ff; echo 'x listening on http://127.0.0.1:9'; \
                echo after; echo oops >&2; exec sleep 30",
            ),
            "sh",
            listening_line,
        );
        assert_eq!(proc.url, "http://127.0.0.1:9");
        assert_eq!(proc.addr().port(), 9);
        assert_eq!(proc.secret(), "00ff");
        crate::until("both streams in the log", Duration::from_secs(5), || {
            let log = proc.log_text();
            log.contains("after") && log.contains("oops")
        })
        .await;
        proc.pause();
        proc.resume();
        proc.terminate();
        let status = proc.wait_exit(Duration::from_secs(5)).await;
        assert!(status.is_some_and(|s| !s.success()), "{status:?}");
    }

    #[test]
    fn a_child_that_exits_first_is_an_error_with_its_log() {
        let exited = Proc::try_spawn(sh("echo no address >&2; exit 3"), "sh", listening_line)
            .expect_err("it never listened");
        assert_eq!(exited.status.and_then(|s| s.code()), Some(3));
        assert!(exited.log.contains("no address"), "{exited}");
    }

    #[tokio::test]
    async fn private_redis_servers_get_ports_of_their_own_and_restart_empty() {
        let (mut one, two) = (RedisServer::start(), RedisServer::start());
        assert_ne!(one.url, two.url);
        one.command(&["SET", "k", "v"]).await;
        assert_eq!(one.dbsize().await, 1);
        assert_eq!(two.dbsize().await, 0);
        let url = one.url.clone();
        one.restart();
        assert_eq!(one.url, url);
        assert_eq!(one.dbsize().await, 0);
    }
}
