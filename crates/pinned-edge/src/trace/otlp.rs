//! The `otlp` feature's half of [`crate::trace`]: the tracer provider and
//! its OTLP/HTTP exporter, the `tracing` layer on it, and the W3C trace
//! context read from and written to header maps.
//!
//! Owns the one process-wide provider (kept for [`shutdown`]) and the flag
//! [`super::active`] reads. Never installs a subscriber: it hands its
//! layer to [`crate::logging`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::filter::{filter_fn, EnvFilter, FilterExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::OtlpError;

/// Set once the OTLP layer is built: from then on spans are exported.
pub(super) static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The provider, for [`shutdown`].
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The exporter's deadline for one export when neither
/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` nor `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (milliseconds) says otherwise (the SDKs' default).
const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP layer for a subscriber of `S`: the provider (exporter, batch
/// processor, resource, sampler from the `OTEL_*` variables) behind a
/// `tracing-opentelemetry` layer with its own filter. Instance spans
/// (`pinned`'s per-instance log context, one per request) are left out:
/// they are context for log lines, not steps of a trace.
///
/// # Errors
///
/// A filter that does not parse, an exporter that cannot be built.
pub(crate) fn layer<S>(
    default_service: &str,
    filter: &str,
) -> Result<Box<dyn Layer<S> + Send + Sync>, OtlpError>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let filter = EnvFilter::builder()
        .parse(filter)
        .map_err(|e| OtlpError::Filter(e.to_string()))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_http_client(Client::new(export_timeout()))
        .build()
        .map_err(|e| OtlpError::Exporter(e.to_string()))?;
    let mut resource = Resource::builder();
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    if !named {
        resource = resource.with_service_name(default_service.to_owned());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("pinned");
    let _ = PROVIDER.set(provider);
    ACTIVE.store(true, Ordering::Relaxed);
    let not_instance = filter_fn(|meta| !(meta.is_span() && meta.name() == "instance"));
    Ok(tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter.and(not_instance))
        .boxed())
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (milliseconds), else 10 s.
fn export_timeout() -> Duration {
    [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|name| std::env::var(name).ok()?.trim().parse::<u64>().ok())
    .map_or(DEFAULT_EXPORT_TIMEOUT, Duration::from_millis)
}

pub(super) fn continue_from(span: &tracing::Span, headers: &HeaderMap) {
    if !headers.contains_key(super::TRACEPARENT) {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    // A span disabled for the OTLP layer has no parent to set.
    let _ = span.set_parent(parent);
}

pub(super) fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    headers.remove(super::TRACEPARENT);
    headers.remove(super::TRACESTATE);
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeadersMut(headers));
}

pub(super) fn follow(span: &tracing::Span) {
    let current = tracing::Span::current();
    if current.is_none() {
        return;
    }
    let _ = span.set_parent(current.context());
}

pub(super) fn shutdown() {
    if let Some(provider) = PROVIDER.get() {
        ACTIVE.store(false, Ordering::Relaxed);
        if let Err(error) = provider.shutdown() {
            tracing::debug!(%error, "OTLP exporter shutdown");
        }
    }
}

/// A request's headers, read by the propagator.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// A request's headers, written by the propagator.
struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// The exporter's HTTP client: the workspace's reqwest (rustls with ring),
/// blocking, for the batch processor runs its exports on its own thread
/// with no async runtime. Made there, on the first export: a blocking
/// client made or dropped inside an async runtime panics.
#[derive(Debug)]
struct Client {
    timeout: Duration,
    client: OnceLock<reqwest::blocking::Client>,
}

impl Client {
    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            client: OnceLock::new(),
        }
    }

    fn get(&self) -> Result<&reqwest::blocking::Client, reqwest::Error> {
        if let Some(client) = self.client.get() {
            return Ok(client);
        }
        let client = reqwest::blocking::Client::builder()
            .timeout(self.timeout)
            .build()?;
        Ok(self.client.get_or_init(|| client))
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let response = self
            .get()?
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body.to_vec())
            .send()?;
        let status = response.status();
        let headers = response.headers().clone();
        // A collector's answer is a short protobuf message; a longer one is
        // cut rather than held.
        let body = response.bytes()?;
        let body = body.slice(..body.len().min(64 * 1024));
        let mut answer = http::Response::builder().status(status).body(body)?;
        *answer.headers_mut() = headers;
        Ok(answer)
    }
}
