//! The worker's side of the control plane: its identity (client id,
//! secret), the challenge pair, the session, the lease, and the handles the
//! registration loop reads.
//!
//! One `Plane` per worker, shared by its hosts. It owns *state* and never
//! points at the hosts: the loop that talks to pinboard lives in
//! [`registration`](crate::plane::registration) and is handed the namespace table
//! when it starts; what a message does to instances lives in the namespace layer.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use pinned_wire::registry::Takeover;
use subtle::ConstantTimeEq;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::config_error::ConfigError;
use crate::metrics::Metrics;
use crate::plane::lease::Lease;
use crate::time::Domain;

/// Default heartbeat interval (also the register retry base).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);

/// How a cluster call through pinboard names its world.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClusterHost {
    /// `Host` is the registered hostname (default).
    #[default]
    Hostname,
    /// `Host` stays the pinboard URL's host; the hostname travels in
    /// `Pinboard-Hostname` (a pinboard behind a front door routing by Host).
    Pinboard,
}

/// A headroom probe, in MB.
pub type Headroom = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Control-plane configuration (validated by `Options::build`).
#[derive(Clone)]
pub(crate) struct PlaneConfig {
    pub(crate) pinboard_url: String,
    pub(crate) token: String,
    /// As configured; port 0 waits for the bound port (see
    /// [`Plane::advertise_url`]).
    pub(crate) advertise_url: String,
    pub(crate) hostname: Option<String>,
    pub(crate) env: Option<String>,
    pub(crate) takeover: Option<Takeover>,
    pub(crate) epoch: u64,
    pub(crate) cluster_host: ClusterHost,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) headroom: Headroom,
    /// Extra CA certificates (PEM file) trusted for an `https://` pinboard,
    /// beside the Mozilla roots.
    pub(crate) pinboard_ca: Option<std::path::PathBuf>,
}

/// A placement release waiting to be sent.
#[derive(Clone, Debug)]
pub(crate) struct PendingRelease {
    pub(crate) ns: String,
    pub(crate) id: String,
    pub(crate) epoch: Option<u64>,
}

/// Registration state of the worker, readable by the application: a
/// snapshot from [`Worker::registration`](crate::Worker::registration), or
/// every change from
/// [`Worker::watch_registration`](crate::Worker::watch_registration).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistrationState {
    /// The current session, `None` while unregistered.
    pub session_id: Option<String>,
    /// Registered with pinboard (an ack arrived and the session is live).
    pub registered: bool,
    /// A higher-epoch worker of the same hostname displaced this one; it
    /// stopped registering for good.
    pub superseded: bool,
    /// Sessions lost to a `reregister` NACK.
    pub reregistrations: u64,
    /// The worker's own drain, as reported in heartbeats.
    pub draining: bool,
}

pub(crate) struct Plane {
    pub(crate) config: PlaneConfig,
    pub(crate) client_id: String,
    pub(crate) secret: Arc<str>,
    /// The configured advertise URL with the bound port in place of its
    /// port 0, set once when [`serve`](crate::serve) binds (before the
    /// registration loop starts, so every register carries the same URL).
    bound_advertise_url: OnceLock<String>,
    pub(crate) lease: Arc<Lease>,
    pub(crate) metrics: Arc<Metrics>,
    /// `(challenge, value)`, replaced before every register and heartbeat.
    challenge: RwLock<(String, String)>,
    session: RwLock<Option<Arc<str>>>,
    pub(crate) prev_session: Mutex<Option<String>>,
    /// The registration state, published to whoever watches it (the
    /// worker's own drain flag in it rides every register/heartbeat).
    state: tokio::sync::watch::Sender<RegistrationState>,
    /// Confirmed msgIds riding the next heartbeat.
    pub(crate) acks: Mutex<BTreeSet<String>>,
    pub(crate) releases: Mutex<Vec<PendingRelease>>,
    /// Serializes release flushes.
    pub(crate) release_turn: tokio::sync::Mutex<()>,
    /// The last applied drain echo: `(draining, absolute target)`.
    pub(crate) echo: Mutex<(bool, Option<tokio::time::Instant>)>,
    /// Ends the loop's wait early (drain flag flipped, session lost).
    pub(crate) wake: Notify,
    pub(crate) stopping: AtomicBool,
    /// The configured heartbeat interval was shrunk to fit a TTL (logged
    /// once).
    pub(crate) heartbeat_shrunk: AtomicBool,
    pub(crate) task: Mutex<Option<AbortHandle>>,
    pub(crate) http: reqwest::Client,
    /// Tasks, timers and randomness (challenges, jitter).
    pub(crate) domain: Domain,
}

/// Sets `*field` to `value`; true when that changed it.
fn replace<T: PartialEq>(field: &mut T, value: T) -> bool {
    if *field == value {
        return false;
    }
    *field = value;
    true
}

impl Plane {
    pub(crate) fn new(
        config: PlaneConfig,
        lease_buffer: Duration,
        metrics: Arc<Metrics>,
        domain: Domain,
    ) -> Result<Self, ConfigError> {
        // rustls with the roots the whole project uses (pinned-edge): the
        // Mozilla set plus `PINNED_PINBOARD_CA`; reqwest speaks HTTP/1.1
        // only here, so no ALPN is offered.
        let tls = pinned_edge::tls::client_config(config.pinboard_ca.as_deref())
            .map_err(|e| ConfigError::PinboardCa(e.to_string()))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .use_preconfigured_tls(tls)
            .build()
            .map_err(|e| ConfigError::HttpClient(e.to_string()))?;
        Ok(Self {
            config,
            client_id: domain.random_hex(16),
            secret: Arc::from(domain.random_hex(32)),
            bound_advertise_url: OnceLock::new(),
            lease: Arc::new(Lease::new(lease_buffer, metrics.clone())),
            metrics,
            challenge: RwLock::new((domain.random_hex(16), domain.random_hex(16))),
            session: RwLock::new(None),
            prev_session: Mutex::new(None),
            state: tokio::sync::watch::Sender::new(RegistrationState::default()),
            acks: Mutex::new(BTreeSet::new()),
            releases: Mutex::new(Vec::new()),
            release_turn: tokio::sync::Mutex::new(()),
            echo: Mutex::new((false, None)),
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            heartbeat_shrunk: AtomicBool::new(false),
            task: Mutex::new(None),
            http,
            domain,
        })
    }

    /// The URL pinboard reaches this worker at: the configured one, its
    /// port 0 replaced by the bound port once [`listening_on`] said it.
    ///
    /// [`listening_on`]: Self::listening_on
    pub(crate) fn advertise_url(&self) -> &str {
        self.bound_advertise_url
            .get()
            .map_or(&self.config.advertise_url, String::as_str)
    }

    /// Whether the advertise URL still has port 0 (nothing bound yet).
    pub(crate) fn awaiting_port(&self) -> bool {
        self.bound_advertise_url.get().is_none()
            && crate::plane::advertise::zero_port(&self.config.advertise_url).is_some()
    }

    /// The listener bound `port`: an advertise URL with port 0 takes it.
    /// Only the first call counts (the worker is served on one listener).
    pub(crate) fn listening_on(&self, port: u16) {
        if let Some(url) = crate::plane::advertise::with_port(&self.config.advertise_url, port) {
            tracing::info!(advertise_url = %url, "advertising the bound port");
            let _ = self.bound_advertise_url.set(url);
        }
    }

    pub(crate) fn session(&self) -> Option<Arc<str>> {
        self.session.read().clone()
    }

    pub(crate) fn set_session(&self, session: Option<Arc<str>>) {
        let published = session.as_deref().map(str::to_owned);
        *self.session.write() = session;
        self.state
            .send_if_modified(|state| replace(&mut state.session_id, published));
    }

    /// Whether registered with pinboard.
    pub(crate) fn registered(&self) -> bool {
        self.state.borrow().registered
    }

    /// Records (and publishes) whether the worker is registered.
    pub(crate) fn set_registered(&self, registered: bool) {
        self.metrics.registered.set(i64::from(registered));
        self.state
            .send_if_modified(|state| replace(&mut state.registered, registered));
    }

    /// Whether a higher-epoch worker displaced this one.
    pub(crate) fn superseded(&self) -> bool {
        self.state.borrow().superseded
    }

    /// Records (and publishes) that this worker was displaced for good.
    pub(crate) fn set_superseded(&self) {
        self.state.send_modify(|state| {
            state.superseded = true;
            state.registered = false;
        });
        self.metrics.registered.set(0);
    }

    /// The worker's own drain flag.
    pub(crate) fn draining(&self) -> bool {
        self.state.borrow().draining
    }

    /// Counts (and publishes) a session lost to a `reregister` NACK.
    pub(crate) fn count_reregistration(&self) -> u64 {
        let mut count = 0;
        self.state.send_modify(|state| {
            state.reregistrations += 1;
            count = state.reregistrations;
        });
        count
    }

    /// Every change of the registration state, from the current one on.
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<RegistrationState> {
        self.state.subscribe()
    }

    /// Mints the pair the next register or heartbeat carries.
    pub(crate) fn fresh_challenge(&self) -> (String, String) {
        let pair = (self.domain.random_hex(16), self.domain.random_hex(16));
        *self.challenge.write() = pair.clone();
        pair
    }

    /// The value for `challenge` if it is the current one.
    pub(crate) fn answer(&self, challenge: &str) -> Option<String> {
        let pair = self.challenge.read();
        bool::from(challenge.as_bytes().ct_eq(pair.0.as_bytes())).then(|| pair.1.clone())
    }

    /// Whether `aud` is the current session.
    pub(crate) fn is_session(&self, aud: &str) -> bool {
        self.session
            .read()
            .as_deref()
            .is_some_and(|session| session == aud)
    }

    pub(crate) fn state(&self) -> RegistrationState {
        self.state.borrow().clone()
    }

    /// Reports the worker's own drain flag and wakes the loop on a change.
    pub(crate) fn set_draining(&self, draining: bool) {
        if self
            .state
            .send_if_modified(|state| replace(&mut state.draining, draining))
        {
            self.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plane(advertise_url: &str) -> Plane {
        let config = PlaneConfig {
            pinboard_url: "http://127.0.0.1:7070".into(),
            token: "t".into(),
            advertise_url: advertise_url.into(),
            hostname: None,
            env: None,
            takeover: None,
            epoch: 0,
            cluster_host: ClusterHost::default(),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            headroom: Arc::new(|| 0),
            pinboard_ca: None,
        };
        Plane::new(
            config,
            Duration::from_secs(1),
            Arc::new(Metrics::new()),
            Domain::system(),
        )
        .expect("plane")
    }

    #[test]
    fn a_zero_port_waits_for_the_bound_one_and_keeps_the_first() {
        let plane = plane("http://127.0.0.1:0");
        assert!(plane.awaiting_port());
        assert_eq!(plane.advertise_url(), "http://127.0.0.1:0");
        plane.listening_on(41234);
        assert!(!plane.awaiting_port());
        assert_eq!(plane.advertise_url(), "http://127.0.0.1:41234");
        plane.listening_on(5);
        assert_eq!(plane.advertise_url(), "http://127.0.0.1:41234");
    }

    #[test]
    fn a_configured_port_is_advertised_whatever_was_bound() {
        let plane = plane("http://worker-1:8080");
        assert!(!plane.awaiting_port());
        plane.listening_on(41234);
        assert_eq!(plane.advertise_url(), "http://worker-1:8080");
    }
}
