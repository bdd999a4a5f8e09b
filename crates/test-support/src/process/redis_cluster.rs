//! A private Redis Cluster: masters (each with its replicas) on loopback,
//! in a temporary directory, for suites that flush one master, kill one,
//! or count what the cluster's servers spent.
//!
//! Each node is a `redis-server --cluster-enabled yes` on a port the kernel
//! just handed out and released, whose cluster bus (port + 10 000) was
//! free a moment before too; `redis-cli --cluster create` joins them. A
//! node that fails to start (its port was taken in between) restarts the
//! whole cluster on fresh ports. Every wait has a deadline.
//!
//! Timing: `--cluster-node-timeout` is [`NODE_TIMEOUT_MS`] (5 s): a master
//! is failed over after that long without answering its peers. Redis's
//! default (15 s) makes a fault test slow; much less than 5 s let a
//! `cargo build` beside the suite on a 2-core machine delay a ping past
//! it and fail over a healthy master. `--cluster-require-full-coverage no`:
//! the other masters keep serving while one is down (as pinboard's README
//! recommends).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::Proc;
use crate::poll::poll;

/// `--cluster-node-timeout` of every node (ms).
pub const NODE_TIMEOUT_MS: u64 = 5_000;

/// Whole-cluster starts tried before giving up.
const ATTEMPTS: usize = 5;

/// How long the cluster may take to agree (slots covered, replicas in sync).
const FORM_PATIENCE: Duration = Duration::from_secs(60);

/// One node of the cluster.
#[derive(Debug)]
struct Node {
    proc: Option<Proc>,
    port: u16,
}

/// A running private Redis Cluster (no persistence), every node killed on
/// drop, its directory removed.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
    /// Every node's URL, comma-separated (`--redis-cluster-url`).
    pub url: String,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each and waits
    /// until every slot is served and every replica is in sync.
    ///
    /// # Panics
    ///
    /// When `redis-server` or `redis-cli` is missing, or the cluster does
    /// not form within its deadline five times.
    pub async fn start(masters: usize, replicas: usize) -> Self {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            match Self::try_start(masters, replicas).await {
                Ok(cluster) => return cluster,
                Err(why) => last = why,
            }
        }
        panic!("the Redis Cluster failed to form {ATTEMPTS} times; the last: {last}");
    }

    async fn try_start(masters: usize, replicas: usize) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let count = masters * (1 + replicas);
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            let port = cluster_port();
            let proc = spawn(port, dir.path().to_path_buf()).map_err(|e| e.to_string())?;
            nodes.push(Node {
                proc: Some(proc),
                port,
            });
        }
        let url = nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",");
        let cluster = Self {
            nodes,
            _dir: dir,
            url,
        };
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        create
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes");
        let out = tokio::task::spawn_blocking(move || create.output())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("redis-cli: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        cluster
            .settled(FORM_PATIENCE, masters)
            .await
            .then_some(())
            .ok_or_else(|| "the cluster did not settle".to_owned())?;
        Ok(cluster)
    }

    /// Waits until every live node says the cluster is ok, `masters`
    /// masters serve slots, and every live replica's link to its master is
    /// up (a `WAIT` can then be answered); `false` past `patience`.
    pub async fn settled(&self, patience: Duration, masters: usize) -> bool {
        poll(patience, || async {
            for port in self.live_ports() {
                let state = cluster_info(port).await?;
                if !state.contains("cluster_state:ok") {
                    return None;
                }
                let replication = info(port, "replication").await?;
                if info_field(&replication, "role")? == "slave"
                    && info_field(&replication, "master_link_status")? != "up"
                {
                    return None;
                }
            }
            (self.masters().await.len() == masters).then_some(())
        })
        .await
        .is_some()
    }

    /// Ports of the nodes not killed.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.proc.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// Ports of the live nodes that are masters serving slots now.
    pub async fn masters(&self) -> Vec<u16> {
        let mut out = Vec::new();
        for port in self.live_ports() {
            let Some(info) = info(port, "replication").await else {
                continue;
            };
            if info_field(&info, "role").as_deref() == Some("master")
                && slots_of(port).await.is_some_and(|n| n > 0)
            {
                out.push(port);
            }
        }
        out.sort_unstable();
        out
    }

    /// The port of the master serving `key`'s slot, as the first live node
    /// that answers sees it.
    pub async fn master_of(&self, key: &str) -> Option<u16> {
        for port in self.live_ports() {
            let Ok(mut c) = conn(port).await else {
                continue;
            };
            let Ok(slot) = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query_async::<i64>(&mut c)
                .await
            else {
                continue;
            };
            let Ok(slots) = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<redis::Value>(&mut c)
                .await
            else {
                continue;
            };
            return master_in_slots(&slots, slot);
        }
        None
    }

    /// `FLUSHALL` on the node at `port` (a master: its replicas follow).
    ///
    /// # Panics
    ///
    /// When the node does not answer.
    pub async fn flushall(&self, port: u16) {
        let mut c = conn(port).await.expect("connect");
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut c)
            .await
            .expect("flushall");
    }

    /// SIGKILL the node at `port` (a crash; its replica is promoted after
    /// [`NODE_TIMEOUT_MS`]).
    ///
    /// # Panics
    ///
    /// When no node has that port.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of the cluster");
        if let Some(mut proc) = node.proc.take() {
            proc.kill();
        }
    }

    /// CPU seconds (user + system) every live node spent so far (`INFO cpu`).
    pub async fn cpu_seconds(&self) -> f64 {
        let mut total = 0.0;
        for port in self.live_ports() {
            total += cpu_seconds(port).await.unwrap_or(0.0);
        }
        total
    }

    /// Keys held by the node at `port` (`DBSIZE`).
    pub async fn dbsize(&self, port: u16) -> Option<u64> {
        redis::cmd("DBSIZE")
            .query_async(&mut conn(port).await.ok()?)
            .await
            .ok()
    }
}

/// CPU seconds (user + system, main thread and children) the Redis at
/// `port` spent (`INFO cpu`).
pub async fn cpu_seconds(port: u16) -> Option<f64> {
    let info = info(port, "cpu").await?;
    let user: f64 = info_field(&info, "used_cpu_user")?.parse().ok()?;
    let sys: f64 = info_field(&info, "used_cpu_sys")?.parse().ok()?;
    Some(user + sys)
}

async fn conn(port: u16) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| redis::RedisError::from((redis::ErrorKind::IoError, "connect timed out")))?
}

async fn info(port: u16, section: &str) -> Option<String> {
    let mut c = conn(port).await.ok()?;
    tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("INFO").arg(section).query_async(&mut c),
    )
    .await
    .ok()?
    .ok()
}

/// `CLUSTER INFO` of the node at `port`.
async fn cluster_info(port: u16) -> Option<String> {
    let mut c = conn(port).await.ok()?;
    tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("CLUSTER").arg("INFO").query_async(&mut c),
    )
    .await
    .ok()?
    .ok()
}

fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    })
}

/// Slots the node at `port` serves as a master (`CLUSTER MYSHARDID` is
/// 7.2+; `CLUSTER NODES`' `myself` line lists them).
async fn slots_of(port: u16) -> Option<usize> {
    let mut c = conn(port).await.ok()?;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut c)
        .await
        .ok()?;
    let me = nodes.lines().find(|l| l.contains("myself"))?;
    Some(me.split_whitespace().skip(8).count())
}

/// The master port of `slot` in a `CLUSTER SLOTS` answer.
fn master_in_slots(slots: &redis::Value, slot: i64) -> Option<u16> {
    let redis::Value::Array(ranges) = slots else {
        return None;
    };
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            continue;
        };
        let (Some(redis::Value::Int(lo)), Some(redis::Value::Int(hi))) =
            (parts.first(), parts.get(1))
        else {
            continue;
        };
        if (*lo..=*hi).contains(&slot) {
            if let Some(redis::Value::Array(master)) = parts.get(2) {
                if let Some(redis::Value::Int(port)) = master.get(1) {
                    return u16::try_from(*port).ok();
                }
            }
        }
    }
    None
}

/// A port the kernel handed out and took back, whose cluster bus port
/// (+10 000) was free too.
fn cluster_port() -> u16 {
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local addr").port();
        let Some(bus) = port.checked_add(10_000) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return port;
        }
    }
}

/// A cluster-enabled `redis-server` on `port`, its node file in `dir`.
fn spawn(port: u16, dir: PathBuf) -> Result<Proc, super::Exited> {
    let mut command = Command::new("redis-server");
    command
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--cluster-enabled", "yes"])
        .arg("--cluster-config-file")
        .arg(format!("nodes-{port}.conf"))
        .arg("--cluster-node-timeout")
        .arg(NODE_TIMEOUT_MS.to_string())
        .args(["--cluster-require-full-coverage", "no"])
        // A replica syncs at once, not after the 5 s default delay.
        .args(["--repl-diskless-sync-delay", "0"])
        .arg("--dir")
        .arg(dir)
        .arg("--port")
        .arg(port.to_string());
    let url = format!("redis://127.0.0.1:{port}");
    Proc::try_spawn(command, "redis-cluster-node", |line| {
        line.contains("Ready to accept connections")
            .then(|| url.clone())
    })
}
