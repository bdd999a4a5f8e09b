//! Worker configuration: [`Options`] (plain data, validated once in
//! [`Options::build`]) and the errors it reports.
//!
//! Every problem is collected and reported together, so a misconfigured
//! worker fails once with the whole list rather than one line per restart.

use std::collections::HashMap;
use std::fmt;

use axum::Router;
use pinned_wire::ids;

use crate::directory::Activator;
use crate::host::HostOptions;
use crate::object::{activator, Object};

/// Environment variable: the port [`serve`](crate::serve) binds (default 0,
/// an ephemeral port).
pub const ENV_PORT: &str = "PORT";
/// Environment variable: the address [`serve`](crate::serve) binds (default
/// `127.0.0.1`).
pub const ENV_HOST: &str = "HOST";
/// Environment variable: the pinboard URL (control-plane mode).
pub const ENV_PINBOARD_URL: &str = "PINBOARD_URL";
/// Environment variable: set to `1` to allow dev mode in production.
pub const ENV_ALLOW_DEV_IN_PRODUCTION: &str = "PINBOARD_ALLOW_DEV_IN_PRODUCTION";
/// Variables whose value `production` or `prod` marks a production process.
pub const PRODUCTION_MARKERS: [&str; 3] = ["NODE_ENV", "ENVIRONMENT", "APP_ENV"];

/// One configuration problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A namespace is not `/` plus one path segment.
    #[error(transparent)]
    InvalidNamespace(#[from] ids::InvalidNamespace),
    /// Two hosts claim one namespace.
    #[error("namespace '{0}' already attached to this worker")]
    DuplicateNamespace(String),
    /// No host was configured.
    #[error("hosts must not be empty")]
    NoHosts,
    /// `max_instances` is 0.
    #[error("max_instances must be at least 1 (namespace '{0}')")]
    MaxInstances(String),
    /// `sweep_interval` is 0.
    #[error("sweep_interval must be positive (namespace '{0}')")]
    SweepInterval(String),
    /// `PORT` is not an integer port.
    #[error("PORT must be an integer port, got {0:?}")]
    Port(String),
    /// Dev mode (no pinboard) in a production environment.
    #[error(
        "pinned dev mode refused: {variable}={value} marks production and no pinboard_url is \
         set; configure a pinboard or set PINBOARD_ALLOW_DEV_IN_PRODUCTION=1"
    )]
    DevModeInProduction {
        /// The variable that marks production.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// `PINBOARD_URL` was set, but this build only runs in local mode.
    #[error(
        "control-plane mode (pinboard_url) is not supported by this build yet; unset PINBOARD_URL"
    )]
    ControlPlaneUnsupported,
}

/// Every problem found in one [`Options`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl ConfigErrors {
    /// Whether `error` is among the problems.
    pub fn contains(&self, error: &ConfigError) -> bool {
        self.0.contains(error)
    }
}

pub(crate) struct HostSpec {
    pub(crate) ns: String,
    pub(crate) options: HostOptions,
    pub(crate) activator: Activator,
    pub(crate) routes: fn() -> Router,
}

/// How a worker is built: which objects it hosts under which namespaces,
/// and how [`serve`](crate::serve) binds.
///
/// ```
/// # use pinned::{BoxError, Context, Object, Options};
/// # struct Counter;
/// # impl Object for Counter {
/// #     async fn activate(_: &Context) -> Result<Self, BoxError> { Ok(Counter) }
/// #     fn routes() -> axum::Router { axum::Router::new() }
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
        }
    }

    /// Options from the process environment: `PORT`, `HOST`, and the
    /// production markers (`NODE_ENV`, `ENVIRONMENT`, `APP_ENV`).
    pub fn from_env() -> Self {
        Self::new().env_vars(std::env::vars())
    }

    /// Reads configuration from these variables instead of the process
    /// environment (tests, embedding).
    pub fn env_vars<K, V>(mut self, vars: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        let vars: HashMap<String, String> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self.port = vars.get(ENV_PORT).cloned();
        self.bind = vars.get(ENV_HOST).cloned();
        self.env = Some(vars);
        self
    }

    /// Hosts object `T` under namespace `ns` with default options.
    pub fn host<T: Object>(self, ns: &str) -> Self {
        self.host_with::<T>(ns, HostOptions::default())
    }

    /// Hosts object `T` under namespace `ns`.
    pub fn host_with<T: Object>(mut self, ns: &str, options: HostOptions) -> Self {
        self.hosts.push(HostSpec {
            ns: ns.to_owned(),
            options,
            activator: activator::<T>(),
            routes: T::routes,
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

    /// Validates everything, reporting all problems at once.
    pub(crate) fn validate(&self) -> Result<(), ConfigErrors> {
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
        }
        if let Err(port) = self.parsed_port() {
            errors.push(port);
        }
        if self
            .var(ENV_PINBOARD_URL)
            .is_some_and(|url| !url.is_empty())
        {
            errors.push(ConfigError::ControlPlaneUnsupported);
        } else if self.var(ENV_ALLOW_DEV_IN_PRODUCTION).as_deref() != Some("1") {
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

    pub(crate) fn into_hosts(self) -> Vec<HostSpec> {
        self.hosts
    }
}
