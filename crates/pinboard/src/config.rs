//! Configuration: flags and environment variables, parsed in one place.
//!
//! Owns the [`Config`] plain-data struct and every default (named consts).
//! Never opens sockets or connections; runtime handles live in `server`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use pinned_edge::logging::{LogFormat, LogSettings};
use pinned_edge::tls::{self, tokio_rustls::TlsAcceptor, TlsError};

use crate::registry::auth::{split_list, Credentials};
use crate::upstream::UpstreamTls;

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// Default lease TTL handed to workers (`expiresInMs`).
pub const DEFAULT_LEASE_TTL_MS: u64 = 10_000;
/// Default bounded retries of one proxied request after a refusal. With the
/// backoff of `proxy::classify` (capped at 250 ms) eight retries wait up to
/// about 1.4 s for a closing instance's release: long enough for a drained
/// worker handing back a thousand ids at once.
pub const DEFAULT_PROXY_RETRIES: u32 = 8;
/// Default Redis key prefix.
pub const DEFAULT_REDIS_PREFIX: &str = "pinboard:";
/// Default time any Redis call waits for its answer (the claim batcher's
/// default deadline).
pub const DEFAULT_REDIS_TIMEOUT_MS: u64 = 5_000;
/// Default of `--redis-cluster-replicas`.
pub const DEFAULT_REDIS_CLUSTER_REPLICAS: u32 = 1;
/// Default largest request body buffered so it can be re-sent on a retry.
pub const DEFAULT_RETRY_BODY_LIMIT: usize = 64 * 1024;
/// Default timeout of the challenge round trip to a worker.
pub const DEFAULT_CHALLENGE_TIMEOUT_MS: u64 = 3_000;
/// Default interval at which the local worker list is re-read from the store.
pub const DEFAULT_WORKER_REFRESH_MS: u64 = 500;
/// Default `--route-cache-capacity`.
pub const DEFAULT_ROUTE_CACHE_CAPACITY: usize = 1_000_000;
/// Default interval between two sweeper laps (the JS document's `sweepIntervalMs`).
pub const DEFAULT_SWEEP_INTERVAL_MS: u64 = 5_000;
/// Default most rows one sweeper lap reads per scan (due alarms, marked instances).
pub const DEFAULT_SWEEP_LIMIT: usize = 256;
/// Default most `_alarm` / `_wake` calls in flight at once.
pub const DEFAULT_SWEEP_CONCURRENCY: usize = 32;
/// Default time a client has to send a complete request head, counted from
/// its first byte (or from accept, for a connection's first request).
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = pinned_edge::defaults::HEADER_READ_TIMEOUT_MS;
/// Default time a keep-alive connection may sit idle between two requests.
pub const DEFAULT_KEEP_ALIVE_TIMEOUT_MS: u64 = pinned_edge::defaults::KEEP_ALIVE_TIMEOUT_MS;
/// Default time a client has to send a body pinboard reads itself (registry
/// calls, buffered proxy bodies), and the longest pause inside a streamed
/// proxy body.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 30_000;
/// Default time open connections get to finish after SIGTERM / SIGINT
/// before they are dropped.
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = pinned_edge::defaults::SHUTDOWN_TIMEOUT_MS;
/// Default most client connections open at once (per process).
pub const DEFAULT_MAX_CONNECTIONS: usize = pinned_edge::defaults::MAX_CONNECTIONS;
/// Default largest request head (request line and headers), in bytes.
pub const DEFAULT_MAX_HEADER_BYTES: usize = pinned_edge::defaults::MAX_HEADER_BYTES;
/// Smallest `--max-header-bytes` accepted.
pub const MIN_MAX_HEADER_BYTES: usize = pinned_edge::defaults::MIN_MAX_HEADER_BYTES;
/// Default largest `/registry/*` request body, in bytes: a re-registration
/// listing 10 000 instances with ids of about 150 characters fits.
pub const DEFAULT_MAX_REGISTRY_BODY_BYTES: usize = 2 * 1024 * 1024;
/// Default time a worker has to answer a proxied request with a response
/// head, counted from when the request (body included) was sent.
pub const DEFAULT_UPSTREAM_TIMEOUT_MS: u64 = 30_000;
/// Default longest pause in a worker's answer body once its head came:
/// nginx's `proxy_read_timeout`.
pub const DEFAULT_UPSTREAM_BODY_TIMEOUT_MS: u64 = 60_000;
/// Longest `--upstream-body-timeout-ms`: one year, as for operator deadlines.
pub const MAX_UPSTREAM_BODY_TIMEOUT_MS: u64 = 365 * 24 * 3600 * 1000;
/// Default time a cluster session a forced re-read did not find stays
/// known as unknown (no further forced re-read for it).
pub const DEFAULT_UNKNOWN_SESSION_TTL_MS: u64 = 1_000;
/// Default least time between two forced re-reads of the worker list.
pub const DEFAULT_FORCED_REFRESH_INTERVAL_MS: u64 = 100;
/// Default time an older deployment that declared `takeover: "wind_down"`
/// is drained before it is superseded.
pub const DEFAULT_TAKEOVER_WIND_DOWN_MS: u64 = 30_000;
/// Longest `--takeover-wind-down-ms`: one year, as for operator deadlines.
pub const MAX_TAKEOVER_WIND_DOWN_MS: u64 = 365 * 24 * 3600 * 1000;
/// Default window of the dashboard's failed-login limit (10 wrong tokens
/// per client address per window).
pub const DEFAULT_DASHBOARD_LOGIN_WINDOW_MS: u64 = 60_000;
/// Default period after which a failure that keeps repeating (a store
/// down, a sweeper scan failing) is logged again, with its count.
pub const DEFAULT_LOG_REPEAT_MS: u64 = 60_000;
/// How long `/readyz` waits for the placement store to answer.
pub const READY_STORE_TIMEOUT_MS: u64 = 1_000;

/// pinboard: registry, placement and reverse proxy for pinned workers.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "pinboard",
    version,
    about,
    after_help = "Operator commands against a running pinboard: pinboard workers | placements | \
                  drain | undrain | wind-down | sweeper | moves (see pinboard <command> --help)."
)]
pub struct Config {
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, env = "PINBOARD_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// Worker token (required): what workers present as `Authorization:
    /// Bearer <token>` on register, heartbeat, release, deregister and tag.
    /// A comma-separated list accepts each entry (rotation without downtime).
    #[arg(long, env = "PINBOARD_TOKEN", hide_env_values = true)]
    pub token: String,

    /// Operator token: what `/registry/push`, `/registry/workers` and
    /// `/registry/overview` take (a comma-separated list accepts each entry).
    /// Without it those endpoints take the worker token, with a warning at
    /// start.
    #[arg(long, env = "PINBOARD_OPERATOR_TOKEN", hide_env_values = true)]
    pub operator_token: Option<String>,

    /// Redis URL; without it placement lives in this process (one node).
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,

    /// Redis Cluster: a comma-separated list of its nodes' URLs
    /// (`redis://host:port`; any one that answers is enough, the client
    /// finds the rest). Placement is spread over 64 virtual shards, each a
    /// hash tag. Exclusive with `--redis-url`.
    #[arg(long, env = "REDIS_CLUSTER_URL", conflicts_with = "redis_url")]
    pub redis_cluster_url: Option<String>,

    /// Redis Cluster: replicas every acknowledged placement, reclaim,
    /// registration and heartbeat waits for (`WAIT`), so a failover that
    /// promotes one loses none of them; 0 for a cluster without replicas.
    #[arg(long, env = "PINBOARD_REDIS_CLUSTER_REPLICAS", default_value_t = DEFAULT_REDIS_CLUSTER_REPLICAS)]
    pub redis_cluster_replicas: u32,

    /// Prefix of every Redis key (lets several deployments or tests share one Redis).
    #[arg(long, env = "PINBOARD_REDIS_PREFIX", default_value = DEFAULT_REDIS_PREFIX)]
    pub redis_prefix: String,

    /// Time every Redis call (connect, claim, heartbeat, operator read,
    /// sweeper query) waits for its answer, in milliseconds; past it the
    /// call fails as the store being unavailable.
    #[arg(long, env = "PINBOARD_REDIS_TIMEOUT_MS", default_value_t = DEFAULT_REDIS_TIMEOUT_MS)]
    pub redis_timeout_ms: u64,

    /// Lease TTL granted to workers, in milliseconds (`expiresInMs`).
    #[arg(long, env = "PINBOARD_LEASE_TTL_MS", default_value_t = DEFAULT_LEASE_TTL_MS)]
    pub lease_ttl_ms: u64,

    /// Quarantine before placing new ids, in milliseconds, after a start
    /// on an empty store or after the store lost its data (default: one
    /// lease TTL; after a store loss never shorter than one lease TTL, so
    /// every live worker re-registers before its ids can move).
    #[arg(long, env = "PINBOARD_QUARANTINE_MS")]
    pub quarantine_ms: Option<u64>,

    /// How long a vacated placement row (released, or its owner gone) is
    /// kept, in milliseconds, so a returning owner reclaims it at its epoch;
    /// then it is removed (default: six lease TTLs).
    #[arg(long, env = "PINBOARD_PLACEMENT_GRACE_MS")]
    pub placement_grace_ms: Option<u64>,

    /// Retries of one proxied request after a refusal or a failed connect.
    #[arg(long, env = "PINBOARD_PROXY_RETRIES", default_value_t = DEFAULT_PROXY_RETRIES)]
    pub proxy_retries: u32,

    /// Largest request body (bytes, known length) buffered so it can be re-sent.
    #[arg(long, env = "PINBOARD_RETRY_BODY_LIMIT", default_value_t = DEFAULT_RETRY_BODY_LIMIT)]
    pub retry_body_limit: usize,

    /// Timeout of the challenge round trip to a worker, in milliseconds.
    #[arg(long, env = "PINBOARD_CHALLENGE_TIMEOUT_MS", default_value_t = DEFAULT_CHALLENGE_TIMEOUT_MS)]
    pub challenge_timeout_ms: u64,

    /// How often the local view of live workers is re-read from the store, in milliseconds.
    #[arg(long, env = "PINBOARD_WORKER_REFRESH_MS", default_value_t = DEFAULT_WORKER_REFRESH_MS)]
    pub worker_refresh_ms: u64,

    /// I/O threads serving connections, each with its own single-threaded
    /// runtime (0: one per CPU).
    #[arg(long, env = "PINBOARD_IO_THREADS", default_value_t = 0)]
    pub io_threads: usize,

    /// Most `(namespace, id)` routes a node keeps in memory (about 200 bytes
    /// each); a route evicted early costs one store read on its next request.
    #[arg(long, env = "PINBOARD_ROUTE_CACHE_CAPACITY", default_value_t = DEFAULT_ROUTE_CACHE_CAPACITY)]
    pub route_cache_capacity: usize,

    /// Postgres connection string of the workers' state store; enables the
    /// alarm and durable-wake sweeper (`postgresql://user@host:port/db`, libpq
    /// `sslmode`/`sslrootcert` included, or `key=value` pairs).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Interval between two sweeper laps, in milliseconds (the sweeper lease
    /// lasts three of them).
    #[arg(long, env = "PINBOARD_SWEEP_INTERVAL_MS", default_value_t = DEFAULT_SWEEP_INTERVAL_MS)]
    pub sweep_interval_ms: u64,

    /// Most rows one sweeper lap reads per scan (due alarms, marked instances).
    #[arg(long, env = "PINBOARD_SWEEP_LIMIT", default_value_t = DEFAULT_SWEEP_LIMIT)]
    pub sweep_limit: usize,

    /// Most `_alarm` / `_wake` calls the sweeper keeps in flight at once.
    #[arg(long, env = "PINBOARD_SWEEP_CONCURRENCY", default_value_t = DEFAULT_SWEEP_CONCURRENCY)]
    pub sweep_concurrency: usize,

    /// Time a client has to send a complete request head, in milliseconds,
    /// counted from the head's first byte (from accept for a connection's
    /// first request); then the connection is closed.
    #[arg(long, env = "PINBOARD_HEADER_READ_TIMEOUT_MS", default_value_t = DEFAULT_HEADER_READ_TIMEOUT_MS)]
    pub header_read_timeout_ms: u64,

    /// Time a keep-alive connection may sit idle between two requests, in
    /// milliseconds; then it is closed.
    #[arg(long, env = "PINBOARD_KEEP_ALIVE_TIMEOUT_MS", default_value_t = DEFAULT_KEEP_ALIVE_TIMEOUT_MS)]
    pub keep_alive_timeout_ms: u64,

    /// Time a client has to send a body pinboard reads whole (registry
    /// calls, buffered proxy bodies: 408 after it), and the longest pause
    /// inside a streamed proxy body, in milliseconds.
    #[arg(long, env = "PINBOARD_BODY_TIMEOUT_MS", default_value_t = DEFAULT_BODY_TIMEOUT_MS)]
    pub body_timeout_ms: u64,

    /// Time open connections get to finish after SIGTERM / SIGINT, in
    /// milliseconds; connections still open then are dropped.
    #[arg(long, env = "PINBOARD_SHUTDOWN_TIMEOUT_MS", default_value_t = DEFAULT_SHUTDOWN_TIMEOUT_MS)]
    pub shutdown_timeout_ms: u64,

    /// Most client connections open at once; one more is accepted and
    /// closed at once. Lowered to half the open-file limit when that is
    /// smaller (every proxied connection may need a worker connection too).
    #[arg(long, env = "PINBOARD_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Largest request head (request line and headers) in bytes; a larger
    /// one is answered 431 and the connection closed.
    #[arg(long, env = "PINBOARD_MAX_HEADER_BYTES", default_value_t = DEFAULT_MAX_HEADER_BYTES)]
    pub max_header_bytes: usize,

    /// Largest `/registry/*` request body in bytes; a larger one is answered 413.
    #[arg(long, env = "PINBOARD_MAX_REGISTRY_BODY_BYTES", default_value_t = DEFAULT_MAX_REGISTRY_BODY_BYTES)]
    pub max_registry_body_bytes: usize,

    /// Time a worker has to answer a proxied request with a response head,
    /// in milliseconds, counted from when the request (body included) was
    /// sent; then the client gets 504 and the cached route is dropped.
    #[arg(long, env = "PINBOARD_UPSTREAM_TIMEOUT_MS", default_value_t = DEFAULT_UPSTREAM_TIMEOUT_MS)]
    pub upstream_timeout_ms: u64,

    /// Longest pause in a worker's answer body once its head came, in
    /// milliseconds (the time between two reads of it, as nginx's
    /// `proxy_read_timeout`); past it the client's answer is aborted (cut
    /// short, never ended as complete). A stream that must pause longer
    /// (server-sent events with sparse events, say) needs a larger value.
    /// Upgraded connections (WebSockets) have no such bound. At most one year.
    #[arg(long, env = "PINBOARD_UPSTREAM_BODY_TIMEOUT_MS", default_value_t = DEFAULT_UPSTREAM_BODY_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(0..=MAX_UPSTREAM_BODY_TIMEOUT_MS))]
    pub upstream_body_timeout_ms: u64,

    /// Time a cluster session (`Pinboard-Session`) that a forced re-read of
    /// the worker list did not find stays known as unknown, in
    /// milliseconds: calls naming it are refused from the local view, with
    /// no store read.
    #[arg(long, env = "PINBOARD_UNKNOWN_SESSION_TTL_MS", default_value_t = DEFAULT_UNKNOWN_SESSION_TTL_MS)]
    pub unknown_session_ttl_ms: u64,

    /// Least time between two forced re-reads of the worker list (an unknown
    /// cluster session, a refused attestation), in milliseconds; callers in
    /// between share the next one.
    #[arg(long, env = "PINBOARD_FORCED_REFRESH_INTERVAL_MS", default_value_t = DEFAULT_FORCED_REFRESH_INTERVAL_MS)]
    pub forced_refresh_interval_ms: u64,

    /// When a newer deployment of a hostname (same env) registers, an older
    /// session that declared `takeover: "wind_down"` is drained for this
    /// long, in milliseconds (it finishes in-flight work and releases its
    /// instances), then superseded; 0 supersedes it at its next heartbeat.
    /// At most one year.
    #[arg(long, env = "PINBOARD_TAKEOVER_WIND_DOWN_MS", default_value_t = DEFAULT_TAKEOVER_WIND_DOWN_MS,
          value_parser = clap::value_parser!(u64).range(0..=MAX_TAKEOVER_WIND_DOWN_MS))]
    pub takeover_wind_down_ms: u64,

    /// PEM certificate chain (leaf first) to serve HTTPS with; needs
    /// `--tls-key`. Without both, pinboard serves plain HTTP. The TLS
    /// handshake counts against the connection cap and must finish within
    /// `--header-read-timeout-ms` of accept (the first request head too).
    #[arg(long, env = "PINBOARD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `--tls-cert`.
    #[arg(long, env = "PINBOARD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// PEM file of extra CA certificates trusted for `https://` advertise
    /// URLs (challenge probes, proxied requests, sweeper calls), beside the
    /// Mozilla roots of `webpki-roots`.
    #[arg(long, env = "PINBOARD_UPSTREAM_CA")]
    pub upstream_ca: Option<PathBuf>,

    /// Mark the dashboard's session cookie `Secure` although pinboard
    /// serves plain HTTP: for a TLS front door (a load balancer or reverse
    /// proxy terminating HTTPS) in front of it. With `--tls-cert` the
    /// cookie is `Secure` anyway. Browsers then send it over HTTPS only.
    #[arg(long, env = "PINBOARD_DASHBOARD_SECURE_COOKIE")]
    pub dashboard_secure_cookie: bool,

    /// Window of the dashboard's failed-login limit, in milliseconds: a
    /// client address that presented 10 wrong tokens within it (counted
    /// from its first) is answered 429 until it ends.
    #[arg(long, env = "PINBOARD_DASHBOARD_LOGIN_WINDOW_MS", default_value_t = DEFAULT_DASHBOARD_LOGIN_WINDOW_MS)]
    pub dashboard_login_window_ms: u64,

    /// Log line format on stderr: `text` (colours only on a terminal) or
    /// `json` (one object per line: timestamp, level, target, the event's
    /// fields, the current span and the span list). `RUST_LOG` filters
    /// (default `info`).
    #[arg(long, env = "PINBOARD_LOG_FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// A failure that keeps repeating (the store down, a sweeper scan or a
    /// worker failing every lap) is logged when it starts, when its cause
    /// changes, when it ends, and again with its count after this many
    /// milliseconds, not on every retry.
    #[arg(long, env = "PINBOARD_LOG_REPEAT_MS", default_value_t = DEFAULT_LOG_REPEAT_MS)]
    pub log_repeat_ms: u64,
}

/// Reasons the configuration is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The token is empty, or its list holds an empty entry.
    #[error("--token / PINBOARD_TOKEN must not be empty (nor hold an empty entry in its comma-separated list)")]
    EmptyToken,
    /// The operator token is set but empty, or its list holds an empty entry.
    #[error("--operator-token / PINBOARD_OPERATOR_TOKEN must not be empty (nor hold an empty entry in its comma-separated list)")]
    EmptyOperatorToken,
    /// The lease TTL is zero.
    #[error("--lease-ttl-ms must be positive")]
    ZeroLease,
    /// A sweeper setting is zero.
    #[error("--{0} must be positive")]
    ZeroSweep(&'static str),
    /// A timeout or bound of the HTTP edge is zero (every wait has a
    /// deadline, every growth a bound: zero does not mean "off").
    #[error("--{0} must be positive")]
    ZeroEdge(&'static str),
    /// `--max-header-bytes` is below [`MIN_MAX_HEADER_BYTES`].
    #[error("--max-header-bytes must be at least {MIN_MAX_HEADER_BYTES}")]
    SmallHeaderLimit,
    /// One of `--tls-cert` / `--tls-key` without the other.
    #[error("--{given} / PINBOARD_{given_env} is set but --{missing} / PINBOARD_{missing_env} is not: HTTPS needs both (or neither, for plain HTTP)")]
    HalfTls {
        /// The flag given.
        given: &'static str,
        /// Its environment variable's suffix.
        given_env: &'static str,
        /// The flag missing.
        missing: &'static str,
        /// Its environment variable's suffix.
        missing_env: &'static str,
    },
}

/// The proxy's settings, derived from [`Config`] (see `crate::proxy`).
#[derive(Debug, Clone, Copy)]
pub struct ProxySettings {
    /// Re-sends after a retryable answer (`--proxy-retries`).
    pub retries: u32,
    /// Largest request body buffered for re-sending (`--retry-body-limit`).
    pub retry_body_limit: usize,
    /// Time a worker has to answer with a response head
    /// (`--upstream-timeout-ms`).
    pub upstream_timeout: Duration,
    /// Time to read a buffered body whole; longest pause in a streamed one
    /// (`--body-timeout-ms`).
    pub body_timeout: Duration,
    /// Longest pause in a worker's answer body once its head came
    /// (`--upstream-body-timeout-ms`).
    pub upstream_body_timeout: Duration,
}

/// How large a registry call's body may be and how long it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Largest body in bytes (413 beyond).
    pub max_bytes: usize,
    /// Time to receive all of it (408 after).
    pub timeout: Duration,
}

impl Config {
    /// The proxy's settings.
    pub fn proxy_settings(&self) -> ProxySettings {
        ProxySettings {
            retries: self.proxy_retries,
            retry_body_limit: self.retry_body_limit,
            upstream_timeout: Duration::from_millis(self.upstream_timeout_ms),
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            upstream_body_timeout: Duration::from_millis(self.upstream_body_timeout_ms),
        }
    }

    /// The bounds of `/registry/*` (and dashboard) request bodies.
    pub fn registry_body_limits(&self) -> BodyLimits {
        BodyLimits {
            max_bytes: self.max_registry_body_bytes,
            timeout: Duration::from_millis(self.body_timeout_ms),
        }
    }

    /// The effective number of I/O threads (`--io-threads`, or one per CPU).
    pub fn io_threads(&self) -> usize {
        match self.io_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }

    /// The effective quarantine (default: one lease TTL).
    pub fn quarantine_ms(&self) -> u64 {
        self.quarantine_ms.unwrap_or(self.lease_ttl_ms)
    }

    /// The effective row grace (default: six lease TTLs).
    pub fn placement_grace_ms(&self) -> u64 {
        self.placement_grace_ms.unwrap_or(
            self.lease_ttl_ms
                .saturating_mul(crate::placement::ROW_GRACE_LEASES),
        )
    }

    /// The worker and operator credentials (see [`crate::registry::auth`]).
    /// A list [`validate`](Self::validate) refuses accepts no token at all.
    pub fn credentials(&self) -> Credentials {
        Credentials::new(&self.token, self.operator_token.as_deref())
    }

    /// The TLS server configuration of `--tls-cert` / `--tls-key`, `None`
    /// for plain HTTP (a half pair is refused by [`validate`](Self::validate)).
    ///
    /// # Errors
    ///
    /// A file unreadable or unusable, naming it.
    pub fn tls_server(&self) -> Result<Option<TlsAcceptor>, TlsError> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(TlsAcceptor::from(tls::server_config(cert, key)?))),
            _ => Ok(None),
        }
    }

    /// The logging setup of `--log-format` and `--log-repeat-ms` (default
    /// filter `info`).
    pub fn log_settings(&self) -> LogSettings {
        LogSettings {
            format: self.log_format,
            repeat_period: std::time::Duration::from_millis(self.log_repeat_ms.max(1)),
            ..LogSettings::default()
        }
    }

    /// Whether the dashboard's cookie is `Secure`: pinboard serves TLS, or
    /// `--dashboard-secure-cookie` says a front door does.
    pub fn secure_cookie(&self) -> bool {
        self.dashboard_secure_cookie || self.tls_cert.is_some()
    }

    /// The TLS client of `https://` advertise URLs: the Mozilla roots plus
    /// `--upstream-ca`.
    ///
    /// # Errors
    ///
    /// The CA file unreadable or unusable, naming it.
    pub fn upstream_tls(&self) -> Result<UpstreamTls, TlsError> {
        UpstreamTls::new(self.upstream_ca.as_deref())
    }

    /// Every problem at once.
    pub fn validate(&self) -> Vec<ConfigError> {
        let mut errs = Vec::new();
        if split_list(&self.token).is_none() {
            errs.push(ConfigError::EmptyToken);
        }
        if self
            .operator_token
            .as_deref()
            .is_some_and(|t| split_list(t).is_none())
        {
            errs.push(ConfigError::EmptyOperatorToken);
        }
        if self.lease_ttl_ms == 0 {
            errs.push(ConfigError::ZeroLease);
        }
        for (flag, value) in [
            ("sweep-interval-ms", self.sweep_interval_ms),
            ("sweep-limit", self.sweep_limit as u64),
            ("sweep-concurrency", self.sweep_concurrency as u64),
        ] {
            if value == 0 {
                errs.push(ConfigError::ZeroSweep(flag));
            }
        }
        for (flag, value) in [
            ("header-read-timeout-ms", self.header_read_timeout_ms),
            ("keep-alive-timeout-ms", self.keep_alive_timeout_ms),
            ("body-timeout-ms", self.body_timeout_ms),
            ("shutdown-timeout-ms", self.shutdown_timeout_ms),
            ("max-connections", self.max_connections as u64),
            (
                "max-registry-body-bytes",
                self.max_registry_body_bytes as u64,
            ),
            ("upstream-timeout-ms", self.upstream_timeout_ms),
            ("upstream-body-timeout-ms", self.upstream_body_timeout_ms),
            ("unknown-session-ttl-ms", self.unknown_session_ttl_ms),
            ("placement-grace-ms", self.placement_grace_ms.unwrap_or(1)),
            (
                "forced-refresh-interval-ms",
                self.forced_refresh_interval_ms,
            ),
            ("dashboard-login-window-ms", self.dashboard_login_window_ms),
            ("log-repeat-ms", self.log_repeat_ms),
        ] {
            if value == 0 {
                errs.push(ConfigError::ZeroEdge(flag));
            }
        }
        if self.max_header_bytes < MIN_MAX_HEADER_BYTES {
            errs.push(ConfigError::SmallHeaderLimit);
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => errs.push(ConfigError::HalfTls {
                given: "tls-cert",
                given_env: "TLS_CERT",
                missing: "tls-key",
                missing_env: "TLS_KEY",
            }),
            (None, Some(_)) => errs.push(ConfigError::HalfTls {
                given: "tls-key",
                given_env: "TLS_KEY",
                missing: "tls-cert",
                missing_env: "TLS_CERT",
            }),
            _ => {}
        }
        errs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_quarantine() {
        let c = Config::try_parse_from(["pinboard", "--token", "t"]).expect("parse");
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(
            c.io_threads(),
            std::thread::available_parallelism().map_or(1, usize::from)
        );
        assert_eq!(c.route_cache_capacity, DEFAULT_ROUTE_CACHE_CAPACITY);
        let c = Config::try_parse_from(["pinboard", "--token", "t", "--io-threads", "3"])
            .expect("parse");
        assert_eq!(c.io_threads(), 3);
        assert_eq!(c.quarantine_ms(), DEFAULT_LEASE_TTL_MS);
        assert_eq!(c.placement_grace_ms(), 6 * DEFAULT_LEASE_TTL_MS);
        assert!(c.validate().is_empty());
        let c = Config::try_parse_from(["pinboard", "--token", " ", "--lease-ttl-ms", "0"])
            .expect("parse");
        assert_eq!(
            c.validate(),
            vec![ConfigError::EmptyToken, ConfigError::ZeroLease]
        );
        let c = Config::try_parse_from(["pinboard", "--token", "a,,b", "--operator-token", " "])
            .expect("parse");
        assert_eq!(
            c.validate(),
            vec![ConfigError::EmptyToken, ConfigError::EmptyOperatorToken]
        );
        let c =
            Config::try_parse_from(["pinboard", "--token", "new,old", "--operator-token", "op"])
                .expect("parse");
        assert!(c.validate().is_empty());
        let creds = c.credentials();
        assert!(creds.worker.accepts(b"old") && !creds.operator.accepts(b"old"));
        let c = Config::try_parse_from(["pinboard", "--token", "t", "--sweep-limit", "0"])
            .expect("parse");
        assert_eq!(c.sweep_interval_ms, DEFAULT_SWEEP_INTERVAL_MS);
        assert_eq!(c.validate(), vec![ConfigError::ZeroSweep("sweep-limit")]);
    }

    #[test]
    fn tls_needs_both_files() {
        let c = Config::try_parse_from(["pinboard", "--token", "t"]).expect("parse");
        assert!(c.tls_cert.is_none() && c.tls_key.is_none() && c.upstream_ca.is_none());
        assert!(matches!(c.tls_server(), Ok(None)));
        assert!(!c.secure_cookie(), "plain HTTP, no front door");
        let c = Config::try_parse_from(["pinboard", "--token", "t", "--dashboard-secure-cookie"])
            .expect("parse");
        assert!(c.secure_cookie(), "a TLS front door");
        let c = Config::try_parse_from(["pinboard", "--token", "t", "--tls-cert", "c.pem"])
            .expect("parse");
        let errs = c.validate();
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0].to_string(),
            "--tls-cert / PINBOARD_TLS_CERT is set but --tls-key / PINBOARD_TLS_KEY is not: \
             HTTPS needs both (or neither, for plain HTTP)"
        );
        assert!(c.secure_cookie(), "pinboard's own TLS");
        let c = Config::try_parse_from(["pinboard", "--token", "t", "--tls-key", "k.pem"])
            .expect("parse");
        assert!(c.validate()[0].to_string().starts_with("--tls-key"));
        let c = Config::try_parse_from([
            "pinboard",
            "--token",
            "t",
            "--tls-cert",
            "/nonexistent/c.pem",
            "--tls-key",
            "/nonexistent/k.pem",
        ])
        .expect("parse");
        assert!(c.validate().is_empty());
        let Err(error) = c.tls_server() else {
            panic!("missing files were accepted")
        };
        assert!(error.to_string().contains("/nonexistent/c.pem"), "{error}");
    }

    #[test]
    fn edge_defaults_and_bounds() {
        let c = Config::try_parse_from(["pinboard", "--token", "t"]).expect("parse");
        assert_eq!(c.header_read_timeout_ms, DEFAULT_HEADER_READ_TIMEOUT_MS);
        assert_eq!(c.keep_alive_timeout_ms, DEFAULT_KEEP_ALIVE_TIMEOUT_MS);
        assert_eq!(c.body_timeout_ms, DEFAULT_BODY_TIMEOUT_MS);
        assert_eq!(c.shutdown_timeout_ms, DEFAULT_SHUTDOWN_TIMEOUT_MS);
        assert_eq!(c.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(c.max_header_bytes, DEFAULT_MAX_HEADER_BYTES);
        assert_eq!(c.max_registry_body_bytes, DEFAULT_MAX_REGISTRY_BODY_BYTES);
        assert_eq!(c.upstream_timeout_ms, DEFAULT_UPSTREAM_TIMEOUT_MS);
        assert_eq!(c.upstream_body_timeout_ms, DEFAULT_UPSTREAM_BODY_TIMEOUT_MS);
        assert!(Config::try_parse_from([
            "pinboard",
            "--token",
            "t",
            "--upstream-body-timeout-ms",
            &(MAX_UPSTREAM_BODY_TIMEOUT_MS + 1).to_string(),
        ])
        .is_err());
        assert_eq!(c.takeover_wind_down_ms, DEFAULT_TAKEOVER_WIND_DOWN_MS);
        let c = Config::try_parse_from([
            "pinboard",
            "--token",
            "t",
            "--upstream-timeout-ms",
            "0",
            "--upstream-body-timeout-ms",
            "0",
            "--max-connections",
            "0",
            "--max-header-bytes",
            "10",
        ])
        .expect("parse");
        assert_eq!(
            c.validate(),
            vec![
                ConfigError::ZeroEdge("max-connections"),
                ConfigError::ZeroEdge("upstream-timeout-ms"),
                ConfigError::ZeroEdge("upstream-body-timeout-ms"),
                ConfigError::SmallHeaderLimit,
            ]
        );
    }
}
