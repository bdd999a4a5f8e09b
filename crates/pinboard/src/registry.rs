//! The registry: worker sessions, leases, control messages and the
//! operator's view.
//!
//! Owns the decisions of register, heartbeat, release, deregister, tag and
//! push. Takes the clock, randomness, the placement store and the challenge
//! prover as inputs (no sockets of its own: the HTTP shell is
//! [`http`], the prover an injected trait), so a simulation can
//! drive it. Never forwards client traffic and never caches routes.
//!
//! # Lifecycle of a session
//!
//! Unregistered → (challenge proved) Registered → renewed by each heartbeat
//! whose challenge proves → Lapsed when no heartbeat renews it within the
//! lease TTL (its placements become vacant), or Removed by deregister or
//! supersession.
//!
//! # Inferred choices
//!
//! - `expiresInMs` is the configured lease TTL; the record lapses that long
//!   after pinboard *received* the call (the worker anchors at send time, so
//!   the worker always gives up first).
//! - A heartbeat whose challenge cannot be reached answers 503 and does not
//!   renew; one that reaches a process answering the wrong value removes the
//!   session and answers 409 `reregister` (the URL no longer reaches it).
//!   A heartbeat without a challenge pair answers `reregister` as well.
//! - Re-registration with `prevSessionId` + `instances`: an id still owned by
//!   the previous session moves to the new one at the *same* epoch (the same
//!   process keeps the same instance); an id nobody live owns is claimed at a
//!   fresh epoch; an id another live session owns is a duplicate.
//! - Deployments (see also `crate::world`): the live sessions registered
//!   with the same hostname (case-insensitive) *and* the same `env` are one
//!   deployment slot; staging and production of one hostname never touch.
//!   A registration with a higher deployment `epoch` than every live
//!   session of its slot takes the slot over; one with a lower epoch than
//!   any of them is refused with 409; equal epochs share it (replicas).
//!   What happens to each older session is *its own* declared `takeover`:
//!   - none (the default): it is superseded at once (removed; its
//!     heartbeats answer 409 `superseded`; its ids move on their next
//!     request);
//!   - `"wind_down"`: it is operator-drained with a deadline of
//!     `--takeover-wind-down-ms` (its acks echo `draining: true` and the
//!     deadline: it takes no new ids, finishes what is in flight and
//!     releases its instances as they close, aborting the rest at the
//!     deadline), and its first heartbeat after the deadline is answered
//!     `superseded`;
//!   - `"deny"`: the newcomer is refused with 409 and nothing changes.
//!
//!   A newcomer is checked against every older session before any is
//!   touched. The check reads the live worker list and is not atomic across
//!   pinboard nodes (two racing registrations may both pass).
//! - An operator drain lives on the session record: the next acks echo
//!   `draining: true` with the remaining seconds; it is not carried over to a
//!   later session of the same process. Its deadline counts from its
//!   delivery, not from the push: the first heartbeat ack that carries it
//!   gives the whole duration asked for, and later acks count down from
//!   that heartbeat (see [`DrainDeadline`]).

pub mod auth;
pub mod error;
pub mod http;

use std::collections::HashMap;
use std::sync::Arc;

use pinned_wire::ids::{validate_id, validate_namespace};
use pinned_wire::registry::{
    ControlMessage, DeregisterRequest, Duplicate, HeartbeatAck, HeartbeatRequest, OverviewResponse,
    PlacementRow, PushRequest, RegisterAck, RegisterRequest, ReleaseItem, TagRequest, Takeover,
    WorkerRow, WorkersResponse,
};

pub use self::error::RegistryError;
use crate::challenge::{ChallengeError, ChallengeProver};
use crate::clock::{Clock, Entropy, EpochFloor, Now};
use crate::placement::InstanceKey;
use crate::placement::{DrainDeadline, LiveWorker, PlacementStore, ReclaimOutcome, WorkerRecord};
use crate::world::{validate_env, validate_hostname};

/// Namespaces pinboard serves itself (they could never be proxied).
pub const RESERVED_NAMESPACES: [&str; 5] =
    ["/registry", "/dashboard", "/healthz", "/readyz", "/metrics"];

/// How long a superseded session keeps answering `superseded`, in lease TTLs.
const SUPERSEDED_MEMORY_TTLS: u64 = 6;

/// Longest operator deadline (`drain` / `wind_down` `deadline`), in
/// seconds: one year. A larger one is a typo or an attack, and would
/// overflow the worker's timers (a `1e19` wind-down panicked the reference
/// worker's registration loop; a `1e17` drain wrapped to an immediate
/// abort), so it is refused with 400 instead of being passed on.
pub const MAX_OPERATOR_DEADLINE_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// Registry settings.
#[derive(Debug, Clone, Copy)]
pub struct RegistryConfig {
    /// Lease TTL granted to workers (ms).
    pub lease_ttl_ms: u64,
    /// How long an older session that declared `takeover: "wind_down"` is
    /// drained before it is superseded (ms).
    pub takeover_wind_down_ms: u64,
}

/// The registry core.
pub struct Registry<S, P> {
    store: Arc<S>,
    prover: P,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    floor: Arc<EpochFloor>,
    config: RegistryConfig,
}

impl<S, P> std::fmt::Debug for Registry<S, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("config", &self.config)
            .finish()
    }
}

/// What the HTTP shell must do besides answering (local cache upkeep).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Effects {
    /// Sessions that ended: drop cached routes to them.
    pub ended_sessions: Vec<String>,
}

fn malformed(msg: impl Into<String>) -> RegistryError {
    RegistryError::Malformed(msg.into())
}

fn challenge_error(e: ChallengeError) -> RegistryError {
    match e {
        ChallengeError::Unreachable(_) => RegistryError::ChallengeUnreachable(e),
        ChallengeError::Mismatch(_) => RegistryError::ChallengeFailed(e),
    }
}

/// Parse a wire epoch (`"<digits>"`).
fn parse_wire_epoch(epoch: Option<&str>) -> Result<Option<u64>, RegistryError> {
    epoch
        .map(|e| {
            pinned_wire::epoch::parse_epoch(e.as_bytes())
                .map_err(|_| malformed(format!("malformed epoch {e:?}")))
        })
        .transpose()
}

/// Validate an advertise URL: `http://host[:port][/base]` or
/// `https://host[:port][/base]` (verified against the Mozilla roots and
/// `--upstream-ca`), no query.
pub fn validate_advertise_url(url: &str) -> Result<(), RegistryError> {
    let uri: ::http::Uri = url
        .parse()
        .map_err(|_| malformed(format!("advertiseUrl is not a URL: {url:?}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https"))
        || uri.authority().is_none()
        || uri.query().is_some()
    {
        return Err(malformed(format!(
            "advertiseUrl must be http(s)://host[:port][/path]: {url:?}"
        )));
    }
    Ok(())
}

impl<S: PlacementStore, P: ChallengeProver> Registry<S, P> {
    /// A registry over `store`.
    pub fn new(
        store: Arc<S>,
        prover: P,
        clock: Arc<dyn Clock>,
        entropy: Arc<dyn Entropy>,
        floor: Arc<EpochFloor>,
        config: RegistryConfig,
    ) -> Self {
        Self {
            store,
            prover,
            clock,
            entropy,
            floor,
            config,
        }
    }

    fn now(&self) -> Now {
        self.clock.now()
    }

    /// The drain echo of an ack sent at `now`: `draining`, and the seconds
    /// left of the deadline (counted from its delivery, see
    /// [`DrainDeadline`]).
    fn drain_echo(record: &WorkerRecord, now: Now) -> (Option<bool>, Option<Option<f64>>) {
        match record.server_drain {
            None => (Some(false), None),
            Some(deadline) => (Some(true), Some(deadline.remaining_secs(now.wall_ms))),
        }
    }

    /// `POST /registry/register`.
    ///
    /// # Errors
    ///
    /// 400 for a malformed body, 503/403 for a failed challenge, 409 when the
    /// hostname is held, 503 when the store fails.
    pub async fn register(
        &self,
        req: RegisterRequest,
    ) -> Result<(RegisterAck, Effects), RegistryError> {
        if req.client_id.is_empty() || req.secret.is_empty() {
            return Err(malformed("clientId and secret must be non-empty"));
        }
        if req.namespaces.is_empty() {
            return Err(malformed("namespaces must not be empty"));
        }
        for ns in &req.namespaces {
            validate_namespace(ns).map_err(|e| malformed(e.to_string()))?;
            if RESERVED_NAMESPACES.contains(&ns.as_str()) {
                return Err(malformed(format!(
                    "namespace {ns:?} is reserved by pinboard"
                )));
            }
        }
        validate_advertise_url(&req.advertise_url)?;
        if req.challenge.is_empty() || req.challenge_value.is_empty() {
            return Err(malformed("challenge and challengeValue must be non-empty"));
        }
        let has_envs = req.envs.as_ref().is_some_and(|e| !e.is_empty());
        if (req.env.is_some() || req.takeover.is_some() || has_envs) && req.hostname.is_none() {
            return Err(malformed("env, envs and takeover require a hostname"));
        }
        if let Some(hostname) = &req.hostname {
            validate_hostname(hostname).map_err(malformed)?;
        }
        if let Some(env) = &req.env {
            validate_env(env).map_err(malformed)?;
        }
        for (ns, env) in req.envs.iter().flatten() {
            if !req.namespaces.contains(ns) {
                return Err(malformed(format!(
                    "envs names an unattached namespace {ns:?}"
                )));
            }
            validate_env(env).map_err(|e| malformed(format!("envs[{ns:?}]: {e}")))?;
        }
        let instances = req.instances.clone().unwrap_or_default();
        for (ns, ids) in &instances {
            if !req.namespaces.contains(ns) {
                return Err(malformed(format!(
                    "instances names an unattached namespace {ns:?}"
                )));
            }
            for id in ids {
                validate_id(id).map_err(|e| malformed(format!("instances: {e}")))?;
            }
        }
        self.prover
            .prove(
                &req.advertise_url,
                &req.secret,
                &req.challenge,
                &req.challenge_value,
            )
            .await
            .map_err(challenge_error)?;

        let now = self.now();
        let mut effects = Effects::default();
        let session_id = self.entropy.token_hex(16);
        let epoch = req.epoch.unwrap_or(0);
        if let Some(hostname) = &req.hostname {
            let displaced = self
                .take_over(
                    hostname,
                    req.env.as_deref(),
                    epoch,
                    req.prev_session_id.as_deref(),
                    now,
                )
                .await?;
            effects.ended_sessions.extend(displaced);
        }
        let record = WorkerRecord {
            session_id: session_id.clone(),
            client_id: req.client_id,
            secret: req.secret,
            advertise_url: req.advertise_url.trim_end_matches('/').to_owned(),
            namespaces: req.namespaces,
            headroom: req.headroom,
            draining: req.draining,
            server_drain: None,
            hostname: req.hostname,
            env: req.env,
            envs: req.envs.unwrap_or_default(),
            epoch,
            takeover: req.takeover,
            retire_at_wall_ms: None,
        };
        // Bound before the worker is live: a `Host` naming the hostname
        // selects its world from now on, on every node (`crate::world`).
        if let Some(hostname) = &record.hostname {
            self.store.bind_hostname(hostname, now).await?;
        }
        self.store
            .put_worker(&record, self.config.lease_ttl_ms, now)
            .await?;
        if let Some(prev) = &req.prev_session_id {
            effects.ended_sessions.push(prev.clone());
        }
        let mut duplicates = Vec::new();
        if !instances.is_empty() {
            // This node may not have noticed a store loss yet, and a
            // reclaim of a row the store lost mints from the floor alone.
            self.floor.reload_durable();
        }
        for (ns, ids) in &instances {
            for id in ids {
                let floor = self.floor.floor_for_claim(now).await;
                match self
                    .store
                    .reclaim(
                        InstanceKey::new(ns, id),
                        &session_id,
                        req.prev_session_id.as_deref(),
                        floor,
                        now,
                    )
                    .await?
                {
                    ReclaimOutcome::Reclaimed(p) => self.floor.minted(p.epoch).await,
                    ReclaimOutcome::Duplicate => duplicates.push(Duplicate {
                        ns: ns.clone(),
                        id: id.clone(),
                    }),
                }
            }
        }
        let (draining, drain_deadline) = Self::drain_echo(&record, now);
        Ok((
            RegisterAck {
                session_id,
                expires_in_ms: self.config.lease_ttl_ms,
                duplicates,
                draining,
                drain_deadline,
            },
            effects,
        ))
    }

    /// Apply the deployment rules (module doc) for a newcomer of
    /// `hostname`/`env` at deployment `epoch`; returns the sessions it
    /// superseded at once (wound-down ones stay live until their deadline).
    async fn take_over(
        &self,
        hostname: &str,
        env: Option<&str>,
        epoch: u64,
        prev: Option<&str>,
        now: Now,
    ) -> Result<Vec<String>, RegistryError> {
        let slot = |r: &WorkerRecord| {
            r.hostname
                .as_deref()
                .is_some_and(|h| h.eq_ignore_ascii_case(hostname))
                && r.env.as_deref() == env
                && Some(r.session_id.as_str()) != prev
        };
        let rivals: Vec<WorkerRecord> = self
            .store
            .list_workers(now)
            .await?
            .into_iter()
            .map(|w| w.record)
            .filter(|r| slot(r))
            .collect();
        let world = match env {
            Some(env) => format!("hostname {hostname:?} in env {env:?}"),
            None => format!("hostname {hostname:?}"),
        };
        if let Some(newer) = rivals.iter().map(|r| r.epoch).filter(|e| *e > epoch).max() {
            return Err(RegistryError::HostnameHeld(format!(
                "{world} is bound to deployment epoch {newer} (> {epoch})"
            )));
        }
        let older: Vec<&WorkerRecord> = rivals.iter().filter(|r| r.epoch < epoch).collect();
        if older.iter().any(|r| r.takeover == Some(Takeover::Deny)) {
            return Err(RegistryError::HostnameHeld(format!(
                "{world} is held by a session that denies takeover"
            )));
        }
        let mut displaced = Vec::new();
        for rival in older {
            if rival.takeover == Some(Takeover::WindDown) {
                if rival.retire_at_wall_ms.is_none() {
                    let deadline = now
                        .wall_ms
                        .saturating_add(self.config.takeover_wind_down_ms);
                    self.store
                        .wind_down_worker(&rival.session_id, deadline, now)
                        .await?;
                    tracing::info!(target: "pinboard::registry", session = %rival.session_id, %world, epoch, "winding an older deployment down");
                }
                continue;
            }
            let reason = format!("superseded by deployment epoch {epoch} of {world}");
            self.supersede(&rival.session_id, &reason, now).await?;
            displaced.push(rival.session_id.clone());
        }
        Ok(displaced)
    }

    /// Remove `session_id` and remember why (its heartbeats answer 409
    /// `superseded` for a while).
    async fn supersede(
        &self,
        session_id: &str,
        reason: &str,
        now: Now,
    ) -> Result<(), RegistryError> {
        self.store
            .mark_superseded(
                session_id,
                reason,
                self.config.lease_ttl_ms * SUPERSEDED_MEMORY_TTLS,
                now,
            )
            .await?;
        self.store.remove_worker(session_id).await?;
        Ok(())
    }

    /// `POST /registry/heartbeat`.
    ///
    /// # Errors
    ///
    /// 409 `reregister`/`superseded`, 503 when the challenge cannot be reached
    /// or the store fails.
    pub async fn heartbeat(
        &self,
        req: HeartbeatRequest,
    ) -> Result<(HeartbeatAck, Effects), RegistryError> {
        let now = self.now();
        if let Some(reason) = self.store.superseded(&req.session_id, now).await? {
            return Err(RegistryError::Superseded(reason));
        }
        let Some(live) = self.store.get_worker(&req.session_id, now).await? else {
            return Err(RegistryError::Reregister);
        };
        if live
            .record
            .retire_at_wall_ms
            .is_some_and(|at| at <= now.wall_ms)
        {
            let reason = format!(
                "wound down for a newer deployment of hostname {:?}",
                live.record.hostname.as_deref().unwrap_or_default()
            );
            self.supersede(&req.session_id, &reason, now).await?;
            return Err(RegistryError::Superseded(reason));
        }
        let (Some(challenge), Some(value)) = (&req.challenge, &req.challenge_value) else {
            return Err(RegistryError::Reregister);
        };
        let record = &live.record;
        match self
            .prover
            .prove(&record.advertise_url, &record.secret, challenge, value)
            .await
        {
            Ok(()) => {}
            Err(e @ ChallengeError::Unreachable(_)) => {
                return Err(RegistryError::ChallengeUnreachable(e))
            }
            Err(ChallengeError::Mismatch(_)) => {
                self.store.remove_worker(&req.session_id).await?;
                return Err(RegistryError::Reregister);
            }
        }
        let now = self.now();
        let Some(record) = self
            .store
            .renew_worker(
                &req.session_id,
                req.headroom,
                req.draining,
                self.config.lease_ttl_ms,
                now,
            )
            .await?
        else {
            return Err(RegistryError::Reregister);
        };
        let messages = self
            .store
            .pending_messages(&req.session_id, &req.acks)
            .await?;
        let (draining, drain_deadline) = Self::drain_echo(&record, now);
        Ok((
            HeartbeatAck {
                expires_in_ms: self.config.lease_ttl_ms,
                messages,
                draining,
                drain_deadline,
            },
            Effects::default(),
        ))
    }

    /// `POST /registry/release`: frees each placement its session still owns
    /// (at the given epoch). Returns how many were freed.
    ///
    /// # Errors
    ///
    /// 400 when any item's epoch is malformed; 503 when the store fails.
    pub async fn release(&self, items: Vec<ReleaseItem>) -> Result<usize, RegistryError> {
        let mut parsed = Vec::with_capacity(items.len());
        for item in &items {
            parsed.push(parse_wire_epoch(item.epoch.as_deref())?);
        }
        let mut freed = 0;
        for (item, epoch) in items.iter().zip(parsed) {
            if self
                .store
                .release(
                    InstanceKey::new(&item.namespace, &item.id),
                    &item.session_id,
                    epoch,
                )
                .await?
            {
                freed += 1;
            }
        }
        Ok(freed)
    }

    /// `POST /registry/deregister`: ends the session (idempotent).
    ///
    /// # Errors
    ///
    /// 503 when the store fails.
    pub async fn deregister(&self, req: DeregisterRequest) -> Result<Effects, RegistryError> {
        self.store.remove_worker(&req.session_id).await?;
        Ok(Effects {
            ended_sessions: vec![req.session_id],
        })
    }

    /// `POST /registry/tag`. Returns whether the tag was stamped.
    ///
    /// # Errors
    ///
    /// 400 for a malformed epoch; 503 when the store fails.
    pub async fn tag(&self, req: TagRequest) -> Result<bool, RegistryError> {
        let epoch = parse_wire_epoch(req.epoch.as_deref())?;
        Ok(self
            .store
            .tag(
                InstanceKey::new(&req.namespace, &req.id),
                &req.session_id,
                epoch,
                &req.tag,
            )
            .await?)
    }

    /// `POST /registry/push` (operator).
    ///
    /// # Errors
    ///
    /// 400 for a bad deadline/namespace/id, 404 for an unknown session.
    pub async fn push(&self, req: PushRequest) -> Result<Option<String>, RegistryError> {
        let now = self.now();
        let check_deadline = |d: Option<f64>| -> Result<(), RegistryError> {
            match d {
                Some(d) if !d.is_finite() || d < 0.0 => Err(malformed(
                    "deadline must be a non-negative number of seconds or null",
                )),
                Some(d) if d > MAX_OPERATOR_DEADLINE_SECS => Err(malformed(format!(
                    "deadline must be at most {MAX_OPERATOR_DEADLINE_SECS:.0} seconds (one year)"
                ))),
                _ => Ok(()),
            }
        };
        match req {
            PushRequest::Drain {
                session_id,
                deadline,
            } => {
                check_deadline(deadline)?;
                // Counted from the ack that delivers it, not from now.
                let drain = deadline.map_or(DrainDeadline::Never, |d| {
                    DrainDeadline::AfterDelivery((d * 1000.0) as u64)
                });
                if !self
                    .store
                    .set_server_drain(&session_id, Some(drain), now)
                    .await?
                {
                    return Err(RegistryError::UnknownSession);
                }
                Ok(None)
            }
            PushRequest::Undrain { session_id } => {
                if !self.store.set_server_drain(&session_id, None, now).await? {
                    return Err(RegistryError::UnknownSession);
                }
                Ok(None)
            }
            PushRequest::WindDown {
                session_id,
                ns,
                id,
                deadline,
            } => {
                check_deadline(deadline)?;
                validate_namespace(&ns).map_err(|e| malformed(e.to_string()))?;
                validate_id(&id).map_err(|e| malformed(e.to_string()))?;
                let Some(live) = self.store.get_worker(&session_id, now).await? else {
                    return Err(RegistryError::UnknownSession);
                };
                if !live.record.hosts(&ns) {
                    return Err(malformed(format!("session does not host namespace {ns:?}")));
                }
                let msg_id = self
                    .store
                    .push_message(
                        &session_id,
                        ControlMessage {
                            kind: "wind_down".into(),
                            id,
                            ns: Some(ns),
                            deadline,
                            msg_id: None,
                        },
                    )
                    .await?;
                Ok(Some(msg_id))
            }
        }
    }

    fn worker_row(w: &LiveWorker, counts: &HashMap<String, u64>) -> WorkerRow {
        let r = &w.record;
        WorkerRow {
            session_id: r.session_id.clone(),
            client_id: r.client_id.clone(),
            advertise_url: r.advertise_url.clone(),
            namespaces: r.namespaces.clone(),
            headroom: r.headroom,
            draining: r.refuses_new_ids(),
            hostname: r.hostname.clone(),
            env: r.env.clone(),
            epoch: r.epoch,
            expires_in_ms: w.expires_in_ms,
            instances: counts.get(&r.session_id).copied().unwrap_or(0),
        }
    }

    /// `GET /registry/workers`.
    ///
    /// # Errors
    ///
    /// 503 when the store fails.
    pub async fn workers(&self) -> Result<WorkersResponse, RegistryError> {
        Ok(self.overview(None).await?.0)
    }

    /// `GET /registry/overview[?tag=]`: live workers plus owned placements.
    ///
    /// # Errors
    ///
    /// 503 when the store fails.
    pub async fn overview(
        &self,
        tag: Option<&str>,
    ) -> Result<(WorkersResponse, OverviewResponse), RegistryError> {
        let now = self.now();
        let workers = self.store.list_workers(now).await?;
        let placements = self.store.list_placements(now).await?;
        let mut counts: HashMap<String, u64> = HashMap::new();
        for p in placements.iter().filter(|p| p.live) {
            *counts.entry(p.placement.session_id.clone()).or_default() += 1;
        }
        let rows: Vec<WorkerRow> = workers
            .iter()
            .map(|w| Self::worker_row(w, &counts))
            .collect();
        let placements = placements
            .into_iter()
            .filter(|p| tag.is_none_or(|t| p.tag.as_deref() == Some(t)))
            .map(|p| PlacementRow {
                ns: p.ns,
                id: p.id,
                session_id: p.placement.session_id,
                epoch: p.placement.epoch.to_string(),
                tag: p.tag,
                live: p.live,
            })
            .collect();
        Ok((
            WorkersResponse {
                workers: rows.clone(),
            },
            OverviewResponse {
                workers: rows,
                placements,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SeededEntropy;
    use crate::placement::MemoryStore;
    use parking_lot::Mutex;
    use std::collections::BTreeMap;

    struct FakeClock(Mutex<Now>);
    impl Clock for FakeClock {
        fn now(&self) -> Now {
            *self.0.lock()
        }
    }

    /// Proves when the value is "ok", unreachable for "down", mismatch otherwise.
    struct FakeProver;
    impl ChallengeProver for FakeProver {
        async fn prove(
            &self,
            _u: &str,
            _s: &str,
            _c: &str,
            value: &str,
        ) -> Result<(), ChallengeError> {
            match value {
                "ok" => Ok(()),
                "down" => Err(ChallengeError::Unreachable("down".into())),
                _ => Err(ChallengeError::Mismatch("wrong".into())),
            }
        }
    }

    fn registry() -> (
        Registry<MemoryStore, FakeProver>,
        Arc<FakeClock>,
        Arc<MemoryStore>,
    ) {
        let clock = Arc::new(FakeClock(Mutex::new(Now {
            wall_ms: 1_000_000,
            mono_ms: 0,
        })));
        let store = Arc::new(MemoryStore::new());
        let reg = Registry::new(
            store.clone(),
            FakeProver,
            clock.clone(),
            Arc::new(SeededEntropy::seeded(1)),
            Arc::new(EpochFloor::default()),
            RegistryConfig {
                lease_ttl_ms: 2000,
                takeover_wind_down_ms: 5000,
            },
        );
        (reg, clock, store)
    }

    fn register_req(value: &str) -> RegisterRequest {
        RegisterRequest {
            client_id: "c".into(),
            secret: "s".into(),
            namespaces: vec!["/counter".into()],
            advertise_url: "http://127.0.0.1:9".into(),
            headroom: 10,
            draining: false,
            challenge: "ch".into(),
            challenge_value: value.into(),
            hostname: None,
            env: None,
            envs: None,
            takeover: None,
            epoch: None,
            prev_session_id: None,
            instances: None,
        }
    }

    fn beat(sid: &str, acks: Vec<String>) -> HeartbeatRequest {
        HeartbeatRequest {
            session_id: sid.into(),
            headroom: 5,
            draining: false,
            challenge: Some("ch".into()),
            challenge_value: Some("ok".into()),
            acks,
        }
    }

    #[tokio::test]
    async fn register_heartbeat_lapse() {
        let (reg, clock, _) = registry();
        let (ack, _) = reg.register(register_req("ok")).await.expect("register");
        assert_eq!(ack.expires_in_ms, 2000);
        assert_eq!(ack.session_id.len(), 32);
        reg.heartbeat(beat(&ack.session_id, vec![]))
            .await
            .expect("beat");
        clock.0.lock().mono_ms = 2500;
        let err = reg
            .heartbeat(beat(&ack.session_id, vec![]))
            .await
            .expect_err("lapsed");
        assert!(matches!(err, RegistryError::Reregister));
    }

    #[tokio::test]
    async fn challenge_failures_are_classified() {
        let (reg, _, _) = registry();
        assert_eq!(
            reg.register(register_req("down"))
                .await
                .expect_err("503")
                .status(),
            503
        );
        assert_eq!(
            reg.register(register_req("bad"))
                .await
                .expect_err("403")
                .status(),
            403
        );
        for ns in ["nope", "/registry"] {
            let mut req = register_req("ok");
            req.namespaces = vec![ns.into()];
            assert_eq!(reg.register(req).await.expect_err("400").status(), 400);
        }
    }

    #[tokio::test]
    async fn wind_down_is_redelivered_until_acked_and_drain_echoes() {
        let (reg, _, _) = registry();
        let (ack, _) = reg.register(register_req("ok")).await.expect("register");
        let sid = ack.session_id;
        let msg_id = reg
            .push(PushRequest::WindDown {
                session_id: sid.clone(),
                ns: "/counter".into(),
                id: "a".into(),
                deadline: Some(1.0),
            })
            .await
            .expect("push")
            .expect("msg id");
        let (hb, _) = reg.heartbeat(beat(&sid, vec![])).await.expect("beat");
        assert_eq!(hb.messages.len(), 1);
        let (hb, _) = reg.heartbeat(beat(&sid, vec![])).await.expect("beat");
        assert_eq!(hb.messages.len(), 1);
        let (hb, _) = reg.heartbeat(beat(&sid, vec![msg_id])).await.expect("beat");
        assert!(hb.messages.is_empty());
        reg.push(PushRequest::Drain {
            session_id: sid.clone(),
            deadline: Some(30.0),
        })
        .await
        .expect("drain");
        let (hb, _) = reg.heartbeat(beat(&sid, vec![])).await.expect("beat");
        assert_eq!(hb.draining, Some(true));
        assert_eq!(hb.drain_deadline, Some(Some(30.0)));
        assert!(matches!(
            reg.push(PushRequest::Undrain {
                session_id: "nope".into()
            })
            .await,
            Err(RegistryError::UnknownSession)
        ));
    }

    #[tokio::test]
    async fn operator_deadlines_beyond_a_year_are_refused() {
        let (reg, _, _) = registry();
        let (ack, _) = reg.register(register_req("ok")).await.expect("register");
        let sid = ack.session_id;
        let wind_down = |deadline| PushRequest::WindDown {
            session_id: sid.clone(),
            ns: "/counter".into(),
            id: "a".into(),
            deadline: Some(deadline),
        };
        let drain = |deadline| PushRequest::Drain {
            session_id: sid.clone(),
            deadline: Some(deadline),
        };
        for push in [
            wind_down(1e19),
            drain(1e17),
            drain(MAX_OPERATOR_DEADLINE_SECS + 1.0),
        ] {
            let err = reg.push(push).await.expect_err("refused");
            assert_eq!(err.status(), 400);
            assert!(err.to_string().contains("one year"), "{err}");
        }
        reg.push(wind_down(MAX_OPERATOR_DEADLINE_SECS))
            .await
            .expect("a year is fine");
        reg.push(drain(MAX_OPERATOR_DEADLINE_SECS))
            .await
            .expect("a year is fine");
    }

    #[tokio::test]
    async fn a_drain_deadline_counts_from_the_ack_that_delivers_it() {
        let (reg, clock, _) = registry();
        let (ack, _) = reg.register(register_req("ok")).await.expect("register");
        let sid = ack.session_id;
        reg.push(PushRequest::Drain {
            session_id: sid.clone(),
            deadline: Some(10.0),
        })
        .await
        .expect("drain");
        // The worker's next heartbeat comes most of an interval later.
        clock.0.lock().wall_ms += 2_900;
        let (hb, _) = reg.heartbeat(beat(&sid, vec![])).await.expect("beat");
        assert_eq!(hb.drain_deadline, Some(Some(10.0)), "the whole deadline");
        clock.0.lock().wall_ms += 3_000;
        let (hb, _) = reg.heartbeat(beat(&sid, vec![])).await.expect("beat");
        assert_eq!(hb.drain_deadline, Some(Some(7.0)), "counting down");
        clock.0.lock().wall_ms += 60_000;
        let (hb, _) = reg.heartbeat(beat(&sid, vec![])).await.expect("beat");
        assert_eq!(hb.drain_deadline, Some(Some(0.0)), "passed");
        // A new push starts over from its own delivery.
        reg.push(PushRequest::Drain {
            session_id: sid.clone(),
            deadline: Some(2.0),
        })
        .await
        .expect("drain again");
        clock.0.lock().wall_ms += 1_500;
        let (hb, _) = reg.heartbeat(beat(&sid, vec![])).await.expect("beat");
        assert_eq!(hb.drain_deadline, Some(Some(2.0)));
    }

    #[tokio::test]
    async fn reregister_reclaims_and_reports_duplicates() {
        let (reg, _, store) = registry();
        let (a, _) = reg.register(register_req("ok")).await.expect("a");
        let (b, _) = reg.register(register_req("ok")).await.expect("b");
        let now = Now {
            wall_ms: 1_000_000,
            mono_ms: 0,
        };
        let generation = store
            .open_generation(&crate::placement::Generation::new("g", 0))
            .await
            .expect("generation");
        store
            .resolve_or_claim(
                InstanceKey::new("/counter", "mine"),
                Some(&a.session_id),
                None,
                1,
                &generation,
                now,
            )
            .await
            .expect("claim");
        store
            .resolve_or_claim(
                InstanceKey::new("/counter", "theirs"),
                Some(&b.session_id),
                None,
                1,
                &generation,
                now,
            )
            .await
            .expect("claim");
        let mut req = register_req("ok");
        req.prev_session_id = Some(a.session_id.clone());
        req.instances = Some(BTreeMap::from([(
            "/counter".to_owned(),
            vec!["mine".to_owned(), "theirs".to_owned()],
        )]));
        let (ack, effects) = reg.register(req).await.expect("re-register");
        assert_eq!(
            ack.duplicates,
            vec![Duplicate {
                ns: "/counter".into(),
                id: "theirs".into()
            }]
        );
        assert_eq!(effects.ended_sessions, vec![a.session_id]);
    }

    #[tokio::test]
    async fn newer_deployment_supersedes_the_hostname() {
        let (reg, _, _) = registry();
        let mut old = register_req("ok");
        old.hostname = Some("app".into());
        old.epoch = Some(1);
        let (a, _) = reg.register(old.clone()).await.expect("old");
        let mut new = old.clone();
        new.epoch = Some(2);
        let (_, effects) = reg.register(new).await.expect("new");
        assert_eq!(effects.ended_sessions, vec![a.session_id.clone()]);
        let err = reg
            .heartbeat(beat(&a.session_id, vec![]))
            .await
            .expect_err("superseded");
        assert!(matches!(err, RegistryError::Superseded(_)));
        assert_eq!(reg.register(old).await.expect_err("older").status(), 409);
    }

    fn deployment(hostname: &str, env: Option<&str>, epoch: u64) -> RegisterRequest {
        let mut req = register_req("ok");
        req.hostname = Some(hostname.into());
        req.env = env.map(Into::into);
        req.epoch = Some(epoch);
        req
    }

    #[tokio::test]
    async fn environments_of_one_hostname_never_supersede_each_other() {
        let (reg, _, _) = registry();
        let (prod, _) = reg
            .register(deployment("app", Some("production"), 5))
            .await
            .expect("production");
        let (staging, effects) = reg
            .register(deployment("APP", Some("staging"), 9))
            .await
            .expect("staging");
        assert!(effects.ended_sessions.is_empty());
        // An older staging deployment is refused by staging, not production.
        let err = reg
            .register(deployment("app", Some("staging"), 1))
            .await
            .expect_err("older staging");
        assert_eq!(err.status(), 409);
        for sid in [&prod.session_id, &staging.session_id] {
            reg.heartbeat(beat(sid, vec![])).await.expect("both live");
        }
    }

    #[tokio::test]
    async fn a_newer_deployment_supersedes_every_replica_of_the_older_one() {
        let (reg, _, _) = registry();
        let (a, _) = reg.register(deployment("app", None, 1)).await.expect("a");
        let (b, _) = reg.register(deployment("app", None, 1)).await.expect("b");
        let (_, effects) = reg.register(deployment("app", None, 2)).await.expect("new");
        assert_eq!(effects.ended_sessions.len(), 2);
        for sid in [&a.session_id, &b.session_id] {
            let err = reg.heartbeat(beat(sid, vec![])).await.expect_err("gone");
            assert!(matches!(err, RegistryError::Superseded(_)), "{err:?}");
        }
    }

    #[tokio::test]
    async fn wind_down_drains_the_incumbent_until_its_deadline() {
        let (reg, clock, _) = registry();
        let mut old = deployment("app", Some("production"), 1);
        old.takeover = Some(Takeover::WindDown);
        let (a, _) = reg.register(old).await.expect("old");
        let (_, effects) = reg
            .register(deployment("app", Some("production"), 2))
            .await
            .expect("new");
        assert!(effects.ended_sessions.is_empty(), "still winding down");
        let (ack, _) = reg
            .heartbeat(beat(&a.session_id, vec![]))
            .await
            .expect("live");
        assert_eq!(ack.draining, Some(true));
        assert_eq!(ack.drain_deadline, Some(Some(5.0)));
        // A third deployment keeps the first deadline.
        clock.0.lock().wall_ms += 4_000;
        reg.register(deployment("app", Some("production"), 3))
            .await
            .expect("newest");
        let (ack, _) = reg
            .heartbeat(beat(&a.session_id, vec![]))
            .await
            .expect("live");
        assert_eq!(ack.drain_deadline, Some(Some(1.0)));
        clock.0.lock().wall_ms += 1_000;
        let err = reg
            .heartbeat(beat(&a.session_id, vec![]))
            .await
            .expect_err("superseded at the deadline");
        assert!(matches!(err, RegistryError::Superseded(_)), "{err:?}");
        let err = reg
            .heartbeat(beat(&a.session_id, vec![]))
            .await
            .expect_err("and stays so");
        assert!(matches!(err, RegistryError::Superseded(_)), "{err:?}");
    }

    #[tokio::test]
    async fn deny_refuses_the_newcomer_and_keeps_every_incumbent() {
        let (reg, _, _) = registry();
        let (plain, _) = reg.register(deployment("app", None, 1)).await.expect("a");
        let mut denying = deployment("app", None, 1);
        denying.takeover = Some(Takeover::Deny);
        let (deny, _) = reg.register(denying).await.expect("b");
        let err = reg
            .register(deployment("app", None, 2))
            .await
            .expect_err("denied");
        assert_eq!(err.status(), 409);
        // Nothing was touched before the refusal.
        for sid in [&plain.session_id, &deny.session_id] {
            reg.heartbeat(beat(sid, vec![])).await.expect("kept");
        }
    }

    #[tokio::test]
    async fn malformed_worlds_are_refused_at_registration() {
        let (reg, _, _) = registry();
        let mut bad_host = register_req("ok");
        bad_host.hostname = Some("a b".into());
        let mut env_alone = register_req("ok");
        env_alone.envs = Some([("/counter".to_owned(), "staging".to_owned())].into());
        let mut foreign_ns = deployment("app", None, 0);
        foreign_ns.envs = Some([("/other".to_owned(), "staging".to_owned())].into());
        let mut bad_env = deployment("app", Some(""), 0);
        bad_env.epoch = None;
        for req in [bad_host, env_alone, foreign_ns, bad_env] {
            let err = reg.register(req.clone()).await.expect_err("malformed");
            assert_eq!(err.status(), 400, "{req:?}");
        }
    }
}
