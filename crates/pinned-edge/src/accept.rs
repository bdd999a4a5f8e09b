//! The accept loop both binaries run: accept under the connection cap
//! (closing the longest idle connection to admit a new one), hand each
//! connection to a lane, run its TLS handshake under the header deadline,
//! serve it with the binary's per-connection service, and drain on
//! shutdown (stop accepting, let open connections finish within the
//! shutdown deadline, then drop the rest).
//!
//! Owns sockets and connection tasks, never a request: what a connection
//! carries is the [`Connection`] a binary's [`Lane`] makes for it. Counts
//! nothing itself either: what a binary counts or logs it learns through
//! [`Events`].
//!
//! Two ways to run ([`Lanes`]): on the caller's runtime (the worker, whose
//! connections share the application's threads), or on I/O threads of
//! their own, each a single-threaded runtime, every connection handed to
//! the least loaded one and staying there (pinboard, as nginx's worker
//! processes: on a work-stealing runtime the same proxied exchange cost
//! about a fifth more CPU in `proxy-bench`, spent moving tasks and
//! wake-ups between threads). Handing connections out rather than letting
//! every thread accept keeps the threads evenly loaded when many arrive
//! at once.
//!
//! The TLS handshake runs in the connection's task: the connection
//! already counts against the cap, and the handshake must finish within
//! the header deadline counted from accept (a slow handshake is a slow
//! head: same deadline, same [`Lapse::Header`]).

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::backoff::{Acceptor, Admission};
use crate::drive::Watchers;
use crate::phase::{ConnTimeouts, Lapse, Phase};
use crate::roster::{Roster, Seat};
use crate::tls::{self, HandshakeError};
use crate::{cap, defaults};

/// Where connections are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lanes {
    /// On the caller's runtime, one lane.
    Caller,
    /// On `count` I/O threads (at least one), each a single-threaded
    /// runtime named `{name}-{index}`.
    Threads {
        /// How many.
        count: usize,
        /// The threads' name stem.
        name: &'static str,
    },
}

/// How [`serve`] accepts and drains.
#[derive(Clone)]
pub struct Settings {
    /// Where connections are served.
    pub lanes: Lanes,
    /// Header and keep-alive deadlines (the header deadline also bounds a
    /// TLS handshake).
    pub timeouts: ConnTimeouts,
    /// How long open connections may finish after the shutdown signal.
    pub shutdown_timeout: Duration,
    /// Most connections open at once, before the open-file limit lowers it
    /// ([`cap::effective`]).
    pub max_connections: usize,
    /// Serve TLS with this acceptor (`None`: plain TCP).
    pub tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("lanes", &self.lanes)
            .field("timeouts", &self.timeouts)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("max_connections", &self.max_connections)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// What a binary counts or logs about its connections; every method does
/// nothing unless overridden.
pub trait Events: Send + Sync + 'static {
    /// The open-file limit `fd_limit` carries only `max_connections` of
    /// the `configured` cap (logged by default: a warning when the
    /// operator chose the cap, debug for the default).
    fn cap_lowered(&self, configured: usize, fd_limit: Option<u64>, max_connections: usize) {
        if configured != defaults::MAX_CONNECTIONS {
            tracing::warn!(
                configured,
                open_file_limit = fd_limit,
                max_connections,
                "max_connections lowered to what the open-file limit carries (raise `ulimit -n` for more)"
            );
        } else {
            tracing::debug!(
                open_file_limit = fd_limit,
                max_connections,
                "max_connections lowered to what the open-file limit carries (the default; raise `ulimit -n` for more)"
            );
        }
    }
    /// An `accept` failed (the loop pauses as [`backoff`](crate::backoff)
    /// says).
    fn accept_failed(&self) {}
    /// A connection was closed at once: the cap was reached with no idle
    /// connection to close in its place.
    fn refused(&self) {}
    /// A TLS handshake failed (one that timed out is a
    /// [`lapsed`](Self::lapsed) header deadline).
    fn handshake_failed(&self, peer: SocketAddr, error: &io::Error) {
        let _ = (peer, error);
    }
    /// The edge closed a connection on its own: a deadline passed, or it
    /// was idle at the cap.
    fn lapsed(&self, peer: SocketAddr, lapse: Lapse) {
        let _ = (peer, lapse);
    }
}

/// One connection's service, made by its lane at accept
/// ([`Lane::connect`]): serves the socket to its end.
pub trait Connection: Send + 'static {
    /// Serves `io` (plain TCP or TLS) until it ends, under the phase
    /// deadlines ([`drive`](crate::drive)): `Some` when one closed it.
    /// `stopping` changes (or its sender drops) when the server stops: the
    /// connection then finishes the request in flight and ends.
    fn serve<IO>(
        self,
        io: IO,
        stopping: watch::Receiver<()>,
    ) -> impl Future<Output = Option<Lapse>> + Send
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static;
}

/// What serves the connections of one lane (one I/O thread, or the
/// caller's runtime): made once per lane, on its thread.
pub trait Lane {
    /// The per-connection service.
    type Conn: Connection;

    /// A connection from `peer` was accepted; `phase` tracks it (and holds
    /// its seat under the cap while any clone lives).
    fn connect(&mut self, peer: SocketAddr, phase: &Phase) -> Self::Conn;
}

/// A connection handed to a lane, with its seat in that lane's roster
/// (taken by the acceptor, so the cap counts it on the way).
struct Handed {
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    seat: Seat,
}

/// Serves `listener` until `shutdown` resolves, then gives every open
/// connection up to `settings.shutdown_timeout` to finish and drops the
/// rest. `make_lane` makes each lane's service, on the lane's thread,
/// with the lane's index.
///
/// At the cap ([`cap::effective`]) the connection that has idled longest
/// (waiting for a request head, none of it read, for at least
/// [`MIN_IDLE`](crate::backoff::MIN_IDLE)) is closed to admit the new one,
/// as nginx does with its keep-alive connections
/// ([`roster`](crate::roster): one roster per lane, the longest idle of
/// them all); with none such the new connection is accepted and closed at
/// once (the client sees the connection close before any answer). A
/// failing accept pauses the loop as [`backoff`](crate::backoff) says.
///
/// # Errors
///
/// When an I/O thread or its runtime cannot be started.
pub async fn serve<M, L, E>(
    listener: TcpListener,
    settings: Settings,
    make_lane: M,
    events: Arc<E>,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()>
where
    M: Fn(usize) -> L + Send + Sync + 'static,
    L: Lane + 'static,
    E: Events,
{
    let fd_limit = cap::open_file_limit();
    let max_connections = cap::effective(settings.max_connections, fd_limit);
    if max_connections < settings.max_connections {
        events.cap_lowered(settings.max_connections, fd_limit, max_connections);
    }
    let mut acceptor = Acceptor::new(max_connections);
    match settings.lanes {
        Lanes::Caller => {
            let (hand, handed) = mpsc::unbounded_channel();
            let roster = Roster::new();
            let rosters = [roster.clone()];
            let lane = lane_loop(
                handed,
                make_lane(0),
                roster,
                &settings,
                events.clone(),
                // Connections outliving the shutdown deadline are cancelled
                // (the runtime is the caller's: it goes on).
                Some(CancellationToken::new()),
            );
            let accept = accept_loop(
                &listener,
                &mut acceptor,
                &rosters,
                vec![hand],
                &*events,
                shutdown,
            );
            tokio::join!(lane, accept);
        }
        Lanes::Threads { count, name } => {
            let make_lane = Arc::new(make_lane);
            let mut lanes = Vec::new();
            let mut rosters = Vec::new();
            let mut finished = Vec::new();
            for index in 0..count.max(1) {
                let (hand, handed) = mpsc::unbounded_channel::<Handed>();
                let roster = Roster::new();
                let (make_lane, load) = (make_lane.clone(), roster.clone());
                let (settings, events) = (settings.clone(), events.clone());
                let (done, finished_rx) = tokio::sync::oneshot::channel();
                std::thread::Builder::new()
                    .name(format!("{name}-{index}"))
                    .spawn(move || {
                        let served = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .map(|runtime| {
                                runtime.block_on(async move {
                                    let lane = make_lane(index);
                                    lane_loop(handed, lane, load, &settings, events, None).await;
                                });
                                // Dropping the runtime drops every
                                // connection that outlived the shutdown
                                // deadline.
                            });
                        let _ = done.send(served);
                    })?;
                lanes.push(hand);
                rosters.push(roster);
                finished.push(finished_rx);
            }
            accept_loop(
                &listener,
                &mut acceptor,
                &rosters,
                lanes,
                &*events,
                shutdown,
            )
            .await;
            for thread in finished {
                if let Ok(Err(error)) = thread.await {
                    tracing::error!(error = %crate::logging::Chain(&error), "an I/O thread failed");
                }
            }
        }
    }
    drop(listener);
    Ok(())
}

/// Accepts until `shutdown`, handing each admitted connection to the lane
/// with the fewest open; closes the lanes when it returns.
async fn accept_loop(
    listener: &TcpListener,
    acceptor: &mut Acceptor,
    rosters: &[Arc<Roster>],
    lanes: Vec<mpsc::UnboundedSender<Handed>>,
    events: &dyn Events,
    shutdown: impl Future<Output = ()> + Send,
) {
    tokio::pin!(shutdown);
    let failed = || events.accept_failed();
    while let Some((tcp, peer)) = acceptor.next(listener, &mut shutdown, failed).await {
        if acceptor.admit(rosters) == Admission::Refused {
            // Closed before any byte: the client sees the connection end.
            drop(tcp);
            events.refused();
            continue;
        }
        // Small request/response exchanges must not wait on Nagle's
        // algorithm.
        let _ = tcp.set_nodelay(true);
        let Ok(tcp) = tcp.into_std() else { continue };
        let lane = lanes
            .iter()
            .zip(rosters)
            .min_by_key(|(_, roster)| roster.open());
        if let Some((hand, roster)) = lane {
            // A failed send drops the seat with the connection.
            let _ = hand.send(Handed {
                tcp,
                peer,
                seat: roster.seat(),
            });
        }
    }
    // Dropping `lanes` closes them: each lane finishes its connections.
    drop(lanes);
}

/// One lane: serves the connections handed to it until accepting stops,
/// then waits up to the shutdown deadline for them to finish. `roster`
/// holds its live connections, for the acceptor's choice and the cap;
/// `abort`, when given, cancels what is left at the deadline.
async fn lane_loop<L: Lane, E: Events>(
    mut handed: mpsc::UnboundedReceiver<Handed>,
    mut lane: L,
    roster: Arc<Roster>,
    settings: &Settings,
    events: Arc<E>,
    abort: Option<CancellationToken>,
) {
    // Every connection holds a receiver: a send asks them to finish, and
    // `closed` resolves once the last one dropped its receiver.
    let (stop, stopping) = watch::channel(());
    while let Some(Handed { tcp, peer, seat }) = handed.recv().await {
        let tcp = match TcpStream::from_std(tcp) {
            Ok(tcp) => tcp,
            Err(error) => {
                tracing::warn!(error = %crate::logging::Chain(&error), "cannot adopt a connection");
                continue;
            }
        };
        let phase = Phase::seated(seat);
        let conn = lane.connect(peer, &phase);
        let (stopping, events) = (stopping.clone(), events.clone());
        let (tls, timeouts) = (settings.tls.clone(), settings.timeouts);
        let task = async move {
            let lapse = match tls {
                None => conn.serve(tcp, stopping).await,
                // The header deadline counts from accept, handshake included.
                Some(acceptor) => match tls::accept(&acceptor, tcp, timeouts.header).await {
                    Ok(tls) => conn.serve(tls, stopping).await,
                    Err(HandshakeError::TimedOut(_)) => Some(Lapse::Header),
                    Err(HandshakeError::Failed(error)) => {
                        events.handshake_failed(peer, &error);
                        None
                    }
                },
            };
            if let Some(lapse) = lapse {
                events.lapsed(peer, lapse);
            }
            drop(phase);
        };
        match &abort {
            None => {
                tokio::spawn(task);
            }
            Some(abort) => {
                let aborted = abort.clone().cancelled_owned();
                tokio::spawn(async move {
                    // The connection is what wakes this task, once or more
                    // per request: the abort is polled only when it woke
                    // the task (see `Watchers`).
                    let (mut task, mut aborted) = (pin!(task), pin!(aborted));
                    let (watchers, waker) = Watchers::new();
                    poll_fn(|cx| {
                        if task.as_mut().poll(cx).is_ready() {
                            return Poll::Ready(());
                        }
                        if watchers.fired(cx) {
                            return aborted.as_mut().poll(&mut Context::from_waker(&waker));
                        }
                        Poll::Pending
                    })
                    .await;
                });
            }
        }
    }
    drop(stopping);
    let _ = stop.send(());
    let left = roster.open();
    if tokio::time::timeout(settings.shutdown_timeout, stop.closed())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = roster.open(),
            open_at_signal = left,
            "shutdown deadline passed; dropping the connections still open"
        );
        if let Some(abort) = abort {
            abort.cancel();
        }
    }
}
