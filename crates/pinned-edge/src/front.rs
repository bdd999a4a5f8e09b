//! The HTTP/1.1 server both binaries put before hyper: a connection's
//! simple requests are read, served and answered by this loop on the
//! connection's own task, with the shared codec ([`h1`](crate::h1)); the
//! first request it does not take hands the connection to hyper, which
//! serves the rest of it.
//!
//! Owns a client connection from its first byte until it ends or is
//! handed over: the read buffer and its bounds, the request body's read
//! deadline, the keep-alive decision, and the two stages
//! ([`serve_connection`]: this loop, then hyper, each under the
//! [`drive`](crate::drive) deadlines). Never decides what a request means
//! or answers it: the binary's [`Service`] does, for every request this
//! loop reads.
//!
//! Takes a request ([`sort`]) when it is HTTP/1.1 in origin form, with no
//! body or a single `Content-Length` one of at most
//! [`Limits::max_body`] bytes, asks for no upgrade and no
//! `100 Continue`, and its path is one the service takes
//! ([`Service::takes`]). Anything else (upgrades, chunked or larger
//! bodies, `Expect`, HTTP/1.0, a malformed or oversized head) goes to
//! hyper with the bytes already read put back ([`Rewind`]), and hyper
//! serves it (or answers 400 and 431) exactly as it would have from the
//! first byte.
//!
//! Why not hyper for every request: its server drives each request's
//! future from a dispatcher that moves it into its state once per request
//! and polls it through layers of state machines; here the service's
//! future lives in this task's own state and the answer goes out in one
//! write. On pinboard's proxied request hyper cost about 3 300
//! instructions more than this loop (`proxy-bench`); on the worker's warm
//! request about 1 650 (`worker-bench`: 22 301 served by hyper, 20 652 by
//! the front).

pub mod sort;

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::drive::{drive, drive_to_end, Driven, EdgeService, GracefulShutdown};
use crate::h1::head::{lower_minor_version, parse_request, Fields};
use crate::h1::rewind::Rewind;
use crate::h1::write::{self, After, Asked};
use crate::phase::{ConnTimeouts, Lapse, Phase, Watched};

/// How much room a read asks for.
const READ_ROOM: usize = 8 * 1024;

/// The bounds the front reads under.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request head (hyper answers 431 to a larger one).
    pub max_head: usize,
    /// Largest body the front reads itself; a larger one goes to hyper,
    /// streamed.
    pub max_body: usize,
    /// Time to read a body whole, from its head.
    pub body_timeout: Duration,
    /// What a body that broke off or did not arrive in time becomes.
    pub broken_body: BrokenBody,
    /// What a client closing its connection while its request is served
    /// does to the request.
    pub client_gone: ClientGone,
}

/// What the front does when the client closes its connection while its
/// request is being served (before the answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientGone {
    /// The request goes on to its answer, whose write then fails
    /// (pinboard: the proxied request finishes within its own deadlines).
    Finish,
    /// The request's future is dropped and the connection closed, as
    /// hyper's server does when it reads the end of the stream with a
    /// request in flight (the worker: a handler waiting for a client that
    /// left stops waiting). Bytes of a pipelined request that arrive
    /// meanwhile are kept, and from then on the end is not looked for, as
    /// in hyper.
    Cancel,
}

/// What the front does with a request whose body broke off (the client
/// closed) or was not whole within [`Limits::body_timeout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokenBody {
    /// Hands the request to the service with the [`BodyFault`] as its
    /// body, and closes the connection after the answer (pinboard: 400 or
    /// 408 from the proxy, no worker reached).
    Answer,
    /// Hands the connection to hyper with the head and the body's bytes so
    /// far put back: the application sees the request as hyper always
    /// served it, its body streamed (the worker: a handler decides what a
    /// slow upload means).
    HandOff,
}

/// What went wrong with a client's request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyFault {
    /// The client's body broke off or was malformed (bad chunked
    /// encoding, a connection closed early). 400.
    #[error("request body could not be read")]
    Unreadable,
    /// The client stopped sending its body. 408.
    #[error("request body not received in time")]
    TimedOut,
}

impl BodyFault {
    /// The status this fault is answered with.
    pub fn status(self) -> http::StatusCode {
        match self {
            Self::Unreadable => http::StatusCode::BAD_REQUEST,
            Self::TimedOut => http::StatusCode::REQUEST_TIMEOUT,
        }
    }
}

/// A request the front read, as its [`Service`] gets it.
#[derive(Debug)]
pub struct Arrived {
    /// Its head, every value sharing the bytes read.
    pub head: http::request::Parts,
    /// Its body (`None`: it has none), or why it was not read whole (only
    /// with [`BrokenBody::Answer`]).
    pub body: Result<Option<Bytes>, BodyFault>,
    /// How many `Host` lines it had (RFC 9112 §3.2 wants exactly one; the
    /// front does not check, a service that cares does, without a second
    /// look at the fields).
    pub hosts: u32,
}

/// What a binary serves the front's requests with: one per connection,
/// its future kept in the connection task's own state.
pub trait Service: Send {
    /// The response body.
    type Body: http_body::Body<Data = Bytes> + Send;

    /// Whether the front serves a request for `path` (its other checks
    /// passed); `false` hands the connection to hyper from this request
    /// on. Every path by default.
    fn takes(&self, path: &str) -> bool {
        let _ = path;
        true
    }

    /// Answers `request`.
    fn call(&mut self, request: Arrived)
        -> impl Future<Output = http::Response<Self::Body>> + Send;
}

/// How the front's part of a connection ended.
#[derive(Debug)]
pub enum Ended<IO> {
    /// The connection is done (closed by either side, or finished after a
    /// stop).
    Closed,
    /// hyper serves the rest: the socket, reporting its reads to the
    /// connection's phase from here on, with what the front had read of it
    /// put back.
    HandOff(Rewind<Watched<IO>>),
}

pin_project_lite::pin_project! {
    /// The front's connection future, with the flag a graceful stop sets
    /// (see [`GracefulShutdown`]).
    pub struct Served<F> {
        #[pin]
        run: F,
        stop: Arc<AtomicBool>,
    }
}

impl<F> Served<F> {
    /// `run` (from [`serve`]), stopped through `stop`.
    pub fn new(run: F, stop: Arc<AtomicBool>) -> Self {
        Self { run, stop }
    }
}

impl<F: Future> Future for Served<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().run.poll(cx)
    }
}

impl<F> GracefulShutdown for Served<F> {
    /// Finishes the request in flight (answered with `Connection: close`);
    /// an idle connection ends at its next poll, which the driver makes
    /// right after asking.
    fn shutdown_gracefully(self: Pin<&mut Self>) {
        self.stop.store(true, Ordering::Release);
    }
}

/// What one connection's two stages share (see [`serve_connection`]).
#[derive(Debug)]
pub struct Stages<'a> {
    /// hyper's server, for the stage after the front.
    pub http: &'a http1::Builder,
    /// The connection's phase.
    pub phase: Phase,
    /// Header and keep-alive deadlines.
    pub timeouts: ConnTimeouts,
    /// The front's bounds.
    pub limits: Limits,
}

/// Serves `io` (plain TCP or TLS) to its end: the front with `front`
/// first, then, if it hands the connection over, hyper with `rest` (upgrades
/// allowed), each under the phase deadlines (see [`drive`]): `Some` when a
/// deadline closed it. `stopping` as [`drive`]'s: a stop the front saw is
/// passed on to hyper.
pub async fn serve_connection<IO, F, H>(
    stages: Stages<'_>,
    io: IO,
    front: F,
    rest: H,
    mut stopping: watch::Receiver<()>,
) -> Option<Lapse>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Service,
    H: EdgeService,
{
    let Stages {
        http,
        phase,
        timeouts,
        limits,
    } = stages;
    let stop = Arc::new(AtomicBool::new(false));
    let run = serve(io, front, phase.clone(), stop.clone(), limits);
    let handed = match drive_to_end(
        Served::new(run, stop.clone()),
        &phase,
        timeouts,
        &mut stopping,
    )
    .await
    {
        Driven::Lapsed(lapse) => return Some(lapse),
        Driven::Ended(Ended::Closed) => return None,
        Driven::Ended(Ended::HandOff(handed)) => handed,
    };
    let connection = http
        .serve_connection(TokioIo::new(handed), rest)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    // A stop the front saw is not seen again by `stopping`.
    if stop.load(Ordering::Acquire) {
        connection.as_mut().graceful_shutdown();
    }
    drive(connection, &phase, timeouts, stopping).await
}

/// Serves `io`'s requests with `service` until the connection ends or a
/// request the front leaves to hyper arrives (see the module doc). `stop`
/// asks it to finish (see [`Served`]); `phase` learns where each head and
/// each request starts and ends, from this loop rather than from every
/// read of the socket: a head read whole at once takes no clock read and
/// no roster update of its own (about 170 instructions a request,
/// `worker-bench`).
pub async fn serve<IO, S>(
    mut io: IO,
    mut service: S,
    phase: Phase,
    stop: Arc<AtomicBool>,
    limits: Limits,
) -> Ended<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service,
{
    let mut buf = BytesMut::with_capacity(READ_ROOM);
    let mut out = Vec::with_capacity(1024);
    let mut fields = Fields::default();
    // The last response's field map: the next head's fields go into it
    // (emptied first).
    let mut spare = http::HeaderMap::new();
    loop {
        // How much of the buffer the last parse of this head saw.
        let mut seen = 0;
        let line = loop {
            // A head can only end with a newline: bytes dripped in without
            // one are not parsed again from the start (a slow client must
            // not cost a parse of the whole head per byte).
            let fresh = &buf[seen..];
            if !fresh.is_empty() && (seen == 0 || fresh.contains(&b'\n')) {
                match parse_request(&buf, &mut fields) {
                    Ok(Some(line)) if line.len <= limits.max_head => break line,
                    // `HTTP/1.2` and up are HTTP/1.1 to us (RFC 9112 §2.3),
                    // where httparse (and hyper) refuse them: parse again.
                    Err(_) if lower_minor_version(&mut buf) => continue,
                    // hyper answers what the front will not: 431 to a head
                    // over the limit, 400 to a malformed one.
                    Ok(Some(_)) | Err(_) => {
                        return Ended::HandOff(handed(buf.freeze(), io, phase));
                    }
                    Ok(None) => {}
                }
            }
            seen = buf.len();
            if !buf.is_empty() {
                // Part of a head: its header deadline runs, and the
                // connection is not idle.
                phase.head_buffered();
            }
            if buf.len() >= limits.max_head {
                return Ended::HandOff(handed(buf.freeze(), io, phase));
            }
            let read = poll_fn(|cx| {
                if buf.is_empty() && stop.load(Ordering::Acquire) {
                    return Poll::Ready(Ok(0));
                }
                fill(&mut io, cx, &mut buf)
            })
            .await;
            if !matches!(read, Ok(n) if n > 0) {
                return Ended::Closed;
            }
        };
        let head = buf.split_to(line.len).freeze();
        let taken = std::mem::take(&mut spare);
        let Some(own) = sort::sort(&head, &line, &fields, limits.max_body, taken, |path| {
            service.takes(path)
        }) else {
            return Ended::HandOff(handed(rejoin(&head, &buf), io, phase));
        };
        let busy = phase.begin_request();
        let asked = Asked {
            head_only: own.head.method == http::Method::HEAD,
            trailers: own.trailers,
        };
        let mut close = own.close;
        let body = match read_body(&mut io, &mut buf, own.body_len, limits.body_timeout).await {
            Ok(body) => Ok(body),
            Err(_) if limits.broken_body == BrokenBody::HandOff => {
                // hyper serves this request from its head, as it would have
                // from the start; the connection is idle until it does.
                drop(busy);
                return Ended::HandOff(handed(rejoin(&head, &buf), io, phase));
            }
            Err(fault) => {
                close = true;
                Err(fault)
            }
        };
        let arrived = Arrived {
            head: own.head,
            body,
            hosts: own.hosts,
        };
        // Pinned where it is made: the service's future (pinboard's proxy
        // is some 5 KB) is never moved, moving it cost about 600
        // instructions a request (`proxy-bench`'s pinboard count).
        let answer = std::pin::pin!(service.call(arrived));
        let res = if limits.client_gone == ClientGone::Cancel {
            match answered_unless_gone(answer, &mut io, &mut buf).await {
                Some(res) => res,
                // The request's future is dropped, as hyper drops it.
                None => return Ended::Closed,
            }
        } else {
            answer.await
        };
        close |= stop.load(Ordering::Acquire);
        let (after, kept) = write::response_keeping(&mut io, &mut out, res, asked, close).await;
        spare = kept;
        drop(busy);
        if after == After::Close {
            let _ = io.shutdown().await;
            return Ended::Closed;
        }
        if !buf.is_empty() {
            // A pipelined head read with this request: its header deadline
            // runs, and it is not idle (never closed to make room).
            phase.head_buffered();
        }
    }
}

/// `answer`, unless the client closes the connection first (`None`): while
/// the answer is pending and nothing is buffered, the socket is read, and
/// its end (or an error) ends the wait; bytes that arrive are kept in
/// `buf`.
async fn answered_unless_gone<F, IO>(
    mut answer: Pin<&mut F>,
    io: &mut IO,
    buf: &mut BytesMut,
) -> Option<F::Output>
where
    F: Future,
    IO: AsyncRead + Unpin,
{
    poll_fn(|cx| {
        if let Poll::Ready(res) = answer.as_mut().poll(cx) {
            return Poll::Ready(Some(res));
        }
        if buf.is_empty() {
            match fill(io, cx, buf) {
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(None),
                Poll::Ready(Ok(_)) | Poll::Pending => {}
            }
        }
        Poll::Pending
    })
    .await
}

/// The socket handed to hyper with `read` put back before it, its reads
/// reported to `phase` from now on.
fn handed<IO>(read: Bytes, io: IO, phase: Phase) -> Rewind<Watched<IO>> {
    Rewind::new(read, Watched::new(io, phase))
}

/// A head split off the buffer and what followed it, as one run of bytes
/// again (for hyper).
fn rejoin(head: &Bytes, rest: &BytesMut) -> Bytes {
    let mut again = BytesMut::with_capacity(head.len() + rest.len());
    again.extend_from_slice(head);
    again.extend_from_slice(rest);
    again.freeze()
}

/// Reads what the socket has into `buf` (0 at its end).
fn fill<IO: AsyncRead + Unpin>(
    io: &mut IO,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    if buf.capacity() - buf.len() < READ_ROOM / 4 {
        buf.reserve(READ_ROOM);
    }
    tokio_util::io::poll_read_buf(Pin::new(io), cx, buf)
}

/// The request's body of `len` bytes, read whole within `timeout` (`None`
/// for no body). On a fault, what was read stays in `buf`.
async fn read_body<IO: AsyncRead + Unpin>(
    io: &mut IO,
    buf: &mut BytesMut,
    len: usize,
    timeout: Duration,
) -> Result<Option<Bytes>, BodyFault> {
    if len == 0 {
        return Ok(None);
    }
    if buf.len() < len {
        buf.reserve(len - buf.len());
        let rest = async {
            while buf.len() < len {
                match poll_fn(|cx| fill(io, cx, buf)).await {
                    Ok(n) if n > 0 => {}
                    _ => return Err(BodyFault::Unreadable),
                }
            }
            Ok(())
        };
        match tokio::time::timeout(timeout, rest).await {
            Ok(read) => read?,
            Err(_) => return Err(BodyFault::TimedOut),
        }
    }
    Ok(Some(buf.split_to(len).freeze()))
}
