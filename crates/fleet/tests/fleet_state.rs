//! The storage inspector and the per-key controls as an operator uses
//! them: the real `pinboard state …` commands against a real pinboard,
//! real Rust workers and the Postgres store.
//!
//! - A job queue whose poisoned job parked its tray: listed by `--parked`,
//!   shown decoded, skipped into the dead letters (the next job then
//!   runs), refused a second unpark, paused (its requests answer 503) and
//!   resumed, and deleted; every control is in the audit list with who
//!   asked, the owner's session and epoch.
//! - An id whose parked row nobody owns: a skip places it on a worker and
//!   the owner acts.
//! - An id owned by a Python reference worker: shown through a Rust worker
//!   of the namespace, and every control refused with 409 (exit 75).
//! - Bad input: an unknown namespace (exit 1), a page too large (exit 65),
//!   and controls with a malformed id, an unknown action or field, no tray
//!   or no token, each a precise 4xx with its `detail`.

mod support;

use std::process::Command;
use std::time::Duration;

use pinned_store::conformance::{database_url, unique_ns, PostgresCleanup};
use pinned_store::{InstanceKey, PostgresOptions, PostgresStore, StateStore, TrayKey};
use serde_json::{json, Value};
use support::{client, eventually, pinboard, python_worker, rust_worker, wait_workers, TOKEN};

/// How long a tray takes to park, skip or run a job on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

/// `pinboard state <args>` against `pb`: exit code, stdout, stderr.
fn state(pb: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-pinboard"))
        .arg("state")
        .args(args)
        .env("PINBOARD_URL", pb)
        .env("PINBOARD_OPERATOR_TOKEN", TOKEN)
        .output()
        .expect("run pinboard state");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `pinboard state <args> --json`, which must succeed: its JSON.
fn state_json(pb: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, out, err) = state(pb, &all);
    assert_eq!(code, 0, "pinboard state {args:?}: {err}");
    serde_json::from_str(&out).expect("--json output parses")
}

async fn done(c: &reqwest::Client, pb: &str, ns: &str, id: &str) -> (u16, Value) {
    let res = c
        .get(format!("{pb}{ns}/{id}/done"))
        .send()
        .await
        .expect("done");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn ids(page: &Value) -> Vec<String> {
    page["ids"]
        .as_array()
        .map(|ids| {
            ids.iter()
                .filter_map(|s| s["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_and_steers_one_bad_key_through_its_owner() {
    let ns = unique_ns("inspect");
    let _cleanup = PostgresCleanup::new(&ns);
    let url = database_url();
    let pb = pinboard()
        .args(&["--database-url", &url, "--sweep-interval-ms", "200"])
        .start();
    let w = rust_worker(&pb.url)
        .envs(&[("FLEET_JOBS_NS", &ns), ("FLEET_DATABASE_URL", &url)])
        .start();
    let c = client();
    let session = wait_workers(&c, &pb.url, 1).await[0]["sessionId"]
        .as_str()
        .expect("session")
        .to_owned();
    for job in ["poison-1", "ok-1"] {
        let res = c
            .post(format!("{}{ns}/j/enqueue/{job}", pb.url))
            .send()
            .await
            .expect("enqueue");
        assert_eq!(res.status(), 200, "{job}");
    }
    eventually("the tray parked", PATIENCE, || async {
        (done(&c, &pb.url, &ns, "j").await.1["parked"] == json!(true)).then_some(())
    })
    .await;

    // Seen: listed as parked, shown decoded with its owner.
    assert_eq!(ids(&state_json(&pb.url, &["list", &ns, "--parked"])), ["j"]);
    let shown = state_json(&pb.url, &["show", &ns, "j"]);
    let tray = &shown["trays"][0];
    assert_eq!(
        (&tray["tray"], &tray["parked"], &tray["attempts"]),
        (&json!("jobs"), &json!(true), &json!(2)),
        "{shown}"
    );
    assert_eq!(tray["fields"]["queue"], json!(["poison-1", "ok-1"]));
    assert_eq!(shown["placement"]["owner"], json!(session));

    // Skipped: the poison lands in the dead letters and the next job runs.
    let skipped = state_json(&pb.url, &["skip", &ns, "j", "jobs", "--by", "alice"]);
    assert_eq!(
        skipped["outcome"]["skipped"]["fieldsBefore"]["queue"],
        json!(["poison-1", "ok-1"]),
        "{skipped}"
    );
    eventually("the next job done", PATIENCE, || async {
        (done(&c, &pb.url, &ns, "j").await.1["done"] == json!(["ok-1"])).then_some(())
    })
    .await;
    let shown = state_json(&pb.url, &["show", &ns, "j"]);
    assert_eq!(
        shown["trays"][0]["dead"][0]["by"],
        json!("alice"),
        "{shown}"
    );
    let (code, _, err) = state(&pb.url, &["unpark", &ns, "j", "jobs"]);
    assert_eq!(code, 75, "{err}");
    assert!(err.contains("tray jobs/~ is not parked"), "{err}");

    // Paused: closed, and its requests refused until resumed.
    state_json(&pb.url, &["pause", &ns, "j", "--by", "alice"]);
    let (status, body) = done(&c, &pb.url, &ns, "j").await;
    assert_eq!(
        (status, &body["detail"]),
        (
            503,
            &json!("instance paused by an operator; resume it to serve")
        )
    );
    assert_eq!(
        state_json(&pb.url, &["list", &ns])["ids"][0]["paused"],
        json!(true)
    );
    state_json(&pb.url, &["resume", &ns, "j"]);
    assert_eq!(
        done(&c, &pb.url, &ns, "j").await,
        (200, json!({"done": ["ok-1"], "queued": 0, "parked": false}))
    );

    // An id nobody owns, with a parked row: the skip places it and its
    // owner acts.
    let store = PostgresStore::open(&url, PostgresOptions::default())
        .await
        .expect("store");
    let row = json!({"queue": ["poison-2"], "done": [], "~attempts": 2, "~parked": true});
    store
        .set_tray(
            InstanceKey::new(&ns, "k"),
            TrayKey::singleton("jobs"),
            true,
            row.as_object().cloned().unwrap_or_default(),
            0,
        )
        .await
        .expect("seed a parked row");
    let skipped = state_json(&pb.url, &["skip", &ns, "k", "jobs"]);
    assert_eq!(
        skipped["outcome"]["skipped"]["fieldsBefore"]["queue"],
        json!(["poison-2"]),
        "{skipped}"
    );
    assert!(
        skipped["epoch"].as_u64() > Some(0),
        "acted at a placement epoch: {skipped}"
    );

    // Deleted: no rows left.
    state_json(&pb.url, &["delete", &ns, "j"]);
    assert_eq!(state_json(&pb.url, &["show", &ns, "j"])["rows"], json!(0));

    // Every control is in the audit list, newest first.
    let audit = state_json(&pb.url, &["audit"]);
    let actions: Vec<(String, u64)> = audit["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap_or("").to_owned(),
                a["status"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let expect = [
        ("delete", 200),
        ("skip", 200),
        ("resume", 200),
        ("pause", 200),
        ("unpark", 409),
        ("skip", 200),
    ];
    assert_eq!(actions, expect.map(|(a, s)| (a.to_owned(), s)));
    assert_eq!(audit["actions"][5]["by"], json!("alice"));
    assert_eq!(audit["actions"][5]["owner"], json!(session));

    // Bad input.
    let (code, _, err) = state(&pb.url, &["list", "/nowhere"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unknown namespace \"/nowhere\""), "{err}");
    let (code, _, err) = state(&pb.url, &["list", &ns, "--limit", "500"]);
    assert_eq!(code, 65, "{err}");
    assert!(
        err.contains("limit must be an integer from 1 to 200"),
        "{err}"
    );
    let act = format!("{}/registry/state/act", pb.url);
    for (body, status, detail) in [
        (
            json!({"ns": ns, "id": "a b", "action": "pause"}),
            400,
            "malformed id: id must contain only [A-Za-z0-9._~-]",
        ),
        (
            json!({"ns": ns, "id": "j", "action": "explode"}),
            400,
            "unknown action \"explode\": one of unpark, skip, pause, resume, delete",
        ),
        (
            json!({"ns": "/nowhere", "id": "j", "action": "pause"}),
            404,
            "unknown namespace \"/nowhere\": no live worker hosts it",
        ),
        (
            json!({"ns": ns, "id": "j", "action": "skip"}),
            400,
            "skip needs a tray (query parameter \"tray\")",
        ),
    ] {
        let res = c
            .post(&act)
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .expect("act");
        let got = res.status().as_u16();
        let answer: Value = res.json().await.expect("json");
        assert_eq!(
            (got, answer["detail"].as_str().unwrap_or_default()),
            (status, detail),
            "{body}"
        );
    }
    let res = c
        .post(&act)
        .json(&json!({"ns": ns, "id": "j", "action": "pause"}))
        .send()
        .await
        .expect("act");
    assert_eq!(res.status(), 401, "no operator token");
    let res = c
        .post(&act)
        .bearer_auth(TOKEN)
        .json(&json!({"ns": ns, "id": "j", "action": "pause", "odd": 1}))
        .send()
        .await
        .expect("act");
    assert_eq!(res.status(), 400, "an unknown field");
    drop(w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_owned_id_is_shown_but_not_acted_on() {
    let url = database_url();
    let pb = pinboard().start();
    let _py = python_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let id = format!("py-{}", support::unique());
    let res = c
        .get(format!("{}/counter/{id}/hit", pb.url))
        .send()
        .await
        .expect("hit");
    assert_eq!(res.status(), 200);
    // A Rust worker of the namespace reads the rows (there are none).
    let _rust = rust_worker(&pb.url)
        .envs(&[("FLEET_DATABASE_URL", &url)])
        .start();
    wait_workers(&c, &pb.url, 2).await;
    let shown = state_json(&pb.url, &["show", "/counter", &id]);
    assert_eq!(
        (&shown["rows"], &shown["placement"]["live"]),
        (&json!(0), &json!(true)),
        "{shown}"
    );
    for action in ["pause", "resume", "delete"] {
        let (code, _, err) = state(&pb.url, &[action, "/counter", &id]);
        assert_eq!(code, 75, "{action}: {err}");
        assert!(err.contains("a Python reference worker"), "{action}: {err}");
    }
}
