//! Worker configuration: [`Options`] (plain data, validated once in
//! [`Options::build`]) and the errors it reports.
//!
//! Every problem is collected and reported together, so a misconfigured
//! worker fails once with the whole list rather than one line per restart.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use pinned_wire::ids;

use pinned_edge::tls::tokio_rustls::TlsAcceptor;

use crate::config_error::{ConfigError, ConfigErrors};
use crate::namespace::options::HostOptions;
use crate::namespace::Lifecycle;
use crate::object::Object;
use crate::plane::lease::DEFAULT_LEASE_BUFFER;
use crate::plane::pinboard::{ClusterHost, Headroom, PlaneConfig, DEFAULT_HEARTBEAT_INTERVAL};
use crate::serve::edge::EdgeSettings;
use pinned_wire::registry::Takeover;

/// Environment variable: the port [`serve`](crate::serve) binds (default 0,
/// an ephemeral port).
pub const ENV_PORT: &str = "PORT";
/// Environment variable: the address [`serve`](crate::serve) binds (default
/// `127.0.0.1`).
pub const ENV_HOST: &str = "HOST";
/// Environment variable: the pinboard URL (control-plane mode).
pub const ENV_PINBOARD_URL: &str = "PINBOARD_URL";
/// Environment variable: the deployment token shared with pinboard.
pub const ENV_PINBOARD_TOKEN: &str = "PINBOARD_TOKEN";
/// Environment variable: the URL pinboard reaches this process at; port 0
/// (`http://10.0.0.5:0`) stands for the port [`serve`](crate::serve) binds
/// (see [`Options::pinboard`]).
pub const ENV_ADVERTISE_URL: &str = "ADVERTISE_URL";
/// Environment variable: the worker's registered hostname.
pub const ENV_PINNED_HOSTNAME: &str = "PINNED_HOSTNAME";
/// Environment variable: set to `1` to allow dev mode in production.
pub const ENV_ALLOW_DEV_IN_PRODUCTION: &str = "PINBOARD_ALLOW_DEV_IN_PRODUCTION";
/// Environment variable: a PEM file of extra CA certificates trusted for an
/// `https://` pinboard (beside the Mozilla roots).
pub const ENV_PINBOARD_CA: &str = "PINNED_PINBOARD_CA";
/// Environment variable: the PEM certificate chain [`serve`](crate::serve)
/// answers HTTPS with (with [`ENV_TLS_KEY`]; see [`Options::tls`]).
pub const ENV_TLS_CERT: &str = "PINNED_TLS_CERT";
/// Environment variable: the PEM private key of [`ENV_TLS_CERT`].
pub const ENV_TLS_KEY: &str = "PINNED_TLS_KEY";
/// Environment variable: [`Options::header_read_timeout`], in milliseconds.
pub const ENV_HEADER_READ_TIMEOUT_MS: &str = "PINNED_HEADER_READ_TIMEOUT_MS";
/// Environment variable: [`Options::keep_alive_timeout`], in milliseconds.
pub const ENV_KEEP_ALIVE_TIMEOUT_MS: &str = "PINNED_KEEP_ALIVE_TIMEOUT_MS";
/// Environment variable: [`Options::shutdown_timeout`], in milliseconds.
pub const ENV_SHUTDOWN_TIMEOUT_MS: &str = "PINNED_SHUTDOWN_TIMEOUT_MS";
/// Environment variable: [`Options::max_connections`].
pub const ENV_MAX_CONNECTIONS: &str = "PINNED_MAX_CONNECTIONS";
/// Environment variable: [`Options::max_header_bytes`].
pub const ENV_MAX_HEADER_BYTES: &str = "PINNED_MAX_HEADER_BYTES";
/// Variables whose value `production` or `prod` marks a production process.
pub const PRODUCTION_MARKERS: [&str; 3] = ["NODE_ENV", "ENVIRONMENT", "APP_ENV"];

/// One namespace to host, as [`Options::host_with`] records it: what the
/// factory in [`Options::build`] builds its layers from.
pub(crate) struct HostSpec {
    pub(crate) ns: String,
    pub(crate) options: HostOptions,
    /// The object's hooks, for the namespace layer.
    pub(crate) lifecycle: Lifecycle,
    /// The object's routes behind the request stack.
    pub(crate) routes: fn(std::sync::Weak<crate::namespace::Namespace>, bool) -> axum::Router,
    /// The object's trays, for the durable layer.
    pub(crate) trays: std::sync::Arc<crate::durable::tray::Declared>,
}

/// How a worker is built: which objects it hosts under which namespaces,
/// and how [`serve`](crate::serve) binds.
///
/// ```
/// # use pinned::{BoxError, Context, Object, Options};
/// # struct Counter;
/// # impl Object for Counter {
/// #     async fn activate(_: &Context) -> Result<Self, BoxError> { Ok(Counter) }
/// #     fn routes() -> pinned::Routes<Self> { axum::Router::new() }
/// # }
/// let worker = Options::new()
///     .host::<Counter>("/counter")
///     .env_vars([("NODE_ENV", "development")])
///     .build()?;
/// # Ok::<(), pinned::ConfigErrors>(())
/// ```
#[must_use]
pub struct Options {
    pub(crate) hosts: Vec<HostSpec>,
    pub(crate) port: Option<String>,
    pub(crate) bind: Option<String>,
    env: Option<HashMap<String, String>>,
    pub(crate) pinboard_url: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) advertise_url: Option<String>,
    pub(crate) hostname: Option<String>,
    pub(crate) world: Option<String>,
    pub(crate) takeover: Option<Takeover>,
    pub(crate) epoch: u64,
    pub(crate) cluster_host: ClusterHost,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) lease_buffer: Duration,
    pub(crate) headroom: Option<Headroom>,
    pub(crate) store: Option<std::sync::Arc<dyn pinned_store::StateStore>>,
    pub(crate) pinboard_ca: Option<PathBuf>,
    pub(crate) edge: EdgeSettings,
    /// Hibernatable sockets the worker holds open at most.
    pub(crate) max_sockets: usize,
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    /// Edge variables that did not parse, reported by `validate`.
    edge_variables: Vec<ConfigError>,
    pub(crate) states: crate::namespace::States,
    pub(crate) domain: crate::time::Domain,
    pub(crate) fence_reclaim: crate::durable::reclaim::Schedule,
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field(
                "hosts",
                &self.hosts.iter().map(|h| &h.ns).collect::<Vec<_>>(),
            )
            .field("port", &self.port)
            .field("bind", &self.bind)
            .finish()
    }
}

impl Options {
    /// No hosts, no control plane; the environment is read at build time.
    pub fn new() -> Self {
        Self {
            hosts: Vec::new(),
            port: None,
            bind: None,
            env: None,
            pinboard_url: None,
            token: None,
            advertise_url: None,
            hostname: None,
            world: None,
            takeover: None,
            epoch: 0,
            cluster_host: ClusterHost::default(),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            lease_buffer: DEFAULT_LEASE_BUFFER,
            headroom: None,
            store: None,
            pinboard_ca: None,
            edge: EdgeSettings::default(),
            max_sockets: crate::namespace::sockets::DEFAULT_MAX_SOCKETS,
            tls_cert: None,
            tls_key: None,
            edge_variables: Vec::new(),
            states: crate::namespace::States::default(),
            domain: crate::time::Domain::system(),
            fence_reclaim: crate::durable::reclaim::Schedule::default(),
        }
    }

    /// How often the worker deletes the fence (epoch) rows of ids that hold
    /// no data in its store, and how old their epoch must be: every store
    /// operation, reads included, leaves its id a fence row, and ids are
    /// the clients' choice. Defaults: every 10 minutes, epochs older than an
    /// hour; the age is raised to twice the lease TTL pinboard grants plus
    /// the store's 30 s transaction deadline when that is more (an older
    /// epoch's owner has surely stopped). `interval` zero: never. The first
    /// pass runs one interval after the start.
    pub fn fence_reclaim(mut self, interval: Duration, age: Duration) -> Self {
        self.fence_reclaim = crate::durable::reclaim::Schedule { interval, age };
        self
    }

    /// Options from the process environment: `PORT`, `HOST`, `PINBOARD_URL`,
    /// `PINBOARD_TOKEN`, `ADVERTISE_URL`, `PINNED_HOSTNAME`,
    /// `PINNED_PINBOARD_CA`, the edge's `PINNED_HEADER_READ_TIMEOUT_MS`,
    /// `PINNED_KEEP_ALIVE_TIMEOUT_MS`, `PINNED_SHUTDOWN_TIMEOUT_MS`,
    /// `PINNED_MAX_CONNECTIONS`, `PINNED_MAX_HEADER_BYTES`, and the
    /// production markers (`NODE_ENV`, `ENVIRONMENT`, `APP_ENV`).
    pub fn from_env() -> Self {
        Self::new().env_vars(std::env::vars())
    }

    /// Reads configuration from these variables instead of the process
    /// environment (tests, embedding). A setting made in code before this
    /// call (`.port`, `.pinboard`, `.hostname`, `.tls`, the edge's bounds)
    /// stays unless one of the variables names another value.
    pub fn env_vars<K, V>(mut self, vars: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        let vars: HashMap<String, String> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        // Settings given in code before this call stay unless a variable
        // names another: the last word wins, whichever said it.
        for (variable, field) in [
            (ENV_PORT, &mut self.port),
            (ENV_HOST, &mut self.bind),
            (ENV_PINBOARD_URL, &mut self.pinboard_url),
            (ENV_PINBOARD_TOKEN, &mut self.token),
            (ENV_ADVERTISE_URL, &mut self.advertise_url),
            (ENV_PINNED_HOSTNAME, &mut self.hostname),
        ] {
            if let Some(value) = vars.get(variable) {
                *field = Some(value.clone());
            }
        }
        for (variable, field) in [
            (ENV_PINBOARD_CA, &mut self.pinboard_ca),
            (ENV_TLS_CERT, &mut self.tls_cert),
            (ENV_TLS_KEY, &mut self.tls_key),
        ] {
            if let Some(path) = vars.get(variable) {
                *field = Some(PathBuf::from(path));
            }
        }
        self.edge_variables.clear();
        let mut number = |variable: &'static str| -> Option<u64> {
            let value = vars.get(variable)?;
            match value.trim().parse() {
                Ok(n) => Some(n),
                Err(_) => {
                    self.edge_variables.push(ConfigError::EdgeVariable {
                        variable,
                        value: value.clone(),
                    });
                    None
                }
            }
        };
        let millis = Duration::from_millis;
        let header = number(ENV_HEADER_READ_TIMEOUT_MS).map(millis);
        let keep_alive = number(ENV_KEEP_ALIVE_TIMEOUT_MS).map(millis);
        let shutdown = number(ENV_SHUTDOWN_TIMEOUT_MS).map(millis);
        let connections = number(ENV_MAX_CONNECTIONS);
        let head = number(ENV_MAX_HEADER_BYTES);
        let edge = &mut self.edge;
        edge.timeouts.header = header.unwrap_or(edge.timeouts.header);
        edge.timeouts.keep_alive = keep_alive.unwrap_or(edge.timeouts.keep_alive);
        edge.shutdown_timeout = shutdown.unwrap_or(edge.shutdown_timeout);
        if let Some(n) = connections {
            edge.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = head {
            edge.max_header_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        self.env = Some(vars);
        self
    }

    /// Trusts the CA certificates in this PEM file for an `https://`
    /// pinboard, beside the Mozilla roots (overrides `PINNED_PINBOARD_CA`).
    pub fn pinboard_ca(mut self, pem_file: impl Into<PathBuf>) -> Self {
        self.pinboard_ca = Some(pem_file.into());
        self
    }

    /// [`serve`](crate::serve) answers HTTPS (rustls, TLS 1.2 and 1.3, ALPN
    /// `http/1.1`) with this PEM certificate chain (leaf first) and PEM
    /// private key, instead of plain HTTP (overrides `PINNED_TLS_CERT` /
    /// `PINNED_TLS_KEY`). The handshake must finish within the header read
    /// timeout of accept, and counts against the connection cap. Advertise
    /// an `https://` URL, and give pinboard the CA (`--upstream-ca`) when it
    /// is a private one.
    pub fn tls(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_cert = Some(cert.into());
        self.tls_key = Some(key.into());
        self
    }

    /// Time a client has to send a complete request head to
    /// [`serve`](crate::serve), counted from the head's first byte (from
    /// accept for a connection's first request); then the connection is
    /// closed. Default 10 s (`PINNED_HEADER_READ_TIMEOUT_MS`), as pinboard.
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.edge.timeouts.header = timeout;
        self
    }

    /// Time a keep-alive connection to [`serve`](crate::serve) may sit idle
    /// between two requests; then it is closed. Default 60 s
    /// (`PINNED_KEEP_ALIVE_TIMEOUT_MS`), as pinboard.
    pub fn keep_alive_timeout(mut self, timeout: Duration) -> Self {
        self.edge.timeouts.keep_alive = timeout;
        self
    }

    /// Time open connections get to finish once [`serve`](crate::serve)'s
    /// drain is done; then they are dropped. Default 10 s
    /// (`PINNED_SHUTDOWN_TIMEOUT_MS`), as pinboard.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.edge.shutdown_timeout = timeout;
        self
    }

    /// Hibernatable sockets ([`WebSocketUpgrade::accept`]) the worker holds
    /// open at most, all namespaces together (default 100 000,
    /// `pinned::ws::DEFAULT_MAX_SOCKETS`); one more is refused with 503
    /// before the handshake. An accepted socket leaves the connection cap
    /// and counts here.
    ///
    /// [`WebSocketUpgrade::accept`]: crate::ws::WebSocketUpgrade::accept
    pub fn max_sockets(mut self, max: usize) -> Self {
        self.max_sockets = max;
        self
    }

    /// Most client connections [`serve`](crate::serve) keeps open at once;
    /// one more is accepted and closed at once. Lowered to half the
    /// open-file limit when that is smaller. Default 10 000
    /// (`PINNED_MAX_CONNECTIONS`), as pinboard.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.edge.max_connections = max;
        self
    }

    /// Largest request head (request line and headers) in bytes; a larger
    /// one is answered 431. Default 64 KiB (`PINNED_MAX_HEADER_BYTES`), as
    /// pinboard.
    pub fn max_header_bytes(mut self, max: usize) -> Self {
        self.edge.max_header_bytes = max;
        self
    }

    /// Control-plane mode: register with the pinboard at `pinboard_url`
    /// using the deployment `token`, reachable at `advertise_url` (which must
    /// address this process alone).
    ///
    /// An `advertise_url` with port 0 (`http://10.0.0.5:0`) is this URL with
    /// the port [`serve`](crate::serve) bound (with `PORT=0`, the one the
    /// kernel picked), filled in before the worker first registers. Only
    /// `serve(options)` can do that: [`build`](Self::build) refuses such a
    /// URL ([`ConfigError::UnboundAdvertisePort`]), since a worker whose
    /// router you serve yourself must advertise your listener's port.
    pub fn pinboard(
        mut self,
        pinboard_url: impl Into<String>,
        token: impl Into<String>,
        advertise_url: impl Into<String>,
    ) -> Self {
        self.pinboard_url = Some(pinboard_url.into());
        self.token = Some(token.into());
        self.advertise_url = Some(advertise_url.into());
        self
    }

    /// The worker's hostname binding (placement world and supersession).
    pub fn hostname(mut self, hostname: impl Into<String>) -> Self {
        self.hostname = Some(hostname.into());
        self
    }

    /// The placement environment of the hostname binding (needs a hostname).
    pub fn placement_env(mut self, env: impl Into<String>) -> Self {
        self.world = Some(env.into());
        self
    }

    /// What happens to a lower-epoch worker of the same hostname (needs a
    /// hostname).
    pub fn takeover(mut self, takeover: Takeover) -> Self {
        self.takeover = Some(takeover);
        self
    }

    /// The deployment epoch (0: none); a higher one supersedes this
    /// hostname's older workers.
    pub fn deployment_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }

    /// How cluster calls through pinboard name their world.
    pub fn cluster_host(mut self, cluster_host: ClusterHost) -> Self {
        self.cluster_host = cluster_host;
        self
    }

    /// Heartbeat period (default 3 s).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// Safety margin before the lease deadline during which new activations
    /// are refused (default 5 s).
    pub fn lease_buffer(mut self, buffer: Duration) -> Self {
        self.lease_buffer = buffer;
        self
    }

    /// The durable state store instances reach through
    /// [`Context::store`](crate::Context::store), and alarms live in. Open
    /// one with `pinned_store::StoreConfig` (Postgres for fleets, the
    /// embedded SQLite file for one machine).
    pub fn store(mut self, store: impl pinned_store::StateStore + 'static) -> Self {
        self.store = Some(std::sync::Arc::new(store));
        self
    }

    /// Shares `state` (a database pool, an HTTP client, a configuration)
    /// with every instance: handlers extract it with
    /// [`State<S>`](crate::State), lifecycle code reads it with
    /// [`Context::state`](crate::Context::state). One value per type; a
    /// second value of the same type replaces the first.
    pub fn state<S: Clone + Send + Sync + 'static>(mut self, state: S) -> Self {
        self.states.insert(state);
        self
    }

    /// Where the worker and its instances get wall time, timers, tasks
    /// and randomness (default [`Domain::system`]);
    /// [`Domain::simulated`] runs them on tokio's paused clock with seeded
    /// randomness, for tests and simulations.
    ///
    /// [`Domain::system`]: crate::Domain::system
    /// [`Domain::simulated`]: crate::Domain::simulated
    pub fn domain(mut self, domain: crate::Domain) -> Self {
        self.domain = domain;
        self
    }

    /// The headroom probe reported to pinboard, in MB (default: cgroup limit
    /// minus usage, floored by available memory).
    pub fn headroom(mut self, probe: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.headroom = Some(std::sync::Arc::new(probe));
        self
    }

    /// Namespaces object `T` under namespace `ns` with default options.
    pub fn host<T: Object>(self, ns: &str) -> Self {
        self.host_with::<T>(ns, HostOptions::default())
    }

    /// Namespaces object `T` under namespace `ns`.
    pub fn host_with<T: Object>(mut self, ns: &str, options: HostOptions) -> Self {
        self.hosts.push(HostSpec {
            ns: ns.to_owned(),
            options,
            lifecycle: crate::object::lifecycle::<T>(),
            routes: crate::serve::stack::routes::<T>,
            trays: std::sync::Arc::new(T::trays().into_declared()),
        });
        self
    }

    /// The port [`serve`](crate::serve) binds (overrides `PORT`).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port.to_string());
        self
    }

    fn var(&self, name: &str) -> Option<String> {
        match &self.env {
            Some(vars) => vars.get(name).cloned(),
            None => std::env::var(name).ok(),
        }
    }

    pub(crate) fn parsed_port(&self) -> Result<u16, ConfigError> {
        match self.port.as_deref().map(str::trim) {
            None | Some("") => Ok(0),
            Some(text) => text.parse().map_err(|_| ConfigError::Port(text.to_owned())),
        }
    }

    /// Validates everything, reporting all problems at once. `served`: the
    /// worker goes to [`serve`](crate::serve), which binds and can fill in
    /// an advertise URL's port 0.
    pub(crate) fn validate(&self, served: bool) -> Result<(), ConfigErrors> {
        let mut errors = Vec::new();
        if self.hosts.is_empty() {
            errors.push(ConfigError::NoHosts);
        }
        let mut seen = std::collections::HashSet::new();
        for host in &self.hosts {
            if let Err(invalid) = ids::validate_namespace(&host.ns) {
                errors.push(invalid.into());
            } else if !seen.insert(host.ns.as_str()) {
                errors.push(ConfigError::DuplicateNamespace(host.ns.clone()));
            }
            if host.options.max_instances == 0 {
                errors.push(ConfigError::MaxInstances(host.ns.clone()));
            }
            if host.options.sweep_interval.is_zero() {
                errors.push(ConfigError::SweepInterval(host.ns.clone()));
            }
            if host.options.detached_timeout.is_zero() {
                errors.push(ConfigError::DetachedTimeout(host.ns.clone()));
            }
        }
        if let Err(port) = self.parsed_port() {
            errors.push(port);
        }
        match &self.pinboard_url {
            Some(url) => {
                if url.trim().is_empty() {
                    errors.push(ConfigError::EmptyPinboardUrl);
                }
                if self.token.as_deref().is_none_or(str::is_empty) {
                    errors.push(ConfigError::MissingToken);
                }
                match self.advertise_url.as_deref() {
                    None | Some("") => errors.push(ConfigError::MissingAdvertiseUrl),
                    Some(url) if !served && crate::plane::advertise::zero_port(url).is_some() => {
                        errors.push(ConfigError::UnboundAdvertisePort(url.to_owned()));
                    }
                    Some(_) => {}
                }
            }
            None => {
                if self.token.is_some() || self.advertise_url.is_some() {
                    errors.push(ConfigError::MissingPinboardUrl);
                }
            }
        }
        if self.hostname.is_none() && (self.world.is_some() || self.takeover.is_some()) {
            errors.push(ConfigError::MissingHostname);
        }
        if self.lease_buffer.is_zero() {
            errors.push(ConfigError::LeaseBuffer);
        }
        if self.heartbeat_interval.is_zero() {
            errors.push(ConfigError::HeartbeatInterval);
        }
        errors.extend(self.edge_variables.iter().cloned());
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => errors.push(ConfigError::HalfTls { missing: "the key" }),
            (None, Some(_)) => errors.push(ConfigError::HalfTls {
                missing: "the certificate",
            }),
            _ => {}
        }
        errors.extend(self.edge.problems());
        if self.pinboard_url.is_none()
            && self.var(ENV_ALLOW_DEV_IN_PRODUCTION).as_deref() != Some("1")
        {
            for variable in PRODUCTION_MARKERS {
                if let Some(value) = self.var(variable) {
                    if matches!(
                        value.trim().to_ascii_lowercase().as_str(),
                        "production" | "prod"
                    ) {
                        errors.push(ConfigError::DevModeInProduction { variable, value });
                        break;
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// The control-plane configuration, when one is set (validated).
    pub(crate) fn plane_config(&mut self) -> Option<PlaneConfig> {
        let pinboard_url = self.pinboard_url.clone()?;
        Some(PlaneConfig {
            pinboard_url: pinboard_url.trim_end_matches('/').to_owned(),
            token: self.token.clone().unwrap_or_default(),
            advertise_url: self.advertise_url.clone().unwrap_or_default(),
            hostname: self.hostname.clone(),
            env: self.world.clone(),
            takeover: self.takeover,
            epoch: self.epoch,
            cluster_host: self.cluster_host,
            heartbeat_interval: self.heartbeat_interval,
            headroom: self
                .headroom
                .clone()
                .unwrap_or_else(|| std::sync::Arc::new(crate::plane::headroom::default_headroom)),
            pinboard_ca: self.pinboard_ca.clone(),
        })
    }

    /// The TLS acceptor of [`tls`](Self::tls), `None` for plain HTTP
    /// (validated: both files or neither).
    pub(crate) fn tls_acceptor(&self) -> Result<Option<TlsAcceptor>, ConfigError> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => pinned_edge::tls::server_config(cert, key)
                .map(|config| Some(TlsAcceptor::from(config)))
                .map_err(|e| ConfigError::Tls(e.to_string())),
            _ => Ok(None),
        }
    }

    pub(crate) fn into_hosts(self) -> Vec<HostSpec> {
        self.hosts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    impl Object for Nothing {
        async fn activate(_: &crate::Context) -> Result<Self, crate::BoxError> {
            Ok(Nothing)
        }

        fn routes() -> crate::Routes<Self> {
            axum::Router::new()
        }
    }

    fn behind_pinboard(advertise: &str) -> Options {
        Options::new().host::<Nothing>("/n").env_vars([
            (ENV_PINBOARD_URL, "http://127.0.0.1:7070"),
            (ENV_PINBOARD_TOKEN, "t"),
            (ENV_ADVERTISE_URL, advertise),
        ])
    }

    #[test]
    fn a_zero_advertise_port_is_for_serve_alone() {
        let url = "http://127.0.0.1:0";
        assert_eq!(
            behind_pinboard(url).validate(false),
            Err(ConfigErrors(vec![ConfigError::UnboundAdvertisePort(
                url.to_owned()
            )]))
        );
        assert_eq!(behind_pinboard(url).validate(true), Ok(()));
        // A real port is fine either way.
        for served in [false, true] {
            assert_eq!(
                behind_pinboard("http://127.0.0.1:8080").validate(served),
                Ok(())
            );
        }
    }

    #[test]
    fn the_refusal_names_the_url_and_the_way_out() {
        let error = ConfigError::UnboundAdvertisePort("http://h:0".into()).to_string();
        assert!(error.contains("\"http://h:0\""), "{error}");
        assert!(error.contains("pinned::serve"), "{error}");
    }
}
