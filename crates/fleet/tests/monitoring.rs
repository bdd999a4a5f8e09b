//! The monitoring files in `deploy/monitoring/` (the Grafana dashboard and
//! the Prometheus alert rules) name only metrics the binaries export: every
//! `pinboard_*` / `pinned_*` name in them is a family of a real pinboard's
//! or a real worker's `/metrics` (a histogram's `_bucket`, a counter's
//! `_total` read as their family). The families they are built on move:
//! `pinboard_quarantined` falls when a quarantine ends, and the
//! per-namespace traffic families count answers, 5xx ones and their
//! latency. (`promtool check rules` / `test rules` run in CI:
//! `deploy/monitoring/check`.)

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use support::{client, get_json, pinboard, rust_worker, wait_workers};
use test_support::{metrics, PATIENCE};

/// The `pinboard_*` and `pinned_*` names in `text`, as families.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in ["pinboard_", "pinned_"] {
        for (at, _) in text.match_indices(prefix) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.len() == prefix.len() {
                // `pinboard_*` in prose: the prefix, not a metric.
                continue;
            }
            let family = ["_total", "_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name);
            names.insert(family.to_owned());
        }
    }
    names
}

fn monitoring_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/monitoring")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The `expr` of every target of the dashboard's panels.
fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_alerts_name_exported_metrics_that_move() {
    let pb = pinboard().args(&["--quarantine-ms", "3000"]).start();
    let c = client();
    let fresh = metrics::scrape(&c, &pb.url).await;
    let worker = rust_worker(&pb.url).start();
    wait_workers(&c, &pb.url, 1).await;
    let exported: BTreeSet<String> = fresh
        .families()
        .chain(metrics::scrape(&c, &worker.url).await.families())
        .map(str::to_owned)
        .collect();

    let dashboard: serde_json::Value =
        serde_json::from_str(&monitoring_file("grafana/pinned.json")).expect("dashboard JSON");
    let exprs = dashboard_exprs(&dashboard);
    assert!(exprs.len() >= 20, "{exprs:?}");
    let in_dashboard = metric_names(&exprs.join("\n"));
    let in_alerts = metric_names(&monitoring_file("prometheus/pinned-alerts.yml"));
    for (file, names) in [("dashboard", &in_dashboard), ("alerts", &in_alerts)] {
        assert!(names.len() >= 10, "{file}: {names:?}");
        let missing: Vec<&String> = names.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "the {file} names metrics no binary exports: {missing:?}\nexported: {exported:?}"
        );
    }
    for alerted in [
        "pinboard_lease_lapses",
        "pinboard_failovers",
        "pinboard_quarantined",
        "pinboard_sweep_failures",
        "pinboard_proxy_namespace_5xx",
        "pinboard_proxy_response_head_seconds",
        "pinned_lease_healthy",
    ] {
        assert!(in_alerts.contains(alerted), "no alert on {alerted}");
    }

    // The quarantine ends: the gauge falls.
    assert_eq!(fresh.value("pinboard_quarantined"), 1.0, "{fresh}");
    let placing = metrics::wait_moved(&c, &pb.url, &fresh, "pinboard_quarantined", PATIENCE).await;
    assert_eq!(placing.value("pinboard_quarantined"), 0.0);

    // Answers per namespace: a 200, a 503 (no worker hosts `/nowhere`).
    get_json(&c, &format!("{}/counter/mon/hit", pb.url), PATIENCE).await;
    let res = c
        .get(format!("{}/nowhere/mon/hit", pb.url))
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), 503);
    let after = metrics::wait_moved(
        &c,
        &pb.url,
        &placing,
        r#"pinboard_proxy_namespace_5xx{namespace="/nowhere"}"#,
        PATIENCE,
    )
    .await;
    assert!(
        metrics::moved(
            &placing,
            &after,
            r#"pinboard_proxy_namespace_requests{namespace="/counter"}"#
        ) >= 1.0
    );
    assert!(
        metrics::moved(
            &placing,
            &after,
            r#"pinboard_proxy_response_head_seconds{namespace="/counter"}"#
        ) >= 1.0
    );
    assert_eq!(
        after.value(r#"pinboard_proxy_namespace_5xx{namespace="/counter"}"#),
        0.0
    );
}
