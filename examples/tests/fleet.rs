//! The fleet example as a real process: `cargo run --example fleet` starts
//! pinboard and three example workers, they register, requests through
//! pinboard reach each of them, the printed operator token opens the
//! operator view, and SIGINT (Ctrl-C) drains and stops everything.

mod support;

use std::process::Stdio;

use anyhow::Context as _;
use serde_json::{json, Value};
use support::{example_binary, jobs, PATIENCE};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::timeout;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_starts_serves_and_stops_on_sigint() -> anyhow::Result<()> {
    let mut child = Command::new(example_binary("fleet").await?)
        .env("PINBOARD_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let (mut url, mut token, mut ready) = (None, None, false);
    timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await? {
            if let Some(u) = line.strip_prefix("pinboard listening on ") {
                url = Some(u.to_owned());
            }
            if line.starts_with("fleet ready: 3 workers") {
                ready = true;
            }
            if let Some(t) = line.trim().strip_prefix("token") {
                token = Some(t.trim().to_owned());
                break;
            }
        }
        anyhow::Ok(())
    })
    .await
    .context("the fleet never came up")??;
    anyhow::ensure!(ready, "no ready line");
    let url = url.context("no pinboard URL printed")?;
    let token = token.context("no operator token printed")?;

    let c = reqwest::Client::new();
    let counted: Value = c
        .post(format!("{url}/counter/a/increment"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    assert_eq!(counted, json!({ "value": 1 }));
    let members: Value = c
        .get(format!("{url}/chat/lobby/members"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    assert!(members.is_object(), "{members}");
    jobs::enqueue(&c, &url, "r1", &["build".to_owned()]).await?;
    jobs::wait("the job done", || async {
        Ok((jobs::done(&c, &url, "r1").await? == ["build"]).then_some(()))
    })
    .await?;
    let workers: Value = c
        .get(format!("{url}/registry/workers"))
        .bearer_auth(&token)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    assert_eq!(workers["workers"].as_array().map(Vec::len), Some(3));

    // Ctrl-C: the whole fleet drains and exits cleanly, and says so.
    let pid = child.id().context("pid")?;
    let kill = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .await?;
    anyhow::ensure!(kill.success(), "kill -INT failed");
    let rest = timeout(PATIENCE, async {
        let mut rest = Vec::new();
        while let Some(line) = lines.next_line().await? {
            rest.push(line);
        }
        anyhow::Ok(rest)
    })
    .await
    .context("the fleet kept its stdout open after SIGINT")??;
    let status = timeout(PATIENCE, child.wait())
        .await
        .context("the fleet did not exit after SIGINT")??;
    assert!(status.success(), "{status:?}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some("fleet stopped"),
        "{rest:?}"
    );
    assert!(
        c.get(format!("{url}/healthz")).send().await.is_err(),
        "pinboard still answers after the fleet stopped"
    );
    Ok(())
}
