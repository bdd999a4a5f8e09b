//! The Redis Cluster placement store: any number of pinboard nodes share
//! one Redis Cluster and behave as one, with the guarantees of one Redis.
//!
//! Owns the split of the keyspace into hash tags and what crosses them
//! (a worker's liveness in every shard, the shards' generations, the
//! `WAIT` after each write a caller acts on); never holds placement state
//! of its own beyond each shard's standing (`standing`). Every placement
//! operation is one of [`RedisStore`]'s, run unchanged on one hash tag, so
//! the scripts, the batching and the deadlines are those of one Redis.
//!
//! # Layout (inferred)
//!
//! A cluster refuses a script whose keys hash to different slots
//! (`CROSSSLOT`), and a claim reads the generation, the candidate's
//! liveness and the owner's, the row and the owner indexes in one script.
//! So the keyspace is cut into [`SHARDS`] *virtual shards*, each a hash tag
//! (`P{s17}`, `P` the `--redis-prefix`) under which the shard holds what one
//! Redis holds for the whole store: its own generation, dropped mark,
//! rows, owner indexes, unsettled and orphan sets, and a *liveness key* per
//! live session (`P{s17}w:<session>`: the string `1` with the lease's TTL,
//! and the session in `P{s17}workers`). An id lives in shard
//! `fnv1a64("<ns>/<id>") % 64`, for ever (the hash is part of the layout).
//! Everything about workers that no claim reads lives under one more tag,
//! `P{g}`: the worker records, control messages, supersession reasons,
//! hostnames, the deployment version, the sweeper lease and the store-wide
//! generation. The cluster spreads the 65 tags over its masters by slot.
//!
//! A registration writes the record under `P{g}`, then a liveness key in
//! every shard; a heartbeat renews the record, then every liveness key
//! (`PEXPIRE`, 64 commands the client sends as they go, each to its
//! master). A heartbeat that finds a liveness key gone while the record
//! lives (the shard lost its data) removes the record and is answered as
//! a lapsed one: the worker re-registers and reclaims its ids, exactly as
//! after the loss of one Redis; its liveness keys in the intact shards
//! stay (until their TTL), so the ids there keep their owner until the
//! reclaim takes them over at their epochs. Removing a session
//! (deregistration, supersession) deletes its liveness key in every shard.
//!
//! # Store loss, per shard
//!
//! Each shard's generation is checked by every claim in it (the script of
//! one Redis) and by the periodic generation check (`generation`: the
//! store-wide one plus all 64, pipelined per master). A shard found
//! without its generation, or with another, is *lost*: a new generation
//! is written (or the one another node wrote adopted) and the shard alone
//! is quarantined for the loss window (`--quarantine-ms`, at least one
//! lease TTL), answering [`ClaimOutcome::ShardLost`]: no new id is placed
//! in it while every live worker re-registers (its next heartbeat finds
//! its liveness key there gone), ids of live owners resolve as before, and
//! the other shards place as usual. The node re-reads its epoch floor
//! before the next claim in the lost shard, so epochs keep rising per id.
//! A flushed master loses the shards whose slots it serves; the store-wide
//! `P{g}` generation going is a loss of the whole store as on one Redis.
//!
//! # Opening
//!
//! A node opening the store reads the `P{g}` generation first. Found, it
//! joins: every shard holds a generation (a shard without one lost its data
//! while no node watched, and is quarantined as above). Not found, the
//! store is new: the node writes its proposal into every shard that has
//! none, *then* into `P{g}`, and adopts whatever each shard holds with the
//! cold-start quarantine. So `P{g}` holding a generation means every shard
//! does, and nodes starting together (each with its own proposal, shards
//! going to whichever reaches them first) never take a shard the other is
//! still writing for a lost one.
//!
//! # Failover: a claim waits for a replica
//!
//! Replication is asynchronous: a promoted replica can lack the last
//! writes its master acknowledged. With `wait_replicas` > 0 (default 1)
//! every write a caller acts on (a claim that placed or moved an id, a
//! reclaim, a registration, a heartbeat, a sweeper lease taken or renewed)
//! is followed by `WAIT <wait_replicas> <timeout>` on the master that took
//! it, and answered only once that many replicas hold it; fewer within the
//! timeout answer [`StoreError::NotReplicated`] (the proxy answers 503 and
//! nobody acts on the write). So a failover that promotes the replica
//! keeps every claim, reclaim and lease renewal a worker or a client was
//! told of: no id gets two live owners. The price is one replication round
//! trip per write and, while a master has no live replica, no new
//! placement in its shards (the write is made, never acknowledged); see
//! the README for the figures. A write that was made but not acknowledged
//! can still be read by another node within that round trip: the window
//! is one replication round trip wide, and a failover must fall inside it.
//!
//! # Bounds
//!
//! The number of shards is fixed ([`SHARDS`]); each per-shard call is one
//! of [`RedisStore`]'s, bounded as there. A listing reads every shard:
//! `list_placements` and `wake_candidates` merge 64 answers (the latter
//! cut to `limit`), `expire_placements` hands each shard `budget`.

mod standing;

use std::sync::Arc;

use futures_util::future::try_join_all;
use parking_lot::Mutex;
use pinned_store::InstanceKey;
use redis::cluster::ClusterClientBuilder;
use redis::{FromRedisValue, Script};

use self::standing::ShardStanding;
use super::connection::{ClusterLink, RedisConn};
use super::forward::forward_calls;
use super::{
    Admission, BatchStats, Batching, ClaimOutcome, Generation, PlacementEntry, PlacementStore,
    ReclaimOutcome, RedisStore, StoreError, WorkerRecord,
};
use crate::clock::{Clock, Entropy, Now, SeededEntropy, SystemClock};

/// Virtual shards: hash tags `{s0}` … `{s63}`. Fixed: an id's shard is
/// part of the key layout.
pub const SHARDS: usize = 64;

// KEYS: the shard's liveness key for the session, the shard's workers
// set. ARGV: ttl ms, session id.
const PUT_LIVE: &str = r#"
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"#;

/// How a [`ClusterStore`] works (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct ClusterSettings {
    /// Claim batching and the deadline of every call, per shard.
    pub batching: Batching,
    /// Replicas every acted-on write waits for (`WAIT`); 0 waits for none
    /// (a cluster without replicas, or one whose failover is not trusted).
    pub wait_replicas: u32,
    /// Quarantine of a cold start on an empty cluster (ms).
    pub quarantine_ms: u64,
    /// Quarantine of a shard after it lost its data (ms): at least one
    /// lease TTL (see `routes::generation`).
    pub loss_quarantine_ms: u64,
    /// Grace of a vacated row (ms).
    pub row_grace_ms: u64,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            batching: Batching::default(),
            wait_replicas: 1,
            quarantine_ms: 0,
            loss_quarantine_ms: 0,
            row_grace_ms: 60_000,
        }
    }
}

/// Placement store shared through a Redis Cluster.
#[derive(Clone)]
pub struct ClusterStore {
    conn: RedisConn,
    prefix: String,
    /// The `{g}` tag: worker records and everything no claim reads.
    global: RedisStore,
    /// The virtual shards, each one Redis store's keyspace under its tag.
    shards: Arc<Vec<RedisStore>>,
    standing: Arc<Vec<Mutex<ShardStanding>>>,
    put_live: Arc<Script>,
    settings: ClusterSettings,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
}

impl std::fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterStore")
            .field("prefix", &self.prefix)
            .field("wait_replicas", &self.settings.wait_replicas)
            .finish()
    }
}

/// The virtual shard of `(ns, id)`: FNV-1a (64 bit) of `<ns>/<id>`, mod
/// [`SHARDS`]. Stable across versions and platforms (it is the layout).
pub fn shard_of(instance: InstanceKey<'_>) -> usize {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut hash = OFFSET;
    let bytes = instance
        .ns
        .bytes()
        .chain(std::iter::once(b'/'))
        .chain(instance.id.bytes());
    for b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(PRIME);
    }
    (hash % SHARDS as u64) as usize
}

impl ClusterStore {
    /// Connect to the cluster through `urls` (any of its nodes, e.g.
    /// `redis://127.0.0.1:7000`; the client finds the others), keys under
    /// `prefix` (which must not hold `{` or `}`: the tags follow it).
    /// Starts each shard's batcher on the current Tokio runtime.
    ///
    /// # Errors
    ///
    /// When a URL is invalid, the prefix holds a brace, or the cluster does
    /// not answer within the deadline.
    pub async fn connect(
        urls: &[&str],
        prefix: &str,
        settings: ClusterSettings,
    ) -> Result<Self, StoreError> {
        if prefix.contains(['{', '}']) {
            return Err(StoreError::Corrupt(format!(
                "the Redis key prefix {prefix:?} holds a brace: a cluster reads it as a hash tag"
            )));
        }
        let deadline = settings.batching.deadline;
        // The client's own timeout fires before the store's deadline, so
        // a silent master is seen as a failed call (which makes the link
        // read the topology again), not only as a call given up on.
        let client = ClusterClientBuilder::new(urls.to_vec())
            .connection_timeout(deadline / 2)
            .response_timeout(deadline * 3 / 4)
            .retries(2)
            .build()?;
        let conn = tokio::time::timeout(deadline, client.get_async_connection())
            .await
            .map_err(|_| StoreError::Timeout(deadline))??;
        let conn = RedisConn::Cluster(Arc::new(ClusterLink::new(client, conn, deadline)));
        let tag = |t: &str| format!("{prefix}{{{t}}}");
        let store = |t: &str| {
            RedisStore::over(conn.clone(), &tag(t), settings.batching)
                .with_row_grace(settings.row_grace_ms)
        };
        let shards = (0..SHARDS).map(|n| store(&format!("s{n}"))).collect();
        Ok(Self {
            global: store("g"),
            shards: Arc::new(shards),
            standing: Arc::new((0..SHARDS).map(|_| Mutex::default()).collect()),
            put_live: Arc::new(Script::new(PUT_LIVE)),
            conn,
            prefix: prefix.to_owned(),
            settings,
            clock: Arc::new(SystemClock::new()),
            entropy: Arc::new(SeededEntropy::from_os()),
        })
    }

    /// A key of shard `n` (`None`: the `{g}` tag).
    fn key(&self, shard: Option<usize>, kind: &str, rest: &str) -> String {
        match shard {
            Some(n) => format!("{}{{s{n}}}{kind}{rest}", self.prefix),
            None => format!("{}{{g}}{kind}{rest}", self.prefix),
        }
    }

    /// Sends `request` through the cluster connection within the deadline.
    async fn send<T: FromRedisValue + Send>(
        &self,
        request: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let deadline = self.settings.batching.deadline;
        match tokio::time::timeout(deadline, request).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(StoreError::Timeout(deadline)),
        }
    }

    /// `WAIT`'s own timeout: half the deadline, so the call that waits
    /// answers within its deadline (and within the client's response
    /// timeout, three quarters of it) when the replica is slow; a busy
    /// machine's replica took more than a quarter (750 ms) at times.
    fn wait_timeout_ms(&self) -> u64 {
        (self.settings.batching.deadline.as_millis() as u64 / 2).max(1)
    }

    /// Wait until `wait_replicas` replicas of the master holding shard
    /// `shard` (`None`: the `{g}` tag) hold every write this node sent it.
    /// A pipeline of a read of the tag (which routes it) and `WAIT`.
    async fn replicated_in(&self, shard: Option<usize>) -> Result<(), StoreError> {
        let want = self.settings.wait_replicas;
        if want == 0 {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.cmd("PTTL")
            .arg(self.key(shard, "gen", ""))
            .ignore()
            .cmd("WAIT")
            .arg(want)
            .arg(self.wait_timeout_ms());
        let (got,): (i64,) = self.send(pipe.query_async(&mut conn)).await?;
        Self::enough(got, want)
    }

    /// As [`replicated_in`](Self::replicated_in), on every master at once
    /// (`WAIT` goes to all of them; the fewest replicas count).
    async fn replicated_everywhere(&self) -> Result<(), StoreError> {
        let want = self.settings.wait_replicas;
        if want == 0 {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("WAIT")
            .arg(want)
            .arg(self.wait_timeout_ms())
            .clone();
        let got: i64 = self.send(cmd.query_async(&mut conn)).await?;
        Self::enough(got, want)
    }

    fn enough(got: i64, want: u32) -> Result<(), StoreError> {
        if got >= i64::from(want) {
            Ok(())
        } else {
            Err(StoreError::NotReplicated {
                got: got.max(0) as u64,
                want,
            })
        }
    }

    /// Write `session`'s liveness key (lease `ttl_ms`) in every shard.
    async fn put_live(&self, session: &str, ttl_ms: u64) -> Result<(), StoreError> {
        try_join_all((0..SHARDS).map(|n| async move {
            let mut conn = self.conn.clone();
            let mut call = self.put_live.prepare_invoke();
            call.key(self.key(Some(n), "w:", session))
                .key(self.key(Some(n), "workers", ""))
                .arg(ttl_ms.max(1))
                .arg(session);
            self.send::<i64>(call.invoke_async(&mut conn)).await
        }))
        .await?;
        Ok(())
    }

    /// Remove `session`'s liveness key from every shard (its rows there
    /// become vacant, its owner index due to expire).
    async fn remove_live(&self, session: &str) -> Result<(), StoreError> {
        try_join_all(self.shards.iter().map(|s| s.remove_worker(session))).await?;
        Ok(())
    }

    /// Renew `session`'s liveness key in every shard; `false` when any
    /// shard no longer held it.
    async fn renew_live(&self, session: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let renewed = try_join_all((0..SHARDS).map(|n| async move {
            let mut conn = self.conn.clone();
            let cmd = redis::cmd("PEXPIRE")
                .arg(self.key(Some(n), "w:", session))
                .arg(ttl_ms.max(1))
                .clone();
            self.send::<i64>(cmd.query_async(&mut conn)).await
        }))
        .await?;
        Ok(renewed.iter().all(|r| *r == 1))
    }

    /// Shard `n` holds `held` (read by a claim or the periodic check): on
    /// a loss (none, or another than this node's), write a new generation
    /// or adopt the one held, and quarantine the shard for the loss
    /// window. Returns the quarantine left.
    async fn shard_lost(&self, n: usize, held: Option<Generation>) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let known = self.standing[n].lock().generation.clone();
        if held.is_some() && held == known {
            return Ok(self.standing[n].lock().left_ms(now.mono_ms));
        }
        let window = self.settings.loss_quarantine_ms;
        let held = match held {
            Some(g) => g,
            None => {
                let proposal = Generation::new(
                    &self.entropy.token_hex(16),
                    now.wall_ms.saturating_add(window),
                );
                self.shards[n].open_generation(&proposal).await?
            }
        };
        let mut standing = self.standing[n].lock();
        if standing.generation.as_ref() == Some(&held) {
            return Ok(standing.left_ms(now.mono_ms));
        }
        let left_ms = standing.adopt(held.clone(), now.wall_ms, now.mono_ms, window, true);
        drop(standing);
        tracing::warn!(
            target: "pinboard::placement",
            shard = n,
            previous = known.as_ref().map_or("none", |g| g.0.as_str()),
            generation = %held.0,
            quarantine_ms = left_ms,
            "a Redis Cluster shard lost its data: no new placements in it until workers re-registered"
        );
        Ok(left_ms)
    }

    /// The shard store `instance` lives in.
    fn shard(&self, instance: InstanceKey<'_>) -> &RedisStore {
        &self.shards[shard_of(instance)]
    }

    /// Whether shard `n` places new ids now, and the quarantine left.
    fn shard_open(&self, n: usize) -> (Option<Generation>, u64) {
        let now = self.clock.now();
        let standing = self.standing[n].lock();
        (standing.generation.clone(), standing.left_ms(now.mono_ms))
    }

    /// A shard's loss answered once: the node re-reads its floor now.
    fn take_reload(&self, n: usize) -> bool {
        std::mem::take(&mut self.standing[n].lock().reload_due)
    }

    /// What the shards' claim batchers did so far, summed.
    pub fn batch_stats(&self) -> BatchStats {
        self.shards
            .iter()
            .map(RedisStore::batch_stats)
            .fold(BatchStats::default(), |a, b| BatchStats {
                batches: a.batches + b.batches,
                ops: a.ops + b.ops,
                queued: a.queued + b.queued,
            })
    }

    /// Shard `n`'s generation as this node knows it (tests, diagnostics).
    pub fn shard_generation(&self, n: usize) -> Option<Generation> {
        self.standing.get(n)?.lock().generation.clone()
    }

    /// Milliseconds of quarantine shard `n` has left on this node (0:
    /// placing; `u64::MAX`: never opened).
    pub fn shard_quarantine_left_ms(&self, n: usize) -> u64 {
        self.standing
            .get(n)
            .map_or(u64::MAX, |s| s.lock().left_ms(self.clock.now().mono_ms))
    }
}

impl PlacementStore for ClusterStore {
    // What lives under the `{g}` tag alone, and the calls on one id that
    // its shard answers as one Redis would.
    forward_calls!(global:
        deployment_version, set_server_drain, get_worker, list_workers, bind_hostname,
        bound_hostnames, mark_superseded, superseded, push_message, pending_messages,
        release_sweeper_lease,
    );
    forward_calls!(shard(instance): release, tag, settle, placement);

    async fn admit_worker(&self, admission: &Admission<'_>, now: Now) -> Result<bool, StoreError> {
        if !self.global.admit_worker(admission, now).await? {
            return Ok(false);
        }
        for (session, _) in admission.supersede {
            self.remove_live(session).await?;
        }
        self.put_live(&admission.record.session_id, admission.ttl_ms)
            .await?;
        self.replicated_everywhere().await?;
        Ok(true)
    }

    async fn put_worker(
        &self,
        record: &WorkerRecord,
        ttl_ms: u64,
        now: Now,
    ) -> Result<(), StoreError> {
        self.global.put_worker(record, ttl_ms, now).await?;
        self.put_live(&record.session_id, ttl_ms).await?;
        self.replicated_everywhere().await
    }

    async fn renew_worker(
        &self,
        session_id: &str,
        headroom: i64,
        draining: bool,
        ttl_ms: u64,
        now: Now,
    ) -> Result<Option<WorkerRecord>, StoreError> {
        let Some(record) = self
            .global
            .renew_worker(session_id, headroom, draining, ttl_ms, now)
            .await?
        else {
            return Ok(None);
        };
        if !self.renew_live(session_id, ttl_ms).await? {
            // A shard lost the session (its data went): the worker, told
            // so, re-registers and reclaims its ids, as after the loss of
            // one Redis. Only the record goes (no new id is placed on the
            // session); its liveness stays in the intact shards, so their
            // rows keep their owner until the reclaim takes them over at
            // their epochs instead of falling vacant to the first claim.
            tracing::warn!(target: "pinboard::placement", session = session_id, "a shard no longer knows this session: it must re-register");
            self.global.remove_worker(session_id).await?;
            return Ok(None);
        }
        self.replicated_everywhere().await?;
        Ok(Some(record))
    }

    async fn remove_worker(&self, session_id: &str) -> Result<bool, StoreError> {
        let removed = self.global.remove_worker(session_id).await?;
        self.remove_live(session_id).await?;
        Ok(removed)
    }

    async fn resolve_or_claim(
        &self,
        instance: InstanceKey<'_>,
        candidate: Option<&str>,
        stale: Option<(&str, u64)>,
        floor: u64,
        _generation: &Generation,
        now: Now,
    ) -> Result<ClaimOutcome, StoreError> {
        // The store-wide generation the node names is checked by the
        // periodic check (`generation`); a claim checks its shard's.
        let n = shard_of(instance);
        let (held, left_ms) = self.shard_open(n);
        let offered = candidate.filter(|_| left_ms == 0);
        if offered.is_some() && self.take_reload(n) {
            return Ok(ClaimOutcome::ShardLost {
                quarantine_left_ms: 0,
            });
        }
        let unknown = Generation(String::new());
        let outcome = self.shards[n]
            .resolve_or_claim(
                instance,
                offered,
                stale,
                floor,
                held.as_ref().unwrap_or(&unknown),
                now,
            )
            .await?;
        match outcome {
            ClaimOutcome::GenerationLost(held) => {
                let left = self.shard_lost(n, held).await?;
                self.take_reload(n);
                Ok(ClaimOutcome::ShardLost {
                    quarantine_left_ms: left,
                })
            }
            ClaimOutcome::Vacant if candidate.is_some() => {
                self.take_reload(n);
                Ok(ClaimOutcome::ShardLost {
                    quarantine_left_ms: left_ms.max(1),
                })
            }
            ClaimOutcome::Claimed(..) => {
                self.replicated_in(Some(n)).await?;
                Ok(outcome)
            }
            other => Ok(other),
        }
    }

    async fn open_generation(&self, proposal: &Generation) -> Result<Generation, StoreError> {
        // The store-wide generation is written last (the module doc's
        // "Opening"), so only a node that finds it may judge a missing
        // shard generation a loss.
        let joining = self.global.generation().await?.is_some();
        let now = self.clock.now();
        let (token, _) = proposal.0.rsplit_once('@').unwrap_or((&proposal.0, ""));
        let window = self.settings.loss_quarantine_ms;
        let cap = if joining {
            window
        } else {
            self.settings.quarantine_ms
        };
        let opened = try_join_all(self.shards.iter().enumerate().map(|(n, shard)| {
            let proposal = if joining {
                Generation::new(&format!("{token}-s{n}"), now.wall_ms.saturating_add(window))
            } else {
                proposal.clone()
            };
            async move {
                let held = shard.open_generation(&proposal).await?;
                Ok::<_, StoreError>((held.clone(), held == proposal))
            }
        }))
        .await?;
        let held = self.global.open_generation(proposal).await?;
        for (n, (shard_held, shard_written)) in opened.into_iter().enumerate() {
            if shard_written && joining {
                tracing::warn!(target: "pinboard::placement", shard = n, "a Redis Cluster shard held no generation in a store that does: quarantined as a loss");
            }
            self.standing[n]
                .lock()
                .adopt(shard_held, now.wall_ms, now.mono_ms, cap, false);
        }
        Ok(held)
    }

    async fn generation(&self) -> Result<Option<Generation>, StoreError> {
        let held = self.global.generation().await?;
        let shards = try_join_all(self.shards.iter().map(|s| s.generation())).await?;
        for (n, shard_held) in shards.into_iter().enumerate() {
            let known = self.standing[n].lock().generation.clone();
            // An unopened shard is the opening's business, not a loss.
            if known.is_some() && shard_held != known {
                self.shard_lost(n, shard_held).await?;
            }
        }
        Ok(held)
    }

    async fn expire_placements(&self, budget: usize, now: Now) -> Result<usize, StoreError> {
        let handled =
            try_join_all(self.shards.iter().map(|s| s.expire_placements(budget, now))).await?;
        Ok(handled.into_iter().sum())
    }

    async fn reclaim(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        prev_sessions: &[&str],
        floor: u64,
        now: Now,
    ) -> Result<ReclaimOutcome, StoreError> {
        let n = shard_of(instance);
        let outcome = self.shards[n]
            .reclaim(instance, session_id, prev_sessions, floor, now)
            .await?;
        if let ReclaimOutcome::Reclaimed(_) = outcome {
            self.replicated_in(Some(n)).await?;
        }
        Ok(outcome)
    }

    async fn wake_candidates(
        &self,
        limit: usize,
        now: Now,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let found = try_join_all(self.shards.iter().map(|s| s.wake_candidates(limit, now))).await?;
        let mut out: Vec<(String, String)> = found.into_iter().flatten().collect();
        out.sort();
        out.truncate(limit);
        Ok(out)
    }

    async fn list_placements(&self, now: Now) -> Result<Vec<PlacementEntry>, StoreError> {
        let found = try_join_all(self.shards.iter().map(|s| s.list_placements(now))).await?;
        let mut out: Vec<PlacementEntry> = found.into_iter().flatten().collect();
        out.sort_by(|a, b| (&a.ns, &a.id).cmp(&(&b.ns, &b.id)));
        Ok(out)
    }

    async fn acquire_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        now: Now,
    ) -> Result<bool, StoreError> {
        let taken = self
            .global
            .acquire_sweeper_lease(token, ttl_ms, now)
            .await?;
        if taken {
            self.replicated_in(None).await?;
        }
        Ok(taken)
    }

    async fn renew_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        now: Now,
    ) -> Result<bool, StoreError> {
        let renewed = self.global.renew_sweeper_lease(token, ttl_ms, now).await?;
        if renewed {
            self.replicated_in(None).await?;
        }
        Ok(renewed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_spread_over_every_shard_and_keep_theirs() {
        let mut hits = [0usize; SHARDS];
        for i in 0..64_000 {
            let id = format!("id-{i}");
            hits[shard_of(InstanceKey::new("/counter", &id))] += 1;
        }
        let (min, max) = (hits.iter().min(), hits.iter().max());
        assert!(min.is_some_and(|m| *m > 850), "{hits:?}");
        assert!(max.is_some_and(|m| *m < 1150), "{hits:?}");
        // The layout: these never change.
        assert_eq!(
            shard_of(InstanceKey::new("/counter", "a")),
            shard_of(InstanceKey::new("/counter", "a"))
        );
        assert_eq!(
            shard_of(InstanceKey::new("", "")),
            (0xcbf2_9ce4_8422_2325u64 ^ u64::from(b'/')).wrapping_mul(0x0100_0000_01b3) as usize
                % SHARDS
        );
    }
}
