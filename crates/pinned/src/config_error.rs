//! The configuration problems [`Options::validate`](crate::Options::validate)
//! and [`Options::build`](crate::Options::build) report, one type for every
//! layer that checks a setting (the edge, the control plane, the options).

use std::fmt;

use pinned_wire::ids;

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
    /// `detached_timeout` is 0.
    #[error("detached_timeout must be positive (namespace '{0}')")]
    DetachedTimeout(String),
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
    /// `pinboard_url` is empty.
    #[error("pinboard_url must not be empty")]
    EmptyPinboardUrl,
    /// `pinboard_url` without a token.
    #[error("control plane mode requires a token (token=)")]
    MissingToken,
    /// `pinboard_url` without an advertise URL.
    #[error("control plane mode requires an advertise URL (advertise_url=)")]
    MissingAdvertiseUrl,
    /// An advertise URL with port 0 on a worker [`serve`](crate::serve)
    /// does not bind, so nothing would fill the port in.
    #[error(
        "advertise_url {0:?} has port 0, which only pinned::serve(options) fills in with the \
         port it binds; a worker built with Options::build and served on a listener of your \
         own must advertise that listener's port"
    )]
    UnboundAdvertisePort(String),
    /// A token or advertise URL without `pinboard_url`.
    #[error("token and advertise_url require a pinboard_url (pinboard_url=)")]
    MissingPinboardUrl,
    /// `env` or `takeover` without a hostname.
    #[error("env and takeover require a hostname (hostname=)")]
    MissingHostname,
    /// A zero lease buffer.
    #[error("lease_buffer must be positive")]
    LeaseBuffer,
    /// A zero heartbeat interval.
    #[error("heartbeat_interval must be positive")]
    HeartbeatInterval,
    /// The registry HTTP client could not be built.
    #[error("cannot build the registry HTTP client: {0}")]
    HttpClient(String),
    /// The pinboard CA file (`PINNED_PINBOARD_CA`) cannot be used.
    #[error("pinboard_ca / PINNED_PINBOARD_CA: {0}")]
    PinboardCa(String),
    /// An edge variable is not a non-negative integer.
    #[error("{variable} must be an integer, got {value:?}")]
    EdgeVariable {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// An edge deadline or bound is zero (zero does not mean "off").
    #[error("{0} must be positive")]
    ZeroEdge(&'static str),
    /// One of the TLS certificate and key without the other.
    #[error("tls needs both a certificate and a key (PINNED_TLS_CERT and PINNED_TLS_KEY): {missing} is missing")]
    HalfTls {
        /// What is missing.
        missing: &'static str,
    },
    /// The TLS certificate or key cannot be used (the file is named).
    #[error("tls: {0}")]
    Tls(String),
    /// `max_header_bytes` is below the smallest head hyper can read.
    #[error("max_header_bytes must be at least {min}", min = pinned_edge::defaults::MIN_MAX_HEADER_BYTES)]
    SmallHeaderLimit,
}

/// Every problem found in one [`Options`](crate::Options).
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
