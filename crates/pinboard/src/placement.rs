//! Placement: who owns `(namespace, id)` and at which epoch, plus the worker
//! records (sessions) that ownership depends on.
//!
//! Owns the [`PlacementStore`] trait and its implementations, the
//! in-process [`MemoryStore`], the shared [`RedisStore`] (one Redis) and
//! [`ClusterStore`] (a Redis Cluster: 64 virtual shards, each a
//! `RedisStore` keyspace under its own hash tag), and the pure
//! candidate choice ([`choose_candidate`]). It never calls a worker and never
//! issues an epoch at or below one already stored for that id.
//!
//! # Invariants
//!
//! - A placement is *live* while its owning session's worker record is live
//!   (not expired, not removed). A placement whose owner lapsed is vacant:
//!   the next claim takes it, with a strictly larger epoch.
//! - Claims are atomic per id (first claim wins): one mutex in memory, one Lua
//!   script call in Redis (concurrent claims of a node share one, applied in
//!   turn), so two pinboard nodes racing for a new id agree on one owner.
//! - At most one `token` holds the sweeper lease at a time (see
//!   `crate::sweeper`); it lapses `ttl_ms` after its last grant or renewal.
//! - Releasing a *settled* row (see [`PlacementStore::settle`]) keeps the
//!   id's epoch (the row stays with an empty owner) for the row grace, so a
//!   placement soon after continues above it; after the grace the row is
//!   gone and [`crate::clock::EpochFloor`] keeps the next epoch above it, as
//!   it does when the store lost everything.
//! - Releasing a row that was never settled (its owner never answered at
//!   that epoch: a claim the worker refused, or an instance record whose
//!   every request `authorize` denied) *drops* it at once and raises the
//!   store's *dropped mark* (the highest epoch dropped so): every later
//!   claim mints above the mark, so no epoch is handed out twice for an id
//!   whichever node claims it next, although no row remembers it.
//!
//! # Bounds (rows do not outlive their owner)
//!
//! A row owned by a live session stays. A row whose owner released it, or
//! whose owner is gone (lapsed, deregistered, superseded), is kept for the
//! *row grace* (`--placement-grace-ms`, default six lease TTLs) and then
//! removed: [`PlacementStore::expire_placements`] runs every half lease TTL
//! and hands each such row its remaining time (Redis: a `PEXPIRE`; memory:
//! a timestamp). During the grace a worker re-registering with the gone
//! session as `prevSessionId` reclaims the row at its epoch. So the rows a
//! store holds are bounded by the live sessions' instances plus what was
//! vacated within one grace, whatever ids clients invent. A claim the
//! worker refused (it never activated the id) is released by the proxy at
//! once (`release` at the claimed epoch), and a record the worker
//! discarded because `authorize` denied its requests is released by the
//! worker at once: neither was settled, so neither leaves a row at all.
//!
//! # Generation (store loss)
//!
//! The store holds one *generation* value, written when a node finds none
//! (`<random token>@<wall ms when its quarantine ends>`). A claim names the generation its node
//! knows and is refused (`ClaimOutcome::GenerationLost`) when the store
//! holds another one or none: the store lost its data (a `FLUSHALL`, a
//! restart without persistence) or another node saw that first. Nothing is
//! ever placed in a store whose loss its node has not noticed; what the node
//! does about it is `proxy::resolve`'s concern.

mod cluster;
mod connection;
mod forward;
#[cfg(test)]
pub(crate) mod gated;
mod memory;
mod redis;

use std::collections::BTreeMap;
use std::future::Future;

use pinned_wire::registry::{ControlMessage, Takeover};
use serde::{Deserialize, Serialize};

pub use self::cluster::{shard_of, ClusterSettings, ClusterStore, SHARDS};
pub use self::memory::MemoryStore;
pub use self::redis::{BatchStats, Batching, RedisStore};
use crate::clock::Now;

/// The `(ns, id)` every per-instance placement operation takes; the state store's key type,
/// so one name means one instance on both sides.
pub use pinned_store::InstanceKey;

/// A registered worker session as the store keeps it. `Default` is an
/// empty record with no drain, no hostname world and epoch 0, for struct
/// update syntax (`WorkerRecord { session_id, .., ..Default::default() }`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerRecord {
    /// Session id (lease token).
    pub session_id: String,
    /// Per-process client id.
    pub client_id: String,
    /// Worker secret: keys attestations; sent only to `/_pinned/*`.
    pub secret: String,
    /// Base URL of the worker process (`http://host:port`, no trailing slash).
    pub advertise_url: String,
    /// Attached namespaces.
    pub namespaces: Vec<String>,
    /// Last reported headroom (MB).
    pub headroom: i64,
    /// The worker's own drain flag (last report).
    pub draining: bool,
    /// Operator drain: `Some(deadline)` while drained by `/registry/push`
    /// (or wound down for a newer deployment).
    #[serde(default)]
    pub server_drain: Option<DrainDeadline>,
    /// Deployment hostname.
    #[serde(default)]
    pub hostname: Option<String>,
    /// Deployment environment (needs `hostname`).
    #[serde(default)]
    pub env: Option<String>,
    /// Per-namespace environments, overriding `env` for those namespaces.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// Deployment epoch (0 when none).
    #[serde(default)]
    pub epoch: u64,
    /// Takeover policy of this session's hostname binding.
    #[serde(default)]
    pub takeover: Option<Takeover>,
    /// Set while a newer deployment of the same hostname and env winds this
    /// session down (`takeover: "wind_down"`): at this wall time (ms) the
    /// session is superseded. It is drained until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retire_at_wall_ms: Option<u64>,
}

impl WorkerRecord {
    /// No new placements may land here.
    pub fn refuses_new_ids(&self) -> bool {
        self.draining || self.server_drain.is_some()
    }

    /// Whether the worker hosts `ns`.
    pub fn hosts(&self, ns: &str) -> bool {
        self.namespaces.iter().any(|n| n == ns)
    }

    /// The environment this worker serves `ns` in: `envs[ns]`, else `env`.
    pub fn env_for(&self, ns: &str) -> Option<&str> {
        self.envs.get(ns).or(self.env.as_ref()).map(String::as_str)
    }
}

/// The deadline of an operator drain, as the store keeps it.
///
/// An operator's deadline counts from its *delivery*: pushed, it waits as
/// [`AfterDelivery`](Self::AfterDelivery) until the first heartbeat that
/// renews the session, which turns it into [`At`](Self::At) (atomically
/// with the renewal) and so echoes the whole duration the operator asked
/// for; later acks count down from there. Otherwise a deadline would lose
/// up to a heartbeat interval between the push and the worker hearing of
/// it (a 2 s deadline on a 3 s heartbeat arrived as 0: an abort with no
/// drain window at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainDeadline {
    /// No deadline: the drain never aborts anything.
    Never,
    /// Pushed and not yet delivered: ends this many milliseconds after the
    /// ack that delivers it.
    AfterDelivery(u64),
    /// Ends at this wall time (ms): delivered, or set by pinboard itself
    /// (a takeover wind-down, whose supersession is due then too).
    At(u64),
}

impl DrainDeadline {
    /// Delivered at `now_wall_ms`: a pending deadline starts counting.
    #[must_use]
    pub fn delivered(self, now_wall_ms: u64) -> Self {
        match self {
            Self::AfterDelivery(ms) => Self::At(now_wall_ms.saturating_add(ms)),
            other => other,
        }
    }

    /// The `drainDeadline` of an ack sent at `now_wall_ms`: the seconds
    /// remaining (floored at 0), `None` for no deadline.
    pub fn remaining_secs(self, now_wall_ms: u64) -> Option<f64> {
        match self {
            Self::Never => None,
            Self::AfterDelivery(ms) => Some(ms as f64 / 1000.0),
            Self::At(at) => Some(at.saturating_sub(now_wall_ms) as f64 / 1000.0),
        }
    }
}

/// A worker record with its remaining lease.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveWorker {
    /// The record.
    pub record: WorkerRecord,
    /// Milliseconds until the record lapses.
    pub expires_in_ms: u64,
}

/// Ownership of one id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Owning session.
    pub session_id: String,
    /// Placement epoch.
    pub epoch: u64,
}

/// A placement row as listed by the overview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementEntry {
    /// Namespace with its slash.
    pub ns: String,
    /// Instance id.
    pub id: String,
    /// Owner and epoch.
    pub placement: Placement,
    /// Owner tag.
    pub tag: Option<String>,
    /// Whether the owning session is live.
    pub live: bool,
    /// Whether the owner answered at this epoch (see
    /// [`PlacementStore::settle`]).
    pub settled: bool,
}

/// What [`PlacementStore::resolve_or_claim`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// A live session already owns the id.
    Owned(Placement),
    /// The candidate now owns the id at a fresh epoch; the session that
    /// owned the row before (gone, or the stale owner named), if another:
    /// the id moved from it.
    Claimed(Placement, Option<String>),
    /// Nobody live owns the id and no candidate was offered.
    Vacant,
    /// The candidate's record is gone; pick another.
    CandidateGone,
    /// Nothing was claimed: the store's generation is not the one named
    /// (it lost its data); this is the one it holds now, if any.
    GenerationLost(Option<Generation>),
    /// Nothing was claimed: the part of the store holding the id (a
    /// [`ClusterStore`] shard) lost its data, and places nothing new for
    /// `quarantine_left_ms` more (0: it places again, ask once more). The
    /// node re-reads its epoch floor before its next claim, as after the
    /// loss of the whole store.
    ShardLost {
        /// What is left of the shard's quarantine (ms).
        quarantine_left_ms: u64,
    },
}

/// The store's generation (see the module doc): `<token>@<wall ms>`, the
/// wall time being when the quarantine its writer started ends (every node
/// that adopts the generation keeps to that same window).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation(pub String);

impl Generation {
    /// A new generation whose quarantine ends at `quarantine_until_wall_ms`.
    pub fn new(token: &str, quarantine_until_wall_ms: u64) -> Self {
        Self(format!("{token}@{quarantine_until_wall_ms}"))
    }

    /// When its quarantine ends (wall ms); `None` when the value has no time.
    pub fn quarantine_until_wall_ms(&self) -> Option<u64> {
        self.0.rsplit_once('@').and_then(|(_, ms)| ms.parse().ok())
    }
}

/// A registration as [`PlacementStore::admit_worker`] applies it, in one
/// atomic step: what the registry decided from the live sessions it read
/// at deployment version `expected_version`.
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    /// The newcomer's record.
    pub record: &'a WorkerRecord,
    /// Its lease (ms).
    pub ttl_ms: u64,
    /// The deployment version the decision was read at
    /// ([`PlacementStore::deployment_version`]); `None` for a registration
    /// that binds no hostname and so decided nothing a rival could change.
    pub expected_version: Option<u64>,
    /// Sessions to supersede, each with its reason: marked (their
    /// heartbeats answer `superseded` for `superseded_ttl_ms`) and removed.
    pub supersede: &'a [(String, String)],
    /// How long a superseded session's reason is kept (ms).
    pub superseded_ttl_ms: u64,
    /// Sessions to wind down, each with the wall time (ms) it is drained
    /// until and then superseded at (see [`WorkerRecord::retire_at_wall_ms`]).
    pub wind_down: &'a [(String, u64)],
}

impl Admission<'_> {
    /// Whether applying it changes the deployment bindings (it then bumps
    /// the version, so a decision read before it is taken again).
    pub fn moves_deployments(&self) -> bool {
        self.expected_version.is_some() || !self.supersede.is_empty() || !self.wind_down.is_empty()
    }
}

/// What [`PlacementStore::reclaim`] did for one re-submitted id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimOutcome {
    /// The id now belongs to the new session.
    Reclaimed(Placement),
    /// Another live session owns it: the worker must quit its copy.
    Duplicate,
}

/// Errors of a placement store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis failed or answered something unexpected.
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// A stored value did not decode.
    #[error("corrupt stored value: {0}")]
    Corrupt(String),
    /// The store did not answer within the deadline (Redis: any call, see
    /// [`Batching::deadline`]); whether the call took effect is unknown.
    #[error("the store did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The store's background task is gone (it panicked).
    #[error("the store's batching task is gone")]
    Closed,
    /// A write was made but fewer replicas than asked took it in time
    /// (`WAIT`, [`ClusterSettings::wait_replicas`]): it is not
    /// acknowledged, and nothing may act on it.
    #[error("the write reached {got} of {want} replicas in time")]
    NotReplicated {
        /// Replicas that acknowledged it.
        got: u64,
        /// Replicas asked for.
        want: u32,
    },
}

/// Most hostnames a store remembers as bound (see
/// [`PlacementStore::bind_hostname`]); past it, the one bound longest ago
/// is forgotten. Hostnames come from authenticated registrations only.
pub const MAX_BOUND_HOSTNAMES: usize = 10_000;

/// Shared state of the control plane: worker records, control-message queues
/// and placements. All methods are cancel safe in the sense that each is one
/// atomic store operation (or a sequence whose partial effect is harmless).
pub trait PlacementStore: Send + Sync + 'static {
    /// The version of the deployment bindings: bumped by every
    /// [`admit_worker`](Self::admit_worker) that changes them, so a
    /// takeover decided from a read of the live sessions is applied only if
    /// no other registration changed them since (two deployments
    /// registering through two nodes at once cannot both pass the check).
    fn deployment_version(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Apply a registration atomically: when `admission.expected_version`
    /// is given and the deployment version is another, write nothing and
    /// answer `false` (decide again); else bump the version if the
    /// admission [moves deployments](Admission::moves_deployments),
    /// supersede and wind down the sessions it names, put its record, and
    /// answer `true`.
    fn admit_worker(
        &self,
        admission: &Admission<'_>,
        now: Now,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Create or replace a worker record with a lease of `ttl_ms`.
    fn put_worker(
        &self,
        record: &WorkerRecord,
        ttl_ms: u64,
        now: Now,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Renew a live record with fresh headroom and drain flag, delivering
    /// a pending operator drain deadline at `now` (see [`DrainDeadline`]);
    /// `None` when the session is unknown or lapsed.
    fn renew_worker(
        &self,
        session_id: &str,
        headroom: i64,
        draining: bool,
        ttl_ms: u64,
        now: Now,
    ) -> impl Future<Output = Result<Option<WorkerRecord>, StoreError>> + Send;

    /// Set or lift the operator drain of a live session (keeps its lease);
    /// `false` when the session is unknown.
    fn set_server_drain(
        &self,
        session_id: &str,
        drain: Option<DrainDeadline>,
        now: Now,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// A live worker record.
    fn get_worker(
        &self,
        session_id: &str,
        now: Now,
    ) -> impl Future<Output = Result<Option<LiveWorker>, StoreError>> + Send;

    /// Remove a session (deregister, supersession); its placements become vacant.
    fn remove_worker(
        &self,
        session_id: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Every live worker.
    fn list_workers(
        &self,
        now: Now,
    ) -> impl Future<Output = Result<Vec<LiveWorker>, StoreError>> + Send;

    /// Remember that a worker registered `hostname` (lowercase): from now
    /// on a client's `Host` naming it selects its world, whether or not a
    /// worker of it is live (`proxy`). Kept as long as the store keeps its
    /// data, the [`MAX_BOUND_HOSTNAMES`] bound last; binding it again
    /// makes it the newest.
    fn bind_hostname(
        &self,
        hostname: &str,
        now: Now,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every hostname [`bind_hostname`](Self::bind_hostname) remembers
    /// (lowercase, at most [`MAX_BOUND_HOSTNAMES`]).
    fn bound_hostnames(&self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Remember that `session_id` was displaced (for `ttl_ms`).
    fn mark_superseded(
        &self,
        session_id: &str,
        error: &str,
        ttl_ms: u64,
        now: Now,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The displacement reason, if `session_id` was superseded.
    fn superseded(
        &self,
        session_id: &str,
        now: Now,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;

    /// Queue a control message; returns its `msgId`.
    fn push_message(
        &self,
        session_id: &str,
        message: ControlMessage,
    ) -> impl Future<Output = Result<String, StoreError>> + Send;

    /// Drop acknowledged messages and return the rest, oldest first.
    fn pending_messages(
        &self,
        session_id: &str,
        acks: &[String],
    ) -> impl Future<Output = Result<Vec<ControlMessage>, StoreError>> + Send;

    /// Resolve the live owner of `instance`, or, when vacant and a candidate
    /// is offered, claim it for the candidate at `max(previous + 1, floor)`
    /// provided the store's generation is `generation` (else
    /// [`ClaimOutcome::GenerationLost`], nothing written).
    /// With `stale = Some((session, epoch))`, an owner equal to that pair is
    /// treated as vacant (it refused the id, so it never activated it).
    fn resolve_or_claim(
        &self,
        instance: InstanceKey<'_>,
        candidate: Option<&str>,
        stale: Option<(&str, u64)>,
        floor: u64,
        generation: &Generation,
        now: Now,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// The store's generation, writing `proposal` when it holds none;
    /// returns the one it holds afterwards (the proposal, or an older one).
    fn open_generation(
        &self,
        proposal: &Generation,
    ) -> impl Future<Output = Result<Generation, StoreError>> + Send;

    /// The store's generation, if it holds one (a read; reachability probe).
    fn generation(&self) -> impl Future<Output = Result<Option<Generation>, StoreError>> + Send;

    /// Give every vacated row (released, or owned by a session that is gone)
    /// its remaining grace, and drop what outlived it; at most about
    /// `budget` rows per call. Returns how many rows it handled.
    fn expire_placements(
        &self,
        budget: usize,
        now: Now,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Give a re-registering worker back an id it holds: kept epoch when the
    /// owner is one of `prev_sessions` (that process's earlier sessions),
    /// a fresh one when vacant; `Duplicate` when another live session owns
    /// it.
    fn reclaim(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        prev_sessions: &[&str],
        floor: u64,
        now: Now,
    ) -> impl Future<Output = Result<ReclaimOutcome, StoreError>> + Send;

    /// Free `instance` if `session_id` owns it (and at `epoch`, when given):
    /// a settled row keeps its epoch for the row grace, then goes; one never
    /// settled is dropped at once, its epoch kept in the dropped mark (see
    /// the module doc).
    fn release(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: Option<u64>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Stamp an owner tag on a placement `session_id` owns.
    fn tag(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: Option<u64>,
        tag: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Record that the owner `session_id` answered for `instance` at
    /// `epoch` (a forwarded request or a `_wake` answered 2xx), so its
    /// state store holds that epoch: the placement is *settled*. A row that
    /// moved on since (another owner or epoch) is left alone (`false`).
    fn settle(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Up to `limit` placements the sweeper must wake, sorted: *orphans*
    /// (owned by a session that lapsed or was removed, not released) and
    /// *unsettled* rows (see [`settle`](Self::settle)). Redis finds them
    /// through the lapsed sessions' owner indexes and two small sets (the
    /// unsettled rows, the orphans upkeep already took out of an index),
    /// never by scanning every row.
    fn wake_candidates(
        &self,
        limit: usize,
        now: Now,
    ) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send;

    /// One owned placement row, if any (operator views, the simulation).
    fn placement(
        &self,
        instance: InstanceKey<'_>,
        now: Now,
    ) -> impl Future<Output = Result<Option<PlacementEntry>, StoreError>> + Send;

    /// Every owned placement row (operator overview).
    fn list_placements(
        &self,
        now: Now,
    ) -> impl Future<Output = Result<Vec<PlacementEntry>, StoreError>> + Send;

    /// Take the sweeper lease for `token` for `ttl_ms` if nobody holds it
    /// (`SET NX PX`); `true` when this call took it. A live lease, even one
    /// held by `token` itself, is not taken again: renew it instead.
    fn acquire_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        now: Now,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Extend the sweeper lease to `ttl_ms` from now if `token` holds it
    /// (compare-and-set); `false` when it lapsed or another node holds it.
    fn renew_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        now: Now,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Give the sweeper lease up if `token` holds it (compare-and-delete).
    fn release_sweeper_lease(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// Pick a worker for a new id among `candidates` (already filtered to live,
/// undrained hosts of the namespace), weighted by headroom (each worker gets
/// at least weight 1). `roll` is a uniform random number.
pub fn choose_candidate<T>(
    candidates: &[T],
    headroom: impl Fn(&T) -> i64,
    roll: u64,
) -> Option<usize> {
    if candidates.is_empty() {
        return None;
    }
    let weights = candidates
        .iter()
        .map(|c| headroom(c).clamp(1, 1 << 40) as u64);
    let total: u64 = weights.clone().sum();
    let mut point = roll % total;
    for (i, w) in weights.enumerate() {
        if point < w {
            return Some(i);
        }
        point -= w;
    }
    Some(candidates.len() - 1)
}

/// Default row grace in lease TTLs (see the module doc).
pub const ROW_GRACE_LEASES: u64 = 6;

/// `max(previous + 1, floor)`: the epoch for a new placement.
pub fn next_epoch(previous: u64, floor: u64) -> u64 {
    previous.saturating_add(1).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_choice_follows_headroom() {
        let hs = [1i64, 1000];
        let mut hits = [0; 2];
        for roll in 0..1001u64 {
            hits[choose_candidate(&hs, |h| *h, roll).expect("some")] += 1;
        }
        assert_eq!(hits, [1, 1000]);
        assert_eq!(choose_candidate::<i64>(&[], |h| *h, 5), None);
        assert_eq!(choose_candidate(&[-5i64], |h| *h, 99), Some(0));
    }

    #[test]
    fn epochs_grow_past_the_floor() {
        assert_eq!(next_epoch(0, 10), 10);
        assert_eq!(next_epoch(10, 10), 11);
        assert_eq!(next_epoch(50, 10), 51);
    }
}
