//! The logs of the real binaries when they go to a file, as under systemd
//! or a container runtime: pinboard and the counter example write no ANSI
//! escape byte into a redirected log (text format), warn of nothing on
//! default settings at start (the connection cap lowered to the open-file
//! limit) or at a clean SIGTERM (the drain's deadline), and with
//! `--log-format json` / `PINNED_LOG_FORMAT=json` every log line is one
//! JSON object carrying its span's fields (the worker's `instance` span:
//! namespace, id, epoch).

mod support;

use serde_json::Value;
use support::{example_binary, pinboard_binary};
use test_support::{eventually, wait_workers, Pinboard, Proc, RustWorker, PATIENCE, TOKEN};

/// pinboard and the counter example registered with it, both logging in
/// `format`; one id activated. Answers both once the activation is logged.
async fn fleet(format: &str) -> anyhow::Result<(Proc, Proc)> {
    let pb = Pinboard::new(pinboard_binary().await?)
        .args(&["--log-format", format])
        .name(&format!("logs-{format}-pinboard"))
        .start();
    let worker = RustWorker::new(example_binary("counter").await?, &pb.url)
        .on_any_port()
        .envs(&[("PINNED_LOG_FORMAT", format)])
        .name(&format!("logs-{format}-counter"))
        .start();
    let c = reqwest::Client::new();
    wait_workers(&c, &pb.url, TOKEN, 1).await;
    c.post(format!("{}/counter/logged/increment", pb.url))
        .send()
        .await?
        .error_for_status()?;
    eventually("the activation in the worker's log", PATIENCE, || async {
        worker
            .log_text()
            .contains("activated instance")
            .then_some(())
    })
    .await;
    Ok((pb, worker))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirected_text_logs_carry_no_escape_codes_nor_start_and_stop_noise() -> anyhow::Result<()>
{
    let (pb, mut worker) = fleet("text").await?;
    // A clean stop: drained in time, nothing aborted, nothing to warn of.
    worker.terminate();
    anyhow::ensure!(
        worker.wait_exit(PATIENCE).await.is_some(),
        "the worker did not stop"
    );
    let stopped = worker.log_text();
    assert!(stopped.contains("drained; stopping"), "{stopped}");
    for noise in ["drain deadline reached", "lowered"] {
        for proc in [&pb, &worker] {
            let log = proc.log_text();
            assert!(
                !log.contains(noise),
                "{noise:?} on default settings:\n{log}"
            );
        }
    }
    for proc in [&pb, &worker] {
        let log = proc.log_text();
        assert!(log.lines().count() >= 3, "{log}");
        assert!(
            !log.contains('\u{1b}'),
            "{}: an escape byte in a redirected log:\n{log}",
            proc.log.display()
        );
    }
    Ok(())
}

/// Every line of `log` that is not an announcement on stdout (an address,
/// a secret), as JSON.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| {
            !l.trim().is_empty() && !l.contains(" listening on ") && !l.starts_with("secret ")
        })
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_with_lifecycle_fields() -> anyhow::Result<()> {
    let (pb, worker) = fleet("json").await?;
    let board = json_lines(&pb.log_text());
    assert!(
        board
            .iter()
            .any(|v| v["message"] == "worker registered" && v["level"] == "INFO"),
        "{board:?}"
    );
    let lines = json_lines(&worker.log_text());
    let activated = lines
        .iter()
        .find(|v| v["message"] == "activated instance")
        .expect("the activation line");
    assert_eq!(activated["level"], "INFO", "{activated}");
    // A lifecycle line names its instance in its own fields: at info no
    // instance span is made (it is DEBUG, as the request spans).
    assert_eq!(activated["namespace"], "/counter", "{activated}");
    assert_eq!(activated["id"], "logged", "{activated}");
    assert!(activated["epoch"].is_u64(), "{activated}");
    assert!(activated.get("span").is_none(), "{activated}");
    Ok(())
}
