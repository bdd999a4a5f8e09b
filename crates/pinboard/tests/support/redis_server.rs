//! A private `redis-server` on a free loopback port, for suites that wipe
//! the whole store (`FLUSHALL`), pause it, or count the commands pinboard
//! sends (`INFO commandstats`) without touching, or being disturbed by, the
//! shared Redis on 6379. Killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::free_port;

/// A running private Redis.
pub struct RedisServer {
    child: Child,
    /// `redis://127.0.0.1:<port>/0`.
    pub url: String,
}

impl RedisServer {
    /// Start one (no persistence) and wait until it answers `PING`.
    pub fn start() -> Self {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--port")
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (is Redis installed?)");
        let server = Self {
            child,
            url: format!("redis://127.0.0.1:{port}/0"),
        };
        let client = redis::Client::open(server.url.as_str()).expect("redis url");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let pong = client
                .get_connection()
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if pong.is_ok() {
                return server;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "private redis-server on {port} never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A connection for the test's own commands.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis connect")
    }

    /// `FLUSHALL`: the store loses everything.
    pub async fn flushall(&self) {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut self.conn().await)
            .await
            .expect("flushall");
    }

    /// Keys matching `pattern`.
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut self.conn().await)
            .await
            .expect("keys")
    }

    /// How many times `command` (lowercase, e.g. `evalsha`) ran so far,
    /// from `INFO commandstats`.
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

    /// SIGSTOP: Redis freezes (connections stay open, nothing answers).
    pub fn pause(&self) {
        super::signal(self.child.id(), "STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        super::signal(self.child.id(), "CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
