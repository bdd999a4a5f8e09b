//! The per-instance [`Context`]: who the instance is, how it learns it is
//! being evicted, and how it keeps work in flight.
//!
//! A `Context` is a cheap handle (one `Arc`); clone it into tasks freely.
//! It never outlives its purpose badly: once the instance closed, tracked
//! work is refused and `abort` is a no-op.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use super::Namespace;
use super::Record;
use crate::instance::Stage;
use crate::plane::cluster::Cluster;
use crate::plane::instance_lease::{EvictionRequested, InstanceLease};
use crate::BoxError;

/// Why [`Context::tag`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TagError {
    /// No request carrying a placement epoch was admitted yet.
    #[error("tag needs an admitted placement epoch")]
    NotAdmitted,
    /// pinboard did not accept the tag after three attempts.
    #[error("pinboard did not accept the tag")]
    Unreachable,
}

/// The context of one live instance, handed to
/// [`Object::activate`](crate::Object::activate) and reachable from every
/// request through [`Call`](crate::Call).
///
/// ```
/// # async fn demo(ctx: pinned::Context) {
/// let background = ctx.clone();
/// ctx.spawn(async move {
///     // Runs until done or until the instance is aborted.
///     background.cancelled().await;
/// });
/// ctx.on_stop(|| async { Ok(()) });
/// # }
/// ```
#[derive(Clone)]
pub struct Context {
    slot: Arc<Record>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("ns", &self.ns())
            .field("id", &self.id())
            .finish()
    }
}

impl Context {
    pub(crate) fn new(slot: Arc<Record>) -> Self {
        Self { slot }
    }

    pub(crate) fn slot(&self) -> &Arc<Record> {
        &self.slot
    }

    /// The instance id (the path segment after the namespace).
    pub fn id(&self) -> &str {
        &self.slot.id
    }

    /// Where this instance gets wall time, timers, tasks and randomness:
    /// the worker's [`Domain`](crate::Domain). Code that reads the time or
    /// draws random numbers through it runs the same under a test's paused
    /// clock and a seeded simulation as in production.
    pub fn domain(&self) -> &crate::Domain {
        &self.slot.host.domain
    }

    /// The namespace, with its leading slash (`/counter`).
    pub fn ns(&self) -> &str {
        &self.slot.host.ns
    }

    /// The placement epoch the instance serves at: the highest
    /// `Pinboard-Epoch` admitted for it, `None` without a control plane.
    pub fn epoch(&self) -> Option<u64> {
        self.slot.epoch()
    }

    /// Completes when the instance is being evicted (idle timeout, wind-down
    /// or drain deadline, [`abort`](Self::abort), worker close).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; create a new one to wait again.
    pub fn cancelled(&self) -> crate::Cancelled<'_> {
        self.slot.cancelled()
    }

    /// Whether eviction has started.
    pub fn is_cancelled(&self) -> bool {
        self.slot.is_cancelled()
    }

    /// Force-ends the instance: in-flight requests answer 503
    /// `instance aborted`, background work is cancelled, then the `on_stop`
    /// handlers run.
    pub fn abort(&self) {
        Namespace::abort(&self.slot);
    }

    /// Runs `handler` when the instance closes, after its open work settled
    /// and after [`Object::on_stop`](crate::Object::on_stop). Handlers run
    /// last-registered first; an error or panic is logged and the next
    /// handler still runs. Handlers are dropped once run, so one may
    /// capture this context.
    pub fn on_stop<F, Fut>(&self, handler: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.slot
            .extra()
            .on_stop
            .lock()
            .push(Box::new(move || handler().boxed()));
    }

    /// Keeps the instance in flight until `work` completes: idle eviction
    /// and drain wait for it, and so does teardown (the work should watch
    /// [`cancelled`](Self::cancelled) to end early). An error is logged.
    /// Counted in `/_pinned/stats` `tasks`.
    pub fn wait_until<F>(&self, work: F)
    where
        F: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.track(work, false);
    }

    /// Runs `work` as a background task bound to the instance: it keeps the
    /// instance in flight and is cancelled (dropped) when the instance is
    /// aborted or closed.
    pub fn spawn<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.track(work.map(Ok), true);
    }

    fn track<F>(&self, work: F, cancellable: bool)
    where
        F: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        if matches!(self.slot.stage(), Stage::Closed) {
            tracing::warn!(namespace = %self.ns(), id = %self.id(), "work spawned on a closed instance was dropped");
            return;
        }
        let entry = self.slot.hold();
        let slot = self.slot.clone();
        let span = slot.task_span(crate::namespace::record::Work::Task);
        let domain = slot.host.domain.clone();
        domain.spawn(span.instrument(
            async move {
                let _entry = entry;
                let outcome = if cancellable {
                    tokio::select! {
                        outcome = std::panic::AssertUnwindSafe(work).catch_unwind() => outcome,
                        () = slot.cancelled() => return,
                    }
                } else {
                    std::panic::AssertUnwindSafe(work).catch_unwind().await
                };
                let error = match outcome {
                    Ok(Ok(())) => return,
                    Ok(Err(error)) => error.to_string(),
                    Err(panic) => super::panic_message(panic.as_ref()),
                };
                tracing::error!(namespace = %slot.host.ns, id = %slot.id, %error, "background task failed");
            },
        ));
    }

    /// Winds the instance down: it closes as soon as nothing is in flight,
    /// and is aborted at `deadline` from now if still busy (`None`: never
    /// aborted). Requests keep being served until the deadline; afterwards
    /// they answer 503 `instance past its wind-down deadline; retry`.
    pub fn wind_down(&self, deadline: Option<Duration>) {
        super::wind_down(&self.slot, deadline);
    }

    /// Application state `S`, given to the worker with
    /// [`Options::state`](crate::Options::state); `None` when no state of
    /// that type was given.
    pub fn state<S: Clone + Send + Sync + 'static>(&self) -> Option<S> {
        self.slot.host.states.get::<S>()
    }

    /// A cluster client for calls to other instances (depth 1; inside a
    /// handler prefer [`Call::cluster`](crate::Call::cluster), which
    /// carries the request's depth).
    pub fn cluster(&self) -> Cluster {
        Cluster::new(
            &self.slot.host.switchboard,
            &self.slot.host.control,
            &self.slot.host.ns,
            self.id(),
            1,
        )
    }

    /// Stamps an owner `tag` on the instance's placement (`POST
    /// /registry/tag` at the admitted epoch), for `GET
    /// /registry/overview?tag=`. The tag is stamped again whenever the
    /// instance adopts a newer placement epoch. A no-op without a control
    /// plane.
    ///
    /// # Errors
    ///
    /// Before any request was admitted with a placement epoch, or when
    /// pinboard stays unreachable over three attempts.
    pub async fn tag(&self, tag: &str) -> Result<(), TagError> {
        let Some(plane) = self.slot.host.control.pinboard() else {
            return Ok(());
        };
        let epoch = self.epoch().ok_or(TagError::NotAdmitted)?;
        self.slot.set_tag(tag);
        if plane.tag(self.ns(), self.id(), epoch, tag).await {
            Ok(())
        } else {
            Err(TagError::Unreachable)
        }
    }

    /// The instance's open hibernatable sockets
    /// ([`WebSocketUpgrade::accept`](crate::ws::WebSocketUpgrade::accept)),
    /// those tagged `tag` when given, oldest first. They belong to the id:
    /// the list is the same before and after a hibernation.
    ///
    /// In a namespace whose sockets survive moves
    /// ([`SocketOptions::survive_moves`](crate::ws::SocketOptions::survive_moves)),
    /// the sockets pinboard holds are listed as this instance heard of
    /// them: accepted by it, or named by an event it handled since it
    /// activated. A socket of the id that has not spoken to this instance
    /// is not listed (a broadcast still reaches it).
    ///
    /// ```
    /// # fn demo(ctx: pinned::Context) {
    /// let everyone = ctx.sockets(None).len();
    /// let admins = ctx.sockets(Some("admin"));
    /// # let _ = (everyone, admins);
    /// # }
    /// ```
    pub fn sockets(&self, tag: Option<&str>) -> Vec<super::sockets::Socket> {
        let host = &self.slot.host;
        let mut sockets = host.sockets.list(&self.slot.id, tag);
        if host.options.sockets.survive_moves {
            sockets.extend(
                host.held
                    .list(&self.slot.id, tag)
                    .into_iter()
                    .map(super::sockets::Socket::held),
            );
        }
        sockets
    }

    /// Sends `message` to every open hibernatable socket of the instance
    /// (those tagged `tag` when given) and answers how many took it. A
    /// socket whose outbox is full is closed with 1013 instead
    /// ([`SocketOptions::outbox`](crate::ws::SocketOptions::outbox)).
    ///
    /// In a namespace whose sockets survive moves, one send to pinboard
    /// reaches every socket of the id it holds (with `tag` when given),
    /// heard of or not, on every pinboard node; the count then includes
    /// the held sockets this instance heard of
    /// ([`sockets`](Self::sockets)).
    pub fn broadcast(
        &self,
        tag: Option<&str>,
        message: impl Into<axum::extract::ws::Message>,
    ) -> usize {
        let message = message.into();
        let host = &self.slot.host;
        let local = host
            .sockets
            .list(&self.slot.id, tag)
            .iter()
            .filter(|socket| socket.send(message.clone()).is_ok())
            .count();
        if !host.options.sockets.survive_moves {
            return local;
        }
        match host.held.broadcast(&self.slot.id, tag, message) {
            Ok(()) => local + host.held.list(&self.slot.id, tag).len(),
            Err(_) => local,
        }
    }

    /// Whether the instance is winding down (its own wind-down, or its host
    /// draining).
    pub fn winding_down(&self) -> bool {
        self.slot.winding_down()
    }

    /// A snapshot of the instance's lease: the worker's lease health and
    /// expiry, the instance's wind-down and its eviction deadline.
    pub fn lease(&self) -> InstanceLease {
        let lease = self.slot.host.control.lease();
        InstanceLease {
            healthy: lease.is_none_or(|lease| lease.healthy()),
            expired: lease.is_some_and(|lease| lease.expired()),
            expires_at: lease
                .and_then(|lease| lease.expires_at())
                .map(|at| self.slot.host.domain.wall_at(at)),
            buffer: lease.map_or(crate::DEFAULT_LEASE_BUFFER, |lease| lease.buffer()),
            winding_down: self.slot.winding_down(),
            eviction_deadline: self
                .slot
                .winding_down()
                .then(|| self.slot.effective_deadline())
                .flatten()
                .map(|at| self.slot.host.domain.wall_at(at)),
        }
    }

    /// A checkpoint for long work: `Err(EvictionRequested)` once the
    /// instance is winding down, so the work can stop and leave the rest to
    /// the next activation instead of being aborted at the deadline.
    ///
    /// ```
    /// # async fn demo(ctx: pinned::Context, items: Vec<u64>) -> Result<(), pinned::BoxError> {
    /// for item in items {
    ///     ctx.eviction_checkpoint()?;
    ///     // ... process `item`, recording progress in the store ...
    /// #   let _ = item;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`EvictionRequested`] while the instance winds down.
    pub fn eviction_checkpoint(&self) -> Result<(), EvictionRequested> {
        if self.slot.winding_down() {
            Err(EvictionRequested)
        } else {
            Ok(())
        }
    }

    /// Completes when the instance starts winding down (its own
    /// [`wind_down`](Self::wind_down), a pinboard `wind_down`, or its worker
    /// draining, as on SIGTERM) or is being evicted, with the deadline after
    /// which it is aborted (`None`: no deadline). Already winding down, it
    /// completes at once.
    ///
    /// Long-lived work such as a WebSocket loop selects on it to finish
    /// early, so a drain does not wait for the deadline:
    ///
    /// ```
    /// # async fn demo(ctx: pinned::Context, mut socket: pinned::ws::WebSocket) {
    /// use pinned::ws::CLOSE_SERVICE_RESTART;
    /// tokio::select! {
    ///     _ = ctx.wind_down_started() => {
    ///         let _ = socket.close(CLOSE_SERVICE_RESTART, "server restarting").await;
    ///     }
    ///     _ = socket.recv() => {}
    /// }
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn wind_down_started(&self) -> Option<tokio::time::Instant> {
        let host = &self.slot.host;
        loop {
            let notified = host.winding.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.slot.winding_down() {
                return self.slot.effective_deadline();
            }
            tokio::select! {
                () = &mut notified => {}
                () = self.slot.cancelled() => return Some(tokio::time::Instant::now()),
            }
        }
    }
}
