//! Traces across pinboard and its workers: the W3C trace context
//! (`traceparent`, `tracestate`) read from a request and written onto the
//! next hop, and the OTLP export of the spans, both only while exporting.
//!
//! - [`Otlp::from_env`]: whether the process exports, read from the
//!   variables the OpenTelemetry SDKs read (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_SDK_DISABLED`,
//!   `OTEL_TRACES_EXPORTER`); [`crate::logging::LogSettings::try_init`]
//!   adds its layer beside the console's, with its own filter
//!   ([`ENV_OTEL_FILTER`], default [`DEFAULT_OTEL_FILTER`]), so exporting
//!   never turns console logging up.
//! - [`continue_from`], [`inject`], [`follow`]: a span continues the
//!   caller's trace, a request carries its span's context on, spawned work
//!   continues the trace of the work that spawned it.
//! - [`shutdown`]: the spans still batched are sent (a binary's last step).
//!
//! Owns no span of its own and installs nothing: the subscriber is the
//! binary's ([`crate::logging`]). Without the `otlp` cargo feature, or
//! while nothing exports, every function here returns after one relaxed
//! load: a `traceparent` then passes through a hop as any other header.

use http::HeaderMap;

/// The filter of the OTLP layer when [`ENV_OTEL_FILTER`] is unset: the
/// project's per-request spans (debug) and anything at info.
pub const DEFAULT_OTEL_FILTER: &str =
    "info,pinboard=debug,pinned=debug,pinned_edge=debug,pinned_store=debug";
/// The environment variable holding the OTLP layer's filter (the syntax of
/// `RUST_LOG`); `RUST_LOG` itself filters the console alone.
pub const ENV_OTEL_FILTER: &str = "PINNED_OTEL_FILTER";
/// The W3C `traceparent` header.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
/// The W3C `tracestate` header.
pub const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// Whether spans are exported (an OTLP layer is installed): the one check
/// the hot path makes.
#[inline]
pub fn active() -> bool {
    #[cfg(feature = "otlp")]
    {
        otlp::ACTIVE.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(feature = "otlp"))]
    {
        false
    }
}

/// `span` continues the trace a request's `traceparent` (and
/// `tracestate`) names, when exporting and the header parses; otherwise
/// its parent stays the span it was opened in.
#[inline]
pub fn continue_from(span: &tracing::Span, headers: &HeaderMap) {
    if active() {
        #[cfg(feature = "otlp")]
        otlp::continue_from(span, headers);
    }
    let _ = (span, headers);
}

/// Writes `span`'s trace context onto an outgoing request (`traceparent`,
/// and `tracestate` when the trace carries one), replacing what was there,
/// when exporting; otherwise leaves `headers` as they are (a client's
/// `traceparent` then passes through untouched).
#[inline]
pub fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    if active() {
        #[cfg(feature = "otlp")]
        otlp::inject(span, headers);
    }
    let _ = (span, headers);
}

/// `span` (opened for work spawned off the current task) continues the
/// current span's trace, when exporting: a tray flush or a background task
/// is then part of the request that started it.
#[inline]
pub fn follow(span: &tracing::Span) {
    if active() {
        #[cfg(feature = "otlp")]
        otlp::follow(span);
    }
    let _ = span;
}

/// Sends the spans still batched and stops exporting (a no-op when nothing
/// exports). Blocks up to the exporter's timeout: call it last, from a
/// binary's `main` or after a server's shutdown.
pub fn shutdown() {
    #[cfg(feature = "otlp")]
    otlp::shutdown();
}

/// Whether and how a process exports its spans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Otlp {
    /// Nothing exports: no endpoint is set, or `OTEL_SDK_DISABLED=true`,
    /// or `OTEL_TRACES_EXPORTER=none`.
    Off,
    /// Spans are exported over OTLP/HTTP (protobuf).
    On {
        /// `service.name` when neither `OTEL_SERVICE_NAME` nor
        /// `OTEL_RESOURCE_ATTRIBUTES` names one.
        default_service: String,
        /// The OTLP layer's filter ([`ENV_OTEL_FILTER`]).
        filter: String,
    },
}

/// Why the OTLP setup was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OtlpError {
    /// An exporter or protocol this build does not have.
    #[error("{var}={value:?} is not supported (this build exports OTLP over HTTP with protobuf: http/protobuf)")]
    Unsupported {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The exporter could not be built (a bad endpoint, timeout or header).
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// The OTLP layer's filter does not parse.
    #[error("{ENV_OTEL_FILTER}: {0}")]
    Filter(String),
    /// An endpoint is set but the `otlp` cargo feature is off.
    #[error("OTEL_EXPORTER_OTLP_ENDPOINT is set but this build has no OTLP exporter (cargo feature `otlp`)")]
    NotBuilt,
}

impl Otlp {
    /// Reads the standard variables: exporting is on when
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// is set (not empty), unless `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none`. `default_service` names the process
    /// when `OTEL_SERVICE_NAME` does not.
    ///
    /// # Errors
    ///
    /// `OTEL_TRACES_EXPORTER` other than `otlp`/`none`, or an
    /// `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` other than `http/protobuf`.
    pub fn from_env(default_service: &str) -> Result<Self, OtlpError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(Self::Off);
        }
        if var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .is_none()
        {
            return Ok(Self::Off);
        }
        if let Some(exporter) = var("OTEL_TRACES_EXPORTER") {
            match exporter.trim() {
                "none" => return Ok(Self::Off),
                "otlp" => {}
                _ => {
                    return Err(OtlpError::Unsupported {
                        var: "OTEL_TRACES_EXPORTER",
                        value: exporter,
                    })
                }
            }
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = var(name) {
                if protocol.trim() != "http/protobuf" {
                    return Err(OtlpError::Unsupported {
                        var: name,
                        value: protocol,
                    });
                }
                break;
            }
        }
        Ok(Self::On {
            default_service: default_service.to_owned(),
            filter: var(ENV_OTEL_FILTER).unwrap_or_else(|| DEFAULT_OTEL_FILTER.to_owned()),
        })
    }
}

/// The service name of a process that gives none: its executable's file
/// stem (`pinboard`, `counter`), else `unknown_service`.
pub fn process_service_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown_service".to_owned())
}

#[cfg(feature = "otlp")]
pub(crate) mod otlp;

#[cfg(test)]
mod tests {
    use super::*;

    /// The only test of this binary that sets `OTEL_*` variables.
    #[test]
    fn the_standard_variables_decide_whether_to_export() {
        let clear = || {
            for var in [
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_SDK_DISABLED",
                "OTEL_TRACES_EXPORTER",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                ENV_OTEL_FILTER,
            ] {
                std::env::remove_var(var);
            }
        };
        clear();
        assert_eq!(Otlp::from_env("p"), Ok(Otlp::Off));
        std::env::set_var(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:1/v1/traces",
        );
        assert_eq!(
            Otlp::from_env("p"),
            Ok(Otlp::On {
                default_service: "p".into(),
                filter: DEFAULT_OTEL_FILTER.into()
            })
        );
        std::env::set_var("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
        assert!(matches!(
            Otlp::from_env("p"),
            Err(OtlpError::Unsupported {
                var: "OTEL_EXPORTER_OTLP_PROTOCOL",
                ..
            })
        ));
        // The signal's own variable wins over the generic one.
        std::env::set_var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf");
        assert!(Otlp::from_env("p").is_ok());
        std::env::set_var("OTEL_TRACES_EXPORTER", "none");
        assert_eq!(Otlp::from_env("p"), Ok(Otlp::Off));
        std::env::set_var("OTEL_TRACES_EXPORTER", "zipkin");
        assert!(Otlp::from_env("p").is_err());
        std::env::remove_var("OTEL_TRACES_EXPORTER");
        std::env::set_var("OTEL_SDK_DISABLED", "true");
        assert_eq!(Otlp::from_env("p"), Ok(Otlp::Off));
        clear();
    }

    #[test]
    fn off_without_the_feature_or_an_exporter() {
        // No layer is installed in this test process.
        assert!(!active());
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, http::HeaderValue::from_static("00-x"));
        let span = tracing::Span::none();
        inject(&span, &mut headers);
        continue_from(&span, &headers);
        assert_eq!(headers[TRACEPARENT], "00-x");
    }
}
