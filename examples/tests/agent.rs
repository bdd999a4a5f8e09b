//! The agent example as a real process on a real SQLite file: SIGKILL it
//! while sessions are being sent messages and worked, restart it, send
//! every message again with its key (the client cannot know which landed),
//! and every session's history holds each message once and its reply once,
//! in the order sent, each reply after its message.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context as _;
use pinned::pinned_store::{SqliteOptions, SqliteStore};
use serde_json::{json, Value};
use support::jobs::drained;
use support::start_example;
use support::PATIENCE;
use tokio::sync::Notify;

const SESSIONS: usize = 8;
const MESSAGES: usize = 30;

/// Session `session`'s messages: (key, text), the text `n` words long.
fn messages(session: usize) -> Vec<(String, String)> {
    (0..MESSAGES)
        .map(|n| {
            let key = format!("s{session}-m{n}");
            let text = vec!["word"; n % 7 + 1].join(" ");
            (key, text)
        })
        .collect()
}

/// Messages answered across the sessions, and the signal given once
/// `KILL_AT` of them were.
#[derive(Default)]
struct Answered {
    count: AtomicUsize,
    reached: Notify,
}

/// Answered messages after which the first process is killed: a fifth,
/// while the rest are still being sent and the replies still worked.
const KILL_AT: usize = SESSIONS * MESSAGES / 5;

/// Sends `messages` to session `id` one after another, counting each
/// answer in `answered`; answers how many were answered before the first
/// failure (the process died) and how many of those were repeats.
async fn send_all(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    messages: &[(String, String)],
    answered: &Answered,
) -> (usize, usize) {
    let mut repeats = 0;
    for (n, (key, text)) in messages.iter().enumerate() {
        let answer = async {
            let answer: Value = client
                .post(format!("{base}/sessions/{id}/messages"))
                .header("idempotency-key", key.as_str())
                .json(&json!({ "text": text }))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            anyhow::Ok(answer)
        };
        match answer.await {
            Ok(answer) => {
                assert_eq!(answer["admitted"], json!(key), "{answer}");
                if answer["repeat"] == json!(true) {
                    repeats += 1;
                }
                if answered.count.fetch_add(1, Ordering::SeqCst) + 1 == KILL_AT {
                    answered.reached.notify_one();
                }
            }
            Err(_) => return (n, repeats),
        }
    }
    (messages.len(), repeats)
}

/// Session `id`'s whole history, read a page of 16 at a time.
async fn history(client: &reqwest::Client, base: &str, id: &str) -> anyhow::Result<Vec<Value>> {
    let mut turns = Vec::new();
    loop {
        let page: Value = client
            .get(format!(
                "{base}/sessions/{id}/history?from={}&limit=16",
                turns.len()
            ))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let got = page["turns"].as_array().context("turns")?;
        turns.extend(got.iter().cloned());
        if got.is_empty() || turns.len() as u64 >= page["end"].as_u64().context("end")? {
            return Ok(turns);
        }
    }
}

#[tokio::test]
async fn messages_sent_again_after_a_sigkill_are_answered_exactly_once_in_order(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("agent.db");
    let db_path = db.to_str().context("utf-8 path")?.to_owned();
    let env = [
        ("PINNED_DB_PATH", db_path.as_str()),
        ("AGENT_THINK_MS", "5"),
    ];
    let (mut child, address) = start_example("agent", &env).await?;
    let base = format!("http://{address}");
    let client = reqwest::Client::new();

    // The sessions are sent to side by side, each one's messages in order;
    // the process dies once a fifth of the messages are answered, while
    // the rest are on their way and replies are being worked.
    let answered = Answered::default();
    let runs = (0..SESSIONS).map(|s| {
        let (client, base, answered) = (client.clone(), base.clone(), &answered);
        async move { send_all(&client, &base, &format!("s{s}"), &messages(s), answered).await }
    });
    let all = futures_util::future::join_all(runs);
    let killer = {
        let child = &mut child;
        let answered = &answered;
        async move {
            let reached = tokio::time::timeout(PATIENCE, answered.reached.notified()).await;
            let _ = child.start_kill();
            reached.expect("a fifth of the messages answered in time");
        }
    };
    let (before, ()) = tokio::join!(all, killer);
    child.wait().await?;
    let sent_before: usize = before.iter().map(|(n, _)| n).sum();
    anyhow::ensure!(
        sent_before < SESSIONS * MESSAGES,
        "every message was answered before the kill: nothing was cut short"
    );

    let (mut child, address) = start_example("agent", &env).await?;
    let base = format!("http://{address}");
    let resent = Answered::default();
    let again = (0..SESSIONS).map(|s| {
        let (client, base, resent) = (client.clone(), base.clone(), &resent);
        async move { send_all(&client, &base, &format!("s{s}"), &messages(s), resent).await }
    });
    let after = futures_util::future::join_all(again).await;
    for (s, (sent, _)) in after.iter().enumerate() {
        assert_eq!(*sent, MESSAGES, "session s{s}: every message answered");
    }
    let repeats: usize = after.iter().map(|(_, r)| r).sum();
    assert!(
        repeats >= sent_before,
        "every message answered before the kill is a repeat now ({repeats} < {sent_before})"
    );
    eprintln!(
        "{sent_before} messages answered before the kill; {repeats} of the {} sent again were repeats",
        SESSIONS * MESSAGES
    );
    let store = SqliteStore::open(&db, SqliteOptions::default()).await?;
    drained("every message worked", &store).await?;

    for s in 0..SESSIONS {
        let id = format!("s{s}");
        let turns = history(&client, &base, &id).await?;
        let sent = messages(s);
        let keys: Vec<&str> = sent.iter().map(|(key, _)| key.as_str()).collect();
        let of = |role: &str| -> Vec<&str> {
            turns
                .iter()
                .filter(|t| t["role"] == role)
                .filter_map(|t| t["key"].as_str())
                .collect()
        };
        assert_eq!(
            of("user"),
            keys,
            "session {id}: each message once, in order"
        );
        assert_eq!(of("agent"), keys, "session {id}: each reply once, in order");
        // Every reply comes after its message, and answers its text.
        let texts: HashMap<&str, &str> =
            sent.iter().map(|(k, t)| (k.as_str(), t.as_str())).collect();
        let mut seen = std::collections::HashSet::new();
        for turn in &turns {
            let key = turn["key"].as_str().context("key")?;
            if turn["role"] == "user" {
                assert_eq!(turn["text"], json!(texts[key]));
                seen.insert(key);
            } else {
                assert!(seen.contains(key), "session {id}: reply to {key} before it");
                let words = texts[key].split_whitespace().count();
                assert_eq!(turn["text"], json!(format!("you said {words} words")));
            }
        }
    }

    // Bad input: no key, a key too long for the admission window, a text
    // over the bound; each a 400 with a detail.
    let post = |key: Option<String>, text: String| {
        let mut request = client
            .post(format!("{base}/sessions/s0/messages"))
            .json(&json!({ "text": text }));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send()
    };
    for (key, text) in [
        (None, "hi".to_owned()),
        (Some("k".repeat(201)), "hi".to_owned()),
        (Some("k".to_owned()), "w".repeat(16 * 1024 + 1)),
    ] {
        let response = post(key, text).await?;
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await?;
        assert!(body["detail"].is_string(), "{body}");
    }
    assert_eq!(
        history(&client, &base, "s0").await?.len(),
        2 * MESSAGES,
        "refused messages leave nothing"
    );
    child.start_kill()?;
    child.wait().await?;
    Ok(())
}
