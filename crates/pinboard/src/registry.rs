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
//!   the previous session, or by any other session of the same `clientId`
//!   at the same advertise URL (one process; its register ack was lost), moves to the new one at the
//!   *same* epoch (the same process keeps the same instance); an id nobody
//!   live owns is claimed at a fresh epoch; an id another live session owns
//!   is a duplicate. The process's other sessions are ended once the
//!   reclaims are done (quietly: it never hears `superseded`).
//! - One advertise URL, one process (the seeds' rule): a registration that
//!   proved its advertise URL supersedes every live session of another
//!   client at that URL at once (a crash and restart), so their ids move on
//!   their next request instead of waiting out the dead session's lease;
//!   the move is recorded as `replaced` (see [`admission`]).
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
//!   touched, and the check is atomic in the store: the decision is taken
//!   from the live sessions read at a deployment version and applied in one
//!   step only if that version still holds (else read and decided again, at
//!   most [`ADMISSION_ATTEMPTS`] times), so two deployments registering
//!   through two pinboard nodes at once cannot both pass it.
//! - An operator drain lives on the session record: the next acks echo
//!   `draining: true` with the remaining seconds; it is not carried over to a
//!   later session of the same process. Its deadline counts from its
//!   delivery, not from the push: the first heartbeat ack that carries it
//!   gives the whole duration asked for, and later acks count down from
//!   that heartbeat (see [`DrainDeadline`]).

pub mod admission;
pub mod auth;
pub mod error;
pub mod http;

use std::collections::HashMap;
use std::sync::Arc;

use pinned_wire::ids::{validate_id, validate_namespace};
use pinned_wire::registry::{
    ControlMessage, DeregisterRequest, Duplicate, HeartbeatAck, HeartbeatRequest, OverviewResponse,
    PlacementRow, PushRequest, RegisterAck, RegisterRequest, ReleaseItem, TagRequest, WorkerRow,
    WorkersResponse,
};

pub use self::error::RegistryError;
use crate::challenge::{ChallengeError, ChallengeProver};
use crate::clock::{Clock, Entropy, EpochFloor, Now};
use crate::placement::InstanceKey;
use crate::placement::{
    Admission, DrainDeadline, LiveWorker, PlacementStore, ReclaimOutcome, WorkerRecord,
};
use crate::world::{validate_env, validate_hostname};

/// Namespaces pinboard serves itself (they could never be proxied).
pub const RESERVED_NAMESPACES: [&str; 5] =
    ["/registry", "/dashboard", "/healthz", "/readyz", "/metrics"];

/// How long a superseded session keeps answering `superseded`, in lease TTLs.
const SUPERSEDED_MEMORY_TTLS: u64 = 6;

/// Most times a registration decides again because another registration
/// changed the deployment bindings between its read and its write (each
/// retry means that other registration went through); past it the worker
/// is answered 503 + `Retry-After` and registers again.
pub const ADMISSION_ATTEMPTS: usize = 8;

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
    /// Sessions that ended (deregistered, or by their own process's
    /// re-registration): drop cached routes to them.
    pub ended_sessions: Vec<String>,
    /// Sessions superseded by a new process at their advertise URL (a
    /// restart): drop cached routes to them, their ids' next claims are
    /// moves of that kind.
    pub replaced_sessions: Vec<String>,
    /// Sessions superseded by a newer deployment of their hostname: drop
    /// cached routes to them, their ids' next claims are takeovers.
    pub taken_over_sessions: Vec<String>,
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

        let session_id = self.entropy.token_hex(16);
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
            epoch: req.epoch.unwrap_or(0),
            takeover: req.takeover,
            retire_at_wall_ms: None,
        };
        // Bound before the worker is live: a `Host` naming the hostname
        // selects its world from now on, on every node (`crate::world`).
        if let Some(hostname) = &record.hostname {
            self.store.bind_hostname(hostname, self.now()).await?;
        }
        let prev = req.prev_session_id.as_deref();
        let (plan, now) = self.admit(&record, prev).await?;
        let mut effects = Effects::default();
        effects.taken_over_sessions.extend(
            plan.supersede
                .iter()
                .map(|(session, _)| session)
                .filter(|session| !plan.replaced.contains(session))
                .cloned(),
        );
        effects.replaced_sessions.clone_from(&plan.replaced);
        let mut earlier: Vec<&str> = plan.earlier.iter().map(String::as_str).collect();
        if let Some(prev) = prev {
            if !earlier.contains(&prev) {
                earlier.push(prev);
            }
        }
        effects
            .ended_sessions
            .extend(earlier.iter().map(|s| (*s).to_owned()));
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
                    .reclaim(InstanceKey::new(ns, id), &session_id, &earlier, floor, now)
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
        // The process's own earlier sessions go only now: until its
        // reclaims were done, the ids they owned were not vacant.
        for session in &plan.ended {
            self.store.remove_worker(session).await?;
        }
        let (draining, drain_deadline) = Self::drain_echo(&record, now);
        tracing::info!(
            target: "pinboard::registry",
            session = %session_id,
            advertise_url = %record.advertise_url,
            namespaces = ?record.namespaces,
            hostname = record.hostname.as_deref().unwrap_or(""),
            reclaimed = instances.values().map(Vec::len).sum::<usize>() - duplicates.len(),
            duplicates = duplicates.len(),
            "worker registered"
        );
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

    /// Put `record` in the store with what registering it does to the live
    /// sessions ([`admission::plan`]), atomically: decided from a read at a
    /// deployment version and applied only while that version holds.
    /// Returns the plan applied and the time it was decided at.
    async fn admit(
        &self,
        record: &WorkerRecord,
        prev: Option<&str>,
    ) -> Result<(admission::Plan, Now), RegistryError> {
        for _ in 0..ADMISSION_ATTEMPTS {
            let now = self.now();
            // Read before the sessions: whatever registration changes them
            // after this read also changes the version.
            let version = match record.hostname {
                Some(_) => Some(self.store.deployment_version().await?),
                None => None,
            };
            let live = self.store.list_workers(now).await?;
            let plan =
                admission::plan(record, prev, &live, now, self.config.takeover_wind_down_ms)?;
            let applied = self
                .store
                .admit_worker(
                    &Admission {
                        record,
                        ttl_ms: self.config.lease_ttl_ms,
                        expected_version: version,
                        supersede: &plan.supersede,
                        superseded_ttl_ms: self.config.lease_ttl_ms * SUPERSEDED_MEMORY_TTLS,
                        wind_down: &plan.wind_down,
                    },
                    now,
                )
                .await?;
            if !applied {
                tracing::debug!(target: "pinboard::registry", session = %record.session_id, "deployment bindings changed while registering; deciding again");
                continue;
            }
            for (session, reason) in &plan.supersede {
                tracing::info!(target: "pinboard::registry", %session, by = %record.session_id, %reason, "session superseded");
            }
            for (session, _) in &plan.wind_down {
                tracing::info!(target: "pinboard::registry", %session, by = %record.session_id, epoch = record.epoch, "winding an older deployment down");
            }
            return Ok((plan, now));
        }
        Err(RegistryError::Contended)
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
        if self.store.remove_worker(&req.session_id).await? {
            tracing::info!(target: "pinboard::registry", session = %req.session_id, "worker deregistered");
        }
        Ok(Effects {
            ended_sessions: vec![req.session_id],
            ..Effects::default()
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
    use crate::clock::fake::FakeClock;
    use crate::clock::SeededEntropy;
    use crate::placement::MemoryStore;
    use pinned_wire::registry::Takeover;
    use std::collections::BTreeMap;

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
        let clock = Arc::new(FakeClock::at(1_000_000));
        let store = Arc::new(MemoryStore::new());
        let reg = registry_over(store.clone(), clock.clone());
        (reg, clock, store)
    }

    fn registry_over<S: PlacementStore>(
        store: Arc<S>,
        clock: Arc<FakeClock>,
    ) -> Registry<S, FakeProver> {
        Registry::new(
            store,
            FakeProver,
            clock,
            Arc::new(SeededEntropy::seeded(1)),
            Arc::new(EpochFloor::default()),
            RegistryConfig {
                lease_ttl_ms: 2000,
                takeover_wind_down_ms: 5000,
            },
        )
    }

    /// A registration of a new process (its own client id and port).
    fn register_req(value: &str) -> RegisterRequest {
        static PROCESSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PROCESSES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RegisterRequest {
            client_id: format!("c{n}"),
            secret: "s".into(),
            namespaces: vec!["/counter".into()],
            advertise_url: format!("http://127.0.0.1:{}", 9000 + n),
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
        let (_, effects) = reg.register(deployment("app", None, 2)).await.expect("new");
        assert_eq!(effects.taken_over_sessions, vec![a.session_id.clone()]);
        assert!(effects.ended_sessions.is_empty(), "{effects:?}");
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
        assert!(effects.taken_over_sessions.is_empty());
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
        assert_eq!(effects.taken_over_sessions.len(), 2);
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
        assert!(effects.taken_over_sessions.is_empty(), "still winding down");
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

    /// Two deployments of one hostname registering at once, as through two
    /// pinboard nodes: the first reads the live sessions, the second goes
    /// through whole, and only then does the first act on what it read.
    /// The newest deployment must end up alone in its slot.
    async fn racing_deployments<S: PlacementStore>(store: S) {
        let clock = Arc::new(FakeClock::at(1_000_000));
        let store = Arc::new(crate::placement::gated::Gated::new(store));
        let reg = registry_over(store.clone(), clock.clone());
        let (incumbent, _) = reg
            .register(deployment("app", None, 1))
            .await
            .expect("incumbent");
        store.arm();
        let slow = reg.register(deployment("app", None, 2));
        let fast = async {
            store.paused().await;
            let registered = reg.register(deployment("app", None, 3)).await;
            store.release();
            registered
        };
        let (slow, fast) = tokio::join!(slow, fast);
        let (newest, effects) = fast.expect("the newest deployment");
        assert_eq!(effects.taken_over_sessions, vec![incumbent.session_id]);
        let err = slow.expect_err("the older newcomer must see the newest one");
        assert_eq!(err.status(), 409, "{err}");
        assert!(err.to_string().contains("epoch 3 (> 2)"), "{err}");
        let live: Vec<(String, u64)> = store
            .list_workers(clock.now())
            .await
            .expect("list")
            .into_iter()
            .map(|w| (w.record.session_id, w.record.epoch))
            .collect();
        assert_eq!(live, vec![(newest.session_id, 3)]);
    }

    #[tokio::test]
    async fn racing_deployments_cannot_both_pass_the_takeover_check() {
        racing_deployments(MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn racing_deployments_cannot_both_pass_the_takeover_check_in_redis() {
        let redis = test_support::RedisServer::start();
        let store = crate::placement::RedisStore::connect(&redis.url, "race:")
            .await
            .expect("redis");
        racing_deployments(store).await;
    }

    #[tokio::test]
    async fn a_new_process_at_an_advertise_url_supersedes_the_one_it_replaced() {
        let (reg, clock, store) = registry();
        let crashed = register_req("ok");
        let (ghost, _) = reg
            .register(crashed.clone())
            .await
            .expect("before the crash");
        let (neighbour, _) = reg
            .register(register_req("ok"))
            .await
            .expect("another worker");
        let generation = store
            .open_generation(&crate::placement::Generation::new("g", 0))
            .await
            .expect("generation");
        let claim = |candidate: String| {
            let (store, generation, now) = (store.clone(), generation.clone(), clock.now());
            async move {
                store
                    .resolve_or_claim(
                        InstanceKey::new("/counter", "x"),
                        Some(&candidate),
                        None,
                        1,
                        &generation,
                        now,
                    )
                    .await
                    .expect("claim")
            }
        };
        let crate::placement::ClaimOutcome::Claimed(first, _) =
            claim(ghost.session_id.clone()).await
        else {
            panic!("x not placed");
        };
        // Restarted at once on the same advertise URL: a new client id.
        let mut restarted = register_req("ok");
        restarted.advertise_url = format!("{}/", crashed.advertise_url);
        let (new, effects) = reg.register(restarted).await.expect("after the restart");
        assert_eq!(effects.replaced_sessions, vec![ghost.session_id.clone()]);
        assert!(effects.ended_sessions.is_empty(), "{effects:?}");
        let err = reg
            .heartbeat(beat(&ghost.session_id, vec![]))
            .await
            .expect_err("the ghost is gone");
        assert!(
            err.to_string().contains("new process at its advertise URL"),
            "{err}"
        );
        reg.heartbeat(beat(&neighbour.session_id, vec![]))
            .await
            .expect("another URL is another process");
        // Its id moves on its next request, above the ghost's epoch.
        match claim(new.session_id.clone()).await {
            crate::placement::ClaimOutcome::Claimed(p, from) => {
                assert_eq!(from, Some(ghost.session_id.clone()));
                assert_eq!(p.session_id, new.session_id);
                assert!(p.epoch > first.epoch);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_process_reregistering_reclaims_from_every_session_of_its_own() {
        let (reg, clock, store) = registry();
        let process = register_req("ok");
        // Its register ack was lost: pinboard knows a session it never
        // heard of, which owns an id it holds.
        let (unheard, _) = reg.register(process.clone()).await.expect("first");
        let generation = store
            .open_generation(&crate::placement::Generation::new("g", 0))
            .await
            .expect("generation");
        let crate::placement::ClaimOutcome::Claimed(held, _) = store
            .resolve_or_claim(
                InstanceKey::new("/counter", "x"),
                Some(&unheard.session_id),
                None,
                7,
                &generation,
                clock.now(),
            )
            .await
            .expect("claim")
        else {
            panic!("x not placed");
        };
        let mut again = process.clone();
        again.prev_session_id = Some("an-older-one".into());
        again.instances = Some(BTreeMap::from([(
            "/counter".to_owned(),
            vec!["x".to_owned()],
        )]));
        let (ack, effects) = reg.register(again).await.expect("again");
        assert!(ack.duplicates.is_empty(), "its own id is no duplicate");
        let row = store
            .placement(InstanceKey::new("/counter", "x"), clock.now())
            .await
            .expect("read")
            .expect("row");
        assert_eq!(
            (row.placement.session_id, row.placement.epoch),
            (ack.session_id, held.epoch),
            "reclaimed at its epoch"
        );
        assert!(effects.ended_sessions.contains(&unheard.session_id));
        // Ended, not superseded: the process must never be told that.
        let err = reg
            .heartbeat(beat(&unheard.session_id, vec![]))
            .await
            .expect_err("ended");
        assert!(matches!(err, RegistryError::Reregister), "{err:?}");
    }
}
