//! Running an example as a real process: find (or build) its binary, start
//! it on an ephemeral port, and read the address it prints.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::timeout;

pub use test_support::PATIENCE;

/// `target/<profile>/examples/<name>`, built by `cargo test` beside this
/// test (built here when missing, as under `cargo test --test`).
pub async fn example_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("test binary location")?;
    let binary = profile_dir.join("examples").join(name);
    if !binary.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "pinned-examples", "--example", name])
            .status()
            .await?;
        anyhow::ensure!(status.success(), "building the {name} example failed");
    }
    Ok(binary)
}

/// `target/<profile>/pinboard`, built when missing.
pub async fn pinboard_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("test binary location")?;
    let binary = profile_dir.join("pinboard");
    if !binary.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "pinned-pinboard", "--bin", "pinboard"])
            .status()
            .await?;
        anyhow::ensure!(status.success(), "building pinboard failed");
    }
    Ok(binary)
}

/// Starts example `name` in local mode on 127.0.0.1 and an ephemeral port,
/// with `env` added; answers the process and its `host:port`.
pub async fn start_example(name: &str, env: &[(&str, &str)]) -> anyhow::Result<(Child, String)> {
    let mut command = Command::new(example_binary(name).await?);
    command
        .env("PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("RUST_LOG", "warn")
        .env_remove("PINBOARD_URL")
        .env_remove("NODE_ENV")
        .env_remove("ENVIRONMENT")
        .env_remove("APP_ENV")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let address = timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await? {
            if let Some(url) = line.strip_prefix("pinned worker listening on http://") {
                return Ok(url.to_owned());
            }
        }
        anyhow::bail!("the {name} example exited before listening")
    })
    .await
    .with_context(|| format!("the {name} example never listened"))??;
    Ok((child, address))
}

/// Sends SIGTERM to `child` and waits for it to exit.
pub async fn terminate(child: &mut Child) -> anyhow::Result<std::process::ExitStatus> {
    let pid = child.id().context("pid")?;
    let kill = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await?;
    anyhow::ensure!(kill.success(), "kill -TERM failed");
    Ok(timeout(PATIENCE, child.wait())
        .await
        .context("the example did not exit")??)
}

/// pinboard's `GET /registry/overview` (workers and placements), with the
/// test token.
pub async fn overview(
    client: &reqwest::Client,
    pinboard: &str,
) -> anyhow::Result<serde_json::Value> {
    Ok(client
        .get(format!("{pinboard}/registry/overview"))
        .bearer_auth(test_support::TOKEN)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// The jobs example's HTTP surface, for its tests.
pub mod jobs {
    use serde_json::{json, Value};

    /// Enqueues `names` into runner `id` at `base` (`http://host:port`), one
    /// after another, each answered only once durable.
    pub async fn enqueue(
        client: &reqwest::Client,
        base: &str,
        id: &str,
        names: &[String],
    ) -> anyhow::Result<()> {
        for name in names {
            let answer: Value = client
                .post(format!("{base}/runners/{id}/enqueue"))
                .json(&json!({ "name": name }))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            anyhow::ensure!(answer == json!({ "admitted": name }), "{answer}");
        }
        Ok(())
    }

    /// Runner `id`'s `done` list.
    pub async fn done(
        client: &reqwest::Client,
        base: &str,
        id: &str,
    ) -> anyhow::Result<Vec<String>> {
        let body: Value = client
            .get(format!("{base}/runners/{id}/done"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(serde_json::from_value(body["done"].clone())?)
    }

    /// Waits until `store` holds no marked instance: every admitted item
    /// of every tray worked and acknowledged.
    pub async fn drained(
        what: &str,
        store: &impl pinned::pinned_store::StateStore,
    ) -> anyhow::Result<()> {
        wait(what, || async {
            Ok(store
                .marked_instances(None, 100)
                .await?
                .is_empty()
                .then_some(()))
        })
        .await
    }

    /// Polls `check` until it answers `Some` (the shared harness's wait,
    /// for at most [`PATIENCE`](super::PATIENCE)); the first error ends
    /// the wait with it.
    pub async fn wait<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
    {
        test_support::eventually(what, super::PATIENCE, || {
            let checked = check();
            async move { checked.await.transpose() }
        })
        .await
    }
}
