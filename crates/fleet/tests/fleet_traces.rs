//! A cluster call carries its trace on: pinboard and two fleet workers
//! export to an OTLP/HTTP receiver inside the test (`test_support::otlp`);
//! a request whose handler calls another object (`/counter/<a>/call/<b>`)
//! makes one trace, in which the caller's `cluster call` span is a child of
//! its `request` span and the target's `request` descends from the call
//! (through pinboard's `proxy` and `attempt` when the target lives
//! elsewhere, directly when it lives on the caller's worker).

mod support;

use support::{client, eventually, get_json, pinboard, rust_worker, wait_workers};
use test_support::otlp::Receiver;
use test_support::PATIENCE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_call_continues_the_callers_trace() {
    let receiver = Receiver::start().await;
    let otel = receiver.env();
    let mut pb = pinboard()
        .env("OTEL_SERVICE_NAME", "pinboard")
        .name("traces-pinboard");
    for (k, v) in &otel {
        pb = pb.env(k, v);
    }
    let pb = pb.start();
    let _fleet: Vec<_> = (0..2)
        .map(|n| {
            let mut worker = rust_worker(&pb.url)
                .env("OTEL_SERVICE_NAME", "worker")
                .name(&format!("traces-worker-{n}"));
            for (k, v) in &otel {
                worker = worker.env(k, v);
            }
            worker.start()
        })
        .collect();
    let c = client();
    wait_workers(&c, &pb.url, 2).await;
    let answer = get_json(
        &c,
        &format!("{}/counter/caller/call/callee", pb.url),
        PATIENCE,
    )
    .await;
    assert_eq!(answer["status"], 200, "{answer}");
    let (call, target) = eventually(
        "the cluster call and its target in one trace",
        PATIENCE,
        || {
            let spans = receiver.spans();
            let found = spans
                .iter()
                .find(|s| s.service == "worker" && s.name == "cluster call")
                .and_then(|call| {
                    // The call's parent is the caller's request span.
                    let caller = spans.iter().find(|s| {
                        s.span_id == call.parent && s.name == "request" && s.service == "worker"
                    })?;
                    let target = spans.iter().find(|s| {
                        s.service == "worker"
                            && s.name == "request"
                            && s.span_id != caller.span_id
                            && s.trace_id == call.trace_id
                            && receiver.descends(s, call)
                    })?;
                    Some((call.clone(), target.clone()))
                });
            std::future::ready(found)
        },
    )
    .await;
    assert_eq!(call.trace_id, target.trace_id);
    // The caller's request continued pinboard's attempt: one trace from the
    // client's request to the target's handler.
    let proxy = receiver
        .find("pinboard", "proxy", Some(&call.trace_id), Some(""))
        .expect("pinboard's span roots the trace");
    assert!(receiver.descends(&target, &proxy));
}
