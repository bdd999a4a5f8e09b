//! Running one HTTP connection to its end under the deadlines of
//! [`phase`](crate::phase), and finishing it gracefully on a stop signal.
//!
//! Owns the connection task's loop; never accepts, counts or routes (the
//! binary's accept loop does). Dropping the connection future closes the
//! socket, which is how a lapsed deadline ends a connection.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::phase::{Check, ConnTimeouts, Lapse, Phase, Watched};

/// An error hyper can report: any error boxed.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A service hyper's HTTP/1 server can serve: its errors, and its
/// response body's, convert into boxed errors. Implemented for every such
/// service; it names hyper's bounds once for the functions that serve
/// connections.
pub trait EdgeService:
    hyper::service::HttpService<Incoming, Error = Self::Failure, ResBody = Self::Body>
{
    /// The service's error.
    type Failure: Into<BoxError>;
    /// The response body.
    type Body: http_body::Body<Error = Self::BodyFailure> + 'static;
    /// The response body's error.
    type BodyFailure: Into<BoxError>;
}

impl<S, E, B> EdgeService for S
where
    S: hyper::service::HttpService<Incoming, Error = E, ResBody = B>,
    E: Into<BoxError>,
    B: http_body::Body + 'static,
    B::Error: Into<BoxError>,
{
    type Failure = E;
    type Body = B;
    type BodyFailure = B::Error;
}

/// A connection future that can be asked to finish gracefully (stop
/// reading new requests, finish the one in flight).
pub trait GracefulShutdown {
    /// Ask the connection to finish after the request in flight.
    fn shutdown_gracefully(self: Pin<&mut Self>);
}

impl<I, S, B> GracefulShutdown for http1::UpgradeableConnection<I, S>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn shutdown_gracefully(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<C: GracefulShutdown + ?Sized> GracefulShutdown for Pin<&mut C> {
    fn shutdown_gracefully(self: Pin<&mut Self>) {
        self.get_mut().as_mut().shutdown_gracefully();
    }
}

/// How a driven connection ended.
#[derive(Debug)]
pub enum Driven<T> {
    /// The connection future finished, with its output.
    Ended(T),
    /// A deadline lapsed, or the connection was idle at the cap; it was
    /// dropped.
    Lapsed(Lapse),
}

/// Runs `connection` to its end: served out (`None`), closed by a lapsed
/// deadline or to make room at the cap (`Some`, the connection dropped),
/// or finished gracefully after
/// `stopping` changed or its sender dropped. A client that goes away
/// mid-exchange is routine, not an error, so the connection's own result
/// is not reported.
///
/// # Cancel safety
///
/// Dropping the future drops the connection (the socket closes).
pub async fn drive<C>(
    connection: C,
    phase: &Phase,
    timeouts: ConnTimeouts,
    mut stopping: watch::Receiver<()>,
) -> Option<Lapse>
where
    C: Future + GracefulShutdown,
{
    match drive_to_end(connection, phase, timeouts, &mut stopping).await {
        Driven::Ended(_) => None,
        Driven::Lapsed(lapse) => Some(lapse),
    }
}

/// [`drive`], answering the connection future's output: for a server
/// that serves a connection in stages (its own loop first, another server
/// for the rest) and drives each stage in turn. A stop already seen by
/// `stopping` is not seen again by the next stage; the stage that saw it
/// was asked to finish gracefully and can tell the next one.
///
/// # Cancel safety
///
/// Dropping the future drops the connection (the socket closes).
pub async fn drive_to_end<C>(
    connection: C,
    phase: &Phase,
    timeouts: ConnTimeouts,
    stopping: &mut watch::Receiver<()>,
) -> Driven<C::Output>
where
    C: Future + GracefulShutdown,
{
    tokio::pin!(connection);
    // From here the connection waits for a head: idle for the roster until
    // one starts (a no-op for a later stage, whose head has started).
    phase.waiting();
    let start = tokio::time::Instant::now();
    let first = match phase.check(start, timeouts) {
        Check::Wait(at) => at,
        Check::Close(lapse) => return Driven::Lapsed(lapse),
    };
    let deadline = tokio::time::sleep_until(first);
    tokio::pin!(deadline);
    // One wait for the stop, kept across wake-ups: a fresh `changed()` per
    // loop would join and leave the channel's waiter list on every poll of
    // the connection, several times a request.
    let stop = stopping.changed();
    tokio::pin!(stop);
    let mut stopped = false;
    // The stop, the roster's reclaim and the deadline wake the task
    // through `watchers`, so they are polled again only when one of them
    // woke it, not on every wake-up of the connection (once or more a
    // request): polling the three each time cost about 500 instructions a
    // request (`worker-bench`).
    let (watchers, watcher_waker) = Watchers::new();
    poll_fn(|cx| loop {
        if let Poll::Ready(out) = connection.as_mut().poll(cx) {
            return Poll::Ready(Driven::Ended(out));
        }
        if !watchers.fired(cx) {
            return Poll::Pending;
        }
        let mut watched = Context::from_waker(&watcher_waker);
        if !stopped && stop.as_mut().poll(&mut watched).is_ready() {
            // A send or the sender's drop: finish either way, after
            // polling the connection again.
            stopped = true;
            connection.as_mut().shutdown_gracefully();
            watchers.again();
            continue;
        }
        // Asked while idle, and not polled since: still idle, so nothing
        // is cut (see `roster`).
        if phase.poll_reclaimed(&mut watched).is_ready() {
            return Poll::Ready(Driven::Lapsed(Lapse::Reclaimed));
        }
        while deadline.as_mut().poll(&mut watched).is_ready() {
            match phase.check(tokio::time::Instant::now(), timeouts) {
                Check::Wait(at) => deadline.as_mut().reset(at),
                Check::Close(lapse) => return Poll::Ready(Driven::Lapsed(lapse)),
            }
        }
        return Poll::Pending;
    })
    .await
}

/// What the futures watching a connection (its stop, reclaim, deadline,
/// abort) wake: a flag saying one of them did, then the connection's
/// task. The task polls them again only when the flag is up, not at every
/// wake-up of the connection itself.
pub(crate) struct Watchers {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Watchers {
    /// New watchers and the waker to poll them with; woken, so the first
    /// poll registers them.
    pub(crate) fn new() -> (Arc<Self>, Waker) {
        let watchers = Arc::new(Self {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(watchers.clone());
        (watchers, waker)
    }

    /// After the connection returned `Pending` in a poll with `cx`:
    /// whether a watcher woke the task since the last call (then poll them
    /// all with the watchers' waker).
    pub(crate) fn fired(&self, cx: &Context<'_>) -> bool {
        self.task.register(cx.waker());
        self.woken.swap(false, Ordering::AcqRel)
    }

    /// Polls the watchers again at the next [`fired`](Self::fired).
    pub(crate) fn again(&self) {
        self.woken.store(true, Ordering::Release);
    }
}

impl Wake for Watchers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// Serves one HTTP/1 connection over `io` (plain TCP or TLS) with
/// `service`, upgrades allowed, to its end under the phase deadlines (see
/// [`drive`]): `Some` when a deadline closed it. The socket reports its
/// reads to `phase`.
pub async fn serve_connection<IO, Svc>(
    http: &http1::Builder,
    io: IO,
    service: Svc,
    phase: &Phase,
    timeouts: ConnTimeouts,
    stopping: watch::Receiver<()>,
) -> Option<Lapse>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    Svc: EdgeService,
{
    let connection = http
        .serve_connection(TokioIo::new(Watched::new(io, phase.clone())), service)
        .with_upgrades();
    drive(connection, phase, timeouts, stopping).await
}
