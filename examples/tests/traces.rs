//! Traces across the real binaries: pinboard and the counter example export
//! their spans over OTLP/HTTP (protobuf) to a receiver inside the test, set
//! up only through the standard `OTEL_*` variables; the receiver decodes
//! each export with `opentelemetry-proto` and keeps the spans.
//!
//! One proxied request makes one trace: pinboard's `proxy` span, its
//! `attempt` span under it, and the worker's `request` span under the
//! attempt (the `traceparent` pinboard sent). A client's own
//! `traceparent` is continued (same trace id, pinboard's span its child)
//! and its `tracestate` reaches the worker's span.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use parking_lot::Mutex;
use prost::Message as _;
use support::{example_binary, pinboard_binary};
use test_support::{eventually, wait_workers, Pinboard, Proc, RustWorker, PATIENCE, TOKEN};

/// A received span with the `service.name` of the process that sent it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    trace_state: String,
}

/// The spans received so far (at most [`MAX_SPANS`]).
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Received>>>);

/// The receiver keeps no more than this many spans.
const MAX_SPANS: usize = 10_000;

impl Receiver {
    /// Serves `POST /v1/traces` on an ephemeral port; answers its address.
    async fn start(&self) -> anyhow::Result<SocketAddr> {
        let spans = self.clone();
        let app = Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let spans = spans.clone();
                async move {
                    let Ok(export) = ExportTraceServiceRequest::decode(body) else {
                        return (http::StatusCode::BAD_REQUEST, Vec::new());
                    };
                    spans.keep(export);
                    let answer = ExportTraceServiceResponse::default().encode_to_vec();
                    (http::StatusCode::OK, answer)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(addr)
    }

    fn keep(&self, export: ExportTraceServiceRequest) {
        let mut kept = self.0.lock();
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
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    if kept.len() < MAX_SPANS {
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
        }
    }

    /// The first span of `service` named `name` in trace `trace` (any
    /// trace when `None`) whose parent is `parent` (any when `None`).
    fn find(
        &self,
        service: &str,
        name: &str,
        trace: Option<&str>,
        parent: Option<&str>,
    ) -> Option<Received> {
        self.0
            .lock()
            .iter()
            .find(|s| {
                s.service == service
                    && s.name == name
                    && trace.is_none_or(|t| s.trace_id == t)
                    && parent.is_none_or(|p| s.parent == p)
            })
            .cloned()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// pinboard and the counter example, both exporting to `receiver` (the
/// batch sent every 100 ms), the worker registered.
async fn fleet(receiver: SocketAddr, name: &str) -> anyhow::Result<(Proc, Proc)> {
    let endpoint = format!("http://{receiver}");
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let mut pb = Pinboard::new(pinboard_binary().await?).name(&format!("{name}-pinboard"));
    for (k, v) in otel {
        pb = pb.env(k, v);
    }
    let pb = pb.start();
    let worker = RustWorker::new(example_binary("counter").await?, &pb.url)
        .envs(&[
            ("PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("ADVERTISE_URL", "http://127.0.0.1:0"),
        ])
        .envs(&otel)
        .name(&format!("{name}-counter"))
        .start();
    wait_workers(&reqwest::Client::new(), &pb.url, TOKEN, 1).await;
    Ok((pb, worker))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_holds_pinboards_attempt_as_the_parent_of_the_workers_request(
) -> anyhow::Result<()> {
    let receiver = Receiver::default();
    let addr = receiver.start().await?;
    let (pb, worker) = fleet(addr, "traces-parent").await?;
    reqwest::Client::new()
        .post(format!("{}/counter/traced/increment", pb.url))
        .send()
        .await?
        .error_for_status()?;
    let (proxy, attempt, request) = eventually("the request's three spans", PATIENCE, || {
        let proxy = receiver.find("pinboard", "proxy", None, None);
        let found = proxy.and_then(|proxy| {
            let attempt = receiver.find(
                "pinboard",
                "attempt",
                Some(&proxy.trace_id),
                Some(&proxy.span_id),
            )?;
            let request = receiver.find(
                "counter",
                "request",
                Some(&proxy.trace_id),
                Some(&attempt.span_id),
            )?;
            Some((proxy, attempt, request))
        });
        std::future::ready(found)
    })
    .await;
    // A request with no `traceparent` starts its trace at pinboard.
    assert_eq!(proxy.parent, "", "{proxy:?}");
    assert_eq!(attempt.trace_id, request.trace_id);
    // The worker's work for the request is in the same trace: the
    // activation under the request span.
    eventually("the activation in the trace", PATIENCE, || {
        std::future::ready(
            receiver
                .find(
                    "counter",
                    "activation",
                    Some(&request.trace_id),
                    Some(&request.span_id),
                )
                .map(|_| ()),
        )
    })
    .await;
    // Exporting debug spans did not turn the console (at info) up: the
    // activation's line names its instance span alone, not the debug
    // `activation` span it was logged in.
    let line = eventually("the activation's line", PATIENCE, || {
        let log = worker.log_text();
        std::future::ready(
            log.lines()
                .find(|l| l.contains("activated instance"))
                .map(str::to_owned),
        )
    })
    .await;
    assert!(
        line.contains("instance{") && !line.contains(":activation") && !line.contains("DEBUG"),
        "{line}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_traceparent_is_continued_and_its_tracestate_passes() -> anyhow::Result<()> {
    let receiver = Receiver::default();
    let addr = receiver.start().await?;
    let (pb, _worker) = fleet(addr, "traces-client").await?;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    reqwest::Client::new()
        .post(format!("{}/counter/continued/increment", pb.url))
        .header("traceparent", format!("00-{trace}-{client_span}-01"))
        .header("tracestate", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        .send()
        .await?
        .error_for_status()?;
    // Each process exports on its own schedule: wait for all three.
    let (proxy, attempt, request) = eventually("the three spans in the client's trace", PATIENCE, || {
        let found = receiver
            .find("pinboard", "proxy", Some(trace), Some(client_span))
            .and_then(|proxy| {
                let attempt =
                    receiver.find("pinboard", "attempt", Some(trace), Some(&proxy.span_id))?;
                let request = receiver.find("counter", "request", Some(trace), None)?;
                Some((proxy, attempt, request))
            });
        std::future::ready(found)
    })
    .await;
    assert_eq!(request.parent, attempt.span_id, "{request:?}");
    for span in [&proxy, &attempt, &request] {
        assert_eq!(
            span.trace_state, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
            "{span:?}"
        );
    }
    Ok(())
}
