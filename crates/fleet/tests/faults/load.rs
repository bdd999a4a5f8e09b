//! The well-behaved client: one task per id, each bumping its id's durable
//! tally through pinboard one request at a time, recording every call for
//! the [`checker`](super::checker).
//!
//! It owns the traffic and its record; it never judges (the checker does)
//! and never retries a call (a retry is simply the next call, recorded as
//! such). Every call has a deadline ([`CALL_TIMEOUT`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::support::until_explained;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::checker::{Answer, Call, History, Outcome};

/// Deadline of one call: above pinboard's upstream timeout in every scenario,
/// so a frozen owner shows up as pinboard's 504, not as the client giving up.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(6);

/// Pause between two calls of one id: keeps a handful of ids from
/// saturating two cores while still calling each id several times a second.
const PACE: Duration = Duration::from_millis(30);

/// The pinboard nodes the load calls, round robin; a scenario changes them
/// (a node died) while the load runs.
pub(crate) type Entrances = Arc<std::sync::Mutex<Vec<String>>>;

/// The process that last answered each id.
type Owners = Arc<std::sync::Mutex<HashMap<String, String>>>;

/// How each id's last call failed, while its last call failed (for the
/// message of a scenario that timed out).
type Failing = Arc<std::sync::Mutex<HashMap<String, String>>>;

/// How many calls each id had answered so far.
type Answered = Arc<std::sync::Mutex<HashMap<String, usize>>>;

/// A running load.
pub(crate) struct Load {
    stop: watch::Sender<bool>,
    tasks: Vec<(String, JoinHandle<Vec<Call>>)>,
    owners: Owners,
    failing: Failing,
    answered: Answered,
}

impl Load {
    /// Starts calling each of `ids` through `entrances`.
    pub(crate) fn start(ids: &[String], entrances: Entrances) -> Self {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(CALL_TIMEOUT)
            .build()
            .expect("client");
        let origin = tokio::time::Instant::now();
        let (stop, stopped) = watch::channel(false);
        let owners = Owners::default();
        let failing = Failing::default();
        let answered = Answered::default();
        let tasks = ids
            .iter()
            .enumerate()
            .map(|(n, id)| {
                let task = tokio::spawn(call_id(
                    client.clone(),
                    id.clone(),
                    n,
                    entrances.clone(),
                    owners.clone(),
                    failing.clone(),
                    answered.clone(),
                    origin,
                    stopped.clone(),
                ));
                (id.clone(), task)
            })
            .collect();
        Self {
            stop,
            tasks,
            owners,
            failing,
            answered,
        }
    }

    /// Waits until every id was answered at least once (at most `patience`).
    pub(crate) async fn warm(&self, patience: Duration) {
        self.until("every id to answer once", patience, |o| {
            o.len() == self.tasks.len()
        })
        .await;
    }

    /// Lets the traffic run until every id was answered `rounds` more
    /// times (at most `patience`): the load between two steps of a
    /// scenario, measured in answers rather than in time, so a slow machine
    /// stretches it instead of thinning it.
    pub(crate) async fn rounds(&self, rounds: usize, patience: Duration) {
        let from = self.answered.lock().expect("answered").clone();
        let done = || {
            let now = self.answered.lock().expect("answered");
            self.tasks.iter().all(|(id, _)| {
                now.get(id).copied().unwrap_or(0) >= from.get(id).copied().unwrap_or(0) + rounds
            })
        };
        until_explained(
            &format!("every id to answer {rounds} more times"),
            patience,
            done,
            || self.explain(),
        )
        .await;
    }

    /// The last answers and failures, for a scenario that timed out.
    fn explain(&self) -> String {
        format!(
            "last answers {:?}, failing {:?}",
            self.owners(),
            self.failing.lock().expect("failing")
        )
    }

    /// The process that last answered each id so far.
    pub(crate) fn owners(&self) -> HashMap<String, String> {
        self.owners.lock().expect("owners").clone()
    }

    /// How many ids `process` answered for last.
    pub(crate) fn held_by(&self, process: &str) -> usize {
        self.owners().values().filter(|p| *p == process).count()
    }

    /// Waits until `check` holds for the load's owners (at most `patience`).
    pub(crate) async fn until(
        &self,
        what: &str,
        patience: Duration,
        check: impl Fn(&HashMap<String, String>) -> bool,
    ) {
        until_explained(what, patience, || check(&self.owners()), || self.explain()).await;
    }

    /// Stops and gathers every call.
    pub(crate) async fn stop(self) -> History {
        let _ = self.stop.send(true);
        let mut history = History::default();
        for (id, task) in self.tasks {
            history
                .calls
                .insert(id, task.await.expect("load task panicked"));
        }
        history
    }
}

/// One id's task: call, record, pause, until stopped. (Its inputs are the
/// load's shared parts, one argument each.)
#[allow(clippy::too_many_arguments)]
async fn call_id(
    client: reqwest::Client,
    id: String,
    offset: usize,
    entrances: Entrances,
    owners: Owners,
    failing: Failing,
    answered: Answered,
    origin: tokio::time::Instant,
    stopped: watch::Receiver<bool>,
) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut turn = offset;
    while !*stopped.borrow() {
        let base = {
            let list = entrances.lock().expect("entrances");
            list[turn % list.len()].clone()
        };
        turn += 1;
        let sent = origin.elapsed();
        let outcome = bump(&client, &base, &id).await;
        match &outcome {
            Outcome::Answered(answer) => {
                owners
                    .lock()
                    .expect("owners")
                    .insert(id.clone(), answer.process.clone());
                failing.lock().expect("failing").remove(&id);
                *answered
                    .lock()
                    .expect("answered")
                    .entry(id.clone())
                    .or_default() += 1;
            }
            Outcome::Failed(why) => {
                let at = format!("{:.3}s: {why}", sent.as_secs_f64());
                failing.lock().expect("failing").insert(id.clone(), at);
            }
        }
        calls.push(Call {
            sent,
            ended: origin.elapsed(),
            outcome,
        });
        tokio::time::sleep(PACE).await;
    }
    calls
}

/// Marks a 503 that came without `Retry-After` in its failure's text.
pub(crate) const NO_RETRY_AFTER: &str = "(no Retry-After)";

async fn bump(client: &reqwest::Client, base: &str, id: &str) -> Outcome {
    let response = match client
        .post(format!("{base}/counter/{id}/bump"))
        .send()
        .await
    {
        Ok(response) => response,
        Err(e) => return Outcome::Failed(format!("transport: {e}")),
    };
    let status = response.status();
    // A refusal a client cannot time its retry by is a failure of its own
    // kind (the scenarios that promise `Retry-After` look for it).
    let retry_after = response.headers().contains_key("retry-after");
    let body = response.text().await.unwrap_or_default();
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE && !retry_after {
        return Outcome::Failed(format!("{status} {NO_RETRY_AFTER} {body}"));
    }
    if !status.is_success() {
        return Outcome::Failed(format!("{status} {body}"));
    }
    let parsed = serde_json::from_str(&body).ok();
    match parsed.as_ref().and_then(Answer::from_json) {
        Some(answer) => Outcome::Answered(answer),
        None => Outcome::Failed(format!("{status} malformed answer {body}")),
    }
}
