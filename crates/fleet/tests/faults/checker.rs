//! The checker: every call the load made, in order per id, and the three
//! properties the suite holds every scenario to.
//!
//! It owns the verdict and nothing else: it never talks to a process. The
//! load ([`super::load`]) calls each id one request at a time, so one id's
//! history is a sequence: a request starts after the previous one ended.
//! That makes "overlapping lease windows" decidable from the history alone:
//! an owner's window is from its first answer's start to its last answer's
//! end, and two owners' windows overlap exactly when their answers
//! interleave.
//!
//! # Properties
//!
//! 1. **One owner at a time.** Per id, epochs never go down, and one epoch
//!    is served by one process: once an answer came at epoch `e` from
//!    process `p`, no later answer comes at an epoch below `e`, nor at `e`
//!    from another process.
//! 2. **No acknowledged durable write is lost.** Each answer carries the
//!    durable tally after its write. Acknowledged values strictly increase,
//!    and each is at most the previous one plus one plus the calls that
//!    failed in between (a failed call may or may not have written). The
//!    tally left in Postgres at the end is at least the last acknowledged
//!    value, and at most that plus the failures after it.
//! 3. **No counter goes backwards while its owner lives.** Per instance
//!    (process and instance token), its in-memory count of bumps strictly
//!    increases.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

/// One acknowledged bump.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    /// The process that answered (its random token).
    pub(crate) process: String,
    /// The instance within it.
    pub(crate) instance: String,
    /// The epoch the durable write carried.
    pub(crate) epoch: u64,
    /// The durable tally after the write.
    pub(crate) value: u64,
    /// The instance's in-memory count of bumps.
    pub(crate) bumps: u64,
}

impl Answer {
    /// Reads the counter's `/bump` answer; `None` when a field is missing.
    pub(crate) fn from_json(v: &Value) -> Option<Self> {
        Some(Self {
            process: v["process"].as_str()?.to_owned(),
            instance: v["instance"].as_str()?.to_owned(),
            epoch: v["epoch"].as_u64()?,
            value: v["value"].as_u64()?,
            bumps: v["bumps"].as_u64()?,
        })
    }
}

/// What one call came to.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// 200 with a well-formed answer.
    Answered(Answer),
    /// Anything else: a status with its body, or a transport error.
    Failed(String),
}

/// One call, timed from the start of the scenario.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// When it was sent.
    pub(crate) sent: Duration,
    /// When it ended.
    pub(crate) ended: Duration,
    /// What came of it.
    pub(crate) outcome: Outcome,
}

/// Every call per id, each id's in the order made.
#[derive(Debug, Default)]
pub(crate) struct History {
    /// Calls per id.
    pub(crate) calls: HashMap<String, Vec<Call>>,
}

/// Counts a scenario reports and asserts on.
#[derive(Debug, Default, Clone)]
pub(crate) struct Summary {
    /// Acknowledged bumps.
    pub(crate) answered: usize,
    /// Failed calls.
    pub(crate) failed: usize,
    /// Times an id's owner (process, epoch) changed.
    pub(crate) owner_changes: usize,
    /// Ids that changed process at least once.
    pub(crate) moved_ids: usize,
    /// Longest time an id went without an answer, between two answers.
    pub(crate) longest_gap: Duration,
    /// Ids whose last call failed: the fleet had not recovered by the end.
    pub(crate) failing_at_end: usize,
    /// Failed calls by kind (status and the start of the body or error).
    pub(crate) failure_kinds: std::collections::BTreeMap<String, usize>,
}

impl History {
    /// Checks properties 1 to 3 over the calls, and the durable tallies
    /// found at the end (`None`: no row).
    ///
    /// # Errors
    ///
    /// Every violation found (not just the first), each with its id's
    /// history, as one message.
    pub(crate) fn verify(&self, durable: &HashMap<String, Option<u64>>) -> Result<Summary, String> {
        let mut violations = Vec::new();
        let mut summary = Summary::default();
        let mut by_instance: HashMap<(String, String), (u64, String)> = HashMap::new();
        for (id, calls) in &self.calls {
            let mut owner: Option<(u64, String)> = None;
            let mut last_value = 0u64;
            let mut failed_since = 0u64;
            let mut last_answer_at: Option<Duration> = None;
            let mut processes = std::collections::HashSet::new();
            for call in calls {
                let answer = match &call.outcome {
                    Outcome::Failed(why) => {
                        let kind: String = why.chars().take(72).collect();
                        *summary.failure_kinds.entry(kind).or_default() += 1;
                        summary.failed += 1;
                        failed_since += 1;
                        continue;
                    }
                    Outcome::Answered(answer) => answer,
                };
                summary.answered += 1;
                if let Some(at) = last_answer_at {
                    summary.longest_gap = summary.longest_gap.max(call.ended.saturating_sub(at));
                }
                last_answer_at = Some(call.ended);
                processes.insert(answer.process.clone());
                // 1. One owner at a time.
                match &owner {
                    Some((epoch, process)) if answer.epoch < *epoch => violations.push(format!(
                        "{id}: {} answered at epoch {} after {process} answered at {epoch} \
                         (at {:?})",
                        answer.process, answer.epoch, call.sent
                    )),
                    Some((epoch, process))
                        if answer.epoch == *epoch && answer.process != *process =>
                    {
                        violations.push(format!(
                            "{id}: two processes at epoch {epoch}: {process} and {} (at {:?})",
                            answer.process, call.sent
                        ))
                    }
                    Some((epoch, process))
                        if answer.epoch == *epoch && answer.process == *process => {}
                    _ => {
                        if owner.is_some() {
                            summary.owner_changes += 1;
                        }
                        owner = Some((answer.epoch, answer.process.clone()));
                    }
                }
                // 2. No acknowledged write lost.
                if answer.value <= last_value || answer.value > last_value + 1 + failed_since {
                    violations.push(format!(
                        "{id}: tally {} acknowledged after {last_value} with {failed_since} \
                         failed calls between (at {:?}, {} epoch {})",
                        answer.value, call.sent, answer.process, answer.epoch
                    ));
                }
                last_value = answer.value;
                failed_since = 0;
                // 3. No in-memory counter going backwards.
                let key = (answer.process.clone(), answer.instance.clone());
                if let Some((bumps, seen_id)) = by_instance.get(&key) {
                    if seen_id == id && answer.bumps <= *bumps {
                        violations.push(format!(
                            "{id}: instance {} of {} went from {bumps} to {} bumps",
                            answer.instance, answer.process, answer.bumps
                        ));
                    }
                }
                by_instance.insert(key, (answer.bumps, id.clone()));
            }
            if processes.len() > 1 {
                summary.moved_ids += 1;
            }
            if calls
                .last()
                .is_some_and(|c| matches!(c.outcome, Outcome::Failed(_)))
            {
                summary.failing_at_end += 1;
            }
            match durable.get(id).copied().flatten() {
                Some(stored) if stored < last_value || stored > last_value + failed_since => {
                    violations.push(format!(
                        "{id}: the store holds tally {stored}, the last acknowledged was \
                         {last_value} with {failed_since} failed calls after it"
                    ));
                }
                None if last_value > 0 => violations.push(format!(
                    "{id}: the store lost the tally (last acknowledged {last_value})"
                )),
                _ => {}
            }
            if violations.iter().any(|v| v.starts_with(&format!("{id}:"))) {
                violations.push(format!("{id}: history\n{}", render(calls)));
            }
        }
        if violations.is_empty() {
            Ok(summary)
        } else {
            Err(format!(
                "the checker found {} violation(s):\n{}",
                violations.len(),
                violations.join("\n")
            ))
        }
    }
}

/// One line per call, for a failure message.
fn render(calls: &[Call]) -> String {
    let mut out = String::new();
    for call in calls {
        let _ = match &call.outcome {
            Outcome::Answered(a) => writeln!(
                out,
                "  {:>8.3}s..{:>8.3}s  {} epoch {} tally {} bumps {}",
                call.sent.as_secs_f64(),
                call.ended.as_secs_f64(),
                a.process,
                a.epoch,
                a.value,
                a.bumps
            ),
            Outcome::Failed(why) => writeln!(
                out,
                "  {:>8.3}s..{:>8.3}s  failed: {why}",
                call.sent.as_secs_f64(),
                call.ended.as_secs_f64()
            ),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(process: &str, epoch: u64, value: u64, bumps: u64, at: u64) -> Call {
        Call {
            sent: Duration::from_millis(at),
            ended: Duration::from_millis(at + 1),
            outcome: Outcome::Answered(Answer {
                process: process.into(),
                instance: format!("{process}-i"),
                epoch,
                value,
                bumps,
            }),
        }
    }

    fn failed(at: u64) -> Call {
        Call {
            sent: Duration::from_millis(at),
            ended: Duration::from_millis(at + 1),
            outcome: Outcome::Failed("504".into()),
        }
    }

    fn verdict(calls: Vec<Call>, stored: Option<u64>) -> Result<Summary, String> {
        let history = History {
            calls: HashMap::from([("x".to_owned(), calls)]),
        };
        let durable = HashMap::from([("x".to_owned(), stored)]);
        history.verify(&durable)
    }

    #[test]
    fn a_clean_failover_passes() {
        let calls = vec![
            answered("a", 1, 1, 1, 0),
            answered("a", 1, 2, 2, 10),
            failed(20),
            answered("b", 5, 4, 1, 30),
        ];
        let summary = verdict(calls, Some(4)).expect("clean");
        assert_eq!(
            (summary.answered, summary.failed, summary.owner_changes),
            (3, 1, 1)
        );
        assert_eq!(summary.moved_ids, 1);
    }

    #[test]
    fn an_old_owner_answering_after_a_new_one_is_caught() {
        let calls = vec![
            answered("a", 1, 1, 1, 0),
            answered("b", 2, 2, 1, 10),
            answered("a", 1, 3, 2, 20),
        ];
        let why = verdict(calls, Some(3)).expect_err("split brain");
        assert!(why.contains("answered at epoch 1 after b"), "{why}");
    }

    #[test]
    fn two_processes_at_one_epoch_are_caught() {
        let calls = vec![answered("a", 1, 1, 1, 0), answered("b", 1, 2, 1, 10)];
        let why = verdict(calls, Some(2)).expect_err("two owners");
        assert!(why.contains("two processes at epoch 1"), "{why}");
    }

    #[test]
    fn a_lost_acknowledged_write_is_caught() {
        // The second owner starts from a tally that misses an acknowledged write.
        let calls = vec![
            answered("a", 1, 1, 1, 0),
            answered("a", 1, 2, 2, 10),
            answered("b", 2, 2, 1, 20),
        ];
        let why = verdict(calls, Some(2)).expect_err("lost write");
        assert!(why.contains("tally 2 acknowledged after 2"), "{why}");
        let why = verdict(vec![answered("a", 1, 1, 1, 0)], None).expect_err("lost row");
        assert!(why.contains("lost the tally"), "{why}");
        let why = verdict(vec![answered("a", 1, 3, 1, 0)], Some(3)).expect_err("skipped");
        assert!(why.contains("tally 3 acknowledged after 0"), "{why}");
    }

    #[test]
    fn a_counter_going_backwards_is_caught() {
        let calls = vec![answered("a", 1, 1, 2, 0), answered("a", 1, 2, 2, 10)];
        let why = verdict(calls, Some(2)).expect_err("backwards");
        assert!(why.contains("went from 2 to 2 bumps"), "{why}");
    }
}
