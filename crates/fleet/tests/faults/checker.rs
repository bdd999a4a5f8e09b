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
//! 4. **No in-memory state lost while its owner lives** (asked for by the
//!    scenarios whose fault spares every worker process, see
//!    [`Memory::Kept`]). Per id, the in-memory count of bumps strictly
//!    increases across the whole run: one instance serves the id from its
//!    first answer to its last. An answer whose count is not above the
//!    previous one came from a fresh instance (in the same process or
//!    another), so the owner's memory was thrown away although the owner
//!    lived: a fault that only hits pinboard or its store must cost none
//!    of it. Counted in every scenario ([`Summary::memory_resets`]); a
//!    violation only where asked for, since a killed worker or a failed
//!    state-store write may legitimately cost an instance.

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

/// Whether a scenario's fault may cost an instance its memory
/// (property 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Memory {
    /// Every worker process lives through the fault and keeps its
    /// instances: an id whose in-memory count goes back is a violation.
    Kept,
    /// The fault may cost instances (a killed worker, a failed write):
    /// resets are counted, not judged.
    MayReset,
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
    /// Times an id's in-memory count went back (property 4): a fresh
    /// instance answered, the previous one's memory was thrown away.
    pub(crate) memory_resets: usize,
    /// Failed calls by kind (status and the start of the body or error).
    pub(crate) failure_kinds: std::collections::BTreeMap<String, usize>,
}

impl History {
    /// Checks properties 1 to 4 over the calls (4 as `memory` says), and
    /// the durable tallies found at the end (`None`: no row).
    ///
    /// # Errors
    ///
    /// Every violation found (not just the first), each with its id's
    /// history, as one message.
    pub(crate) fn verify(
        &self,
        durable: &HashMap<String, Option<u64>>,
        memory: Memory,
    ) -> Result<Summary, String> {
        let mut violations = Vec::new();
        let mut summary = Summary::default();
        let mut by_instance: HashMap<(String, String), (u64, String)> = HashMap::new();
        for (id, calls) in &self.calls {
            let mut owner: Option<(u64, String)> = None;
            let mut last_value = 0u64;
            let mut failed_since = 0u64;
            let mut last_answer_at: Option<Duration> = None;
            let mut processes = std::collections::HashSet::new();
            // The id's last answer, for its in-memory count.
            let mut previous: Option<&Answer> = None;
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
                // 4. No in-memory state lost while its owner lives.
                if let Some(before) = previous.filter(|before| answer.bumps <= before.bumps) {
                    summary.memory_resets += 1;
                    if memory == Memory::Kept {
                        violations.push(format!(
                            "{id}: its in-memory count went from {} (instance {} of {}) to {} \
                             (instance {} of {}) at {:?}: in-memory state lost",
                            before.bumps,
                            before.instance,
                            before.process,
                            answer.bumps,
                            answer.instance,
                            answer.process,
                            call.sent
                        ));
                    }
                }
                previous = Some(answer);
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
                "  {:>8.3}s..{:>8.3}s  {} instance {} epoch {} tally {} bumps {}",
                call.sent.as_secs_f64(),
                call.ended.as_secs_f64(),
                a.process,
                a.instance,
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
        answered_by(process, "i", epoch, value, bumps, at)
    }

    fn answered_by(
        process: &str,
        instance: &str,
        epoch: u64,
        value: u64,
        bumps: u64,
        at: u64,
    ) -> Call {
        Call {
            sent: Duration::from_millis(at),
            ended: Duration::from_millis(at + 1),
            outcome: Outcome::Answered(Answer {
                process: process.into(),
                instance: format!("{process}-{instance}"),
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
        verdict_with(calls, stored, Memory::MayReset)
    }

    fn verdict_with(
        calls: Vec<Call>,
        stored: Option<u64>,
        memory: Memory,
    ) -> Result<Summary, String> {
        let history = History {
            calls: HashMap::from([("x".to_owned(), calls)]),
        };
        let durable = HashMap::from([("x".to_owned(), stored)]);
        history.verify(&durable, memory)
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

    #[test]
    fn an_instance_thrown_away_while_its_owner_lives_is_caught() {
        // What a Redis wipe did: the tallies all fine, but a fresh instance
        // (here in the same process, at a higher epoch) with its count back
        // at 1.
        let calls = || {
            vec![
                answered_by("a", "one", 1, 1, 1, 0),
                answered_by("a", "one", 1, 2, 2, 10),
                failed(20),
                answered_by("a", "two", 7, 3, 1, 30),
            ]
        };
        let why = verdict_with(calls(), Some(3), Memory::Kept).expect_err("memory lost");
        assert!(
            why.contains("went from 2 (instance a-one of a) to 1 (instance a-two of a)"),
            "{why}"
        );
        let summary = verdict_with(calls(), Some(3), Memory::MayReset).expect("counted only");
        assert_eq!(summary.memory_resets, 1);
        // And the other way it did: the id placed on the other live worker.
        let moved = vec![
            answered_by("a", "one", 1, 1, 1, 0),
            answered_by("a", "one", 1, 2, 2, 10),
            answered_by("b", "one", 5, 3, 1, 20),
        ];
        let why = verdict_with(moved, Some(3), Memory::Kept).expect_err("memory lost");
        assert!(
            why.contains("went from 2 (instance a-one of a) to 1"),
            "{why}"
        );
        // The same instance at a newer epoch (a reclaim) keeps its memory.
        let reclaimed = vec![
            answered_by("a", "one", 1, 1, 1, 0),
            answered_by("a", "one", 9, 2, 2, 10),
        ];
        assert_eq!(
            verdict_with(reclaimed, Some(2), Memory::Kept)
                .expect("kept")
                .memory_resets,
            0
        );
    }
}
