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

use support::{example_binary, pinboard_binary};
use test_support::otlp::Receiver;
use test_support::{eventually, wait_workers, Pinboard, Proc, RustWorker, PATIENCE, TOKEN};

/// pinboard and the counter example, both exporting to `receiver` (the
/// batch sent every 100 ms), the worker registered.
async fn fleet(receiver: &Receiver, name: &str) -> anyhow::Result<(Proc, Proc)> {
    let otel = receiver.env();
    let mut pb = Pinboard::new(pinboard_binary().await?).name(&format!("{name}-pinboard"));
    for (k, v) in &otel {
        pb = pb.env(k, v);
    }
    let pb = pb.start();
    let mut worker = RustWorker::new(example_binary("counter").await?, &pb.url)
        .on_any_port()
        .name(&format!("{name}-counter"));
    for (k, v) in &otel {
        worker = worker.env(k, v);
    }
    let worker = worker.start();
    wait_workers(&reqwest::Client::new(), &pb.url, TOKEN, 1).await;
    Ok((pb, worker))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_holds_pinboards_attempt_as_the_parent_of_the_workers_request(
) -> anyhow::Result<()> {
    let receiver = Receiver::start().await;
    let (pb, worker) = fleet(&receiver, "traces-parent").await?;
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
    // activation's line names its instance in its own fields, not through
    // the debug `instance` and `activation` spans it was logged in.
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
        line.contains("namespace=/counter")
            && !line.contains("instance{")
            && !line.contains("activation{")
            && !line.contains("DEBUG"),
        "{line}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_traceparent_is_continued_and_its_tracestate_passes() -> anyhow::Result<()> {
    let receiver = Receiver::start().await;
    let (pb, _worker) = fleet(&receiver, "traces-client").await?;
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
    let (proxy, attempt, request) =
        eventually("the three spans in the client's trace", PATIENCE, || {
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
