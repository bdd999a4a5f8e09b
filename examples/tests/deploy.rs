//! The deployment recipes in `deploy/` held to the binaries they run:
//!
//! - every Kubernetes probe names an endpoint its binary serves, on the
//!   port the container declares and the binary listens on: each one is
//!   requested from a real pinboard and a real worker registered with it,
//!   and readiness is seen to drop when the worker drains;
//! - every termination grace period and systemd stop timeout exceeds what
//!   the binary does after SIGTERM (the drain deadline and shutdown timeout
//!   read from the code's constants, the preStop sleep from the manifest);
//! - every `LimitNOFILE` carries the default connection cap under the cap
//!   rule of `pinned_edge::cap`;
//! - the Dockerfile builds packages and targets that exist, with a Rust at
//!   least the workspace's `rust-version`, and its open-file wrapper raises
//!   the soft limit to the hard one.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context as _};
use serde::Deserialize as _;
use serde_json::{json, Value};
use support::{example_binary, pinboard_binary};
use test_support::{eventually, Pinboard, RustWorker, TOKEN};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn read(relative: &str) -> anyhow::Result<String> {
    let path = deploy_dir().join(relative);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// Every YAML document under `deploy/kubernetes/`.
fn manifests() -> anyhow::Result<Vec<Value>> {
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(deploy_dir().join("kubernetes"))? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        for doc in serde_norway::Deserializer::from_str(&text) {
            let doc = Value::deserialize(doc).with_context(|| path.display().to_string())?;
            if !doc.is_null() {
                docs.push(doc);
            }
        }
    }
    Ok(docs)
}

fn deployments(docs: &[Value]) -> Vec<&Value> {
    docs.iter().filter(|d| d["kind"] == "Deployment").collect()
}

/// Which binary a container runs, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Binary {
    Pinboard,
    Worker,
}

fn binary_of(container: &Value) -> anyhow::Result<Binary> {
    match container["name"].as_str() {
        Some("pinboard") => Ok(Binary::Pinboard),
        Some("worker") => Ok(Binary::Worker),
        other => bail!("a container this test knows no binary for: {other:?}"),
    }
}

/// The port the container's binary listens on, from its own settings
/// (pinboard's `--listen`, the worker's `PORT`).
fn listen_port(container: &Value, binary: Binary) -> anyhow::Result<u64> {
    let port = match binary {
        Binary::Pinboard => {
            let args: Vec<&str> = container["args"]
                .as_array()
                .context("pinboard's args")?
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let at = args
                .iter()
                .position(|a| *a == "--listen")
                .context("no --listen")?;
            let listen = args.get(at + 1).context("--listen without a value")?;
            listen.rsplit(':').next().unwrap_or_default().to_owned()
        }
        Binary::Worker => container["env"]
            .as_array()
            .and_then(|env| env.iter().find(|v| v["name"] == "PORT"))
            .and_then(|v| v["value"].as_str())
            .context("the worker's PORT")?
            .to_owned(),
    };
    Ok(port.parse()?)
}

/// The container port a probe's `port` (a name or a number) refers to.
fn probe_port(container: &Value, port: &Value) -> anyhow::Result<u64> {
    let ports = container["ports"].as_array().context("no ports")?;
    let found = ports.iter().find(|p| match port {
        Value::String(name) => p["name"] == name.as_str(),
        number => p["containerPort"] == *number,
    });
    found
        .and_then(|p| p["containerPort"].as_u64())
        .with_context(|| format!("probe port {port} is not a declared container port"))
}

/// A probe: which binary, liveness or readiness, which path.
#[derive(Debug)]
struct Probe {
    binary: Binary,
    kind: &'static str,
    path: String,
}

/// Every liveness and readiness probe of every Deployment, its port
/// checked against the container's ports and the binary's own.
fn probes(docs: &[Value]) -> anyhow::Result<Vec<Probe>> {
    let mut probes = Vec::new();
    for deployment in deployments(docs) {
        let containers = deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .context("containers")?;
        for container in containers {
            let binary = binary_of(container)?;
            let listening = listen_port(container, binary)?;
            for kind in ["livenessProbe", "readinessProbe"] {
                let probe = &container[kind]["httpGet"];
                let path = probe["path"]
                    .as_str()
                    .with_context(|| format!("{binary:?} has no {kind}"))?;
                let port = probe_port(container, &probe["port"])?;
                ensure!(
                    port == listening,
                    "{binary:?}'s {kind} probes port {port}; it listens on {listening}"
                );
                probes.push(Probe {
                    binary,
                    kind,
                    path: path.to_owned(),
                });
            }
        }
    }
    Ok(probes)
}

#[tokio::test]
async fn every_probe_names_an_endpoint_its_binary_serves() -> anyhow::Result<()> {
    let probes = probes(&manifests()?)?;
    let kinds: Vec<(Binary, &str)> = probes.iter().map(|p| (p.binary, p.kind)).collect();
    for binary in [Binary::Pinboard, Binary::Worker] {
        for kind in ["livenessProbe", "readinessProbe"] {
            ensure!(kinds.contains(&(binary, kind)), "no {kind} for {binary:?}");
        }
    }
    let pinboard = Pinboard::new(pinboard_binary().await?)
        .name("deploy-pinboard")
        .start();
    let state = tempfile::tempdir()?;
    let db = state.path().join("pinned.db");
    let worker = RustWorker::new(example_binary("worker").await?, &pinboard.url)
        .on_any_port()
        .envs(&[
            ("DATABASE_URL", ""),
            ("PINNED_DB_PATH", db.to_str().context("temp path")?),
        ])
        .name("deploy-worker")
        .start();
    let client = reqwest::Client::new();
    let base = BTreeMap::from([
        (Binary::Pinboard, pinboard.url.clone()),
        (Binary::Worker, worker.url.clone()),
    ]);
    let status = |url: String| {
        let client = client.clone();
        async move {
            client
                .get(url)
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    // Liveness answers at once; readiness once the worker registered.
    for probe in &probes {
        let url = format!("{}{}", base[&probe.binary], probe.path);
        if probe.kind == "livenessProbe" {
            let answer = status(url.clone()).await;
            ensure!(
                answer == 200,
                "{:?}'s liveness {url} answers {answer}",
                probe.binary
            );
        } else {
            let what = format!("{:?}'s readiness {url} to answer 200", probe.binary);
            eventually(&what, Duration::from_secs(30), || {
                let answer = status(url.clone());
                async move { (answer.await == 200).then_some(()) }
            })
            .await;
        }
    }
    // A path the binaries do not serve is refused, so a misspelt probe
    // fails above rather than passing on a catch-all.
    for url in base.values() {
        let answer = status(format!("{url}/healthz-misspelt")).await;
        ensure!(answer == 404, "{url}/healthz-misspelt answers {answer}");
    }

    // The worker's readiness means something: an operator's drain takes
    // it out, liveness stays.
    let session =
        test_support::wait_workers(&client, &pinboard.url, TOKEN, 1).await[0]["sessionId"].clone();
    client
        .post(format!("{}/registry/push", pinboard.url))
        .bearer_auth(TOKEN)
        .json(&json!({ "sessionId": session, "type": "drain", "deadline": null }))
        .send()
        .await?
        .error_for_status()?;
    let readyz = format!("{}/readyz", worker.url);
    eventually(
        "the draining worker to turn unready",
        Duration::from_secs(30),
        || {
            let answer = status(readyz.clone());
            async move { (answer.await == 503).then_some(()) }
        },
    )
    .await;
    ensure!(status(format!("{}/healthz", worker.url)).await == 200);
    Ok(())
}

/// `Key=value` of a unit's `[Service]` section (the last one of a key).
fn service_section(unit: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let text = read(&format!("systemd/{unit}"))?;
    let mut in_service = false;
    let mut keys = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service && !line.starts_with('#') {
            if let Some((key, value)) = line.split_once('=') {
                keys.insert(key.trim().to_owned(), value.trim().to_owned());
            }
        }
    }
    ensure!(!keys.is_empty(), "{unit} has no [Service] section");
    Ok(keys)
}

fn units() -> [(&'static str, Binary); 2] {
    [
        ("pinboard.service", Binary::Pinboard),
        ("pinned-worker.service", Binary::Worker),
    ]
}

/// What a binary may take after SIGTERM before it exits: pinboard gives
/// open connections its shutdown timeout; the worker drains for
/// `SHUTDOWN_DRAIN_DEADLINE`, then gives connections its shutdown timeout.
fn stop_time(binary: Binary) -> Duration {
    match binary {
        Binary::Pinboard => Duration::from_millis(pinboard::config::DEFAULT_SHUTDOWN_TIMEOUT_MS),
        Binary::Worker => {
            pinned::SHUTDOWN_DRAIN_DEADLINE
                + Duration::from_millis(pinned_edge::defaults::SHUTDOWN_TIMEOUT_MS)
        }
    }
}

#[test]
fn grace_periods_exceed_what_the_binaries_do_after_sigterm() -> anyhow::Result<()> {
    let docs = manifests()?;
    let deployments = deployments(&docs);
    ensure!(deployments.len() == 2, "{} Deployments", deployments.len());
    for deployment in deployments {
        let spec = &deployment["spec"]["template"]["spec"];
        let grace = Duration::from_secs(
            spec["terminationGracePeriodSeconds"]
                .as_u64()
                .context("no terminationGracePeriodSeconds (Kubernetes' 30 s)")?,
        );
        for container in spec["containers"].as_array().context("containers")? {
            let binary = binary_of(container)?;
            let pre_stop = Duration::from_secs(
                container["lifecycle"]["preStop"]["sleep"]["seconds"]
                    .as_u64()
                    .unwrap_or(0),
            );
            let needed = pre_stop + stop_time(binary);
            ensure!(
                grace > needed,
                "{binary:?}: grace {grace:?} is not above preStop {pre_stop:?} + stop {:?}",
                stop_time(binary)
            );
        }
        // A PodDisruptionBudget covers the Deployment's pods.
        let labels = &deployment["spec"]["selector"]["matchLabels"];
        ensure!(
            docs.iter().any(|d| d["kind"] == "PodDisruptionBudget"
                && d["spec"]["selector"]["matchLabels"] == *labels),
            "no PodDisruptionBudget selects {labels}"
        );
    }
    for (unit, binary) in units() {
        let service = service_section(unit)?;
        let stop = service
            .get("TimeoutStopSec")
            .with_context(|| format!("{unit}: no TimeoutStopSec (systemd's 90 s)"))?;
        let stop = Duration::from_secs(stop.parse()?);
        ensure!(
            stop > stop_time(binary),
            "{unit}: TimeoutStopSec {stop:?} is not above {:?}",
            stop_time(binary)
        );
        ensure!(
            service.get("KillSignal").map(String::as_str) == Some("SIGTERM"),
            "{unit}: KillSignal is not SIGTERM"
        );
        ensure!(service.contains_key("Restart"), "{unit}: no Restart policy");
    }
    Ok(())
}

#[test]
fn limit_nofile_carries_the_default_connection_cap() -> anyhow::Result<()> {
    for (unit, binary) in units() {
        let cap = match binary {
            Binary::Pinboard => pinboard::config::DEFAULT_MAX_CONNECTIONS,
            Binary::Worker => pinned_edge::defaults::MAX_CONNECTIONS,
        };
        let limit: u64 = service_section(unit)?
            .get("LimitNOFILE")
            .with_context(|| format!("{unit}: no LimitNOFILE"))?
            .parse()?;
        let carried = pinned_edge::cap::effective(cap, Some(limit));
        ensure!(
            carried == cap,
            "{unit}: LimitNOFILE={limit} lowers the default cap {cap} to {carried}"
        );
    }
    Ok(())
}

/// The workspace as `cargo metadata` sees it.
fn metadata() -> anyhow::Result<Value> {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?;
    ensure!(out.status.success(), "cargo metadata failed");
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn version(text: &str) -> Vec<u64> {
    text.split('.').map(|n| n.parse().unwrap_or(0)).collect()
}

#[test]
fn the_dockerfile_builds_what_exists_with_a_new_enough_rust() -> anyhow::Result<()> {
    let dockerfile = read("Dockerfile")?;
    let metadata = metadata()?;
    let packages = metadata["packages"].as_array().context("packages")?;
    let rust_version = packages
        .iter()
        .filter_map(|p| p["rust_version"].as_str())
        .max_by_key(|v| version(v))
        .context("no rust-version")?;
    let builder = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("FROM rust:"))
        .context("no rust builder stage")?;
    let builder = builder.split(['-', ' ']).next().unwrap_or_default();
    ensure!(
        version(builder) >= version(rust_version),
        "the builder's Rust {builder} is older than rust-version {rust_version}"
    );
    // Each `cargo build -p <package> --bin/--example <name>` names a target
    // of that package.
    let mut builds = 0;
    for command in dockerfile.split("cargo build").skip(1) {
        let words: Vec<&str> = command
            .split_whitespace()
            .take_while(|w| *w != "&&")
            .collect();
        let at = words
            .iter()
            .position(|w| *w == "-p")
            .context("a cargo build without -p")?;
        let name = words.get(at + 1).context("-p without a package")?;
        let kind = match words.get(at + 2).copied() {
            Some("--bin") => "bin",
            Some("--example") => "example",
            other => bail!("-p {name} followed by {other:?}, not --bin or --example"),
        };
        let target = words.get(at + 3).context("no target name")?;
        let package = packages
            .iter()
            .find(|p| p["name"] == *name)
            .with_context(|| {
                format!("the Dockerfile builds package {name}, not in the workspace")
            })?;
        ensure!(
            package["targets"].as_array().is_some_and(|targets| targets
                .iter()
                .any(|t| t["name"] == *target && t["kind"][0] == kind)),
            "package {name} has no {kind} {target}"
        );
        builds += 1;
    }
    ensure!(builds == 2, "{builds} cargo builds in the Dockerfile");
    // The manifests' images are its two final stages.
    for stage in ["AS pinboard", "AS worker"] {
        ensure!(dockerfile.contains(stage), "no stage `{stage}`");
    }
    for line in dockerfile.lines() {
        if let Some(rest) = line.strip_prefix("COPY deploy/") {
            let source = rest.split_whitespace().next().unwrap_or_default();
            ensure!(
                deploy_dir().join(source).exists(),
                "COPY of a missing deploy/{source}"
            );
        }
    }
    Ok(())
}

#[test]
fn the_image_wrapper_raises_the_soft_open_file_limit_to_the_hard_one() -> anyhow::Result<()> {
    let wrapper = deploy_dir().join("container/nofile-exec");
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -Sn 256 && exec "$0" sh -c 'echo "$(ulimit -Sn) $(ulimit -Hn)"'"#)
        .arg(&wrapper)
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let (soft, hard) = text.trim().split_once(' ').context("two numbers")?;
    ensure!(soft != "256" && soft == hard, "soft {soft}, hard {hard}");
    Ok(())
}
