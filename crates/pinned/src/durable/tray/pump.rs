//! The pump: drives a tray's items through its handler, one at a time,
//! at least once.
//!
//! One step under the tray's lock decides what to do next (run a built-in
//! command, stop parked or winding down, go dry, park, or record the next
//! delivery); the handler then runs unlocked, after its attempt is durable.
//! An admission to an idle tray records the next delivery itself, in its
//! own row write (`OpenTray::commit_admission`), and the step then runs
//! that delivery as counted: one store write before the handler, not two.
//! An admission made while a quick run is under way (the last run ended
//! within the frontier's linger) lets its row linger for that run's ack,
//! which then carries it and the next delivery's count in one row write.
//! Success settles the item's keyed dispatches (phase two, `dispatch`),
//! then applies the handler's `on_ack` edits and the tray's ack in one
//! write segment, so they land in one row write. Failure (an error, a
//! panic, the dispatch timeout) backs off and redelivers. The pump runs as
//! the instance's background work: it keeps the instance in flight, an
//! abort cancels it mid-handler, and the durable attempt count carries the
//! delivery to the next activation.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::frontier::Urgency;
use super::machine::{
    delete_command, AckEdit, Active, AfterAck, Delivery, OpenTray, Retired, Staged,
};
use super::{Tray, MAX_CONCURRENT_DISPATCHES};
use crate::namespace::context::Context;
use crate::namespace::panic_message;
use crate::namespace::Record;

/// Handler runs across the process.
static DISPATCH_SLOTS: Semaphore = Semaphore::const_new(MAX_CONCURRENT_DISPATCHES);

/// First redelivery delay after a failed run; doubles per attempt.
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest redelivery delay.
const BACKOFF_MAX: Duration = Duration::from_secs(30);

fn backoff(attempts: u64) -> Duration {
    let doublings = u32::try_from(attempts.saturating_sub(1).min(16)).unwrap_or(16);
    BACKOFF_START
        .saturating_mul(1u32 << doublings)
        .min(BACKOFF_MAX)
}

/// What one locked step decided.
enum Step<T: Tray> {
    /// Nothing more to do: the pump exits.
    Stop,
    /// The built-in delete: retire, wipe the row, free the key.
    Delete,
    /// Deliver `item` (attempt `attempts`) once `receipt` landed.
    Run {
        item: T::Item,
        attempts: u64,
        receipt: super::Receipt,
        cancel: CancellationToken,
    },
}

/// How one handler run ended.
enum Outcome {
    Done,
    /// `cancel_dispatch`: the item is consumed without its `on_ack` edits.
    Consumed,
    Failed(String),
}

impl<T: Tray> OpenTray<T> {
    /// Starts the pump unless it runs, the tray is retired, or the instance
    /// winds down (and the tray does not drain on eviction).
    pub(crate) fn start_pump(self: &Arc<Self>) {
        let Some(slot) = self.slot.upgrade() else {
            return;
        };
        // Not before `on_open` ran: opening resumes the pump.
        if self.opened.load(std::sync::atomic::Ordering::SeqCst) != super::machine::OPEN {
            return;
        }
        {
            let mut state = self.state.lock();
            if state.pumping || state.retired.is_some() {
                return;
            }
            if slot.winding_down() && !T::DRAIN_ON_EVICTION {
                return;
            }
            state.pumping = true;
        }
        let tray = self.clone();
        Context::new(slot.clone()).spawn(async move {
            // The pump's one reference to the tray (passivation counts them).
            let mut running = PumpGuard { tray, armed: true };
            running.tray.pump(&slot).await;
            // Every return from `pump` cleared `pumping` under the lock
            // already; a new pump may be running by now.
            running.armed = false;
        });
    }

    /// Ends the pump: cleared under the lock, so an admission racing the
    /// exit either sees the pump running (and it sees the admission) or
    /// starts a new one.
    fn stopped(&self) {
        self.state.lock().pumping = false;
    }

    fn step(self: &Arc<Self>, slot: &Arc<Record>) -> Step<T> {
        let mut state = self.state.lock();
        let step = self.decide(slot, &mut state);
        if matches!(step, Step::Stop) {
            state.pumping = false;
            // The last ack, when no next delivery's write carried it:
            // nobody waits for it, so it may wait for company.
            if state.changed {
                if let Err(error) = self.commit_with(&mut state, Urgency::Idle) {
                    tracing::error!(tray = %self.label(), error = %pinned_edge::logging::Chain(&error), "could not write a tray's ack");
                }
            }
        }
        step
    }

    fn decide(
        self: &Arc<Self>,
        slot: &Arc<Record>,
        state: &mut super::machine::TrayState<T>,
    ) -> Step<T> {
        // A delivery an admission counted runs as counted; one that cannot
        // run now (a delete, an edit that emptied the tray, a wind-down
        // since) is uncounted, and the step below decides as usual.
        let counted = std::mem::take(&mut state.primed);
        let counted = counted && {
            let deliverable = Self::deliverable(slot, state);
            if !deliverable {
                state.attempts = state.attempts.saturating_sub(1);
                state.changed = true;
            }
            deliverable
        };
        if state.retired.is_some() {
            return Step::Stop;
        }
        if !state.inbox.is_empty() {
            if state
                .inbox
                .iter()
                .all(|command| *command == delete_command())
            {
                state.retired = Some(Retired::Deleted);
                return Step::Delete;
            }
            tracing::error!(namespace = %slot.host.ns, id = %slot.id, tray = %self.label(), inbox = ?state.inbox, "unknown built-in tray command; the tray stays marked");
            return Step::Stop;
        }
        if state.parked {
            return Step::Stop;
        }
        if slot.winding_down() && !T::DRAIN_ON_EVICTION {
            return Step::Stop;
        }
        let Some(item) = state.tray.head() else {
            // Dry: the row rests unmarked (marked while messages wait for
            // their receivers), and a keyed tray that is not always open
            // passivates.
            Self::set_marked(state, !state.sends.is_empty());
            // The last ack and the unmark: nobody waits for them, and the
            // next admission (a steady stream's usual case) carries them.
            if let Err(error) = self.commit_with(state, Urgency::Idle) {
                tracing::error!(tray = %self.label(), error = %pinned_edge::logging::Chain(&error), "could not unmark a dry tray");
            }
            // The open map's reference and the pump's.
            if self.passivate_if_dry(state, 2) {
                self.close_later();
            }
            return Step::Stop;
        };
        if !counted {
            if state.attempts >= T::MAX_ATTEMPTS {
                state.parked = true;
                state.changed = true;
                tracing::error!(namespace = %slot.host.ns, id = %slot.id, tray = %self.label(), attempts = state.attempts, "tray parked its head item after too many delivery attempts");
                if let Err(error) = self.commit(state) {
                    tracing::error!(tray = %self.label(), error = %pinned_edge::logging::Chain(&error), "could not park the tray");
                }
                return Step::Stop;
            }
            state.attempts += 1;
            state.changed = true;
        }
        // Counted by an admission, the attempt rides in that admission's
        // write (enlisted already): this commit enlists nothing new, and
        // its receipt covers that write.
        let receipt = match self.commit(state) {
            Ok(receipt) => receipt,
            Err(_) => return Step::Stop,
        };
        let cancel = CancellationToken::new();
        state.active = Some(Active {
            cancel: cancel.clone(),
        });
        Step::Run {
            item,
            attempts: state.attempts,
            receipt,
            cancel,
        }
    }

    async fn pump(self: &Arc<Self>, slot: &Arc<Record>) {
        loop {
            let (item, attempts, receipt, cancel) = match self.step(slot) {
                Step::Stop => return,
                Step::Delete => return self.delete_row().await,
                Step::Run {
                    item,
                    attempts,
                    receipt,
                    cancel,
                } => (item, attempts, receipt, cancel),
            };
            // The attempt is durable before the handler runs: a crash in
            // it redelivers with a higher count, and a poison item parks.
            if receipt.await.is_err() {
                return self.stopped();
            }
            let staged: Arc<Mutex<Staged<T>>> = Arc::default();
            let started = tokio::time::Instant::now();
            let outcome = self
                .run(slot, item.clone(), attempts, cancel, staged.clone())
                .await;
            self.state.lock().quick = started.elapsed() < super::frontier::LINGER;
            match outcome {
                Outcome::Done | Outcome::Consumed => {
                    // Phase two of the item's keyed dispatches, before its ack.
                    if let Err(error) = self.settle().await {
                        tracing::error!(tray = %self.label(), error = %pinned_edge::logging::Chain(&error), "could not settle a tray item's dispatches");
                        self.state.lock().active = None;
                        return self.stopped();
                    }
                    let keep = matches!(outcome, Outcome::Done);
                    let Staged {
                        edits,
                        after,
                        sends,
                    } = std::mem::take(&mut *staged.lock());
                    let sent = keep && !sends.is_empty();
                    if !self.acked(&item, keep, edits, sends) {
                        return;
                    }
                    if sent {
                        self.start_courier();
                    }
                    if keep && !after.is_empty() && !self.after_acked(slot, after) {
                        return;
                    }
                }
                Outcome::Failed(error) => {
                    {
                        let mut state = self.state.lock();
                        state.active = None;
                        // The run's takes are back at the front for its
                        // redelivery, as a restore after a crash puts them.
                        state.tray.fields(&mut super::Fields::new(&mut |_, field| {
                            field.return_takes();
                        }));
                    }
                    slot.host.metrics.request_failed("tray", "dispatch");
                    tracing::warn!(namespace = %slot.host.ns, id = %slot.id, tray = %self.label(), attempts, %error, "tray handler failed; redelivering");
                    tokio::time::sleep(backoff(attempts)).await;
                }
            }
        }
    }

    /// The ack of a handler run, one write segment: the staged `on_ack`
    /// edits (when `keep`), the tray's ack, the pending takes, the cleared
    /// delivery count and dispatch state, and the unmark if that left the
    /// tray dry; the next [`step`](Self::step) writes it. False when the
    /// pump must stop.
    fn acked(
        &self,
        item: &T::Item,
        keep: bool,
        edits: Vec<AckEdit<T>>,
        sends: Vec<super::sends::Draft>,
    ) -> bool {
        let mut state = self.state.lock();
        state.active = None;
        let applied = self.segment(&mut state, |tray| {
            if keep {
                for edit in edits {
                    edit(tray);
                }
            }
            tray.ack(item);
            tray.fields(&mut super::Fields::new(&mut |_, field| {
                field.commit_takes()
            }));
        });
        if applied.is_err() {
            state.pumping = false;
            return false;
        }
        if keep && Self::queue_sends(&mut state, sends).is_err() {
            state.pumping = false;
            return false;
        }
        state.attempts = 0;
        state.dispatch_state = None;
        Self::purge_dispatches(&mut state);
        state.changed = true;
        if state.tray.head().is_none()
            && !state.parked
            && state.inbox.is_empty()
            && state.sends.is_empty()
        {
            Self::set_marked(&mut state, false);
        }
        // Not written here: the pump's next step follows at once, under the lock
        // again, and writes the ack in the same row write as whatever it decides (the
        // next delivery's count, the unmark of a dry tray): one store write per item.
        true
    }

    /// The output gate of a run that staged `after_ack` hooks: its ack is
    /// written now (not with the next step), and the hooks run once that
    /// write landed, in a task of their own so the next item is not held
    /// up; never if it fails (the instance aborts and the item comes
    /// again). False when the pump must stop.
    fn after_acked(&self, slot: &Arc<Record>, hooks: Vec<AfterAck>) -> bool {
        let receipt = {
            let mut state = self.state.lock();
            match self.commit(&mut state) {
                Ok(receipt) => receipt,
                Err(_) => {
                    state.pumping = false;
                    return false;
                }
            }
        };
        let label = self.label();
        crate::task::spawn_detached(&slot.host.domain, async move {
            if receipt.await.is_err() {
                return;
            }
            for hook in hooks {
                if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(hook)) {
                    tracing::error!(tray = %label, panic = %panic_message(panic.as_ref()), "an after_ack hook panicked");
                }
            }
        });
        true
    }

    /// One handler run: a dispatch slot, the instance's turn in exclusive
    /// mode, the dispatch timeout, and `cancel_dispatch`.
    async fn run(
        self: &Arc<Self>,
        slot: &Arc<Record>,
        item: T::Item,
        attempts: u64,
        cancel: CancellationToken,
        staged: Arc<Mutex<Staged<T>>>,
    ) -> Outcome {
        let Some(instance) = slot.instance() else {
            return Outcome::Failed("the instance is not live".to_owned());
        };
        let Ok(_slot_permit) = DISPATCH_SLOTS.acquire().await else {
            return Outcome::Failed("dispatch slots closed".to_owned());
        };
        let _turn = match &slot.turn {
            Some(turn) => match turn.acquire().await {
                Ok(permit) => Some(permit),
                Err(_) => return Outcome::Failed("the instance's turns closed".to_owned()),
            },
            None => None,
        };
        let state = self.state.lock().dispatch_state.clone();
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let delivery = Delivery {
            tray: self.clone(),
            ctx: Context::new(slot.clone()),
            attempts,
            state,
            staged,
            cancel: cancel.clone(),
            ended: ended.clone(),
        };
        let handler = AssertUnwindSafe((self.handler)(instance, delivery, item)).catch_unwind();
        // However the run ends, before its phase two and its ack.
        let _ended = EndsRun(ended);
        tokio::select! {
            ran = tokio::time::timeout(T::DISPATCH_TIMEOUT, handler) => match ran {
                Ok(Ok(Ok(()))) => Outcome::Done,
                Ok(Ok(Err(error))) => Outcome::Failed(error.to_string()),
                Ok(Err(panic)) => Outcome::Failed(format!("panicked: {}", panic_message(panic.as_ref()))),
                Err(_) => Outcome::Failed(format!("exceeded its dispatch timeout of {:?}", T::DISPATCH_TIMEOUT)),
            },
            () = cancel.cancelled() => Outcome::Consumed,
        }
    }

    /// The built-in delete: one atomic row delete, then the key is free.
    /// A crash before it leaves the marked row with the command, and the
    /// next activation runs it again.
    async fn delete_row(self: &Arc<Self>) {
        // The rows of its paged fields go in the same write.
        let mut deletes = Self::page_deletes(&mut self.state.lock());
        deletes.push(super::frontier::Effect::Row {
            tray_ns: T::NAME.to_owned(),
            tray_id: self.key.clone(),
            image: None,
        });
        let deleted = self.frontier.enlist_all(deletes, Urgency::Now);
        if deleted.is_err() || self.frontier.receipt().await.is_err() {
            return self.stopped();
        }
        if let Some(owner) = self.owner.upgrade() {
            owner.forget(T::NAME, &self.key, Arc::as_ptr(self).cast::<()>());
        }
        if let Some(slot) = self.slot.upgrade() {
            if let Some(instance) = slot.instance() {
                self.clone()
                    .run_close(instance, Context::new(slot.clone()))
                    .await;
            }
        }
        self.stopped();
        self.freed.send_replace(true);
    }
}

/// Marks a run ended when dropped: on every way out of
/// [`run`](OpenTray::run), an abort's included.
struct EndsRun(Arc<std::sync::atomic::AtomicBool>);

impl Drop for EndsRun {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Clears `pumping` when an abort drops the pump mid-run.
struct PumpGuard<T: Tray> {
    tray: Arc<OpenTray<T>>,
    armed: bool,
}

impl<T: Tray> Drop for PumpGuard<T> {
    fn drop(&mut self) {
        if self.armed {
            let mut state = self.tray.state.lock();
            state.pumping = false;
            state.active = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_a_tenth_of_a_second_up_to_thirty() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(4), Duration::from_millis(800));
        assert_eq!(backoff(50), BACKOFF_MAX);
    }
}
