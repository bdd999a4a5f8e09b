//! The operator commands (`pinboard workers`, `placements`, `drain`, …) as
//! an operator runs them: the real `pinboard` binary as a client of a real
//! pinboard process with two real Python reference workers behind it.
//! Checks the table and the JSON, that a drain typed at the command line
//! changes the worker's state, and the exit codes of each failure.

mod support;

use std::process::{Command, Output};

use serde_json::Value;
use support::{client, eventually, get_json, python_worker};
use test_support::PATIENCE;

const OPERATOR: &str = "operator-secret";

/// Runs `pinboard <args>` against `url` with `token` in the environment.
fn pinboard(url: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pinboard"));
    cmd.args(args)
        .env("PINBOARD_URL", url)
        .env_remove("PINBOARD_OPERATOR_TOKEN");
    if let Some(t) = token {
        cmd.env("PINBOARD_OPERATOR_TOKEN", t);
    }
    cmd.output().expect("run pinboard")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).expect("--json output parses")
}

/// The registry's worker rows, read with the operator token.
async fn operator_workers(c: &reqwest::Client, pb: &str) -> Vec<Value> {
    test_support::workers(c, pb, OPERATOR).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_commands_list_act_and_fail_with_meaningful_exit_codes() {
    let pb = support::pinboard()
        .args(&["--operator-token", OPERATOR])
        .start();
    let _plain = python_worker(&pb.url).start();
    let _blue = python_worker(&pb.url)
        .env("PINNED_HOSTNAME", "blue")
        .start();
    let c = client();
    let rows = eventually("two workers", PATIENCE, || async {
        let rows = operator_workers(&c, &pb.url).await;
        (rows.len() == 2).then_some(rows)
    })
    .await;
    for i in 0..4 {
        get_json(&c, &format!("{}/counter/op{i}/hit", pb.url), PATIENCE).await;
    }

    // The table: a header and one aligned row per worker.
    let out = pinboard(&pb.url, Some(OPERATOR), &["workers"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("SESSION"), "{text}");
    let state_col = lines[0].find("STATE").expect("STATE column");
    for (line, row) in lines[1..].iter().zip(["serving", "serving"]) {
        assert_eq!(&line[state_col..], row, "{text}");
    }
    for row in &rows {
        let session = row["sessionId"].as_str().expect("session");
        assert!(text.contains(session), "{text}");
    }
    // --json parses, and is pinboard's answer.
    let listed = json_of(&pinboard(&pb.url, Some(OPERATOR), &["workers", "--json"]));
    assert_eq!(listed["workers"].as_array().map(Vec::len), Some(2));

    // Placements: filtered by namespace and id, with owner and epoch.
    let page = json_of(&pinboard(
        &pb.url,
        Some(OPERATOR),
        &["placements", "--ns", "/counter", "--id", "op", "--json"],
    ));
    assert_eq!(page["matched"], 4, "{page}");
    let first = &page["placements"][0];
    assert_eq!(first["id"], "op0");
    assert!(first["epoch"].as_str().is_some_and(|e| !e.is_empty()));
    let owner = first["sessionId"].as_str().expect("owner").to_owned();
    let paged = json_of(&pinboard(
        &pb.url,
        Some(OPERATOR),
        &["placements", "--limit", "3", "--all", "--json"],
    ));
    assert_eq!(paged["placements"].as_array().map(Vec::len), Some(4));
    let table = stdout(&pinboard(
        &pb.url,
        Some(OPERATOR),
        &["placements", "--limit", "2"],
    ));
    assert!(table.starts_with("NAMESPACE"), "{table}");
    assert!(table.contains("2 of 4 shown"), "{table}");

    // Drain by hostname at the command line: the worker turns draining.
    let out = pinboard(
        &pb.url,
        Some(OPERATOR),
        &["drain", "blue", "--deadline", "30s"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("drained "), "{}", stdout(&out));
    let blue = eventually("blue draining", PATIENCE, || async {
        operator_workers(&c, &pb.url)
            .await
            .into_iter()
            .find(|w| w["hostname"] == "blue" && w["draining"] == true)
    })
    .await;
    let blue_session = blue["sessionId"].as_str().expect("session").to_owned();
    let text = stdout(&pinboard(&pb.url, Some(OPERATOR), &["workers"]));
    let line = text
        .lines()
        .find(|l| l.starts_with(&blue_session))
        .expect("blue row");
    assert!(line.ends_with("draining"), "{text}");
    // Undrain by a prefix of the session.
    let out = pinboard(&pb.url, Some(OPERATOR), &["undrain", &blue_session[..8]]);
    assert!(out.status.success(), "{}", stderr(&out));
    eventually("blue serving again", PATIENCE, || async {
        operator_workers(&c, &pb.url)
            .await
            .into_iter()
            .find(|w| w["sessionId"] == blue_session.as_str() && w["draining"] == false)
    })
    .await;

    // Wind down one instance on its owner.
    let wound = json_of(&pinboard(
        &pb.url,
        Some(OPERATOR),
        &["wind-down", "/counter", "op0", "--deadline", "5s", "--json"],
    ));
    assert_eq!(wound["windDown"]["sessionId"], owner.as_str(), "{wound}");
    assert!(wound["msgId"].as_str().is_some(), "{wound}");

    // The sweeper and the moves answer (no database: not enabled).
    let sweeper = json_of(&pinboard(&pb.url, Some(OPERATOR), &["sweeper", "--json"]));
    assert_eq!(sweeper["enabled"], false, "{sweeper}");
    let moves = json_of(&pinboard(&pb.url, Some(OPERATOR), &["moves", "--json"]));
    assert!(moves["moves"].is_array(), "{moves}");

    // Failures: one line on stderr, an exit code that says which.
    let cases: [(&str, Option<&str>, Vec<&str>, i32); 7] = [
        ("no token", None, vec!["workers"], 64),
        ("wrong token", Some("nope"), vec!["workers"], 77),
        ("unknown target", Some(OPERATOR), vec!["drain", "nobody"], 1),
        (
            "bad deadline",
            Some(OPERATOR),
            vec!["drain", "blue", "--deadline", "soon"],
            64,
        ),
        (
            "refused input",
            Some(OPERATOR),
            vec!["drain", "blue", "--deadline", "1000000h"],
            65,
        ),
        (
            "refused limit",
            Some(OPERATOR),
            vec!["placements", "--limit", "0"],
            65,
        ),
        (
            "unknown placement",
            Some(OPERATOR),
            vec!["wind-down", "/counter", "zzz"],
            1,
        ),
    ];
    for (what, token, args, code) in cases {
        let out = pinboard(&pb.url, token, &args);
        assert_eq!(out.status.code(), Some(code), "{what}: {}", stderr(&out));
        assert_eq!(stderr(&out).lines().count(), 1, "{what}: {}", stderr(&out));
        assert!(
            stderr(&out).starts_with("pinboard: "),
            "{what}: {}",
            stderr(&out)
        );
    }
    let dead = support::unreachable_url();
    let out = pinboard(&dead, Some(OPERATOR), &["workers", "--timeout", "2s"]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
}
