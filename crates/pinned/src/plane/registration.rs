//! The registration loop: register, then heartbeat at a fixed rate, with
//! the Python reference's reactions to every answer (wire spec §6).
//!
//! - one loop per worker; each iteration registers (no session) or
//!   heartbeats (session), then waits `interval - elapsed since send`;
//! - a fresh challenge pair before every send;
//! - register failures back off exponentially with jitter (capped at
//!   30 s), a 503 `Retry-After` replacing the base;
//! - `reregister` NACK: the session is lost, instances are kept and
//!   resubmitted at once with `prevSessionId`; `duplicates` in the ack are
//!   aborted before the lease renews;
//! - `superseded` NACK: every instance aborted, the loop ends for good.
//!
//! Control-plane input is never trusted to be well formed: answers are
//! decoded into the lenient views of [`pinned_wire::registry::received`]
//! (and [`HeartbeatNack`]); a malformed answer or member is logged, counted
//! in `pinned_control_plane_failures_total`, and the loop carries on.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use pinned_wire::registry::received::{self, Entry, Field, WIND_DOWN};
use pinned_wire::registry::{
    DeregisterRequest, Duplicate, HeartbeatNack, HeartbeatRequest, RegisterRequest, ReleaseItem,
    TagRequest,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::plane::pinboard::{PendingRelease, Plane};
use crate::time::Domain;

/// The longest duration the worker takes from pinboard (a lease, a drain or
/// wind-down deadline): one year. Anything longer, or infinite, means "not
/// in this process's lifetime" and is capped, so no arithmetic on it can
/// overflow; a negative or NaN value is zero.
const MAX_GRANTED: Duration = Duration::from_secs(365 * 86_400);

/// `seconds` from pinboard as a duration, capped at [`MAX_GRANTED`].
fn bounded_secs(seconds: f64) -> Duration {
    if seconds.is_nan() || seconds <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(seconds).map_or(MAX_GRANTED, |granted| granted.min(MAX_GRANTED))
}

/// How far a drain's absolute target may drift between two echoes before
/// it counts as a new deadline (the reference's 1.0 s): heartbeats are
/// sent and answered with some jitter.
const DRAIN_TARGET_SLACK: Duration = Duration::from_secs(1);

/// Whether a drain echo whose target is `echoed` (now plus the remaining
/// seconds) moved the deadline from `applied`, the target in force.
///
/// Targets are compared as absolute instants, so a steady countdown keeps
/// the same one and re-applies nothing. pinboard reports the remaining
/// seconds floored at 0, so an echo of 0 says only "passed": it matches
/// any target in force that is not later than now (within the slack). Were
/// it read as a new deadline of now, every heartbeat after a passed
/// deadline would re-drain the host, re-cap the lease at that heartbeat and
/// abort again (wire spec §9.2: applied only on change).
fn target_moved(echoed: Instant, applied: Instant, now: Instant) -> bool {
    if echoed <= now && applied <= now + DRAIN_TARGET_SLACK {
        return false;
    }
    let gap = if echoed > applied {
        echoed - applied
    } else {
        applied - echoed
    };
    gap > DRAIN_TARGET_SLACK
}

/// Register backoff cap.
const BACKOFF_MAX: f64 = 30.0;
/// Attempts of release, deregister and tag calls.
const ATTEMPTS: u32 = 3;

/// Register retry pacing.
#[derive(Default)]
struct Backoff {
    failures: u32,
    /// `Retry-After` of a 503 deferral; replaces the base for the next delay.
    deferred: Option<f64>,
}

impl Backoff {
    fn delay(&self, interval: Duration, in_session: bool, domain: &Domain) -> Duration {
        if in_session || self.failures == 0 {
            return interval;
        }
        let exponent = self.failures.min(17);
        let seconds = match self.deferred {
            Some(base) => (base * 2f64.powi(exponent as i32 - 1)).min(BACKOFF_MAX),
            None => (interval.as_secs_f64() * 2f64.powi(exponent.min(16) as i32)).min(BACKOFF_MAX),
        };
        // Jittered so a fleet's re-registrations spread out.
        Duration::from_secs_f64(seconds * domain.random_between(0.3, 1.0))
    }

    fn defer(&mut self, retry_after: Option<&str>) {
        self.failures += 1;
        self.deferred = Some(
            retry_after
                .and_then(|text| text.trim().parse::<f64>().ok())
                .filter(|seconds| seconds.is_finite())
                .map_or(1.0, |seconds| seconds.max(0.05)),
        );
    }
}

/// The answer body; anything but a JSON object reads as `{}`. Kept raw for
/// the logs of a malformed or refused answer.
async fn json_object(response: reqwest::Response) -> Map<String, Value> {
    match response.json::<Value>().await {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// One hosted namespace as pinboard commands it (duplicates to quit,
/// instances to wind down, drain echoes): the control plane is handed this
/// view of the namespaces above it and never reaches further.
pub(crate) trait Commanded: Send + Sync {
    /// The namespace, with its leading slash.
    fn ns(&self) -> &str;
    /// Its `env` option, registered with it.
    fn env(&self) -> Option<String>;
    /// Ids it holds (resident, activating or closing).
    fn ids(&self) -> Vec<String>;
    /// Aborts instance `id` if resident.
    fn abort_id(&self, id: &str);
    /// Aborts every instance.
    fn abort_all(&self);
    /// Winds instance `id` down (`None` revokes a wind-down).
    fn wind_down_id(&self, id: &str, deadline: Option<Duration>);
    /// Applies pinboard's drain echo.
    fn server_drain(&self, draining: bool, deadline: Option<Duration>);
}

/// The namespaces one registration loop commands, in declaration order.
pub(crate) type Commands = Arc<[Arc<dyn Commanded>]>;

/// The registration loop: the plane's state plus the namespaces it acts
/// on, handed over when the loop starts (the plane itself never points at
/// the hosts).
struct Registrar {
    plane: Arc<Plane>,
    hosts: Commands,
}

impl Registrar {
    fn find(&self, ns: &str) -> Option<&Arc<dyn Commanded>> {
        self.hosts.iter().find(|host| host.ns() == ns)
    }
}

/// The loop reads and updates the plane's state as its own.
impl std::ops::Deref for Registrar {
    type Target = Plane;

    fn deref(&self) -> &Plane {
        &self.plane
    }
}

impl Registrar {
    async fn run(&self) {
        let mut backoff = Backoff::default();
        while !self.stopping.load(Ordering::SeqCst) && !self.superseded() {
            let started = Instant::now();
            if self.session().is_none() {
                self.register(&mut backoff).await;
            } else {
                self.heartbeat(&mut backoff).await;
            }
            if self.superseded() {
                return;
            }
            let delay = backoff
                .delay(
                    self.heartbeat_interval(),
                    self.session().is_some(),
                    &self.domain,
                )
                .saturating_sub(started.elapsed());
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.wake.notified() => {}
            }
        }
    }

    fn register_failed(&self, backoff: &mut Backoff, reason: &'static str) {
        backoff.failures += 1;
        self.metrics.registration_failures.inc();
        self.metrics.control_failed("register", reason);
    }

    fn register_body(&self, challenge: String, challenge_value: String) -> RegisterRequest {
        let hosts = self.hosts.clone();
        let envs: std::collections::BTreeMap<String, String> = hosts
            .iter()
            .filter_map(|host| host.env().map(|env| (host.ns().to_owned(), env)))
            .collect();
        let instances: std::collections::BTreeMap<String, Vec<String>> = hosts
            .iter()
            .map(|host| (host.ns().to_owned(), host.ids()))
            .filter(|(_, ids)| !ids.is_empty())
            .collect();
        let prev = self
            .session()
            .map(|s| s.to_string())
            .or_else(|| self.prev_session.lock().clone());
        RegisterRequest {
            client_id: self.client_id.clone(),
            secret: self.secret.to_string(),
            namespaces: hosts.iter().map(|host| host.ns().to_owned()).collect(),
            advertise_url: self.advertise_url().to_owned(),
            headroom: (self.config.headroom)(),
            draining: self.draining(),
            challenge,
            challenge_value,
            hostname: self.config.hostname.clone(),
            env: self.config.env.clone(),
            envs: (!envs.is_empty()).then_some(envs),
            takeover: self.config.takeover,
            epoch: (self.config.epoch > 0).then_some(self.config.epoch),
            prev_session_id: prev,
            instances: (!instances.is_empty()).then_some(instances),
        }
    }

    async fn register(&self, backoff: &mut Backoff) {
        let anchor = Instant::now();
        backoff.deferred = None;
        let (challenge, value) = self.fresh_challenge();
        let body = self.register_body(challenge, value);
        let response = match self
            .http
            .post(self.url("/registry/register"))
            .bearer_auth(&self.config.token)
            .json(&body)
            .send()
            .await
        {
            Ok(response) => response,
            Err(error) => {
                self.register_failed(backoff, "transport");
                // Once with its cause and count, not every retry (see `repeats`).
                if let Some(seen) = pinned_edge::logging::repeats().failed(
                    "pinboard register",
                    &self.client_id,
                    pinned_edge::logging::Chain(&error),
                ) {
                    tracing::warn!(error = %seen, failures = seen.failures, "pinboard register failed");
                }
                return;
            }
        };
        match response.status().as_u16() {
            200 => {}
            401 => {
                self.register_failed(backoff, "unauthorized");
                if let Some(seen) = pinned_edge::logging::repeats().failed(
                    "pinboard register",
                    &self.client_id,
                    "401 unauthorized",
                ) {
                    tracing::error!(
                        failures = seen.failures,
                        "pinboard register rejected: 401 unauthorized; check the deployment token"
                    );
                }
                return;
            }
            503 => {
                // A deferral, not a rejection: pinboard (or our own advertise
                // URL behind its gateway) is not ready yet.
                self.metrics.control_failed("register", "deferred");
                let retry_after = response
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                backoff.defer(retry_after.as_deref());
                let text = response.text().await.unwrap_or_default();
                if let Some(seen) = pinned_edge::logging::repeats().failed(
                    "pinboard register",
                    &self.client_id,
                    format_args!("503 {text}"),
                ) {
                    tracing::info!(attempt = backoff.failures, text = %seen, "pinboard deferred registration; retrying");
                }
                return;
            }
            status => {
                self.register_failed(backoff, "rejected");
                let text = response.text().await.unwrap_or_default();
                if let Some(seen) = pinned_edge::logging::repeats().failed(
                    "pinboard register",
                    &self.client_id,
                    format_args!("{status} {text}"),
                ) {
                    tracing::warn!(status, failures = seen.failures, text = %seen, "pinboard register rejected; retrying");
                }
                return;
            }
        }
        let body = json_object(response).await;
        let Ok(ack) = received::RegisterAck::deserialize(&body) else {
            self.register_failed(backoff, "malformed");
            tracing::error!(ack = ?body, "malformed register response");
            return;
        };
        let session = ack.session_id;
        backoff.failures = 0;
        self.set_session(Some(Arc::from(session.as_str())));
        *self.prev_session.lock() = None;
        self.acks.lock().clear();
        // Duplicates quit before the lease renews: no request may land on
        // an instance another session owns.
        self.quit_duplicates(&ack.duplicates);
        self.lease
            .renewed(bounded_secs(ack.expires_in_ms / 1000.0), anchor);
        self.set_registered(true);
        self.apply_echo(&ack.echo);
        if let Some(after) =
            pinned_edge::logging::repeats().recovered("pinboard register", &self.client_id)
        {
            tracing::info!(
                failures = after.failures,
                failing_for_ms = after.failing_for_ms(),
                "pinboard register succeeded again"
            );
        }
        tracing::info!(session = %session, reregistrations = self.state().reregistrations, "registered with pinboard");
        self.flush_releases().await;
    }

    fn quit_duplicates(&self, duplicates: &Field<Vec<Entry<Duplicate>>>) {
        let entries = match duplicates {
            Field::Absent | Field::Null => return,
            Field::Invalid(duplicates) => {
                self.metrics
                    .control_failed("register", "malformed_duplicates");
                tracing::error!(?duplicates, "malformed register ack duplicates");
                return;
            }
            Field::Valid(entries) => entries,
        };
        for entry in entries {
            let Duplicate { ns, id } = match entry {
                Entry::Valid(duplicate) => duplicate,
                Entry::Invalid(entry) => {
                    self.metrics
                        .control_failed("register", "malformed_duplicates");
                    tracing::error!(?entry, "malformed duplicate entry");
                    continue;
                }
            };
            let (ns, id) = (ns.as_str(), id.as_str());
            self.metrics.duplicate_quits.inc();
            tracing::warn!(namespace = ns, id, "duplicate placement; quitting instance");
            if let Some(host) = self.find(ns) {
                host.abort_id(id);
            }
        }
    }

    async fn heartbeat(&self, backoff: &mut Backoff) {
        let Some(session) = self.session() else {
            return;
        };
        let anchor = Instant::now();
        let (challenge, value) = self.fresh_challenge();
        let acks: Vec<String> = self.acks.lock().iter().cloned().collect();
        let body = HeartbeatRequest {
            session_id: session.to_string(),
            headroom: (self.config.headroom)(),
            draining: self.draining(),
            challenge: Some(challenge),
            challenge_value: Some(value),
            acks: acks.clone(),
        };
        let response = match self
            .http
            .post(self.url("/registry/heartbeat"))
            .bearer_auth(&self.config.token)
            .json(&body)
            .send()
            .await
        {
            Ok(response) => response,
            Err(error) => {
                self.metrics.control_failed("heartbeat", "transport");
                if let Some(seen) = pinned_edge::logging::repeats().failed(
                    "pinboard heartbeat",
                    &self.client_id,
                    pinned_edge::logging::Chain(&error),
                ) {
                    tracing::warn!(error = %seen, failures = seen.failures, "pinboard heartbeat failed");
                }
                return;
            }
        };
        let status = response.status().as_u16();
        let body = json_object(response).await;
        if status == 200 {
            let Ok(ack) = received::HeartbeatAck::deserialize(&body) else {
                self.metrics.control_failed("heartbeat", "malformed");
                tracing::error!(ack = ?body, "malformed heartbeat ack");
                return;
            };
            self.lease
                .renewed(bounded_secs(ack.expires_in_ms / 1000.0), anchor);
            if let Some(after) =
                pinned_edge::logging::repeats().recovered("pinboard heartbeat", &self.client_id)
            {
                tracing::info!(
                    failures = after.failures,
                    failing_for_ms = after.failing_for_ms(),
                    "pinboard heartbeat succeeded again"
                );
            }
            self.apply_echo(&ack.echo);
            let delivered = self.apply_messages(&ack.messages);
            let mut pending = self.acks.lock();
            for sent in &acks {
                pending.remove(sent);
            }
            pending.extend(delivered);
            return;
        }
        // Decoding a NACK never fails on an object; a failure reads as no flag.
        let nack = HeartbeatNack::deserialize(&body).unwrap_or_default();
        if status == 409 && nack.superseded {
            self.displaced(&nack);
            return;
        }
        if nack.reregister {
            self.session_lost();
            Box::pin(self.register(backoff)).await;
            return;
        }
        if status == 401 {
            self.metrics.control_failed("heartbeat", "unauthorized");
            if let Some(seen) = pinned_edge::logging::repeats().failed(
                "pinboard heartbeat",
                &self.client_id,
                "401 unauthorized",
            ) {
                tracing::error!(
                    failures = seen.failures,
                    "pinboard heartbeat rejected: 401 unauthorized; check the deployment token"
                );
            }
            return;
        }
        self.metrics.control_failed("heartbeat", "rejected");
        if let Some(seen) = pinned_edge::logging::repeats().failed(
            "pinboard heartbeat",
            &self.client_id,
            format_args!("{status} {body:?}"),
        ) {
            tracing::warn!(status, failures = seen.failures, ack = %seen, "pinboard heartbeat rejected; retrying");
        }
    }

    fn session_lost(&self) {
        self.set_registered(false);
        *self.prev_session.lock() = self.session().map(|s| s.to_string());
        self.set_session(None);
        self.count_reregistration();
        tracing::warn!("pinboard session unknown; instances retained pending reregistration");
    }

    fn displaced(&self, nack: &HeartbeatNack) {
        // A higher-epoch worker owns this binding now: retrying with this
        // configuration can never succeed.
        self.set_superseded();
        self.metrics.control_failed("heartbeat", "superseded");
        tracing::error!(error = ?nack.error, "pinboard superseded this worker; stopping registration");
        for host in self.hosts.iter() {
            host.abort_all();
        }
    }

    /// The `draining` echo of an ack, applied only on a change.
    fn apply_echo(&self, echo: &received::DrainEcho) {
        let Field::Valid(draining) = echo.draining else {
            return;
        };
        let deadline = match (draining, &echo.drain_deadline) {
            (false, _) | (true, Field::Absent | Field::Null) => None,
            (true, Field::Valid(seconds)) if *seconds >= 0.0 => Some(bounded_secs(*seconds)),
            (true, Field::Valid(other)) => {
                self.malformed_deadline(other);
                None
            }
            (true, Field::Invalid(other)) => {
                self.malformed_deadline(other);
                None
            }
        };
        let now = Instant::now();
        let target = deadline.map(|after| now + after);
        let mut echo = self.echo.lock();
        let moved = match (target, echo.1) {
            (None, None) => false,
            (Some(a), Some(b)) => target_moved(a, b, now),
            _ => true,
        };
        if echo.0 == draining && !moved {
            return;
        }
        *echo = (draining, target);
        drop(echo);
        if draining {
            tracing::info!(?deadline, "control plane drain: refusing new activations");
        } else {
            tracing::info!("control plane drain revoked: accepting new activations");
        }
        for host in self.hosts.iter() {
            host.server_drain(draining, deadline);
        }
    }

    fn malformed_deadline(&self, other: &dyn std::fmt::Debug) {
        self.metrics
            .control_failed("server_draining", "malformed_deadline");
        tracing::error!(?other, "malformed drainDeadline in ack");
    }

    /// Applies a batch of control messages; returns the msgIds to confirm
    /// (the contiguous prefix applied without error).
    fn apply_messages(
        &self,
        messages: &Field<Vec<Entry<received::ControlMessage>>>,
    ) -> Vec<String> {
        let messages = match messages {
            Field::Absent | Field::Null => return Vec::new(),
            Field::Invalid(messages) => {
                self.metrics
                    .control_failed("control_message", "malformed_batch");
                tracing::error!(?messages, "malformed heartbeat ack messages");
                return Vec::new();
            }
            Field::Valid(messages) => messages,
        };
        let mut confirmed = Vec::new();
        let mut confirming = true;
        for message in messages {
            let message = match message {
                Entry::Valid(message) => message,
                Entry::Invalid(message) => {
                    self.metrics.control_failed("control_message", "malformed");
                    tracing::error!(?message, "malformed control message");
                    continue;
                }
            };
            if let Err(error) = self.apply_message(message) {
                confirming = false;
                self.metrics.control_failed("control_message", "callback");
                tracing::error!(%error, "control message failed");
            }
            if let (true, Field::Valid(id)) = (confirming, &message.msg_id) {
                confirmed.push(id.clone());
            }
        }
        confirmed
    }

    fn apply_message(&self, message: &received::ControlMessage) -> Result<(), String> {
        if message.kind.valid().map(String::as_str) != Some(WIND_DOWN) {
            return Err(format!("unknown control message: {message}"));
        }
        let deadline = match message.deadline {
            Field::Absent => {
                return Err(format!(
                    "wind_down requires a deadline (null revokes): {message}"
                ))
            }
            Field::Null => None,
            Field::Valid(seconds) => Some(seconds),
            Field::Invalid(_) => {
                return Err(format!("deadline must be a number or null: {message}"))
            }
        };
        let Field::Valid(id) = &message.id else {
            return Err(format!("wind_down requires an id: {message}"));
        };
        let id = id.as_str();
        let host = match &message.ns {
            Field::Absent | Field::Null => {
                match &self.hosts[..] {
                    [only] => only.clone(),
                    _ => {
                        return Err(format!(
                            "wind_down without a namespace on a multi-namespace worker (upgrade pinboard): {message}"
                        ))
                    }
                }
            }
            Field::Valid(ns) => self
                .find(ns)
                .cloned()
                .ok_or_else(|| format!("wind_down for an unknown namespace: {message}"))?,
            Field::Invalid(_) => {
                return Err(format!("wind_down for an unknown namespace: {message}"))
            }
        };
        match deadline {
            None => {
                tracing::info!(namespace = host.ns(), id, "resumed instance");
                host.wind_down_id(id, None);
            }
            Some(seconds) if !seconds.is_finite() => {
                return Err("wind_down deadline must be finite (None revokes)".to_owned())
            }
            Some(seconds) => {
                tracing::info!(namespace = host.ns(), id, seconds, "winding down instance");
                host.wind_down_id(id, Some(bounded_secs(seconds)));
            }
        }
        Ok(())
    }
}

impl Plane {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.pinboard_url)
    }

    /// The heartbeat interval in force: the configured one, at most a third
    /// of the granted lease so two beats can fail before it lapses (a
    /// shrink is logged once).
    fn heartbeat_interval(&self) -> Duration {
        let configured = self.config.heartbeat_interval;
        let Some(ttl) = self.lease.ttl() else {
            return configured;
        };
        let interval = configured.min(ttl / 3);
        if interval < configured && !self.heartbeat_shrunk.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                configured = ?configured,
                ttl = ?ttl,
                interval = ?interval,
                "heartbeat interval longer than a third of the granted lease; using a third"
            );
        }
        interval
    }

    /// Starts the loop (a no-op once superseded or already running).
    pub(crate) fn start(self: &Arc<Self>, hosts: Commands) {
        if self.superseded() {
            return;
        }
        // `Options::build` refuses port 0 and `serve` fills it in before it
        // starts the worker; should neither have happened, registering port
        // 0 would only send pinboard's challenge nowhere.
        if self.awaiting_port() {
            tracing::error!(
                advertise_url = %self.config.advertise_url,
                "advertise URL has port 0 and no listener was bound: not registering"
            );
            return;
        }
        let mut task = self.task.lock();
        if task.is_some() {
            return;
        }
        let plane = Registrar {
            plane: self.clone(),
            hosts,
        };
        let handle = self.domain.spawn(async move {
            loop {
                let run = AssertUnwindSafe(plane.run()).catch_unwind().await;
                if run.is_ok() || plane.stopping.load(Ordering::SeqCst) {
                    return;
                }
                plane.metrics.control_failed("registration_loop", "crashed");
                tracing::error!("registration loop crashed; restarting");
                tokio::time::sleep(plane.config.heartbeat_interval).await;
            }
        });
        *task = Some(handle.abort_handle());
    }

    /// Stops the loop.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
        self.lease.close();
    }

    /// Queues a placement release and flushes every pending one.
    pub(crate) async fn release(&self, ns: String, id: String, epoch: Option<u64>) {
        self.releases.lock().push(PendingRelease { ns, id, epoch });
        self.flush_releases().await;
    }

    /// Sends every pending release in one batch; while sessionless they
    /// wait for the next successful register.
    async fn flush_releases(&self) {
        let _turn = self.release_turn.lock().await;
        let Some(session) = self.session() else {
            return;
        };
        let batch = std::mem::take(&mut *self.releases.lock());
        if batch.is_empty() {
            return;
        }
        let items: Vec<ReleaseItem> = batch
            .into_iter()
            .map(|pending| ReleaseItem {
                session_id: session.to_string(),
                namespace: pending.ns,
                id: pending.id,
                epoch: pending.epoch.map(|epoch| epoch.to_string()),
            })
            .collect();
        self.post_with_retries("release", "/registry/release", &items)
            .await;
    }

    /// Sends to the sockets pinboard holds (`pinned_wire::held::Sends`),
    /// with the registration's retries; whether pinboard took them.
    pub(crate) async fn send_to_held(&self, sends: &pinned_wire::held::Sends) -> bool {
        self.post_with_retries("socket sends", pinned_wire::held::SEND_PATH, sends)
            .await
    }

    /// Ends the session (after every instance closed).
    pub(crate) async fn deregister(&self) {
        let Some(session) = self.session() else {
            return;
        };
        let body = DeregisterRequest {
            session_id: session.to_string(),
        };
        if self
            .post_with_retries("deregister", "/registry/deregister", &body)
            .await
        {
            self.set_session(None);
        }
        self.set_registered(false);
    }

    /// Stamps an owner tag on a placement.
    pub(crate) async fn tag(&self, ns: &str, id: &str, epoch: u64, tag: &str) -> bool {
        let Some(session) = self.session() else {
            return false;
        };
        let body = TagRequest {
            session_id: session.to_string(),
            namespace: ns.to_owned(),
            id: id.to_owned(),
            epoch: Some(epoch.to_string()),
            tag: tag.to_owned(),
        };
        self.post_with_retries("tag", "/registry/tag", &body).await
    }

    /// POSTs `payload` up to three times (sleeping 0.2 s, then 0.4 s);
    /// true on a 200.
    async fn post_with_retries(
        &self,
        operation: &'static str,
        path: &str,
        payload: &impl Serialize,
    ) -> bool {
        let mut failure = String::new();
        for attempt in 0..ATTEMPTS {
            match self
                .http
                .post(self.url(path))
                .bearer_auth(&self.config.token)
                .json(payload)
                .send()
                .await
            {
                Ok(response) if response.status().as_u16() == 200 => return true,
                Ok(response) => {
                    failure = format!(
                        "{} {}",
                        response.status(),
                        response.text().await.unwrap_or_default()
                    );
                }
                Err(error) => failure = error.to_string(),
            }
            if attempt + 1 < ATTEMPTS {
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt + 1))).await;
            }
        }
        tracing::warn!(operation, %failure, "{operation} failed after {ATTEMPTS} attempts; pinboard frees the placements when the lease lapses");
        self.metrics.control_failed(operation, "exhausted");
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn granted_durations_are_bounded() {
        assert_eq!(bounded_secs(1.5), Duration::from_millis(1500));
        assert_eq!(bounded_secs(-3.0), Duration::ZERO);
        assert_eq!(bounded_secs(f64::NAN), Duration::ZERO);
        // The operator's absurd deadlines: capped, never a panic or a wrap.
        assert_eq!(bounded_secs(1e19), MAX_GRANTED);
        assert_eq!(bounded_secs(1e17), MAX_GRANTED);
        assert_eq!(bounded_secs(f64::INFINITY), MAX_GRANTED);
        assert_eq!(bounded_secs(1e300 / 1000.0), MAX_GRANTED);
        // And the capped deadline can be added to now.
        assert!(tokio::time::Instant::now()
            .checked_add(MAX_GRANTED)
            .is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_target_moves_only_by_more_than_the_slack() {
        let applied = Instant::now() + Duration::from_secs(10);
        tokio::time::advance(Duration::from_secs(3)).await;
        let now = Instant::now();
        // The countdown: 7 s left is the same target.
        assert!(!target_moved(now + Duration::from_secs(7), applied, now));
        assert!(!target_moved(
            now + Duration::from_millis(7_900),
            applied,
            now
        ));
        assert!(target_moved(now + Duration::from_secs(9), applied, now));
        assert!(target_moved(now + Duration::from_secs(5), applied, now));
        // Past the deadline pinboard says 0 on every beat: not a move.
        tokio::time::advance(Duration::from_secs(20)).await;
        let now = Instant::now();
        assert!(!target_moved(now, applied, now));
        // A 0 while the deadline in force is still ahead is one (pinboard
        // moved it up to now).
        let ahead = now + Duration::from_secs(30);
        assert!(target_moved(now, ahead, now));
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let interval = Duration::from_secs(3);
        let mut backoff = Backoff::default();
        assert_eq!(backoff.delay(interval, false, &Domain::system()), interval);
        backoff.failures = 1;
        let d = backoff
            .delay(interval, false, &Domain::system())
            .as_secs_f64();
        assert!((1.8..=6.0).contains(&d), "{d}");
        backoff.failures = 10;
        let d = backoff
            .delay(interval, false, &Domain::system())
            .as_secs_f64();
        assert!((9.0..=30.0).contains(&d), "{d}");
        assert_eq!(backoff.delay(interval, true, &Domain::system()), interval);
        let mut deferred = Backoff::default();
        deferred.defer(Some("2"));
        let d = deferred
            .delay(interval, false, &Domain::system())
            .as_secs_f64();
        assert!((0.6..=2.0).contains(&d), "{d}");
        deferred.defer(Some("nonsense"));
        assert_eq!(deferred.deferred, Some(1.0));
    }
}
