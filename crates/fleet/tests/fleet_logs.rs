//! Logs a machine can read, from the real processes: pinboard with
//! `--log-format json` writes one JSON object per line (the span fields
//! included: its background tasks run in a `node` span naming its bound
//! address) and says at warn when a SIGKILLed worker's lease lapses (once)
//! and when that worker's id fails over (counted in
//! `pinboard_lease_lapses_total` and `pinboard_failovers_total`); a worker whose TLS handshake with
//! pinboard fails (a `CA:TRUE` certificate as pinboard's own: webpki's
//! `CaUsedAsEndEntity`) logs the cause once, then reminders with a count
//! (`PINNED_LOG_REPEAT_MS`), never on every retry; and pinboard's sweeper
//! and epoch mark on a database whose tables exist log no Postgres
//! `NOTICE`.

mod support;

use serde_json::Value;
use support::{client, eventually, get_json, pinboard, rust_worker, wait_workers, Proc, TOKEN};
use test_support::{SelfSigned, PATIENCE};

/// What a process prints on stdout (its address, a worker's secret): the
/// only lines of its log that are not log lines.
fn announcement(line: &str) -> bool {
    line.contains(" listening on ") || line.starts_with("secret ")
}

/// Every log line of `text` as JSON, failing on a line that is neither
/// JSON nor an announcement.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !announcement(line))
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
            assert!(v.is_object(), "{line}");
            v
        })
        .collect()
}

/// The lines whose `message` contains `text`.
fn with_message<'a>(lines: &'a [Value], text: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|v| v["message"].as_str().is_some_and(|m| m.contains(text)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_lease_lapse_and_failover_are_json_warnings_once() {
    let pb = pinboard().args(&["--log-format", "json"]).start();
    let mut fleet = [rust_worker(&pb.url).start(), rust_worker(&pb.url).start()];
    let c = client();
    let rows = wait_workers(&c, &pb.url, 2).await;
    get_json(&c, &format!("{}/counter/lapse-0/hit", pb.url), PATIENCE).await;
    let placed: Value = c
        .get(format!(
            "{}/registry/placements?ns=/counter&id=lapse-0",
            pb.url
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("placements")
        .json()
        .await
        .expect("json");
    let session = placed["placements"][0]["sessionId"]
        .as_str()
        .expect("a placement")
        .to_owned();
    let advertise = rows
        .iter()
        .find(|r| r["sessionId"] == session.as_str())
        .and_then(|r| r["advertiseUrl"].as_str())
        .expect("the owner's row")
        .to_owned();
    let victim = fleet
        .iter()
        .position(|w| w.url == advertise)
        .expect("the owner is one of ours");
    let before = test_support::metrics::scrape(&c, &pb.url).await;
    fleet[victim].kill();

    let lapse = eventually("the lease-lapse warning", PATIENCE, || async {
        let lines = json_lines(&pb.log_text());
        let found = with_message(&lines, "lease lapsed")
            .into_iter()
            .find(|v| v["session"] == session.as_str())
            .cloned();
        found
    })
    .await;
    assert_eq!(lapse["level"], "WARN", "{lapse}");
    assert_eq!(lapse["advertise_url"], advertise.as_str(), "{lapse}");
    // The span fields: the upkeep runs in the node's span.
    let addr = pb.addr().to_string();
    assert_eq!(lapse["span"]["name"], "node", "{lapse}");
    assert_eq!(lapse["span"]["addr"], addr.as_str(), "{lapse}");
    assert_eq!(lapse["spans"][0]["addr"], addr.as_str(), "{lapse}");

    // The id fails over on its next request, and that is a warning too.
    get_json(&c, &format!("{}/counter/lapse-0/hit", pb.url), PATIENCE).await;
    let failover = eventually("the failover warning", PATIENCE, || async {
        let lines = json_lines(&pb.log_text());
        let found = with_message(&lines, "failover")
            .into_iter()
            .find(|v| v["id"] == "lapse-0")
            .cloned();
        found
    })
    .await;
    assert_eq!(failover["level"], "WARN", "{failover}");
    assert_eq!(failover["from"], session.as_str(), "{failover}");
    assert_eq!(failover["reason"], "lease_lapsed", "{failover}");
    let after = test_support::metrics::scrape(&c, &pb.url).await;
    assert_eq!(
        test_support::metrics::moved(&before, &after, "pinboard_lease_lapses"),
        1.0
    );
    assert_eq!(
        test_support::metrics::moved(&before, &after, "pinboard_failovers"),
        1.0
    );
    let lines = json_lines(&pb.log_text());
    let lapses = with_message(&lines, "lease lapsed")
        .into_iter()
        .filter(|v| v["session"] == session.as_str())
        .count();
    assert_eq!(lapses, 1, "one lapse, one line:\n{}", pb.log_text());
    let registered = with_message(&lines, "worker registered");
    assert_eq!(registered.len(), 2, "{registered:?}");
    assert_eq!(registered[0]["level"], "INFO");
}

/// The worker's log lines naming webpki's `CaUsedAsEndEntity` (rustls puts
/// its name in the error's text).
fn cause_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("CaUsedAsEndEntity"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_failure_is_logged_once_with_its_cause_then_with_a_count() {
    // What `openssl req -x509` makes by default: a CA certificate, here
    // used as pinboard's own. The worker trusts it and still refuses it.
    let certs = SelfSigned::ca_as_server();
    let pb = pinboard().tls(&certs).start();
    let worker = rust_worker(&pb.url)
        .env(
            "PINNED_PINBOARD_CA",
            certs.cert.to_str().expect("utf-8 path"),
        )
        .env("RUST_LOG", "info")
        // Registration retries start at the heartbeat and back off.
        .env("FLEET_HEARTBEAT_MS", "50")
        .env("PINNED_LOG_REPEAT_MS", "300")
        .start();
    let reminder = eventually("a reminder with a count", PATIENCE, || async {
        let log = worker.log_text();
        let found = log
            .lines()
            .find(|l| l.contains("pinboard register failed") && l.contains("unchanged since"))
            .map(str::to_owned);
        found
    })
    .await;
    let failures: u64 = reminder
        .split("failures=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {reminder:?}"));
    assert!(failures >= 2, "{reminder}");
    let log = worker.log_text();
    let causes = cause_lines(&log);
    assert_eq!(causes.len(), 1, "the cause once:\n{log}");
    assert!(
        causes[0].contains("pinboard register failed") && causes[0].contains("failures=1"),
        "{}",
        causes[0]
    );
    assert!(
        !log.contains('\u{1b}'),
        "ANSI codes in a redirected log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_stores_ddl_logs_no_postgres_notice() {
    let url = std::env::var("PINNED_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned());
    let start = |name: &str| -> Proc {
        pinboard()
            .args(&["--database-url", &url, "--sweep-interval-ms", "100"])
            .env("RUST_LOG", "info")
            .name(name)
            .start()
    };
    // The first start creates the tables (if no other test did); the
    // second finds them, which is when Postgres says NOTICE.
    for name in ["notice-first", "notice-second"] {
        let pb = start(name);
        let c = client();
        eventually("a sweeper lap", PATIENCE, || async {
            let scrape = test_support::metrics::try_scrape(&c, &pb.url).await?;
            (scrape.value("pinboard_sweep_laps") > 0.0).then_some(())
        })
        .await;
        // A placement reads (and first creates) the durable epoch mark.
        let _worker = rust_worker(&pb.url).start();
        wait_workers(&c, &pb.url, 1).await;
        get_json(&c, &format!("{}/counter/notice/hit", pb.url), PATIENCE).await;
        let log = pb.log_text();
        assert!(
            !log.contains("NOTICE") && !log.contains("already exists"),
            "{name}:\n{log}"
        );
    }
}
