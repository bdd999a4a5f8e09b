//! The connection the Redis stores send through: one server's reconnecting
//! `ConnectionManager`, or a Redis Cluster's slot-routing connection.
//!
//! Owns the choice between the two and, for a cluster, when to read its
//! topology again: every command, pipeline and script call is handed to
//! the connection underneath unchanged. It never routes a key itself (the
//! cluster client does, from each command's keys) and never retries.
//!
//! # Following a failover
//!
//! The cluster client learns a new slot map only from a `MOVED` answer;
//! a master that died answers nothing, so the client would keep dialling
//! it after its replica took over. A call that fails on a connection or
//! times out therefore makes [`ClusterLink`] connect again from the seed
//! URLs (which reads `CLUSTER SLOTS` afresh) in the background, at most
//! once per [`REFRESH_INTERVAL`], and swap the new connection in; calls
//! in flight finish on the old one.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::time::Instant;

/// Fewest time between two topology refreshes of one [`ClusterLink`].
pub(crate) const REFRESH_INTERVAL: Duration = Duration::from_millis(500);

/// A cluster connection that reconnects from its seeds after failures
/// (see the module doc).
pub(crate) struct ClusterLink {
    client: ClusterClient,
    current: RwLock<ClusterConnection>,
    /// When the last refresh started; `None` while one runs.
    last_refresh: Mutex<Option<Instant>>,
    /// Deadline of one reconnect.
    deadline: Duration,
}

impl ClusterLink {
    /// A link over `conn`, made by `client`.
    pub(crate) fn new(client: ClusterClient, conn: ClusterConnection, deadline: Duration) -> Self {
        Self {
            client,
            current: RwLock::new(conn),
            last_refresh: Mutex::new(Some(Instant::now())),
            deadline,
        }
    }

    fn conn(&self) -> ClusterConnection {
        self.current.read().clone()
    }

    /// A call failed with `error`: refresh when it says the node is gone
    /// or silent, and no refresh ran within [`REFRESH_INTERVAL`].
    fn failed(self: &Arc<Self>, error: &RedisError) {
        let node_trouble = error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_unrecoverable_error();
        if !node_trouble {
            return;
        }
        {
            let mut last = self.last_refresh.lock();
            match *last {
                Some(at) if at.elapsed() >= REFRESH_INTERVAL => *last = None,
                _ => return,
            }
        }
        let link = self.clone();
        tokio::spawn(async move {
            let fresh =
                tokio::time::timeout(link.deadline, link.client.get_async_connection()).await;
            match fresh {
                Ok(Ok(conn)) => {
                    *link.current.write() = conn;
                    tracing::info!(target: "pinboard::placement", "Redis Cluster topology read again after a failed call");
                }
                Ok(Err(error)) => {
                    tracing::warn!(target: "pinboard::placement", %error, "Redis Cluster reconnect failed");
                }
                Err(_) => {
                    tracing::warn!(target: "pinboard::placement", "Redis Cluster reconnect timed out");
                }
            }
            *link.last_refresh.lock() = Some(Instant::now());
        });
    }
}

/// A connection to one Redis or to a Redis Cluster; cheap to clone (both
/// multiplex one socket per server).
#[derive(Clone)]
pub(crate) enum RedisConn {
    /// One Redis (`--redis-url`).
    Single(ConnectionManager),
    /// A Redis Cluster (`--redis-cluster-url`): each command goes to the
    /// master of its keys' slot.
    Cluster(Arc<ClusterLink>),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(link) => Box::pin(async move {
                let answer = link.conn().req_packed_command(cmd).await;
                if let Err(error) = &answer {
                    link.failed(error);
                }
                answer
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(link) => Box::pin(async move {
                let answer = link.conn().req_packed_commands(cmd, offset, count).await;
                if let Err(error) = &answer {
                    link.failed(error);
                }
                answer
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(_) => 0,
        }
    }
}
