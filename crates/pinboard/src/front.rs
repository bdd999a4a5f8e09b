//! pinboard's own HTTP/1.1 server for proxied requests: read a head, read
//! a buffered body, run the proxy, write the answer, on the connection's
//! own task.
//!
//! Owns a client connection from its first byte until it ends or is
//! handed to hyper, the read buffer and its bounds, the body's read
//! deadline and the keep-alive decision. The proxy's logic is
//! [`proxy::serve`]'s, unchanged; the deadlines between requests are the
//! edge's ([`phase`](crate::accept::phase), enforced by the accept loop's
//! [`drive_to_end`](pinned_edge::drive::drive_to_end) around this task).
//!
//! Never answers a head it did not sort as its own ([`head::sort`]):
//! anything else (pinboard's own paths, upgrades, chunked or large bodies,
//! `Expect`, HTTP/1.0, a malformed or oversized head) goes to hyper with
//! the bytes already read put back ([`Rewind`]), and hyper serves the rest
//! of that connection as it always did. Proxied traffic from a keep-alive
//! client never leaves this loop.
//!
//! Why not hyper here: its server drives the request future from a
//! dispatcher that moves it (5.4 KB) into its state once per request and
//! polls through layers of state machines; on a proxied request that was
//! about a third of what pinboard spent over nginx. Here the proxy's future
//! lives in this task's own state and the answer goes out in one write.

pub mod head;

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::Request;
use pinned_edge::drive::GracefulShutdown;
use pinned_edge::phase::Phase;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::app::App;
use crate::placement::PlacementStore;
use crate::proxy::body::BodyFault;
use crate::proxy::{self, ClientAddr, Inbound, ProxyError};
use pinned_edge::h1::head::{lower_minor_version, parse_request, Fields};
use pinned_edge::h1::rewind::Rewind;
use pinned_edge::h1::write::{self, After, Asked};

/// How much room a read asks for.
const READ_ROOM: usize = 8 * 1024;

/// The bounds the front reads under.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request head (`--max-header-bytes`; hyper answers 431 to a
    /// larger one).
    pub max_head: usize,
    /// Largest body the front reads itself (`--retry-body-limit`: the
    /// proxy buffers bodies up to it anyway).
    pub max_body: usize,
    /// Time to read a body whole (`--body-timeout-ms`).
    pub body_timeout: Duration,
}

/// How the front's part of a connection ended.
#[derive(Debug)]
pub enum Ended<IO> {
    /// The connection is done (closed by either side, or finished after a
    /// stop).
    Closed,
    /// hyper serves the rest: the socket, with what the front had read of
    /// it put back.
    HandOff(Rewind<IO>),
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

/// Serves `io`'s requests until the connection ends or a request the
/// front leaves to hyper arrives (see the module doc). `stop` asks it to
/// finish (see [`Served`]); `phase` learns where each request starts and
/// ends. The socket must report its reads to `phase` (it is the edge's
/// `Watched`).
pub async fn serve<IO, S>(
    mut io: IO,
    app: Arc<App<S>>,
    client: Arc<ClientAddr>,
    phase: Phase,
    stop: Arc<AtomicBool>,
    limits: Limits,
) -> Ended<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: PlacementStore,
{
    let mut buf = BytesMut::with_capacity(READ_ROOM);
    let mut out = Vec::with_capacity(1024);
    let mut fields = Fields::default();
    // The deadline of each request's answer from its worker, reset per
    // request (see `proxy::send::await_head`).
    let mut head_timer = std::pin::pin!(tokio::time::sleep(limits.body_timeout));
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
                        return Ended::HandOff(Rewind::new(buf.freeze(), io));
                    }
                    Ok(None) => {}
                }
            }
            seen = buf.len();
            if buf.len() >= limits.max_head {
                return Ended::HandOff(Rewind::new(buf.freeze(), io));
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
        let own = match head::sort(&head, &line, &fields, limits.max_body) {
            Some(own) => own,
            None => {
                let mut again = BytesMut::with_capacity(head.len() + buf.len());
                again.extend_from_slice(&head);
                again.extend_from_slice(&buf);
                return Ended::HandOff(Rewind::new(again.freeze(), io));
            }
        };
        let busy = phase.begin_request();
        let asked = Asked {
            head_only: own.head.method == http::Method::HEAD,
            trailers: own.trailers,
        };
        let mut close = own.close;
        let read = read_body(&mut io, &mut buf, own.body_len, limits.body_timeout).await;
        let inbound = match (read, own.host) {
            (Ok(_), Err(bad_host)) => Inbound::Refused(ProxyError::bad_host(bad_host)),
            (Ok(body), Ok(())) => {
                let body = match body {
                    Some(bytes) => Body::from(bytes),
                    None => Body::empty(),
                };
                Inbound::HostChecked(Request::from_parts(own.head, body))
            }
            (Err(fault), _) => {
                close = true;
                Inbound::Refused(ProxyError::client_body(fault))
            }
        };
        let res = proxy::serve(&app, Some(&client), inbound, Some(head_timer.as_mut())).await;
        close |= stop.load(Ordering::Acquire);
        let after = write::response(&mut io, &mut out, res, asked, close).await;
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
/// for no body).
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
