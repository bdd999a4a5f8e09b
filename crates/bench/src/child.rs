//! Server processes for benchmarks: the bench binary re-executes itself
//! with a `serve …` subcommand, reads the bound address from the child's
//! first stdout line, and kills the child when the handle drops.

use std::net::SocketAddr;
use std::process::Stdio;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running server process.
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    child: Child,
}

impl Server {
    /// Starts `program args…`, which must print `… http://<addr>` as a line.
    ///
    /// # Errors
    ///
    /// The process cannot start or never prints an address.
    pub async fn start(program: &str, args: &[&str]) -> anyhow::Result<Self> {
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {program}"))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next_line().await? {
            if let Some(addr) = line
                .rsplit("http://")
                .next()
                .filter(|_| line.contains("http://"))
            {
                let addr: SocketAddr = addr.trim().parse().context("address")?;
                // Keep draining stdout so the child never blocks on a full pipe.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                return Ok(Self { addr, child });
            }
        }
        anyhow::bail!("{program} exited without printing its address")
    }

    /// The child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}
