//! Where each client connection is in its life, and the deadline that
//! applies there: waiting idle for the next request, reading a request
//! head, or busy with a request.
//!
//! Owns the per-connection [`Phase`], the socket wrapper that notices a
//! request head's first byte ([`Watched`]), the response body wrapper that
//! notices a request's end ([`Tracked`]) and the deadline arithmetic
//! ([`Phase::check`]). Never closes anything itself: the connection task
//! ([`drive`](crate::drive::drive)) asks [`Phase::check`] and drops the
//! connection when it says so.
//!
//! | phase | from | deadline |
//! | --- | --- | --- |
//! | waiting for the first request | accept (a TLS handshake included: it runs under the same deadline) | header read timeout (a client that connects and sends nothing is a slow client too) |
//! | idle between requests | the end of the previous response | keep-alive timeout |
//! | reading a head | the head's first byte | header read timeout |
//! | busy | the complete head, until the response body ended | none here (request bodies and workers have their own deadlines) |
//!
//! Why not hyper's own `header_read_timeout`: hyper arms it whenever it
//! waits for a head, which on a keep-alive connection includes the idle
//! time before the next request, so an idle timeout longer than the header
//! timeout could not exist. As in Go's `net/http`, the idle deadline runs
//! until a head's first byte arrives, and the header deadline from there.
//!
//! A phase with a [`Seat`] (see [`Phase::seated`]) also tells its
//! connection's roster when the connection goes idle (waiting for a head,
//! none of it read) and when it is active again, so the accept loop at
//! the cap can close the longest idle connection ([`roster`](crate::roster)).
//!
//! # Invariants
//!
//! - Every transition is observed by the connection task within
//!   `min(header, keep-alive)` of happening ([`Check::Wait`] never lies
//!   further ahead), so each deadline is enforced on time, without a wake-up
//!   per request.
//! - A request is busy from its head to the drop of its response body, so a
//!   long-polling request or a slow download is never cut as "idle".

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::roster::Seat;

/// The two deadlines the connection task enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnTimeouts {
    /// From accept, or from a head's first byte, to the complete head.
    pub header: Duration,
    /// From the end of a response to the first byte of the next request.
    pub keep_alive: Duration,
}

/// Why the edge closed a connection on its own: a deadline passed, or it
/// was idle at the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapse {
    /// A request head was not complete in time (or a new connection sent
    /// nothing).
    Header,
    /// A keep-alive connection stayed idle too long.
    Idle,
    /// The connection was the longest idle one when the accept loop, at the
    /// cap, needed room for a new one ([`roster`](crate::roster)).
    Reclaimed,
}

/// What the connection task should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Nothing lapsed: look again at this instant.
    Wait(Instant),
    /// Close the connection.
    Close(Lapse),
}

/// One connection's phase, shared by its socket, its requests and its task.
/// Cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct Phase {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// When the connection was accepted; marks are nanoseconds after it (a
    /// head's mark doubles as its request's start, see
    /// [`Phase::begin_request_at`]).
    epoch: Instant,
    /// Requests whose head arrived and whose response body has not ended.
    busy: AtomicU32,
    /// A byte arrived while no request was busy: a head is being read.
    head_started: AtomicBool,
    /// Whether any request completed its head on this connection.
    served: AtomicBool,
    /// Start of the current idle or head phase, ns after `epoch`.
    mark_ns: AtomicU64,
    /// Switched protocols: never idle again.
    upgraded: AtomicBool,
    /// The connection's place in its roster, when it has one.
    seat: Option<Seat>,
}

impl Phase {
    /// A connection accepted now: waiting for its first request.
    pub fn new() -> Self {
        Self::with_seat(None)
    }

    /// [`new`](Self::new), reporting to `seat` when the connection goes
    /// idle and when it is active again. The seat stays active until
    /// [`waiting`](Self::waiting).
    pub fn seated(seat: Seat) -> Self {
        Self::with_seat(Some(seat))
    }

    fn with_seat(seat: Option<Seat>) -> Self {
        Self {
            shared: Arc::new(Shared {
                epoch: Instant::now(),
                busy: AtomicU32::new(0),
                head_started: AtomicBool::new(false),
                served: AtomicBool::new(false),
                mark_ns: AtomicU64::new(0),
                upgraded: AtomicBool::new(false),
                seat,
            }),
        }
    }

    /// The connection is ready for its first head (accepted, handshake
    /// done): idle in its roster unless a head started already.
    pub fn waiting(&self) {
        let s = &self.shared;
        if let Some(seat) = &s.seat {
            if s.busy.load(Ordering::Acquire) == 0
                && !s.head_started.load(Ordering::Acquire)
                && !s.upgraded.load(Ordering::Acquire)
            {
                seat.idle(Instant::now());
            }
        }
    }

    /// The connection switched protocols (its answer was `101`): it is
    /// never idle again, so never closed to make room.
    pub fn upgraded(&self) {
        self.shared.upgraded.store(true, Ordering::Release);
        if let Some(seat) = &self.shared.seat {
            seat.active();
        }
    }

    /// The connection leaves its roster, still open: no longer counted
    /// under the cap, never closed to make room (see [`Seat::leave`]).
    pub fn leave_roster(&self) {
        if let Some(seat) = &self.shared.seat {
            seat.leave();
        }
    }

    /// Bytes of the next head are already buffered by the server (read
    /// with the previous request): a head is being read, as if its first
    /// byte had just arrived.
    pub fn head_buffered(&self) {
        self.on_read();
    }

    /// Ready once the accept loop asked this idle connection to close (see
    /// [`roster`](crate::roster)); never without a seat.
    pub fn poll_reclaimed(&self, cx: &mut Context<'_>) -> Poll<()> {
        match &self.shared.seat {
            Some(seat) => seat.poll_asked(cx),
            None => Poll::Pending,
        }
    }

    fn now_ns(&self) -> u64 {
        // In 64 bits (`as_nanos` is 128-bit arithmetic, twice a request).
        let elapsed = self.shared.epoch.elapsed();
        elapsed
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(elapsed.subsec_nanos()))
    }

    fn at(&self, ns: u64) -> Instant {
        self.shared.epoch + Duration::from_nanos(ns)
    }

    /// Bytes arrived from the client.
    fn on_read(&self) {
        let s = &self.shared;
        if s.busy.load(Ordering::Acquire) == 0 && !s.head_started.load(Ordering::Acquire) {
            s.mark_ns.store(self.now_ns(), Ordering::Release);
            s.head_started.store(true, Ordering::Release);
            if let Some(seat) = &s.seat {
                seat.active();
            }
        }
    }

    /// A complete request head arrived: busy until the returned guard drops
    /// (move it into the response body with [`Tracked`]).
    pub fn begin_request(&self) -> Busy {
        let s = &self.shared;
        s.busy.fetch_add(1, Ordering::AcqRel);
        s.head_started.store(false, Ordering::Release);
        self.served()
    }

    /// [`begin_request`](Self::begin_request), also answering when the
    /// head's first byte arrived, read from the mark the header deadline
    /// counts from (so a server can time the request without a clock read
    /// of its own). `None` when no mark was taken for this head: it arrived
    /// while another request on the connection was busy (pipelining).
    pub fn begin_request_at(&self) -> (Busy, Option<Instant>) {
        let s = &self.shared;
        s.busy.fetch_add(1, Ordering::AcqRel);
        let marked = s.head_started.swap(false, Ordering::AcqRel);
        let busy = self.served();
        (
            busy,
            marked.then(|| self.at(s.mark_ns.load(Ordering::Acquire))),
        )
    }

    /// The rest of beginning a request: the connection has served one,
    /// and is busy until the guard drops.
    fn served(&self) -> Busy {
        self.shared.served.store(true, Ordering::Release);
        // A pipelined head complete in the buffer had no byte of its own
        // read while idle.
        if let Some(seat) = &self.shared.seat {
            seat.active();
        }
        Busy {
            phase: self.clone(),
        }
    }

    /// Whether a deadline lapsed at `now`, or when to look again.
    pub fn check(&self, now: Instant, limits: ConnTimeouts) -> Check {
        let s = &self.shared;
        let look_again = now + limits.header.min(limits.keep_alive);
        if s.busy.load(Ordering::Acquire) > 0 {
            return Check::Wait(look_again);
        }
        let since = self.at(s.mark_ns.load(Ordering::Acquire));
        let (lapse, allowed) = if s.head_started.load(Ordering::Acquire) {
            (Lapse::Header, limits.header)
        } else if s.served.load(Ordering::Acquire) {
            (Lapse::Idle, limits.keep_alive)
        } else {
            (Lapse::Header, limits.header)
        };
        let deadline = since + allowed;
        if now >= deadline {
            Check::Close(lapse)
        } else {
            Check::Wait(deadline.min(look_again))
        }
    }
}

impl Default for Phase {
    fn default() -> Self {
        Self::new()
    }
}

/// A request in progress; dropping it ends the request (the connection
/// is idle from then on if no other request is busy).
#[derive(Debug)]
pub struct Busy {
    phase: Phase,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let s = &self.phase.shared;
        // Mark first: once `busy` reads zero the mark must be this one.
        if s.busy.load(Ordering::Acquire) == 1 {
            let now = self.phase.now_ns();
            s.mark_ns.store(now, Ordering::Release);
            if s.busy.fetch_sub(1, Ordering::AcqRel) == 1 && !s.upgraded.load(Ordering::Acquire) {
                if let Some(seat) = &s.seat {
                    seat.idle(self.phase.at(now));
                }
            }
            return;
        }
        s.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A client socket that reports arriving bytes to its [`Phase`].
#[derive(Debug)]
pub struct Watched<T> {
    inner: T,
    phase: Phase,
}

impl<T> Watched<T> {
    /// Wrap `inner`, reporting to `phase`.
    pub fn new(inner: T, phase: Phase) -> Self {
        Self { inner, phase }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.phase.on_read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request [`Busy`] until hyper has
    /// written it to the end (or dropped it).
    pub struct Tracked<B> {
        #[pin]
        body: B,
        busy: Option<Busy>,
    }
}

impl<B> Tracked<B> {
    /// `body`, ending `busy` when it is done.
    pub fn new(body: B, busy: Busy) -> Self {
        Self {
            body,
            busy: Some(busy),
        }
    }
}

impl<B: http_body::Body<Data = Bytes>> http_body::Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            this.busy.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ConnTimeouts = ConnTimeouts {
        header: Duration::from_millis(100),
        keep_alive: Duration::from_millis(1000),
    };

    #[tokio::test(start_paused = true)]
    async fn a_request_starts_at_its_heads_first_byte() {
        let phase = Phase::new();
        tokio::time::advance(Duration::from_millis(30)).await;
        phase.on_read();
        let first_byte = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        let (busy, head) = phase.begin_request_at();
        assert_eq!(head, Some(first_byte));
        // Bytes of a pipelined head arrive while the first is busy: no
        // mark of its own, so no start to answer.
        phase.on_read();
        let (second, head) = phase.begin_request_at();
        assert_eq!(head, None);
        drop((busy, second));
    }

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_deadline() {
        let phase = Phase::new();
        let start = Instant::now();
        // A new connection that sends nothing: the header deadline.
        assert_eq!(
            phase.check(start, LIMITS),
            Check::Wait(start + LIMITS.header)
        );
        assert_eq!(
            phase.check(start + LIMITS.header, LIMITS),
            Check::Close(Lapse::Header)
        );

        // Busy: never lapses, looked at again every header timeout.
        let busy = phase.begin_request();
        tokio::time::advance(Duration::from_secs(5)).await;
        let now = Instant::now();
        assert_eq!(phase.check(now, LIMITS), Check::Wait(now + LIMITS.header));

        // Idle after the response: the keep-alive deadline, from its end.
        drop(busy);
        let ended = Instant::now();
        assert!(matches!(phase.check(ended, LIMITS), Check::Wait(_)));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(matches!(
            phase.check(Instant::now(), LIMITS),
            Check::Wait(_)
        ));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            phase.check(Instant::now(), LIMITS),
            Check::Close(Lapse::Idle)
        );

        // A head's first byte switches to the header deadline from that byte.
        let phase = Phase::new();
        drop(phase.begin_request());
        tokio::time::advance(Duration::from_millis(500)).await;
        phase.on_read();
        let first_byte = Instant::now();
        assert_eq!(
            phase.check(first_byte, LIMITS),
            Check::Wait(first_byte + LIMITS.header)
        );
        tokio::time::advance(LIMITS.header).await;
        assert_eq!(
            phase.check(Instant::now(), LIMITS),
            Check::Close(Lapse::Header)
        );
    }
}
