//! The frontier: one instance's ordered log of durable effects, and the
//! [`Receipt`] that resolves once an effect is in the store.
//!
//! Effects land in the order they were enlisted. Adjacent row writes leave
//! as one `apply_batch`, each row at its last written image (at that
//! write's position); an opaque effect (a future the log only awaits) ends
//! the batch before it. A failed flush poisons the log for good and aborts
//! the instance: nothing enlisted later can land, so memory never runs
//! ahead of the store. The log never does anything but write; what goes in
//! it is the trays' business.
//!
//! An effect nobody waits for (a dispatch's ledger entries, a courier's
//! bookkeeping) may be enlisted to land [`Soon`](Urgency::Soon): the log then
//! lingers up to [`LINGER`] for company before it flushes. The last write of
//! a tray that went dry (its ack, its unmark) lingers longer
//! ([`Idle`](Urgency::Idle), up to [`IDLE_LINGER`]): under a steady stream
//! of admissions, whose next one is a client's round trip away, the ack of
//! one item and the admission of the next leave as one row write instead of
//! two. Anything enlisted to land [`Now`](Urgency::Now), and anyone awaiting
//! a receipt, ends the linger.

use std::collections::{HashMap, VecDeque};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use pinned_store::{BatchOp, DocText, InstanceKey, StateStore};
use tokio::sync::{watch, Notify};

use super::TrayError;
use crate::namespace::Busy;
use crate::namespace::Record;
use crate::BoxError;

/// How long one flush (a batch, or an opaque effect) may take before the
/// log counts it failed. Store backends bound their own calls well below.
const FLUSH_DEADLINE: Duration = Duration::from_secs(60);

/// Longest an effect enlisted to land [`Soon`](Urgency::Soon) waits for
/// company. A crash inside it loses nothing the log promised: such an effect
/// is one nobody was told had landed (an ack is then redelivered, at least
/// once, and the handler's edits it carries are redone with it).
pub(crate) const LINGER: Duration = Duration::from_millis(5);

/// Longest an effect enlisted to land [`Idle`](Urgency::Idle) waits for
/// company: the last write of a tray that went dry (its ack, its unmark).
/// Under a stream of admissions whose clients take longer than [`LINGER`]
/// to send the next (a loaded machine, a slow network), the ack still
/// rides in the next admission's write instead of taking the instance's
/// one write in flight, a flush of its own, just before it. As safe as
/// [`LINGER`]: nobody was told it landed.
pub(crate) const IDLE_LINGER: Duration = Duration::from_millis(25);

/// When an enlisted effect should leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// At once (with whatever waits in front of it).
    Now,
    /// Within [`LINGER`], or with the next effect to land now.
    Soon,
    /// Within [`IDLE_LINGER`], or with the next effect to land now.
    Idle,
}

/// One enlisted effect.
pub(crate) enum Effect {
    /// A whole-row image of tray `(tray_ns, tray_id)`; `None` deletes it.
    Row {
        tray_ns: String,
        tray_id: String,
        image: Option<(bool, DocText)>,
    },
    /// A durable effect of the application's own, awaited at its place.
    Opaque(BoxFuture<'static, Result<(), BoxError>>),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Progress {
    flushed: u64,
    failed: bool,
}

#[derive(Default)]
struct Log {
    pending: VecDeque<Effect>,
    enlisted: u64,
    flushing: bool,
    /// Something waiting must leave without lingering.
    urgent: bool,
    /// How long what waits may linger: the shortest its effects asked for.
    linger: Option<Duration>,
    failure: Option<Arc<str>>,
}

/// One instance's effect log.
pub(crate) struct Frontier {
    store: Arc<dyn StateStore>,
    /// Weak: the slot owns its trays, which own this frontier.
    slot: Weak<Record>,
    log: Mutex<Log>,
    progress: watch::Sender<Progress>,
    /// Ends a linger early.
    hurry: Notify,
}

impl Frontier {
    pub(crate) fn new(store: Arc<dyn StateStore>, slot: Weak<Record>) -> Self {
        Self {
            store,
            slot,
            log: Mutex::new(Log::default()),
            progress: watch::Sender::new(Progress::default()),
            hurry: Notify::new(),
        }
    }

    /// Appends `effect` and returns its position; starts the flusher when
    /// it is not running.
    ///
    /// # Errors
    ///
    /// [`TrayError::Poisoned`] once a flush failed, and [`TrayError::Closed`]
    /// once the instance is gone.
    pub(crate) fn enlist(self: &Arc<Self>, effect: Effect) -> Result<u64, TrayError> {
        self.enlist_with(effect, Urgency::Now)
    }

    /// As [`enlist`](Self::enlist), leaving when `urgency` says.
    ///
    /// # Errors
    ///
    /// As [`enlist`](Self::enlist).
    pub(crate) fn enlist_with(
        self: &Arc<Self>,
        effect: Effect,
        urgency: Urgency,
    ) -> Result<u64, TrayError> {
        self.enlist_all(std::iter::once(effect), urgency)
    }

    /// Appends `effects` together and returns the position of the last:
    /// row writes enlisted together always leave in one batch (nothing can
    /// come between them, and a batch takes every row write at the front),
    /// so they land all or none.
    ///
    /// # Errors
    ///
    /// As [`enlist`](Self::enlist).
    pub(crate) fn enlist_all(
        self: &Arc<Self>,
        effects: impl IntoIterator<Item = Effect>,
        urgency: Urgency,
    ) -> Result<u64, TrayError> {
        let mut log = self.log.lock();
        if let Some(failure) = &log.failure {
            return Err(TrayError::Poisoned(failure.to_string()));
        }
        let Some(slot) = self.slot.upgrade() else {
            return Err(TrayError::Closed);
        };
        for effect in effects {
            log.pending.push_back(effect);
            log.enlisted += 1;
        }
        let position = log.enlisted;
        let linger = match urgency {
            Urgency::Now => None,
            Urgency::Soon => Some(LINGER),
            Urgency::Idle => Some(IDLE_LINGER),
        };
        if let Some(linger) = linger {
            log.linger = Some(log.linger.map_or(linger, |held| held.min(linger)));
        }
        if urgency == Urgency::Now && !log.urgent {
            log.urgent = true;
            self.hurry.notify_one();
        }
        if !log.flushing {
            log.flushing = true;
            // The flusher counts as in flight: an instance with unflushed
            // effects is not idle, and its teardown waits for them.
            let busy = slot.hold();
            let frontier = self.clone();
            slot.host.domain.spawn(
                slot.task_span(crate::namespace::record::Work::TrayFlush)
                    .instrument(frontier.flush(busy)),
            );
        }
        Ok(position)
    }

    /// A receipt for everything enlisted so far.
    pub(crate) fn receipt(self: &Arc<Self>) -> Receipt {
        let position = self.log.lock().enlisted;
        Receipt {
            frontier: self.clone(),
            position,
            patience: Duration::ZERO,
        }
    }

    /// Waits until every effect up to `position` landed. For the first
    /// `patience` the wait lets the log linger (another write may come to
    /// carry the same row); after it, it hurries the log like any wait.
    pub(crate) async fn wait(&self, position: u64, patience: Duration) -> Result<(), TrayError> {
        let mut progress = self.progress.subscribe();
        if !patience.is_zero() && progress.borrow().flushed < position {
            let _ = tokio::time::timeout(
                patience,
                progress.wait_for(|progress| progress.flushed >= position || progress.failed),
            )
            .await;
        }
        if progress.borrow().flushed < position {
            // Someone waits: nothing lingers.
            let mut log = self.log.lock();
            if !log.urgent {
                log.urgent = true;
                self.hurry.notify_one();
            }
        }
        let reached = progress
            .wait_for(|progress| progress.flushed >= position || progress.failed)
            .await
            .map(|progress| *progress);
        match reached {
            Ok(progress) if progress.flushed >= position => Ok(()),
            _ => Err(TrayError::Poisoned(
                self.log
                    .lock()
                    .failure
                    .as_deref()
                    .unwrap_or("the instance closed")
                    .to_owned(),
            )),
        }
    }

    async fn flush(self: Arc<Self>, busy: Busy) {
        let slot = busy.slot().clone();
        loop {
            let linger = {
                let mut log = self.log.lock();
                if log.pending.is_empty() {
                    log.flushing = false;
                    return;
                }
                (!log.urgent).then(|| log.linger.unwrap_or(LINGER))
            };
            if let Some(linger) = linger {
                // A permit left by a hurry whose effects have left already
                // wakes this wait early: only a hurry still standing ends it.
                let deadline = tokio::time::Instant::now() + linger;
                while tokio::time::timeout_at(deadline, self.hurry.notified())
                    .await
                    .is_ok()
                {
                    if self.log.lock().urgent {
                        break;
                    }
                }
            }
            let (work, count) = {
                let mut log = self.log.lock();
                let taken = match log.pending.front() {
                    None => {
                        log.flushing = false;
                        return;
                    }
                    Some(Effect::Opaque(_)) => match log.pending.pop_front() {
                        Some(Effect::Opaque(effect)) => (Work::Opaque(effect), 1),
                        _ => continue,
                    },
                    Some(Effect::Row { .. }) => {
                        let (ops, count) = coalesce(&mut log.pending);
                        (Work::Batch(ops), count)
                    }
                };
                // Whatever stays behind keeps its urgency.
                if log.pending.is_empty() {
                    log.urgent = false;
                    log.linger = None;
                }
                taken
            };
            let epoch = slot.epoch().unwrap_or(0);
            let outcome = match work {
                Work::Batch(ops) => tokio::time::timeout(
                    FLUSH_DEADLINE,
                    tracing::Instrument::instrument(
                        self.store.apply_batch(
                            InstanceKey::new(&slot.host.ns, &slot.id),
                            ops,
                            epoch,
                        ),
                        // Under the flush's span: part of the trace of the
                        // request that enlisted the effects.
                        tracing::debug_span!("store write", effects = count, epoch),
                    ),
                )
                .await
                .map(|done| done.map_err(|error| error.to_string())),
                Work::Opaque(effect) => tokio::time::timeout(FLUSH_DEADLINE, effect)
                    .await
                    .map(|done| done.map_err(|error| error.to_string())),
            };
            let failure = match outcome {
                Ok(Ok(())) => {
                    self.progress
                        .send_modify(|progress| progress.flushed += count);
                    continue;
                }
                Ok(Err(error)) => error,
                Err(_) => format!("a durable effect took over {FLUSH_DEADLINE:?}"),
            };
            tracing::error!(namespace = %slot.host.ns, id = %slot.id, error = %failure, "durable effects failed to land; aborting the instance");
            {
                let mut log = self.log.lock();
                log.failure = Some(Arc::from(failure.as_str()));
                log.pending.clear();
                log.flushing = false;
            }
            self.progress.send_modify(|progress| progress.failed = true);
            crate::namespace::Namespace::abort(&slot);
            return;
        }
    }
}

enum Work {
    Batch(Vec<BatchOp>),
    Opaque(BoxFuture<'static, Result<(), BoxError>>),
}

/// Takes the run of row writes at the front of `pending` as one batch: each
/// row once, at its last image, placed where that last write was enlisted.
fn coalesce(pending: &mut VecDeque<Effect>) -> (Vec<BatchOp>, u64) {
    let mut ops: Vec<Option<BatchOp>> = Vec::new();
    let mut last: HashMap<(String, String), usize> = HashMap::new();
    let mut count = 0;
    while matches!(pending.front(), Some(Effect::Row { .. })) {
        let Some(Effect::Row {
            tray_ns,
            tray_id,
            image,
        }) = pending.pop_front()
        else {
            break;
        };
        count += 1;
        if let Some(earlier) = last.insert((tray_ns.clone(), tray_id.clone()), ops.len()) {
            ops[earlier] = None;
        }
        ops.push(Some(match image {
            Some((marked, doc)) => BatchOp::set(tray_ns, tray_id, marked, doc),
            None => BatchOp::delete(tray_ns, tray_id),
        }));
    }
    (ops.into_iter().flatten().collect(), count)
}

/// Resolves once the effects it covers are durable in the store. Await it
/// for a durable answer, or drop it: the effects land anyway
/// (fire-and-forget).
///
/// ```
/// # async fn demo(jobs: pinned::tray::TrayHandle<impl pinned::tray::Tray>) -> Result<(), pinned::tray::TrayError> {
/// let receipt = jobs.admit(|_jobs| { /* push an item */ })?;
/// receipt.await?; // in the store now
/// # Ok(())
/// # }
/// ```
#[must_use = "a receipt does nothing unless awaited; drop it explicitly for fire-and-forget"]
pub struct Receipt {
    frontier: Arc<Frontier>,
    position: u64,
    /// How long an awaiting caller lets the log linger before hurrying it
    /// (see [`Receipt::patient`]).
    patience: Duration,
}

impl Receipt {
    /// This receipt, its awaiting caller letting the log linger up to
    /// [`LINGER`] before hurrying it: an admission to a tray whose handler
    /// is running a quick item waits for that run's ack to carry its row
    /// (one row write for the two) instead of a write of its own just
    /// before it.
    pub(crate) fn patient(mut self) -> Self {
        self.patience = LINGER;
        self
    }
}

impl std::fmt::Debug for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receipt")
            .field("position", &self.position)
            .finish()
    }
}

impl IntoFuture for Receipt {
    type Output = Result<(), TrayError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.frontier.wait(self.position, self.patience).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tray_id: &str, marked: bool) -> Effect {
        Effect::Row {
            tray_ns: "jobs".to_owned(),
            tray_id: tray_id.to_owned(),
            image: Some((marked, DocText::from(pinned_store::Doc::new()))),
        }
    }

    #[test]
    fn adjacent_rows_coalesce_to_their_last_image_at_its_position() {
        let mut pending = VecDeque::from([
            row("a", true),
            row("b", true),
            row("a", false),
            Effect::Opaque(Box::pin(async { Ok(()) })),
            row("a", true),
        ]);
        let (ops, count) = coalesce(&mut pending);
        assert_eq!(count, 3);
        assert_eq!(
            ops,
            vec![
                BatchOp::set("jobs", "b", true, pinned_store::Doc::new()),
                BatchOp::set("jobs", "a", false, pinned_store::Doc::new()),
            ]
        );
        assert_eq!(pending.len(), 2, "the opaque effect ends the batch");
    }
}
