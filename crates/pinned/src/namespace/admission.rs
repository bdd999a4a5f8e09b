//! Admission: how a request enters an instance record of the namespace,
//! creating it for a new id (one record per id, also under a burst), and
//! how the record's activation is started once and awaited by everyone.
//!
//! An activation's first poll runs on the requester's task; one that has
//! to wait goes on in a task of its own, so a client that goes away
//! mid-activation leaves it to finish for the next request.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use futures_util::future::FutureExt;
use pinned_wire::refusal::Refusal;
use tokio::time::Instant;

use super::churn_log::{churn_line, Churn};
use super::deadlines::Judged;
use super::Busy;
use super::Record;
use super::{panic_message, Keyed, Namespace};
use crate::instance::{Activation, Instance, Stage};

/// How many records an eviction at capacity looks at, at most, in the
/// sweep's index (records found out of place move, so the next one looks
/// further on).
const EVICTION_LOOKS: usize = 64;

/// A request inside an instance record.
pub(crate) enum Entered {
    /// The instance is live.
    Live(Busy, Instance),
    /// The record is not live yet: its activation may not have started.
    Activating(Busy),
}

impl Entered {
    /// The record entered.
    pub(crate) fn slot(&self) -> &Arc<Record> {
        match self {
            Self::Live(busy, _) | Self::Activating(busy) => busy.slot(),
        }
    }
}

/// What one attempt to enter an instance came to.
pub(crate) enum Attempt {
    /// Entered.
    Entered(Entered),
    /// The id's record is closing: wait until it has left the map
    /// ([`Namespace::enter_after`] waits it out and tries again).
    Closing(Arc<Record>),
}

/// Why a request could not enter an instance.
#[derive(Debug)]
pub(crate) enum Admission {
    /// A 503 refusal with the reference's detail.
    Refused(Refusal),
    /// The activation failed or panicked: 500.
    ActivationFailed,
    /// The worker was closed: 500.
    ShutDown,
    /// An operator paused the id, or holds it for an action under way:
    /// 503 with [`PAUSED_DETAIL`](crate::durable::inspect::PAUSED_DETAIL).
    Paused,
}

impl From<Refusal> for Admission {
    fn from(refusal: Refusal) -> Self {
        Self::Refused(refusal)
    }
}

impl Namespace {
    /// Enters instance `id`, activating it first when it is not resident.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an activation runs in its own task, so a client that
    /// goes away mid-activation leaves it to finish for the next request.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        id: &str,
        epoch: Option<u64>,
    ) -> Result<(Busy, Instance), Admission> {
        match self.admit(id, epoch).await? {
            Entered::Live(busy, instance) => Ok((busy, instance)),
            Entered::Activating(busy) => Self::activation(busy).await,
        }
    }

    /// Enters instance `id` without activating it: a record that is not
    /// live yet (constructed by this request or an earlier one) comes back
    /// as [`Entered::Activating`], for the caller to authorize the request
    /// before [`activation`](Self::activation) starts it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        id: &str,
        epoch: Option<u64>,
    ) -> Result<Entered, Admission> {
        match self.try_admit(id, epoch, self.elapsed_ms())? {
            Attempt::Entered(entered) => Ok(entered),
            Attempt::Closing(slot) => self.enter_after(slot, id, epoch).await,
        }
    }

    /// Enters `id` once its closing record `slot` has left the map (the
    /// admission checks already passed: [`try_admit`](Self::try_admit)
    /// answered [`Attempt::Closing`]), waiting out any record that closes
    /// in between.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(crate) async fn enter_after(
        self: &Arc<Self>,
        mut slot: Arc<Record>,
        id: &str,
        epoch: Option<u64>,
    ) -> Result<Entered, Admission> {
        loop {
            self.wait_gone(&slot).await;
            match self.try_enter(id, epoch, self.elapsed_ms())? {
                Attempt::Entered(entered) => return Ok(entered),
                Attempt::Closing(closing) => slot = closing,
            }
        }
    }

    /// [`admit`](Self::admit) without waiting, for a request that arrived
    /// at `now_ms` (on the host's clock, [`Namespace::ms_at`]; its entry
    /// counts as the instance's activity then): the
    /// admission checks, then one attempt to enter. A record of `id` that
    /// is closing comes back as [`Attempt::Closing`], to be waited out
    /// before trying again ([`admit`](Self::admit) does).
    #[inline]
    pub(crate) fn try_admit(
        self: &Arc<Self>,
        id: &str,
        epoch: Option<u64>,
        now_ms: u64,
    ) -> Result<Attempt, Admission> {
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(self.shut_down_answer());
        }
        // Past its lease the placement may live elsewhere: a woken process
        // serves nothing until it has re-registered.
        if self.control.lease_expired() {
            return Err(Refusal::LeaseExpired.into());
        }
        if let Some(epoch) = epoch {
            self.fences.admit(id, epoch, self.control.lease_ttl())?;
        }
        self.try_enter(id, epoch, now_ms)
    }

    /// One attempt to enter `id`'s record (creating it when there is none).
    fn try_enter(
        self: &Arc<Self>,
        id: &str,
        epoch: Option<u64>,
        now_ms: u64,
    ) -> Result<Attempt, Admission> {
        loop {
            if self.shut_down.load(Ordering::SeqCst) {
                return Err(self.shut_down_answer());
            }
            let resident = self.slot(id);
            let Some(slot) = resident else {
                match self.create(id, epoch, now_ms)? {
                    Some(busy) => return Ok(Attempt::Entered(Entered::Activating(busy))),
                    None => continue,
                }
            };
            return match slot.enter(now_ms) {
                Ok((busy, phase)) => {
                    if slot.winding.load(Ordering::Relaxed) || self.draining() {
                        if let Some(deadline) = slot.effective_deadline() {
                            if Instant::now() >= deadline {
                                return Err(Refusal::PastWindDown.into());
                            }
                        }
                    }
                    match phase {
                        Stage::Live => match slot.instance() {
                            Some(instance) => Ok(Attempt::Entered(Entered::Live(busy, instance))),
                            None => Err(Admission::ActivationFailed),
                        },
                        _ => Ok(Attempt::Entered(Entered::Activating(busy))),
                    }
                }
                // While its placement release is in flight the proxy must
                // re-resolve, not re-activate here; otherwise (local mode, a
                // close that keeps its placement) the close is waited out
                // and the id activates afresh.
                Err(_) => {
                    if self.control.refuses_while_releasing()
                        && slot.releasing.load(Ordering::SeqCst)
                    {
                        Err(Refusal::Closing.into())
                    } else {
                        Ok(Attempt::Closing(slot))
                    }
                }
            };
        }
    }

    /// What a closed worker answers. Behind pinboard, a request routed just
    /// before the deregistration landed gets the retryable draining refusal
    /// so pinboard places it elsewhere; locally, the reference's 500.
    fn shut_down_answer(&self) -> Admission {
        if self.control.closed_is_retryable() {
            Admission::Refused(Refusal::Draining)
        } else {
            Admission::ShutDown
        }
    }

    /// Creates and starts activating a record for `id`, arrived at
    /// `now_ms`; `None` when another request created one first.
    fn create(
        self: &Arc<Self>,
        id: &str,
        epoch: Option<u64>,
        now_ms: u64,
    ) -> Result<Option<Busy>, Refusal> {
        // Existing instances keep serving; only new activations refuse.
        if !self.control.lease_healthy() {
            return Err(Refusal::LeaseUnhealthy);
        }
        if self.draining() {
            return Err(Refusal::Draining);
        }
        let records = self.count.fetch_add(1, Ordering::SeqCst);
        if !self.has_room(records) {
            self.count.fetch_sub(1, Ordering::SeqCst);
            return Err(Refusal::Capacity);
        }
        // The record is its own map key (the id is stored once, in it), so
        // it is built before the map is asked; a lost race drops it unseen
        // (its sequence number goes unused).
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        // The requester's entry; the activation task takes its own when it
        // starts.
        let slot = Arc::new(Record::new(id, self.clone(), seq, 1, now_ms));
        // The activation (and the store reads it makes) runs at the
        // admitted epoch.
        if let Some(epoch) = epoch {
            let _ = slot.adopt_epoch(epoch);
        }
        match self.slots.entry(Keyed(slot.clone())) {
            Entry::Occupied(_) => {
                self.count.fetch_sub(1, Ordering::SeqCst);
                Ok(None)
            }
            Entry::Vacant(vacant) => {
                vacant.insert(());
                Ok(Some(slot.adopt()))
            }
        }
    }

    /// Whether a new record fits beside `records` existing ones: fewer than
    /// `max_instances` that are not closing, making room by evicting an
    /// idle one when allowed. Closing records, which leave soon, may add
    /// up to `max_instances` more, never beyond.
    fn has_room(&self, records: usize) -> bool {
        let max = self.options.max_instances;
        let closing = self.closing.load(Ordering::SeqCst);
        if records.saturating_sub(closing) < max {
            return true;
        }
        self.options.evict_idle_at_capacity && records < max.saturating_mul(2) && self.evict_idle()
    }

    /// Begins closing the least recently used idle instance, the oldest
    /// the sweep's index holds (at the sweep interval's granularity, by last
    /// activity within it); false when none is idle.
    fn evict_idle(&self) -> bool {
        let now = self.elapsed_ms();
        let victim = self.deadlines.oldest(EVICTION_LOOKS, |slot| {
            if slot.stage() != Stage::Live || slot.winding_down() {
                return Judged::Skip;
            }
            let deadline_ms = self.next_look(slot, now);
            if slot.in_flight() != 0 {
                Judged::Later(deadline_ms)
            } else {
                Judged::Candidate {
                    rank: slot.activity_ms(),
                    deadline_ms,
                }
            }
        });
        let Some(victim) = victim else {
            return false;
        };
        let evicted = victim.begin_idle_close(self.releases_on_idle(&victim));
        if evicted {
            churn_line!(
                self,
                Churn::EvictedAtCapacity,
                victim.id,
                "at capacity: evicting the least recently used idle instance"
            );
            Self::close_begun(&victim);
        } else {
            // A request entered it meanwhile: it stays, and in the index.
            let at = self.next_look(&victim, now);
            self.deadlines.queue(victim, at);
        }
        evicted
    }

    /// Drops a request's entry into a record whose activation it was
    /// refused; a record nobody else entered and that never started
    /// activating is closed with its placement released (the reference's
    /// "denied cold request discards the constructed instance").
    pub(crate) fn discard(busy: Busy) {
        let slot = busy.slot().clone();
        let untouched = slot.stage() == Stage::Activating
            && slot.activation().is_none()
            && slot.in_flight() == 1;
        drop(busy);
        if untouched {
            Self::discard_unserved(&slot);
        }
    }

    /// Activates the record `busy` entered (once, whoever asks first) and
    /// waits for the outcome.
    pub(crate) async fn activation(busy: Busy) -> Result<(Busy, Instance), Admission> {
        busy.slot().host.start_activation(busy.slot());
        Self::await_activation(busy).await
    }

    /// Starts the activation of `slot` unless it started already.
    ///
    /// The activation is a shared future in the record, which every
    /// request waiting for it awaits. Its first poll runs here, on the
    /// requester's task, in the instance's span: an activation that needs
    /// no wait (most do not) ends at once, without a task, a join handle
    /// and the wake-ups between them (about 6 500 instructions of a new
    /// id, `worker-bench`). One that waits goes on in a task of its own
    /// that drives it to its end, so a requester that goes away leaves it
    /// to finish. A domain with a runtime of its own activates on that
    /// runtime from the first poll.
    fn start_activation(self: &Arc<Self>, slot: &Arc<Record>) {
        let host = self.clone();
        let mut pending = slot.activation();
        if pending.is_some() || slot.stage() != Stage::Activating || slot.activated_at().is_some() {
            return;
        }
        let task_slot = slot.clone();
        let entry = slot.hold();
        let span = slot.task_span(crate::namespace::record::Work::Activation);
        let run = async move {
            let slot = task_slot;
            let entry = entry;
            if let Some(durable) = &host.durable {
                let opened = durable.open(&slot).await;
                if !matches!(opened, Ok(true)) {
                    if let Err(error) = &opened {
                        tracing::error!(namespace = %host.ns, id = %slot.id, error = %pinned_edge::logging::Chain(&**error), "cannot read the instance's pause row and pending tray rows");
                    }
                    slot.cancel();
                    host.remove(&slot);
                    return match opened {
                        Ok(_) => Activation::Paused,
                        Err(_) => Activation::Failed,
                    };
                }
            }
            let activate = AssertUnwindSafe(async {
                let instance = (host.lifecycle.activate)(slot.clone()).await?;
                // The trays resume once the object exists (their handlers
                // need it) and before the instance serves.
                slot.set_instance(instance.clone());
                if let Some(durable) = &host.durable {
                    durable.resume(&slot).await?;
                }
                Ok::<_, crate::BoxError>(instance)
            })
            .catch_unwind();
            let outcome = tokio::select! {
                outcome = activate => outcome,
                () = slot.cancelled() => return Activation::Aborted,
            };
            let failure = match outcome {
                Ok(Ok(instance)) => {
                    let activated = slot.go_live(host.domain.unix_ms());
                    *slot.activation() = None;
                    if !activated {
                        return Activation::Aborted;
                    }
                    // One clock read for the sweep's index and the
                    // activation's own entry, which leaves below.
                    let now = host.elapsed_ms();
                    host.went_live(&slot, now);
                    host.activations.fetch_add(1, Ordering::Relaxed);
                    host.metrics.activations.inc();
                    host.metrics.active_instances.inc();
                    if let Some(durable) = &host.durable {
                        durable.activated(&host, &slot);
                    }
                    churn_line!(host, Churn::Activated, slot.id, "activated instance", at now, epoch = slot.epoch());
                    entry.leave_at(now);
                    return Activation::Ready(instance);
                }
                Ok(Err(error)) => error.to_string(),
                Err(panic) => panic_message(panic.as_ref()),
            };
            tracing::error!(namespace = %host.ns, id = %slot.id, error = %failure, "instance activation failed");
            host.metrics.request_failed("lifespan", "http");
            slot.cancel();
            drop(slot.take_instance());
            drop(slot.take_trays());
            host.remove(&slot);
            Activation::Failed
        };
        // A panic outside the object's code fails the activation, as a
        // task's panic did: the requesters polling it never see it.
        let run = AssertUnwindSafe(span.instrument(run))
            .catch_unwind()
            .map(|outcome| outcome.unwrap_or(Activation::Failed))
            .boxed()
            .shared();
        *pending = Some(Box::new(run.clone()));
        // Released before the first poll: a successful activation clears it.
        drop(pending);
        let mut first = run;
        if self.domain.has_runtime() || (&mut first).now_or_never().is_none() {
            drop(self.domain.spawn(async move {
                let _ = first.await;
            }));
        }
    }

    async fn await_activation(busy: Busy) -> Result<(Busy, Instance), Admission> {
        let pending = busy.slot().activation().as_deref().cloned();
        let outcome = match pending {
            Some(activation) => activation.await,
            None => match (busy.slot().stage(), busy.slot().instance()) {
                (Stage::Live, Some(instance)) => Activation::Ready(instance),
                // Aborted and torn down before this request looked.
                (Stage::Closing | Stage::Closed, _) => Activation::Aborted,
                _ => Activation::Failed,
            },
        };
        match outcome {
            Activation::Ready(instance) => Ok((busy, instance)),
            Activation::Failed => Err(Admission::ActivationFailed),
            Activation::Aborted => Err(Refusal::Aborted.into()),
            Activation::Paused => Err(Admission::Paused),
        }
    }

    /// Waits until `slot` has left the map.
    pub(crate) async fn wait_gone(&self, slot: &Arc<Record>) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let present = self
                .slots
                .get(slot.id.as_str())
                .is_some_and(|entry| entry.key().is(slot));
            if !present {
                return;
            }
            changed.await;
        }
    }
}
