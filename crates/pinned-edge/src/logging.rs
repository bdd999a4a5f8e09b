//! Logs both binaries write the same way: one subscriber setup, one way to
//! put an error's causes on its line, one way to log a failure a retry loop
//! repeats.
//!
//! - [`LogSettings`]: the format (`text`, or `json`: one object per line
//!   with the current span's fields and the span list), the default filter
//!   (`info` unless `RUST_LOG` says otherwise) and the reminder period of
//!   [`repeats`]; [`LogSettings::init`] installs it as the global
//!   subscriber, writing to stderr, with ANSI colours only when stderr is a
//!   terminal (never into a file or a pipe) and `NO_COLOR` is unset. Beside
//!   the console it installs the OTLP layer when the `OTEL_*` variables ask
//!   ([`crate::trace`]); each layer then has its own filter, so exporting
//!   debug spans never turns the console up (alone, the console's filter
//!   is the subscriber's).
//! - [`Chain`]: `error = %Chain(&e)` logs `e` with every `source()`.
//! - [`Repeats`] / [`repeats`]: a failure repeated by a retry loop is
//!   logged when it starts, when it changes, once per period while it
//!   lasts (with its count) and when it recovers.
//!
//! Libraries never install a subscriber (a global one belongs to the
//! binary); binaries call [`LogSettings::init`] first thing. The worker
//! SDK re-exports this module as `pinned::logging`.

mod chain;
mod repeats;

use std::io::IsTerminal;
use std::str::FromStr;
use std::time::Duration;

pub use self::chain::Chain;
pub use self::repeats::{
    repeats, Recovered, Repeats, Seen, DEFAULT_REPEAT_PERIOD, MAX_STREAMS, QUIET_PERIODS,
};

/// The environment variable a worker reads its log format from.
pub const ENV_LOG_FORMAT: &str = "PINNED_LOG_FORMAT";
/// The environment variable a worker reads its reminder period from (ms).
pub const ENV_LOG_REPEAT_MS: &str = "PINNED_LOG_REPEAT_MS";
/// The command-line flag an example reads its log format from.
pub const FLAG_LOG_FORMAT: &str = "--log-format";
/// The filter when `RUST_LOG` is unset.
pub const DEFAULT_FILTER: &str = "info";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (`tracing-subscriber`'s full format).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, the
    /// event's fields (`message` included) at the top level, `span` (the
    /// current span's name and fields) and `spans` (every span it is in,
    /// outermost first).
    Json,
}

impl FromStr for LogFormat {
    type Err = LogError;

    fn from_str(s: &str) -> Result<Self, LogError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(LogError::Format(s.to_owned())),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// Why the logging setup was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    /// A log format other than `text` or `json`.
    #[error("unknown log format {0:?} (expected text or json)")]
    Format(String),
    /// A reminder period that is not a positive number of milliseconds.
    #[error("{ENV_LOG_REPEAT_MS} must be a positive number of milliseconds, not {0:?}")]
    Period(String),
    /// A global subscriber is installed already.
    #[error("a global tracing subscriber is installed already")]
    Installed,
    /// The `OTEL_*` variables ask for an export this build cannot make.
    #[error(transparent)]
    Otlp(#[from] crate::trace::OtlpError),
}

/// The logging setup of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// The line format.
    pub format: LogFormat,
    /// The filter when `RUST_LOG` is unset (or does not parse).
    pub default_filter: String,
    /// How often a repeated failure is logged again ([`repeats`]).
    pub repeat_period: Duration,
    /// The `service.name` of exported spans when `OTEL_SERVICE_NAME` names
    /// none (`None`: the executable's file name).
    pub service: Option<String>,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            default_filter: DEFAULT_FILTER.to_owned(),
            repeat_period: DEFAULT_REPEAT_PERIOD,
            service: None,
        }
    }
}

impl LogSettings {
    /// A worker's settings: [`ENV_LOG_FORMAT`] and [`ENV_LOG_REPEAT_MS`]
    /// from the environment, then a `--log-format <text|json>` (or
    /// `--log-format=…`) among `args` (the process's arguments, for an
    /// example run by hand), which wins.
    ///
    /// # Errors
    ///
    /// An unknown format or a bad period, naming the value.
    pub fn from_env_and_args(args: impl IntoIterator<Item = String>) -> Result<Self, LogError> {
        let mut settings = Self::default();
        if let Some(format) = std::env::var(ENV_LOG_FORMAT).ok().filter(|v| !v.is_empty()) {
            settings.format = format.parse()?;
        }
        if let Some(ms) = std::env::var(ENV_LOG_REPEAT_MS)
            .ok()
            .filter(|v| !v.is_empty())
        {
            settings.repeat_period = parse_period(&ms)?;
        }
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let value = match arg.strip_prefix(FLAG_LOG_FORMAT) {
                Some("") => args.next(),
                Some(rest) => rest.strip_prefix('=').map(str::to_owned),
                None => continue,
            };
            if let Some(value) = value {
                settings.format = value.parse()?;
            }
        }
        Ok(settings)
    }

    /// Installs these settings as the global subscriber, on stderr.
    ///
    /// # Errors
    ///
    /// [`LogError::Installed`] when a global subscriber is set already.
    pub fn try_init(&self) -> Result<(), LogError> {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        use tracing_subscriber::Layer as _;

        repeats().set_period(self.repeat_period);
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&self.default_filter));
        let otlp = crate::trace::Otlp::from_env(&self.service_name())?;
        let (otlp, unbuilt) = match otlp {
            crate::trace::Otlp::Off => (None, false),
            #[cfg(feature = "otlp")]
            crate::trace::Otlp::On {
                default_service,
                filter,
            } => (
                Some(crate::trace::otlp::layer(&default_service, &filter)?),
                false,
            ),
            #[cfg(not(feature = "otlp"))]
            crate::trace::Otlp::On { .. } => (None, true),
        };
        let otlp: Option<
            Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>,
        > = otlp;
        // Made in each arm: the layer's type names the subscriber under it.
        macro_rules! console {
            () => {
                tracing_subscriber::fmt::layer().with_writer(std::io::stderr)
            };
        }
        match otlp {
            // The console alone: its filter is the subscriber's. A per-layer
            // one looks every span up again on each enter and exit, which
            // cost a warm request at `info` about 270 instructions
            // (`worker-bench`).
            None => {
                let console = match self.format {
                    LogFormat::Text => console!().with_ansi(colours()).boxed(),
                    LogFormat::Json => console!()
                        .json()
                        .flatten_event(true)
                        .with_current_span(true)
                        .with_span_list(true)
                        .boxed(),
                };
                tracing_subscriber::registry()
                    .with(filter)
                    .with(console)
                    .try_init()
            }
            // The console's filter is its own (a per-layer filter): the OTLP
            // layer may ask for debug spans without the console printing
            // them.
            Some(otlp) => {
                let console = match self.format {
                    LogFormat::Text => console!().with_ansi(colours()).with_filter(filter).boxed(),
                    LogFormat::Json => console!()
                        .json()
                        .flatten_event(true)
                        .with_current_span(true)
                        .with_span_list(true)
                        .with_filter(filter)
                        .boxed(),
                };
                tracing_subscriber::registry()
                    .with(otlp)
                    .with(console)
                    .try_init()
            }
        }
        .map_err(|_| LogError::Installed)?;
        if unbuilt {
            tracing::warn!(error = %crate::trace::OtlpError::NotBuilt, "traces are not exported");
        }
        Ok(())
    }

    /// The `service.name` of exported spans when `OTEL_SERVICE_NAME` names
    /// none: [`service`](Self::service), else the executable's name.
    fn service_name(&self) -> String {
        self.service
            .clone()
            .unwrap_or_else(crate::trace::process_service_name)
    }

    /// [`try_init`](Self::try_init), for a `main` that installs the only
    /// subscriber.
    ///
    /// # Panics
    ///
    /// When a global subscriber is set already.
    pub fn init(&self) {
        if let Err(error) = self.try_init() {
            panic!("logging: {error}");
        }
    }
}

/// The worker binaries' one call: [`LogSettings::from_env_and_args`] with
/// the process's arguments, installed on stderr.
///
/// # Panics
///
/// When [`ENV_LOG_FORMAT`], [`ENV_LOG_REPEAT_MS`] or `--log-format` holds
/// a bad value (the message names it), or a global subscriber is set
/// already.
pub fn init() {
    match LogSettings::from_env_and_args(std::env::args().skip(1)) {
        Ok(settings) => settings.init(),
        Err(error) => panic!("logging: {error}"),
    }
}

/// A reminder period in milliseconds (positive).
///
/// # Errors
///
/// [`LogError::Period`] for anything else.
pub fn parse_period(ms: &str) -> Result<Duration, LogError> {
    match ms.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(LogError::Period(ms.to_owned())),
    }
}

/// Colours only for a person at a terminal who did not opt out.
fn colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn formats_and_flags_parse() {
        assert_eq!("JSON".parse(), Ok(LogFormat::Json));
        assert_eq!(" text ".parse(), Ok(LogFormat::Text));
        assert_eq!(
            "xml".parse::<LogFormat>(),
            Err(LogError::Format("xml".into()))
        );
        // The environment of the test process is left alone: only flags.
        let s = LogSettings::from_env_and_args(args(&["--port", "1", "--log-format", "json"]));
        assert_eq!(s.map(|s| s.format), Ok(LogFormat::Json));
        let s = LogSettings::from_env_and_args(args(&["--log-format=json"]));
        assert_eq!(s.map(|s| s.format), Ok(LogFormat::Json));
        assert!(LogSettings::from_env_and_args(args(&["--log-format=yaml"])).is_err());
        assert_eq!(parse_period("250"), Ok(Duration::from_millis(250)));
        assert!(parse_period("0").is_err() && parse_period("soon").is_err());
    }
}
