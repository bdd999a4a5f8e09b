//! Server processes for benchmarks: the bench binary re-executes itself
//! with a `serve …` subcommand (or runs another program: nginx, uvicorn),
//! learns where it listens, and kills the child when the handle drops.
//!
//! A child is ready either when it prints `… http://<addr>` as a line on
//! stdout (lines before it are kept as its *preamble*, e.g. `secret <hex>`),
//! or, for programs that cannot print their address, when a given address
//! accepts connections ([`Spawn::listening_on`]).

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How long a child may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A free loopback port (bound, read and released; a tiny race is accepted).
///
/// # Errors
///
/// When no port can be bound.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// How to start a server process.
#[derive(Debug)]
#[must_use]
pub struct Spawn {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    env_remove: Vec<OsString>,
    log: Option<PathBuf>,
    listening_on: Option<SocketAddr>,
    own_group: bool,
}

impl Spawn {
    /// Starts `program` (no arguments yet).
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Self {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            env_remove: Vec::new(),
            log: None,
            listening_on: None,
            own_group: false,
        }
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Appends one argument.
    pub fn arg_os(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Unsets an environment variable the child would inherit.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.env_remove.push(key.as_ref().to_owned());
        self
    }

    /// Appends the child's stderr to this file (default: discarded).
    pub fn log(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// Ready once `addr` accepts a connection, instead of when the child
    /// prints its address.
    pub fn listening_on(mut self, addr: SocketAddr) -> Self {
        self.listening_on = Some(addr);
        self
    }

    /// Runs the child in its own process group, killed as a group (for
    /// programs that fork workers, like nginx).
    pub fn own_group(mut self) -> Self {
        self.own_group = true;
        self
    }

    /// Starts the child and waits until it is ready.
    ///
    /// # Errors
    ///
    /// The process cannot start, exits, or is not ready in time.
    pub async fn start(self) -> anyhow::Result<Server> {
        let name = self.program.to_string_lossy().into_owned();
        let mut command = Command::new(&self.program);
        for key in &self.env_remove {
            command.env_remove(key);
        }
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(if self.listening_on.is_some() {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .kill_on_drop(true);
        command.stderr(match &self.log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("open log {}", path.display()))?,
            ),
            None => Stdio::null(),
        });
        if self.own_group {
            command.process_group(0);
        }
        let mut child = command.spawn().with_context(|| format!("spawn {name}"))?;
        let group = self.own_group;
        match self.listening_on {
            Some(addr) => {
                let deadline = Instant::now() + READY_TIMEOUT;
                loop {
                    if TcpStream::connect(addr).await.is_ok() {
                        return Ok(Server::new(addr, child, Vec::new(), group));
                    }
                    if let Some(status) = child.try_wait()? {
                        anyhow::bail!("{name} exited ({status}) before listening on {addr}");
                    }
                    anyhow::ensure!(
                        Instant::now() < deadline,
                        "{name} not listening on {addr} after {READY_TIMEOUT:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            None => {
                let stdout = child.stdout.take().context("child stdout")?;
                let mut lines = BufReader::new(stdout).lines();
                let mut preamble = Vec::new();
                let read = async {
                    while let Some(line) = lines.next_line().await? {
                        if let Some((_, after)) = line.rsplit_once("http://") {
                            let addr: SocketAddr = after
                                .split_whitespace()
                                .next()
                                .unwrap_or_default()
                                .parse()
                                .with_context(|| format!("address in {line:?}"))?;
                            return Ok(Some(addr));
                        }
                        preamble.push(line);
                    }
                    Ok::<_, anyhow::Error>(None)
                };
                let addr = tokio::time::timeout(READY_TIMEOUT, read)
                    .await
                    .with_context(|| format!("{name} printed no address in {READY_TIMEOUT:?}"))??
                    .with_context(|| format!("{name} exited without printing its address"))?;
                // Keep draining stdout so the child never blocks on a full pipe.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                Ok(Server::new(addr, child, preamble, group))
            }
        }
    }
}

/// A running server process.
#[derive(Debug)]
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    child: Child,
    preamble: Vec<String>,
    group: Option<u32>,
}

impl Server {
    fn new(addr: SocketAddr, child: Child, preamble: Vec<String>, group: bool) -> Self {
        let group = if group { child.id() } else { None };
        Self {
            addr,
            child,
            preamble,
            group,
        }
    }

    /// Starts `program args…`, which must print `… http://<addr>` as a line.
    ///
    /// # Errors
    ///
    /// The process cannot start or never prints an address.
    pub async fn start(program: &str, args: &[&str]) -> anyhow::Result<Self> {
        Spawn::new(program).args(args).start().await
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The value of the preamble line `<key> <value>` printed before the
    /// address, if any.
    pub fn printed(&self, key: &str) -> Option<&str> {
        self.preamble.iter().find_map(|line| {
            line.strip_prefix(key)
                .and_then(|rest| rest.strip_prefix(' '))
                .map(str::trim)
        })
    }

    /// The process's resident memory, bytes, from `/proc` (Linux; `None`
    /// elsewhere).
    pub fn rss_bytes(&self) -> Option<u64> {
        let pid = self.child.id()?;
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }

    /// CPU time (user + system) the process has used so far, with its
    /// process group's for [`Spawn::own_group`] (nginx's worker), from
    /// `/proc` (Linux; `None` elsewhere).
    pub fn cpu_time(&self) -> Option<Duration> {
        let pid = self.child.id()?;
        let ticks = match self.group {
            None => proc_stat(&pid.to_string()).map(|(_, ticks)| ticks)?,
            Some(group) => std::fs::read_dir("/proc")
                .ok()?
                .filter_map(Result::ok)
                .filter_map(|entry| proc_stat(&entry.file_name().to_string_lossy()))
                .filter(|(pgrp, _)| *pgrp == group)
                .map(|(_, ticks)| ticks)
                .sum(),
        };
        Some(Duration::from_millis(ticks * 1000 / CLOCK_TICKS))
    }

    /// SIGTERM, then waits up to `patience` for the process to exit (a
    /// profiler under it writes its output on a clean exit only); SIGKILL
    /// after that.
    ///
    /// # Errors
    ///
    /// When the process cannot be signalled or waited for.
    pub async fn terminate(&mut self, patience: Duration) -> anyhow::Result<()> {
        let pid = self.child.id().context("the process already exited")?;
        let status = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await?;
        anyhow::ensure!(status.success(), "kill -TERM {pid} failed");
        if tokio::time::timeout(patience, self.child.wait())
            .await
            .is_err()
        {
            self.kill().await?;
            anyhow::bail!("process {pid} did not exit within {patience:?} of SIGTERM");
        }
        Ok(())
    }

    /// SIGKILL (the whole group for [`Spawn::own_group`]) and reap.
    ///
    /// # Errors
    ///
    /// When the process cannot be signalled or waited for.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(group) = self.group.take() {
            kill_group(group);
        }
        self.child.start_kill().ok();
        self.child.wait().await?;
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // `kill_on_drop` covers the child itself; a group leader's children
        // (nginx's worker) need the group signalled.
        if let Some(group) = self.group {
            kill_group(group);
        }
    }
}

/// `USER_HZ`: the unit of `/proc/<pid>/stat` times (100 on Linux builds
/// for every mainstream architecture).
const CLOCK_TICKS: u64 = 100;

/// `(pgrp, utime + stime)` of `/proc/<pid>/stat`.
/// The CPU time (user and system) this process has used, at the kernel's
/// clock-tick resolution (10 ms).
pub fn own_cpu_time() -> Option<Duration> {
    proc_stat("self").map(|(_, ticks)| Duration::from_millis(ticks * 1000 / CLOCK_TICKS))
}

/// The CPU time (user and system) used so far by every process whose command
/// name is `comm` (`postgres`: the server and all its backends, other
/// clients' included), from `/proc` (Linux; zero elsewhere).
pub fn cpu_time_of(comm: &str) -> Duration {
    let ticks: u64 = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| {
            std::fs::read_to_string(entry.path().join("comm"))
                .is_ok_and(|name| name.trim_end() == comm)
        })
        .filter_map(|entry| proc_stat(&entry.file_name().to_string_lossy()))
        .map(|(_, ticks)| ticks)
        .sum();
    Duration::from_millis(ticks * 1000 / CLOCK_TICKS)
}

fn proc_stat(pid: &str) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start at field 3.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let pgrp = fields.get(2)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((pgrp, utime + stime))
}

fn kill_group(group: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
}
