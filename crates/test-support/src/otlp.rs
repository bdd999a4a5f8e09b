//! An OTLP/HTTP trace receiver for tests: `POST /v1/traces` on an
//! ephemeral port, each export decoded as protobuf with
//! `opentelemetry-proto`, its spans kept (at most [`MAX_SPANS`]) with the
//! `service.name` of the process that sent them.
//!
//! Owns nothing of the processes under test: they find it through the
//! `OTEL_*` variables the test gives them ([`Receiver::env`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;

/// The receiver keeps no more than this many spans.
pub const MAX_SPANS: usize = 10_000;

/// A received span, ids in lowercase hex (`parent` empty for a root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The sender's `service.name`.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// Its trace id (32 hex digits).
    pub trace_id: String,
    /// Its span id (16 hex digits).
    pub span_id: String,
    /// Its parent's span id, empty for a root.
    pub parent: String,
    /// The W3C `tracestate` it carried.
    pub trace_state: String,
}

/// The receiver: started once, cloned into the test's checks.
#[derive(Clone, Debug)]
pub struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Receiver {
    /// Serves `POST /v1/traces` on 127.0.0.1 and an ephemeral port.
    ///
    /// # Panics
    ///
    /// When no port can be bound.
    pub async fn start() -> Self {
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let kept = spans.clone();
        let app = Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let kept = kept.clone();
                async move {
                    let Ok(export) = ExportTraceServiceRequest::decode(body) else {
                        return (http::StatusCode::BAD_REQUEST, Vec::new());
                    };
                    keep(&kept, export);
                    let answer = ExportTraceServiceResponse::default().encode_to_vec();
                    (http::StatusCode::OK, answer)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("the receiver's address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { spans, addr }
    }

    /// The variables that make a process export here, every 100 ms.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://{}", self.addr),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ]
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The first span of `service` named `name`, in trace `trace` (any
    /// when `None`), whose parent is `parent` (any when `None`).
    pub fn find(
        &self,
        service: &str,
        name: &str,
        trace: Option<&str>,
        parent: Option<&str>,
    ) -> Option<Received> {
        self.spans().into_iter().find(|s| {
            s.service == service
                && s.name == name
                && trace.is_none_or(|t| s.trace_id == t)
                && parent.is_none_or(|p| s.parent == p)
        })
    }

    /// Whether `ancestor` is `span`'s parent, or its parent's, and so on
    /// (among the spans received).
    pub fn descends(&self, span: &Received, ancestor: &Received) -> bool {
        let spans = self.spans();
        let mut parent = span.parent.clone();
        // A chain no longer than the spans kept: a cycle cannot loop.
        for _ in 0..spans.len() {
            if parent.is_empty() {
                return false;
            }
            if parent == ancestor.span_id {
                return true;
            }
            match spans
                .iter()
                .find(|s| s.span_id == parent && s.trace_id == span.trace_id)
            {
                Some(next) => parent = next.parent.clone(),
                None => return false,
            }
        }
        false
    }
}

fn keep(spans: &Mutex<Vec<Received>>, export: ExportTraceServiceRequest) {
    let Ok(mut kept) = spans.lock() else {
        return;
    };
    for resource_spans in export.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
            if kept.len() >= MAX_SPANS {
                return;
            }
            kept.push(Received {
                service: service.clone(),
                name: span.name,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent: hex(&span.parent_span_id),
                trace_state: span.trace_state,
            });
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
