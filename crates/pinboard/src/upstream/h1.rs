//! A small HTTP/1.1 client for the proxy's hot path: a buffered request
//! out, a response head in, the body relayed as it arrives, on a keep-alive
//! connection that the request's own task drives.
//!
//! Owns one exchange on a connection (the request written, the response
//! head and body read with the shared codec, [`pinned_edge::h1`]) and when
//! a connection may carry another request. Never
//! decides where to send or what to do with an answer, never speaks TLS
//! and never switches protocols: `https://` workers, upgrades and streamed
//! request bodies go through hyper's client ([`super::Pool`] chooses).
//!
//! Why not hyper's client here: hyper drives each connection from a task
//! of its own and hands requests and responses across channels, which cost
//! about a third of pinboard's instructions per proxied request
//! (`proxy-bench`). Here the
//! request's task writes and reads the socket itself, and a response whose
//! body is already in the read buffer (most are) gives its connection back
//! to the pool before the client has read a byte of it.
//!
//! Bounds: a response head of at most [`MAX_HEAD`] bytes and
//! [`MAX_FIELDS`](head::MAX_FIELDS) fields, the codec's bounds on chunk
//! lines and trailers, data frames of at most what one read returned. A connection is
//! reused only after a complete, keep-alive HTTP/1.1 response with nothing
//! after it.
//!
//! Framing is read as strictly as hyper and nginx read it (see
//! [`pinned_edge::h1::body`]); the chunk framing already read with the head
//! is checked before the head is handed on, so bad framing there is a 502
//! rather than a cut body.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{header, Method, Response};
use http_body::{Frame, SizeHint};
use pinned_edge::h1::body::{self, BodyError, Decoder, Step};
use pinned_edge::h1::framing::Framing;
use pinned_edge::h1::head::{self, Fields, ResponseError, ResponseHead};
use pinned_edge::h1::write;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{Pool, Stamp};

/// Largest response head (status line and fields) accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// How much room a read asks for.
const READ_ROOM: usize = 8 * 1024;
/// A request body up to this size is written with its head in one write.
const COALESCE_BODY: usize = 16 * 1024;

/// Why an exchange failed after its connection was open.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// Reading or writing the socket failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The worker closed the connection before the response was complete.
    #[error("connection closed before the response was complete")]
    Closed,
    /// The response head exceeded [`MAX_HEAD`] or
    /// [`MAX_FIELDS`](head::MAX_FIELDS), or the trailers their bounds.
    #[error("response head too large")]
    HeadTooLarge,
    /// The response was not valid HTTP/1.1.
    #[error("malformed response: {0}")]
    Malformed(&'static str),
}

impl From<ResponseError> for ExchangeError {
    fn from(error: ResponseError) -> Self {
        match error {
            ResponseError::TooLarge => Self::HeadTooLarge,
            ResponseError::Malformed(what) => Self::Malformed(what),
        }
    }
}

impl From<BodyError> for ExchangeError {
    fn from(error: BodyError) -> Self {
        match error {
            BodyError::Closed => Self::Closed,
            BodyError::TooLarge => Self::HeadTooLarge,
            BodyError::Malformed(what) => Self::Malformed(what),
        }
    }
}

/// How far an exchange got before it failed: what sending the request
/// again could repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// The request could not be written: nothing reached the worker.
    Nothing,
    /// The request was written (or part of it) and the connection ended
    /// (closed or reset) before a byte of an answer: the keep-alive race of
    /// a connection the worker closed as it was reused, or a worker that
    /// died on it.
    NoAnswer,
    /// Part of an answer arrived, or the answer was invalid: the worker
    /// took the request.
    Answer,
}

/// One keep-alive connection to a worker, with its read buffer and its
/// reusable write buffer.
#[derive(Debug)]
pub struct Conn {
    io: TcpStream,
    read: BytesMut,
    write: Vec<u8>,
    fields: Fields,
}

impl Conn {
    /// A connection over `io` (connected, `TCP_NODELAY` set by the
    /// caller), boxed once for its life: the response body holds it, and
    /// is moved several times a request. Held inline, it made pinboard's
    /// proxied request about 800 instructions dearer (`proxy-bench`:
    /// 21 868 inline, 21 043 boxed, nginx 20 735).
    pub fn new(io: TcpStream) -> Box<Self> {
        Box::new(Self {
            io,
            read: BytesMut::with_capacity(READ_ROOM),
            write: Vec::with_capacity(1024),
            fields: Fields::default(),
        })
    }

    /// Whether an idle connection can carry another request: nothing is
    /// buffered, and the worker has neither closed it nor sent anything
    /// unasked (one non-blocking read finds nothing to read). The read is
    /// a syscall only when the socket turned readable since its last read
    /// drained it (tokio's readiness, kept by `poll_fill`), so a worker's
    /// close is seen once the runtime has taken its event.
    pub fn is_reusable(&self) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Reads what the socket has into the read buffer: the byte count, 0
    /// at end of stream.
    ///
    /// Through tokio's `poll_read`, which takes a read that left room in
    /// the buffer as proof the socket is drained and forgets its
    /// readiness: the next [`is_reusable`](Self::is_reusable) then answers
    /// from that readiness without a syscall. A read that kept the
    /// readiness would cost every reuse a `recvfrom` answering `EAGAIN`,
    /// three reads a proxied request where nginx makes two.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < READ_ROOM / 4 {
            self.read.reserve(READ_ROOM);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read)
    }

    /// Writes the request and reads its response head. The body comes
    /// from [`RawBody`]; `pool` gets the connection back when the response
    /// has been read whole and the worker keeps the connection open.
    ///
    /// # Errors
    ///
    /// [`ExchangeError`], with how far the exchange got ([`Reached`]).
    pub async fn exchange(
        mut self: Box<Self>,
        head: &http::request::Parts,
        stamp: &Stamp<'_>,
        body: &Bytes,
        pool: &Arc<Pool>,
    ) -> Result<Response<RawBody>, (Reached, ExchangeError)> {
        encode(head, stamp, body.len(), &mut self.write);
        let coalesce = body.len() <= COALESCE_BODY;
        if coalesce {
            self.write.extend_from_slice(body);
        }
        if let Err(e) = self.io.write_all(&self.write).await {
            return Err((Reached::Nothing, e.into()));
        }
        if !coalesce {
            // Part of the request went out, and nothing of an answer came.
            if let Err(e) = self.io.write_all(body).await {
                return Err((Reached::NoAnswer, e.into()));
            }
        }
        let head_only = head.method == Method::HEAD;
        let mut interim = 0;
        // Until a byte of an answer arrives, a connection that ends is the
        // keep-alive race or a dead worker (see `Reached::NoAnswer`).
        let mut reached = Reached::NoAnswer;
        let parsed = loop {
            match head::response_head(
                &mut self.read,
                &mut self.fields,
                head_only,
                &mut interim,
                MAX_HEAD,
            ) {
                Ok(Some(parsed)) => break parsed,
                Ok(None) => {}
                Err(e) => return Err((Reached::Answer, e.into())),
            }
            if self.read.len() >= MAX_HEAD {
                return Err((Reached::Answer, ExchangeError::HeadTooLarge));
            }
            match std::future::poll_fn(|cx| self.poll_fill(cx)).await {
                Ok(0) => return Err((reached, ExchangeError::Closed)),
                Ok(_) => reached = Reached::Answer,
                Err(e) => return Err((reached, e.into())),
            }
        };
        let ResponseHead {
            response,
            framing,
            keep_alive,
        } = parsed;
        if framing == Framing::Chunked {
            body::check_chunks(&self.read).map_err(|e| (Reached::Answer, e.into()))?;
        }
        let home = keep_alive.then(|| pool.clone());
        let body = RawBody::start(self, framing, home);
        Ok(response.map(|()| body))
    }
}

/// The request head: origin-form target, the headers as given (but any
/// `Content-Length`: the body's own length is written instead; and any
/// `Host`: the stamp's is), then `stamp`'s fields.
fn encode(head: &http::request::Parts, stamp: &Stamp<'_>, body_len: usize, out: &mut Vec<u8>) {
    let target = head.uri.path_and_query().map_or("/", |pq| pq.as_str());
    write::request_line(out, &head.method, target);
    write::fields(out, &head.headers, |name| {
        name == header::CONTENT_LENGTH || name == header::HOST
    });
    stamp.write(out);
    write::request_end(out, &head.method, body_len);
}

/// Where a [`RawBody`] is.
#[derive(Debug)]
enum State {
    /// The whole body, already read (the connection went home).
    Whole(Option<Bytes>),
    /// Read off the connection as it arrives.
    Reading(Decoder),
}

/// A worker's response body read off a [`Conn`]; the connection goes back
/// to its pool when the body ended cleanly with nothing after it, and is
/// closed otherwise (dropped early included).
#[derive(Debug)]
pub struct RawBody {
    state: State,
    conn: Option<Box<Conn>>,
    home: Option<Arc<Pool>>,
}

impl RawBody {
    fn start(mut conn: Box<Conn>, framing: Framing, home: Option<Arc<Pool>>) -> Self {
        let state = match framing {
            Framing::Empty => State::Whole(None),
            // The common case: the whole body came with the head.
            Framing::Fixed(n) if conn.read.len() as u64 == n => {
                State::Whole((n > 0).then(|| conn.read.split().freeze()))
            }
            framing => State::Reading(Decoder::new(framing)),
        };
        let mut body = Self {
            state,
            conn: Some(conn),
            home,
        };
        if matches!(body.state, State::Whole(_)) {
            body.release();
        }
        body
    }

    /// The body ended cleanly: the connection goes home if it may.
    fn release(&mut self) {
        if let (Some(conn), Some(pool)) = (self.conn.take(), self.home.take()) {
            if conn.read.is_empty() {
                pool.put_raw(conn);
            }
        }
    }

    /// The whole body is in memory already: reading it waits for nothing.
    pub fn in_memory(&self) -> bool {
        matches!(self.state, State::Whole(_))
    }

    fn fail(&mut self, e: ExchangeError) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        self.state = State::Whole(None);
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }

    /// One step on what is buffered, without reading; the connection goes
    /// home as soon as the body has ended cleanly (with its last data).
    fn step(&mut self) -> Step {
        let decoder = match &mut self.state {
            // A whole body needs no connection (it went home at the start).
            State::Whole(data) => {
                return data.take().map_or(Step::End, Step::Data);
            }
            State::Reading(decoder) => decoder,
        };
        // Ended: its connection may have gone home with the last data.
        let (Some(conn), false) = (self.conn.as_mut(), decoder.is_done()) else {
            return Step::End;
        };
        let step = decoder.step(&mut conn.read);
        if decoder.is_done() && !matches!(step, Step::Fail(_)) {
            self.release();
        }
        step
    }
}

impl http_body::Body for RawBody {
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        let this = self.get_mut();
        loop {
            match this.step() {
                Step::Data(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Step::Trailers(t) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Step::End => {
                    this.state = State::Whole(None);
                    return Poll::Ready(None);
                }
                Step::Fail(e) => return this.fail(e.into()),
                Step::Read => {}
            }
            let Some(conn) = this.conn.as_mut() else {
                return this.fail(ExchangeError::Closed);
            };
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => {
                    let State::Reading(decoder) = &mut this.state else {
                        return this.fail(ExchangeError::Closed);
                    };
                    return match decoder.at_eof() {
                        Step::Fail(e) => this.fail(e.into()),
                        _ => {
                            // Read until close: the connection is spent.
                            this.state = State::Whole(None);
                            this.conn = None;
                            Poll::Ready(None)
                        }
                    };
                }
                Ok(_) => {}
                Err(e) => return this.fail(e.into()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            State::Whole(data) => data.is_none(),
            State::Reading(decoder) => decoder.is_done(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Whole(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            State::Reading(decoder) => match decoder.remaining() {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn the_request_head_carries_the_body_length_it_has() {
        let (mut head, ()) = http::Request::builder()
            .method(Method::POST)
            .uri("/c/a/x?q=1")
            .header("host", "w:1")
            .header("content-length", "999")
            .body(())
            .expect("request")
            .into_parts();
        let (host, epoch) = (
            HeaderValue::from_static("w:2"),
            HeaderValue::from_static("7"),
        );
        let stamp = Stamp {
            host: &host,
            attestation: HeaderValue::from_static("tok"),
            epoch: &epoch,
            forwarded: None,
        };
        let mut out = Vec::new();
        encode(&head, &stamp, 3, &mut out);
        assert_eq!(
            String::from_utf8(out.clone()).expect("ascii"),
            "POST /c/a/x?q=1 HTTP/1.1\r\nhost: w:2\r\npinboard-attestation: tok\r\n\
             pinboard-epoch: 7\r\ncontent-length: 3\r\n\r\n"
        );
        head.method = Method::GET;
        encode(&head, &stamp, 0, &mut out);
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "GET /c/a/x?q=1 HTTP/1.1\r\nhost: w:2\r\npinboard-attestation: tok\r\n\
             pinboard-epoch: 7\r\n\r\n"
        );
    }
}
