//! Dispatching trays taken over across languages on one Postgres database:
//! the Python reference (pinned 0.16.0) running the relay/sink pair of its
//! crash workload and the Rust relay example read and write the same rows.
//! Each side is SIGKILLed mid-dispatch (a relay item's admission into the
//! sink recorded, its release and ack not), the other side (or, once, a
//! second Rust worker) finishes the work, and the rows are held to the relay/sink part of the reference's
//! own durability contract (`pinned.sim.contract`): every relayed item
//! lands in the sink exactly once, none lost, the two-phase records gone.
//!
//! Needs Postgres at `PINNED_TEST_DATABASE_URL` and the reference venv at
//! `PINNED_PY` (both set by `scripts/test`); fails, never skips, without
//! them.

mod support;

use std::path::PathBuf;

use pinned::pinned_store::{InstanceKey, PostgresOptions, PostgresStore, StateStore, TrayKey};
use serde_json::{json, Value};
use support::jobs::wait;
use support::start_example;
use test_support::{Proc, PythonWorker};

const ITEMS: u64 = 12;
const NS: &str = "/relays";

/// One test at a time: the Rust example wakes every marked relay it finds
/// in the database when it starts, the other test's included.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn database_url() -> String {
    std::env::var("PINNED_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned())
}

/// The Python relay app; `hold`: its relay handler never acks (`RELAY_HOLD`).
fn start_python(hold: bool) -> Proc {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py");
    PythonWorker::local()
        .app(dir, "relay_app:app")
        .envs(&[
            ("DATABASE_URL", &database_url()),
            ("RELAY_HOLD", if hold { "1" } else { "0" }),
        ])
        .name("relay-python")
        .start()
}

fn unique_id(side: &str) -> String {
    format!("{side}-{}-{}", std::process::id(), rand::random::<u32>())
}

async fn store() -> anyhow::Result<PostgresStore> {
    Ok(PostgresStore::open(&database_url(), PostgresOptions::default()).await?)
}

/// Admits relay items `ns` through `base`; answers those answered 200.
async fn relay(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    ns: impl IntoIterator<Item = u64>,
) -> anyhow::Result<Vec<u64>> {
    let mut acked = Vec::new();
    for n in ns {
        let response = client
            .post(format!("{base}{NS}/{id}/relay"))
            .json(&json!({ "n": n }))
            .send()
            .await?;
        anyhow::ensure!(
            response.status() == 200,
            "POST relay {n}: {}",
            response.status()
        );
        acked.push(n);
    }
    Ok(acked)
}

/// The doc of tray `tray` of relay `id` (local mode on both sides: every
/// epoch is 0, so a read at 0 fences no one).
async fn doc(store: &PostgresStore, id: &str, tray: &str) -> anyhow::Result<Option<Value>> {
    Ok(store
        .get_tray(InstanceKey::new(NS, id), TrayKey::singleton(tray), 0)
        .await?
        .map(|row| Value::Object(row.doc)))
}

/// Whether the relay's row holds a dispatch record not yet cleaned: the
/// item is between its admission into the sink and its release.
fn mid_dispatch(relay: &Value) -> bool {
    relay["~dispatch"]
        .as_array()
        .is_some_and(|records| records.iter().any(|record| record["cleaned"] == false))
}

/// Waits until relay `id` is mid-dispatch with at least one item relayed
/// before: the moment to kill its owner.
async fn until_mid_dispatch(store: &PostgresStore, id: &str) -> anyhow::Result<()> {
    wait("a relay item mid-dispatch", || async {
        let Some(relay) = doc(store, id, "relay").await? else {
            return Ok(None);
        };
        let relayed = relay["relayed"].as_object().map_or(0, |map| map.len());
        anyhow::ensure!(
            relayed < usize::try_from(ITEMS)?,
            "every item was relayed before the kill"
        );
        Ok((relayed >= 1 && mid_dispatch(&relay)).then_some(()))
    })
    .await
}

async fn drained(store: &PostgresStore, id: &str) -> anyhow::Result<()> {
    wait("the relay and the sink drained", || async {
        let marked = store
            .list(InstanceKey::new(NS, id), 0, None, Some(true))
            .await?;
        Ok(marked.is_empty().then_some(()))
    })
    .await
}

/// The relay/sink part of the reference's contract on relay `id`'s rows,
/// drained, run by the reference itself.
async fn reference_contract(
    store: &PostgresStore,
    id: &str,
    sent: &[u64],
    acked: &[u64],
) -> anyhow::Result<Value> {
    let relay = doc(store, id, "relay").await?.unwrap_or_else(|| json!({}));
    let sink = doc(store, id, "sink").await?.unwrap_or_else(|| json!({}));
    let script = r#"
import json, sys
from pinned.sim.contract import _validate_relay
run = json.loads(sys.stdin.read())
_validate_relay(run["relay"], run["sink"], sent=run["sent"], acked=run["acked"], drained=True)
"#;
    let input = json!({ "relay": relay, "sink": sink, "sent": sent, "acked": acked });
    let mut child = std::process::Command::new(test_support::python())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().ok_or_else(|| anyhow::anyhow!("stdin"))?;
        stdin.write_all(input.to_string().as_bytes())?;
    }
    let output = child.wait_with_output()?;
    anyhow::ensure!(
        output.status.success(),
        "the reference's contract failed on {input}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(json!({ "relay": relay, "sink": sink }))
}

/// Every sent item delivered to the sink exactly once, in order.
fn sunk_once(rows: &Value, sent: &[u64]) {
    let log: Vec<u64> = rows["sink"]["log"]
        .as_array()
        .map(|log| log.iter().filter_map(|entry| entry["n"].as_u64()).collect())
        .unwrap_or_default();
    let mut once = log.clone();
    once.dedup();
    assert_eq!(once, sent, "the sink's deliveries {log:?}");
}

#[tokio::test]
async fn a_rust_worker_finishes_the_dispatches_a_python_worker_was_killed_in() -> anyhow::Result<()>
{
    let _alone = ONE_AT_A_TIME.lock().await;
    let id = unique_id("py2rs");
    let client = reqwest::Client::new();
    let store = store().await?;
    let mut python = start_python(true);
    let mut acked = relay(&client, &python.url, &id, 1..=ITEMS).await?;
    until_mid_dispatch(&store, &id).await?;
    python.kill();
    let relay_row = doc(&store, &id, "relay").await?.unwrap_or_default();
    assert!(mid_dispatch(&relay_row), "killed mid-dispatch: {relay_row}");
    eprintln!("python killed mid-dispatch: {}", relay_row["~dispatch"]);

    let url = database_url();
    let (mut rust, address) = start_example("relay", &[("DATABASE_URL", url.as_str())]).await?;
    acked.extend(relay(&client, &format!("http://{address}"), &id, [ITEMS + 1]).await?);
    drained(&store, &id).await?;
    let rows = reference_contract(&store, &id, &acked, &acked).await?;
    sunk_once(&rows, &acked);
    rust.start_kill()?;
    rust.wait().await?;
    Ok(())
}

#[tokio::test]
async fn a_python_worker_finishes_the_dispatches_a_rust_worker_was_killed_in() -> anyhow::Result<()>
{
    let _alone = ONE_AT_A_TIME.lock().await;
    let id = unique_id("rs2py");
    let client = reqwest::Client::new();
    let store = store().await?;
    let url = database_url();
    let (mut rust, address) = start_example(
        "relay",
        &[("DATABASE_URL", url.as_str()), ("RELAY_HOLD", "1")],
    )
    .await?;
    let mut acked = relay(&client, &format!("http://{address}"), &id, 1..=ITEMS).await?;
    until_mid_dispatch(&store, &id).await?;
    rust.start_kill()?;
    rust.wait().await?;
    let relay_row = doc(&store, &id, "relay").await?.unwrap_or_default();
    assert!(mid_dispatch(&relay_row), "killed mid-dispatch: {relay_row}");
    eprintln!("rust killed mid-dispatch: {}", relay_row["~dispatch"]);

    // The reference resumes marked trays when the id activates: the next
    // admission activates it.
    let mut python = start_python(false);
    acked.extend(relay(&client, &python.url, &id, [ITEMS + 1]).await?);
    drained(&store, &id).await?;
    let rows = reference_contract(&store, &id, &acked, &acked).await?;
    sunk_once(&rows, &acked);
    python.kill();
    Ok(())
}

#[tokio::test]
async fn a_rust_worker_finishes_the_dispatches_another_rust_worker_was_killed_in(
) -> anyhow::Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let id = unique_id("rs2rs");
    let client = reqwest::Client::new();
    let store = store().await?;
    let url = database_url();
    let (mut first, address) = start_example(
        "relay",
        &[("DATABASE_URL", url.as_str()), ("RELAY_HOLD", "1")],
    )
    .await?;
    let mut acked = relay(&client, &format!("http://{address}"), &id, 1..=ITEMS).await?;
    until_mid_dispatch(&store, &id).await?;
    first.start_kill()?;
    first.wait().await?;
    let relay_row = doc(&store, &id, "relay").await?.unwrap_or_default();
    assert!(mid_dispatch(&relay_row), "killed mid-dispatch: {relay_row}");

    // The second worker wakes the marked rows itself at start.
    let (mut second, address) = start_example("relay", &[("DATABASE_URL", url.as_str())]).await?;
    drained(&store, &id).await?;
    acked.extend(relay(&client, &format!("http://{address}"), &id, [ITEMS + 1]).await?);
    drained(&store, &id).await?;
    let rows = reference_contract(&store, &id, &acked, &acked).await?;
    sunk_once(&rows, &acked);
    second.start_kill()?;
    second.wait().await?;
    Ok(())
}
