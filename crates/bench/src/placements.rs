//! New-id placements against pinboard's Redis placement store alone: no
//! HTTP, no proxy, no worker. Each placement is the two store calls
//! pinboard makes for a new id (`resolve_or_claim` naming a candidate,
//! then `settle` once the worker answered), issued by `tasks` concurrent
//! tasks of this process through one [`RedisStore`] (one multiplexed
//! connection, as in pinboard). So the Redis side of a placement is seen
//! apart from proxying and activation.
//!
//! The same placements run on pinboard's Redis Cluster store
//! ([`run_cluster_store`]): the store's 64 virtual shards spread over the
//! cluster's masters, with or without the `WAIT` for a replica after each
//! claim, and Redis' CPU summed over every node of the cluster (replicas
//! included: they apply every write too).
//!
//! Also owns reading Redis' own CPU time (`INFO cpu`) and memory (`INFO
//! memory`), which the proxy benchmark prints per placement for both
//! figures, and the Redis side of a worker's heartbeat ([`run_heartbeats`]:
//! the four store calls pinboard makes per heartbeat, whatever the worker
//! holds).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use pinboard::clock::Now;
use pinboard::placement::{
    BatchStats, Batching, ClaimOutcome, ClusterSettings, ClusterStore, Generation, InstanceKey,
    PlacementStore, RedisStore, WorkerRecord,
};

/// The namespace the direct placements claim in.
const NS: &str = "/direct";

/// One run's figures.
#[derive(Debug, Clone, Copy)]
pub struct StoreReport {
    /// Placements (claim + settle) completed in the measured window.
    pub placements: u64,
    /// Store calls that failed or answered other than a fresh claim.
    pub errors: u64,
    /// Placements per second.
    pub rate: f64,
    /// Median latency of one placement (both calls), microseconds.
    pub p50_us: u64,
    /// 99th percentile latency of one placement, microseconds.
    pub p99_us: u64,
    /// CPU of this (the client) process per placement, microseconds.
    pub client_cpu_us: Option<f64>,
    /// Redis' CPU per placement, microseconds.
    pub redis_cpu_us: Option<f64>,
    /// Store calls per script call Redis ran (the store's batching).
    pub ops_per_batch: f64,
    /// Redis' memory per placement (`used_memory`, every node), bytes: the
    /// rows stay, with their owner's lease.
    pub redis_bytes: Option<f64>,
}

impl std::fmt::Display for StoreReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |v: Option<f64>| v.map_or_else(|| "  ?".to_owned(), |v| format!("{v:>5.1}"));
        write!(
            f,
            "{:>9.0} placements/s  p50 {:>6} us  p99 {:>6} us  ({} ok, {} errors)  cpu/placement client {} us, Redis {} us; {:.1} calls/batch; Redis memory {} B/placement",
            self.rate,
            self.p50_us,
            self.p99_us,
            self.placements,
            self.errors,
            us(self.client_cpu_us),
            us(self.redis_cpu_us),
            self.ops_per_batch,
            self.redis_bytes
                .map_or_else(|| "?".to_owned(), |b| format!("{b:.0}")),
        )
    }
}

/// Places new ids on the Redis at `url` (keys under `prefix`, which the
/// caller wipes) from `tasks` concurrent tasks: `warmup`, then `duration`
/// measured. `round` keeps each run's ids apart.
///
/// # Errors
///
/// When Redis cannot be reached or the worker record cannot be written.
pub async fn run_store(
    url: &str,
    prefix: &str,
    round: usize,
    tasks: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<StoreReport> {
    let store = RedisStore::connect(url, prefix)
        .await
        .context("connect the placement store")?;
    let nodes = vec![
        redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?,
    ];
    run_on(Bench::Single(store), nodes, round, tasks, warmup, duration).await
}

/// As [`run_store`], on the Redis Cluster whose nodes are `urls`
/// (comma-separated), every claim waiting for `wait_replicas` replicas;
/// Redis' CPU is the sum over every node.
///
/// # Errors
///
/// When the cluster cannot be reached or the worker record cannot be written.
pub async fn run_cluster_store(
    urls: &str,
    prefix: &str,
    wait_replicas: u32,
    round: usize,
    tasks: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<StoreReport> {
    let seeds: Vec<&str> = urls.split(',').map(str::trim).collect();
    let settings = ClusterSettings {
        batching: Batching::default(),
        wait_replicas,
        ..ClusterSettings::default()
    };
    let store = ClusterStore::connect(&seeds, prefix, settings)
        .await
        .context("connect the cluster placement store")?;
    let mut nodes = Vec::new();
    for url in &seeds {
        nodes.push(
            redis::Client::open(*url)?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    run_on(Bench::Cluster(store), nodes, round, tasks, warmup, duration).await
}

/// The store a run places on.
#[derive(Clone)]
enum Bench {
    Single(RedisStore),
    Cluster(ClusterStore),
}

impl Bench {
    fn batch_stats(&self) -> BatchStats {
        match self {
            Self::Single(s) => s.batch_stats(),
            Self::Cluster(s) => s.batch_stats(),
        }
    }

    async fn open_generation(&self, proposal: &Generation) -> anyhow::Result<Generation> {
        Ok(match self {
            Self::Single(s) => s.open_generation(proposal).await?,
            Self::Cluster(s) => s.open_generation(proposal).await?,
        })
    }

    async fn put_worker(&self, record: &WorkerRecord, ttl_ms: u64) -> anyhow::Result<()> {
        match self {
            Self::Single(s) => s.put_worker(record, ttl_ms, now()).await?,
            Self::Cluster(s) => s.put_worker(record, ttl_ms, now()).await?,
        }
        Ok(())
    }

    /// One heartbeat of `session` (see [`heartbeat`]).
    async fn heartbeat(&self, session: &str, ttl_ms: u64) -> bool {
        match self {
            Self::Single(s) => heartbeat(s, session, ttl_ms).await,
            Self::Cluster(s) => heartbeat(s, session, ttl_ms).await,
        }
    }

    /// Claim `key` for `session` and settle it: whether both did.
    async fn place(&self, key: InstanceKey<'_>, session: &str, generation: &Generation) -> bool {
        match self {
            Self::Single(s) => place(s, key, session, generation).await,
            Self::Cluster(s) => place(s, key, session, generation).await,
        }
    }
}

async fn place<S: PlacementStore>(
    store: &S,
    key: InstanceKey<'_>,
    session: &str,
    generation: &Generation,
) -> bool {
    let at = now();
    let claimed = store
        .resolve_or_claim(
            key,
            Some(session),
            None,
            at.wall_ms.saturating_mul(1000),
            generation,
            at,
        )
        .await;
    let Ok(ClaimOutcome::Claimed(p, _)) = claimed else {
        return false;
    };
    matches!(store.settle(key, &p.session_id, p.epoch).await, Ok(true))
}

/// Redis' memory over `nodes`, bytes.
async fn nodes_memory(nodes: &mut [redis::aio::MultiplexedConnection]) -> Option<f64> {
    let mut total = 0.0;
    for node in nodes.iter_mut() {
        total += redis_memory(node).await?;
    }
    Some(total)
}

/// Redis' CPU over `nodes`, seconds.
async fn nodes_cpu(nodes: &mut [redis::aio::MultiplexedConnection]) -> Option<f64> {
    let mut total = 0.0;
    for node in nodes.iter_mut() {
        total += redis_cpu(node).await?;
    }
    Some(total)
}

async fn run_on(
    store: Bench,
    mut nodes: Vec<redis::aio::MultiplexedConnection>,
    round: usize,
    tasks: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<StoreReport> {
    let generation = store
        .open_generation(&Generation::new("bench", 0))
        .await
        .context("open the generation")?;
    let session = format!("bench-session-{round}");
    let lease = warmup + duration + Duration::from_secs(60);
    store
        .put_worker(&record(&session), lease.as_millis() as u64)
        .await
        .context("register the bench's worker record")?;
    let shared = Arc::new(Shared {
        store,
        generation,
        session,
        round,
        done: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let handles: Vec<_> = (0..tasks.max(1))
        .map(|task| tokio::spawn(place_loop(shared.clone(), task)))
        .collect();
    tokio::time::sleep(warmup).await;
    shared.measuring.store(true, Ordering::Release);
    let before = (
        shared.done.load(Ordering::Acquire),
        shared.errors.load(Ordering::Acquire),
        own_cpu(),
        nodes_cpu(&mut nodes).await,
        shared.store.batch_stats(),
        nodes_memory(&mut nodes).await,
    );
    let started = tokio::time::Instant::now();
    tokio::time::sleep(duration).await;
    let after = (
        shared.done.load(Ordering::Acquire),
        shared.errors.load(Ordering::Acquire),
        own_cpu(),
        nodes_cpu(&mut nodes).await,
        shared.store.batch_stats(),
        nodes_memory(&mut nodes).await,
    );
    let elapsed = started.elapsed().as_secs_f64();
    shared.measuring.store(false, Ordering::Release);
    shared.stop.store(true, Ordering::Release);
    let mut latency = new_histogram();
    for handle in handles {
        if let Ok(h) = handle.await {
            let _ = latency.add(h);
        }
    }
    let placements = after.0 - before.0;
    let per = |a: Option<f64>, b: Option<f64>| Some((b? - a?) * 1e6 / placements.max(1) as f64);
    Ok(StoreReport {
        placements,
        errors: after.1 - before.1,
        rate: placements as f64 / elapsed,
        p50_us: latency.value_at_quantile(0.5),
        p99_us: latency.value_at_quantile(0.99),
        client_cpu_us: per(before.2, after.2),
        redis_cpu_us: per(before.3, after.3),
        ops_per_batch: (after.4.ops - before.4.ops) as f64
            / (after.4.batches - before.4.batches).max(1) as f64,
        redis_bytes: before
            .5
            .zip(after.5)
            .map(|(from, to)| (to - from) / placements.max(1) as f64),
    })
}

struct Shared {
    store: Bench,
    generation: Generation,
    session: String,
    round: usize,
    done: AtomicU64,
    errors: AtomicU64,
    measuring: AtomicBool,
    stop: AtomicBool,
}

/// One task: claim a new id, settle it, again, until told to stop; the
/// latencies of the measured placements.
async fn place_loop(shared: Arc<Shared>, task: usize) -> Histogram<u64> {
    let mut latency = new_histogram();
    let mut id = String::new();
    for n in 0u64.. {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        id.clear();
        use std::fmt::Write as _;
        let _ = write!(id, "r{}-t{task}-{n}", shared.round);
        let key = InstanceKey::new(NS, &id);
        let started = tokio::time::Instant::now();
        let placed = shared
            .store
            .place(key, &shared.session, &shared.generation)
            .await;
        let counted = if placed { &shared.done } else { &shared.errors };
        counted.fetch_add(1, Ordering::AcqRel);
        if shared.measuring.load(Ordering::Acquire) {
            let _ = latency.record(started.elapsed().as_micros() as u64);
        }
    }
    latency
}

fn new_histogram() -> Histogram<u64> {
    // Three significant figures up to a minute; the bounds are constants.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn now() -> Now {
    let wall_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Now {
        wall_ms,
        mono_ms: wall_ms,
    }
}

fn record(session: &str) -> WorkerRecord {
    WorkerRecord {
        session_id: session.to_owned(),
        client_id: format!("client-{session}"),
        secret: "bench".into(),
        advertise_url: "http://127.0.0.1:9".into(),
        namespaces: vec![NS.into()],
        headroom: 1,
        ..Default::default()
    }
}

/// This process' CPU time (user + system), seconds, from `/proc/self/stat`.
fn own_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Redis' CPU time (user + system, all its threads), seconds, from `INFO
/// cpu`; `None` when it cannot be read.
pub async fn redis_cpu(conn: &mut redis::aio::MultiplexedConnection) -> Option<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await.ok()?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(field("used_cpu_user")? + field("used_cpu_sys")?)
}

/// Redis' memory in use (`used_memory` of `INFO memory`), bytes; `None`
/// when it cannot be read.
pub async fn redis_memory(conn: &mut redis::aio::MultiplexedConnection) -> Option<f64> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
}

/// One heartbeat run's figures.
#[derive(Debug, Clone, Copy)]
pub struct HeartbeatReport {
    /// Heartbeats completed in the measured window.
    pub heartbeats: u64,
    /// Heartbeats per second.
    pub rate: f64,
    /// CPU of this (the client) process per heartbeat, microseconds.
    pub client_cpu_us: Option<f64>,
    /// Redis' CPU per heartbeat (every node), microseconds.
    pub redis_cpu_us: Option<f64>,
}

impl std::fmt::Display for HeartbeatReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |v: Option<f64>| v.map_or_else(|| "?".to_owned(), |v| format!("{v:.1}"));
        write!(
            f,
            "{:>9.0} heartbeats/s ({} in all)  cpu/heartbeat client {} us, Redis {} us",
            self.rate,
            self.heartbeats,
            us(self.client_cpu_us),
            us(self.redis_cpu_us),
        )
    }
}

/// The Redis side of worker heartbeats on the Redis at `url` (keys under
/// `prefix`, which the caller wipes): `workers` sessions, each renewing as
/// pinboard's heartbeat handler does (supersession check, record read,
/// renewal, pending control messages), back to back from a task of its
/// own; `warmup`, then `duration` measured.
///
/// # Errors
///
/// When Redis cannot be reached or a worker record cannot be written.
pub async fn run_heartbeats(
    url: &str,
    prefix: &str,
    workers: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<HeartbeatReport> {
    let store = RedisStore::connect(url, prefix)
        .await
        .context("connect the placement store")?;
    let nodes = vec![
        redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?,
    ];
    heartbeats_on(Bench::Single(store), nodes, workers, warmup, duration).await
}

/// As [`run_heartbeats`], on the Redis Cluster whose nodes are `urls`, each
/// renewal waiting for `wait_replicas` replicas (a heartbeat also writes
/// the session's liveness in every virtual shard).
///
/// # Errors
///
/// When the cluster cannot be reached or a worker record cannot be written.
pub async fn run_cluster_heartbeats(
    urls: &str,
    prefix: &str,
    wait_replicas: u32,
    workers: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<HeartbeatReport> {
    let seeds: Vec<&str> = urls.split(',').map(str::trim).collect();
    let settings = ClusterSettings {
        batching: Batching::default(),
        wait_replicas,
        ..ClusterSettings::default()
    };
    let store = ClusterStore::connect(&seeds, prefix, settings)
        .await
        .context("connect the cluster placement store")?;
    let mut nodes = Vec::new();
    for url in &seeds {
        nodes.push(
            redis::Client::open(*url)?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    heartbeats_on(Bench::Cluster(store), nodes, workers, warmup, duration).await
}

async fn heartbeats_on(
    store: Bench,
    mut nodes: Vec<redis::aio::MultiplexedConnection>,
    workers: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<HeartbeatReport> {
    store
        .open_generation(&Generation::new("bench", 0))
        .await
        .context("open the generation")?;
    let lease = warmup + duration + Duration::from_secs(60);
    let store = Arc::new(store);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for worker in 0..workers.max(1) {
        let session = format!("bench-heartbeat-{worker}");
        store
            .put_worker(&record(&session), lease.as_millis() as u64)
            .await
            .context("register a heartbeating worker")?;
        let (store, done, stop) = (store.clone(), done.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                if store.heartbeat(&session, lease.as_millis() as u64).await {
                    done.fetch_add(1, Ordering::AcqRel);
                }
            }
        }));
    }
    tokio::time::sleep(warmup).await;
    let before = (
        done.load(Ordering::Acquire),
        own_cpu(),
        nodes_cpu(&mut nodes).await,
    );
    let started = tokio::time::Instant::now();
    tokio::time::sleep(duration).await;
    let after = (
        done.load(Ordering::Acquire),
        own_cpu(),
        nodes_cpu(&mut nodes).await,
    );
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Release);
    for handle in handles {
        let _ = handle.await;
    }
    let heartbeats = after.0 - before.0;
    let per = |a: Option<f64>, b: Option<f64>| Some((b? - a?) * 1e6 / heartbeats.max(1) as f64);
    Ok(HeartbeatReport {
        heartbeats,
        rate: heartbeats as f64 / elapsed,
        client_cpu_us: per(before.1, after.1),
        redis_cpu_us: per(before.2, after.2),
    })
}

/// One heartbeat of `session` as pinboard's handler makes it in the store
/// (the challenge to the worker aside): whether it renewed.
async fn heartbeat<S: PlacementStore>(store: &S, session: &str, ttl_ms: u64) -> bool {
    let at = now();
    if !matches!(store.superseded(session, at).await, Ok(None)) {
        return false;
    }
    if !matches!(store.get_worker(session, at).await, Ok(Some(_))) {
        return false;
    }
    if !matches!(
        store.renew_worker(session, 1, false, ttl_ms, now()).await,
        Ok(Some(_))
    ) {
        return false;
    }
    store.pending_messages(session, &[]).await.is_ok()
}
