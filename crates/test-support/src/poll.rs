//! Waiting for a condition: the one polling loop of the test suites.
//!
//! Waits are on tokio's clock, so under `start_paused = true` a poll passes
//! in no real time, and every wait has a deadline that fails the test.

use std::future::Future;
use std::time::Duration;

/// The pause between two checks (tokio time).
pub const POLL: Duration = Duration::from_millis(10);

/// How long a test waits for a condition, an answer or a close it expects
/// before it fails: room for a loaded machine, never a measure of speed (a
/// passing test stops waiting as soon as the condition holds). Tokio time:
/// under a paused clock it passes in no real time.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Polls `check` until it answers `Some`, and answers that; fails the test
/// after `patience` (tokio time).
///
/// # Panics
///
/// When `patience` passes first, naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, patience: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll(patience, check).await {
        Some(value) => value,
        None => panic!("timed out waiting for {what}"),
    }
}

/// Waits until `done` holds (see [`eventually`]).
///
/// # Panics
///
/// When `patience` passes first, naming `what`.
pub async fn until(what: &str, patience: Duration, mut done: impl FnMut() -> bool) {
    eventually(what, patience, || std::future::ready(done().then_some(()))).await;
}

/// Waits until `done` holds, like [`until`]; a failure also carries
/// `explain()`, the state that kept `done` from holding (what a scenario's
/// log needs to tell a slow recovery from a wrong one).
///
/// # Panics
///
/// When `patience` passes first, naming `what` and the explanation.
pub async fn until_explained(
    what: &str,
    patience: Duration,
    mut done: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let held = poll(patience, || std::future::ready(done().then_some(()))).await;
    if held.is_none() {
        panic!("timed out waiting for {what}: {}", explain());
    }
}

/// The loop behind every wait: `None` once `patience` passed.
pub(crate) async fn poll<T, F, Fut>(patience: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn answers_the_first_value_and_fails_at_the_deadline() {
        let mut calls = 0;
        let value = eventually("the third call", Duration::from_secs(1), || {
            calls += 1;
            std::future::ready((calls == 3).then_some(calls))
        })
        .await;
        assert_eq!(value, 3);
        let never = tokio::spawn(until("never", Duration::from_secs(1), || false));
        let error = never.await.expect_err("the deadline fails the wait");
        assert!(error.is_panic());
    }
}
