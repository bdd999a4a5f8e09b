//! The output gate across real crashes: the agent example, a real process on
//! a real SQLite file (and again on Postgres), pushes each reply to its
//! session's WebSocket once the reply's ack (which appends it to the
//! history) is durable. Clients hold
//! one socket per session while messages are sent and worked; the worker is
//! SIGKILLed after the k-th reply of a run reached the clients (k varied
//! per run), and after each kill the store's rows are read directly, before
//! anything restarts (a restarted worker would redo the lost items and mask
//! a reply pushed ahead of its write).
//!
//! Asserted:
//! - after every kill, every reply any client received (in any run so far)
//!   is in the store's rows, with the text it was pushed with;
//! - no reply is received twice, across every kill and restart: the gate
//!   makes a push at most once (exactly once when its worker survives its
//!   ack's landing with the socket open; never when the worker dies between
//!   the landing and the push, or no socket is open, and the client reads
//!   it from the history), which is stricter than at-least-once;
//! - at the end, the history holds each message's reply exactly once, in
//!   the order sent, and at least one kill left messages admitted and not
//!   yet answered (the kills landed while items were being worked).

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use futures_util::StreamExt;
use pinned::pinned_store::{InstanceKey, StateStore, StoreConfig};
use serde_json::{json, Value};
use support::jobs::wait;
use support::{start_example, terminate, PATIENCE};
use tokio::process::Child;
use tokio::sync::Notify;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

const SESSIONS: usize = 3;
const MESSAGES: usize = 40;
/// Replies received in a run before its SIGKILL, one run each; a last run
/// then finishes the work and ends with SIGTERM.
const KILL_AFTER: [usize; 4] = [1, 4, 9, 15];

/// The store the worker runs on, and the session ids it is given.
struct Where {
    /// The worker's environment: its store and its think time.
    env: Vec<(&'static str, String)>,
    /// `DATABASE_URL`, when Postgres.
    location: Option<String>,
    /// The SQLite file otherwise.
    file: std::path::PathBuf,
    /// Before every session id: unique per test run on a shared database.
    prefix: String,
}

impl Where {
    fn id(&self, session: usize) -> String {
        format!("{}s{session}", self.prefix)
    }

    /// The store, opened by the test beside the worker.
    async fn open(&self) -> anyhow::Result<Arc<dyn StateStore>> {
        Ok(
            StoreConfig::from_location(self.location.as_deref(), &self.file)?
                .open()
                .await?,
        )
    }
}

/// A reply as a client received it: (session, key, text).
type Pushed = (usize, String, String);

/// What the clients saw across every run.
#[derive(Default)]
struct Seen {
    /// Every reply received, in the order received.
    replies: Mutex<Vec<Pushed>>,
    /// Per session, how many of its messages (from the first) were answered.
    answered: Mutex<[usize; SESSIONS]>,
}

fn key(session: usize, n: usize) -> String {
    format!("s{session}-m{n}")
}

fn text(n: usize) -> String {
    vec!["word"; n % 5 + 1].join(" ")
}

/// Sends session `session`'s messages from its first unanswered one, each
/// after the previous one was answered, until all are or the process dies.
async fn send_rest(
    client: reqwest::Client,
    base: String,
    id: String,
    session: usize,
    seen: Arc<Seen>,
) {
    let from = seen.answered.lock().expect("lock")[session];
    for n in from..MESSAGES {
        let answer = async {
            client
                .post(format!("{base}/sessions/{id}/messages"))
                .header("idempotency-key", key(session, n))
                .json(&json!({ "text": text(n) }))
                .send()
                .await?
                .error_for_status()?
                .json::<Value>()
                .await
        };
        match answer.await {
            Ok(answer) => {
                assert_eq!(answer["admitted"], json!(key(session, n)), "{answer}");
                seen.answered.lock().expect("lock")[session] = n + 1;
            }
            Err(_) => return,
        }
    }
}

/// One run's count of replies, and its signal to kill.
struct ThisRun {
    seen: Arc<Seen>,
    /// Replies received in this run, across the sessions.
    count: Mutex<usize>,
    /// The count at which `reached` is notified.
    kill_after: Option<usize>,
    reached: Notify,
}

/// Reads session `session`'s socket until it ends (the process died or
/// closed it), recording each reply.
async fn listen(
    address: String,
    id: String,
    session: usize,
    run: Arc<ThisRun>,
    connected: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{address}/sessions/{id}/ws")).await?;
    let _ = connected.send(());
    loop {
        let next = timeout(PATIENCE, socket.next())
            .await
            .with_context(|| format!("session s{session}: the socket neither spoke nor ended"))?;
        let text = match next {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(_)) | Err(_)) | None => return Ok(()),
            Some(Ok(_)) => continue,
        };
        let reply: Value = serde_json::from_str(text.as_str())?;
        let pushed = (
            session,
            reply["key"].as_str().context("key")?.to_owned(),
            reply["text"].as_str().context("text")?.to_owned(),
        );
        run.seen.replies.lock().expect("lock").push(pushed);
        let mut count = run.count.lock().expect("lock");
        *count += 1;
        if Some(*count) == run.kill_after {
            run.reached.notify_one();
        }
    }
}

/// Collects every object with a `role` found anywhere in `value`: the turns
/// a session's rows hold, wherever the history keeps its pages.
fn turns_in(value: &Value, into: &mut Vec<Value>) {
    match value {
        Value::Object(map) if map.contains_key("role") => into.push(value.clone()),
        Value::Object(map) => map.values().for_each(|v| turns_in(v, into)),
        Value::Array(items) => items.iter().for_each(|v| turns_in(v, into)),
        _ => {}
    }
}

/// Read from the store's rows directly: per session, the replies it holds
/// (key → text) and how many user turns it holds.
async fn stored(at: &Where) -> anyhow::Result<Vec<(HashMap<String, String>, usize)>> {
    let store = at.open().await?;
    let mut sessions = Vec::new();
    for s in 0..SESSIONS {
        let id = at.id(s);
        // Local mode writes at epoch 0; nothing runs now to be fenced.
        let rows = store
            .list(InstanceKey::new("/sessions", &id), 0, None, None)
            .await?;
        let mut turns = Vec::new();
        for row in &rows {
            turns_in(&Value::Object(row.doc.clone()), &mut turns);
        }
        let mut replies = HashMap::new();
        let mut users = 0;
        for turn in turns {
            let key = turn["key"].as_str().context("key")?.to_owned();
            let text = turn["text"].as_str().context("text")?.to_owned();
            if turn["role"] == "agent" {
                anyhow::ensure!(
                    replies.insert(key.clone(), text).is_none(),
                    "session {id}: reply {key} twice in the rows"
                );
            } else {
                users += 1;
            }
        }
        sessions.push((replies, users));
    }
    Ok(sessions)
}

/// One run of the worker: clients connect, messages are sent from where the
/// last run left off, and the process ends — SIGKILLed once `kill_after`
/// replies of this run were received, or (`None`) SIGTERMed once every
/// message is answered and worked. Answers when every socket has ended.
async fn run(at: &Where, kill_after: Option<usize>, seen: &Arc<Seen>) -> anyhow::Result<()> {
    let env: Vec<(&str, &str)> = at.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (mut child, address) = start_example("agent", &env).await?;
    let base = format!("http://{address}");
    let client = reqwest::Client::new();
    let this_run = Arc::new(ThisRun {
        seen: seen.clone(),
        count: Mutex::new(0),
        kill_after,
        reached: Notify::new(),
    });
    let mut listeners = Vec::new();
    for s in 0..SESSIONS {
        let (connected, is_connected) = tokio::sync::oneshot::channel();
        listeners.push(tokio::spawn(listen(
            address.clone(),
            at.id(s),
            s,
            this_run.clone(),
            connected,
        )));
        timeout(PATIENCE, is_connected)
            .await
            .context("a socket did not connect")??;
    }
    let senders: Vec<_> = (0..SESSIONS)
        .map(|s| {
            tokio::spawn(send_rest(
                client.clone(),
                base.clone(),
                at.id(s),
                s,
                seen.clone(),
            ))
        })
        .collect();
    match kill_after {
        Some(k) => {
            timeout(PATIENCE, this_run.reached.notified())
                .await
                .with_context(|| format!("{k} replies did not arrive"))?;
            kill(&mut child).await?;
        }
        None => {
            for sender in senders {
                sender.await?;
            }
            // A reply is in the history exactly when its message was acked.
            let history = wait("every message worked", || async {
                let history = history(&client, &base, at).await?;
                Ok(history
                    .iter()
                    .all(|replies| replies.len() == MESSAGES)
                    .then_some(history))
            })
            .await?;
            for (s, replies) in history.iter().enumerate() {
                let keys: Vec<String> = (0..MESSAGES).map(|n| key(s, n)).collect();
                assert_eq!(replies, &keys, "session s{s}: each reply once, in order");
            }
            let answered = *seen.answered.lock().expect("lock");
            assert_eq!(answered, [MESSAGES; SESSIONS], "every message answered");
            terminate(&mut child).await?;
        }
    }
    for listener in listeners {
        timeout(PATIENCE, listener)
            .await
            .context("a socket outlived its process")???;
    }
    Ok(())
}

/// SIGKILL, and the wait for the process to be gone.
async fn kill(child: &mut Child) -> anyhow::Result<()> {
    child.start_kill()?;
    timeout(PATIENCE, child.wait())
        .await
        .context("the killed process lingered")??;
    Ok(())
}

/// Each session's replies as its history endpoint lists them: keys in
/// order.
async fn history(
    client: &reqwest::Client,
    base: &str,
    at: &Where,
) -> anyhow::Result<Vec<Vec<String>>> {
    let mut sessions = Vec::new();
    for s in 0..SESSIONS {
        let page: Value = client
            .get(format!(
                "{base}/sessions/{}/history?from=0&limit=1000",
                at.id(s)
            ))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let replies = page["turns"]
            .as_array()
            .context("turns")?
            .iter()
            .filter(|turn| turn["role"] == "agent")
            .filter_map(|turn| turn["key"].as_str().map(str::to_owned))
            .collect();
        sessions.push(replies);
    }
    Ok(sessions)
}

/// Every reply received so far is in the rows, as pushed; none twice.
fn check_received(seen: &Seen, rows: &[(HashMap<String, String>, usize)], after: &str) {
    let replies = seen.replies.lock().expect("lock");
    let mut once = HashSet::new();
    for (session, key, text) in replies.iter() {
        assert_eq!(
            rows[*session].0.get(key),
            Some(text),
            "{after}: session s{session} received reply {key} that the store does not hold"
        );
        assert!(
            once.insert((session, key)),
            "{after}: session s{session} received reply {key} twice"
        );
    }
}

/// The kills and the last run on `at`, with every check.
async fn crash_and_check(at: &Where) -> anyhow::Result<()> {
    let seen = Arc::new(Seen::default());
    let mut cut_short = 0;
    for (n, k) in KILL_AFTER.into_iter().enumerate() {
        run(at, Some(k), &seen).await?;
        let rows = stored(at).await?;
        check_received(&seen, &rows, &format!("kill {n} (after {k} replies)"));
        // Admitted (a user turn) and not yet answered: work the kill cut.
        let waiting: usize = rows.iter().map(|(r, users)| users - r.len()).sum();
        if waiting > 0 {
            cut_short += 1;
        }
        eprintln!(
            "kill {n} after {k} replies: {} received so far, {} stored, {waiting} admitted and unanswered",
            seen.replies.lock().expect("lock").len(),
            rows.iter().map(|(r, _)| r.len()).sum::<usize>(),
        );
    }
    assert!(
        cut_short > 0,
        "no kill landed while messages waited for their reply"
    );

    run(at, None, &seen).await?;
    let rows = stored(at).await?;
    check_received(&seen, &rows, "the last run");
    for (s, (replies, users)) in rows.iter().enumerate() {
        assert_eq!(*users, MESSAGES, "session s{s}: each message once");
        for n in 0..MESSAGES {
            let words = text(n).split_whitespace().count();
            assert_eq!(
                replies.get(&key(s, n)),
                Some(&format!("you said {words} words")),
                "session s{s}: the reply to message {n}"
            );
        }
    }
    let received = seen.replies.lock().expect("lock").len();
    eprintln!(
        "{received} of {} replies pushed and received across {} kills; the rest only in the history",
        SESSIONS * MESSAGES,
        KILL_AFTER.len()
    );
    Ok(())
}

#[tokio::test]
async fn a_sigkill_never_leaves_a_client_holding_a_reply_the_store_lacks() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("agent.db");
    let path = file.to_str().context("utf-8 path")?.to_owned();
    crash_and_check(&Where {
        env: vec![("PINNED_DB_PATH", path), ("AGENT_THINK_MS", "2".into())],
        location: None,
        file,
        prefix: String::new(),
    })
    .await
}

/// The same on Postgres (`PINNED_TEST_DATABASE_URL`, shared: the session
/// ids are this run's own).
#[tokio::test]
async fn on_postgres_a_sigkill_never_leaves_a_client_holding_a_reply_the_store_lacks(
) -> anyhow::Result<()> {
    let url = std::env::var("PINNED_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned());
    let dir = tempfile::tempdir()?;
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    crash_and_check(&Where {
        env: vec![
            ("DATABASE_URL", url.clone()),
            ("AGENT_THINK_MS", "2".into()),
        ],
        location: Some(url),
        file: dir.path().join("unused.db"),
        prefix: format!("gate-{run}-"),
    })
    .await
}
