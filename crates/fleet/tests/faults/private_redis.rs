//! A private `redis-server` on its own loopback port, which the suite may
//! wipe (`FLUSHALL`), restart empty, or pause (`CLIENT PAUSE`) without
//! touching the shared Redis on 6379 that other suites use at the same
//! time. Killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::support::free_port;

/// A running private Redis.
pub(crate) struct PrivateRedis {
    child: Child,
    port: u16,
    /// `redis://127.0.0.1:<port>/0`.
    pub(crate) url: String,
}

impl PrivateRedis {
    /// Starts one (no persistence) and waits until it answers `PING`.
    pub(crate) async fn start() -> Self {
        let port = free_port();
        let mut redis = Self {
            child: spawn(port),
            port,
            url: format!("redis://127.0.0.1:{port}/0"),
        };
        redis.wait_ready().await;
        redis
    }

    async fn wait_ready(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if self.try_conn().await.is_some() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "private redis-server on {} never answered",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn try_conn(&self) -> Option<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.url.as_str()).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let pong: String = redis::cmd("PING").query_async(&mut conn).await.ok()?;
        (pong == "PONG").then_some(conn)
    }

    async fn command(&self, args: &[&str]) {
        let mut conn = self.try_conn().await.expect("private redis answers");
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let _: redis::Value = cmd.query_async(&mut conn).await.expect("redis command");
    }

    /// `FLUSHALL`: the store loses everything at once.
    pub(crate) async fn flushall(&self) {
        self.command(&["FLUSHALL"]).await;
    }

    /// `CLIENT PAUSE <ms> ALL`: every client's commands wait, connections
    /// stay open.
    pub(crate) async fn pause(&self, how_long: Duration) {
        self.command(&["CLIENT", "PAUSE", &how_long.as_millis().to_string(), "ALL"])
            .await;
    }

    /// SIGKILL, then a new empty server on the same port: every connection
    /// breaks and the data is gone (no persistence), as in a crash.
    pub(crate) async fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(self.port);
        self.wait_ready().await;
    }

    /// Number of keys held (`DBSIZE`).
    pub(crate) async fn keys(&self) -> u64 {
        let mut conn = self.try_conn().await.expect("private redis answers");
        redis::cmd("DBSIZE")
            .query_async(&mut conn)
            .await
            .expect("dbsize")
    }
}

fn spawn(port: u16) -> Child {
    Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--port")
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server (is Redis installed?)")
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
