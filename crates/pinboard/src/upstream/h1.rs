//! A small HTTP/1.1 client for the proxy's hot path: a buffered request
//! out, a response head in, the body relayed as it arrives, on a keep-alive
//! connection that the request's own task drives.
//!
//! Owns the wire format of one exchange (the request head, the response
//! head parsed with `httparse`, the body framing: a fixed length, chunked,
//! or until close) and when a connection may carry another request. Never
//! decides where to send or what to do with an answer, never speaks TLS
//! and never switches protocols: `https://` workers, upgrades and streamed
//! request bodies go through hyper's client ([`super::Pool`] chooses).
//!
//! Why not hyper's client here: hyper drives each connection from a task
//! of its own and hands requests and responses across channels, which cost
//! about a third of pinboard's instructions per proxied request. Here the
//! request's task writes and reads the socket itself, and a response whose
//! body is already in the read buffer (most are) gives its connection back
//! to the pool before the client has read a byte of it.
//!
//! Bounds: a response head of at most [`MAX_HEAD`] bytes and
//! [`MAX_HEADERS`] fields, chunk-size lines of at most [`MAX_CHUNK_LINE`]
//! bytes, data frames of at most what one read returned. A connection is
//! reused only after a complete, keep-alive HTTP/1.1 response with nothing
//! after it.
//!
//! Framing is read as strictly as hyper and nginx read it, so that no
//! parser between the worker and the client frames an answer differently
//! (a smuggling gap): `Content-Length` is digits only; the body is chunked
//! when the last coding of every `Transfer-Encoding` line, joined, is
//! `chunked` (empty list elements do not count, RFC 9110 §5.6.1); a
//! chunk-size line is hex digits, optional blanks and `;` extensions, then
//! CRLF; a chunk's data ends with CRLF, never a bare LF. The chunk framing
//! already read with the head is checked before the head is handed on, so
//! bad framing there is a 502 rather than a cut body.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{Pool, Stamp};

/// Largest response head (status line and fields) accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most fields in a response head or a trailer section.
pub const MAX_HEADERS: usize = 100;
/// Most interim (1xx) answers skipped before the final one.
pub const MAX_INTERIM: usize = 16;
/// Longest chunk-size line (hex digits and chunk extensions).
pub const MAX_CHUNK_LINE: usize = 4096;
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
    /// The response head exceeded [`MAX_HEAD`] or [`MAX_HEADERS`].
    #[error("response head too large")]
    HeadTooLarge,
    /// The response was not valid HTTP/1.1.
    #[error("malformed response: {0}")]
    Malformed(&'static str),
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
}

impl Conn {
    /// A connection over `io` (connected, `TCP_NODELAY` set by the caller).
    pub fn new(io: TcpStream) -> Self {
        Self {
            io,
            read: BytesMut::with_capacity(READ_ROOM),
            write: Vec::with_capacity(1024),
        }
    }

    /// Whether an idle connection can carry another request: nothing is
    /// buffered, and the worker has neither closed it nor sent anything
    /// unasked (one non-blocking read finds nothing to read).
    pub fn is_reusable(&self) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Reads what the socket has into the read buffer: the byte count, 0
    /// at end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.io.poll_read_ready(cx))?;
            if self.read.capacity() - self.read.len() < READ_ROOM / 4 {
                self.read.reserve(READ_ROOM);
            }
            match self.io.try_read_buf(&mut self.read) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    /// Writes the request and reads its response head. The body comes
    /// from [`RawBody`]; `pool` gets the connection back when the response
    /// has been read whole and the worker keeps the connection open.
    ///
    /// # Errors
    ///
    /// [`ExchangeError`], with how far the exchange got ([`Reached`]).
    pub async fn exchange(
        mut self,
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
            match parse_head(&mut self.read, head_only, &mut interim) {
                Ok(Some(parsed)) => break parsed,
                Ok(None) => {}
                Err(e) => return Err((Reached::Answer, e)),
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
        let Parsed {
            response,
            framing,
            keep_alive,
        } = parsed;
        if framing == Framing::Chunked {
            check_chunks(&self.read).map_err(|e| (Reached::Answer, e))?;
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
    out.clear();
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    let target = head.uri.path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &head.headers {
        if name == http::header::CONTENT_LENGTH || name == http::header::HOST {
            continue;
        }
        field_line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    stamp.write(out);
    // An empty body is announced only where a body is expected, as hyper
    // does; elsewhere no length means none.
    let announce =
        body_len > 0 || matches!(head.method, Method::POST | Method::PUT | Method::PATCH);
    if announce {
        let mut digits = itoa::Buffer::new();
        field_line(out, b"content-length", digits.format(body_len).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends one `name: value` head line (a request's, a response's or a
/// trailer section's).
pub(crate) fn field_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body (HEAD, 204, 304).
    Empty,
    /// `Content-Length`.
    Fixed(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the worker closes the connection.
    UntilClose,
}

/// A parsed final response head.
struct Parsed {
    response: Response<()>,
    framing: Framing,
    keep_alive: bool,
}

/// Parses one final response head off the front of `buf` (interim 1xx
/// heads are skipped); `None` when it is not complete yet.
/// `interim` counts the 1xx heads skipped so far (at most [`MAX_INTERIM`]).
fn parse_head(
    buf: &mut BytesMut,
    head_only: bool,
    interim: &mut usize,
) -> Result<Option<Parsed>, ExchangeError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        // Offsets, not slices, so the head can be split off the buffer and
        // its field values shared without a copy. The field array is left
        // uninitialised: zeroing a hundred fields per response cost more
        // than the parse.
        let (len, code, minor, spans) = {
            let mut fields =
                [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
            let mut res = httparse::Response::new(&mut []);
            let config = httparse::ParserConfig::default();
            let len = match config.parse_response_with_uninit_headers(&mut res, buf, &mut fields) {
                // A head that arrived whole in one large read is held to
                // the bound as well as one still coming in (`exchange`).
                Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
                    return Err(ExchangeError::HeadTooLarge)
                }
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => return Err(ExchangeError::HeadTooLarge),
                Err(_) => return Err(ExchangeError::Malformed("response head")),
            };
            let base = buf.as_ptr() as usize;
            let spans: Vec<[usize; 4]> = res
                .headers
                .iter()
                .map(|field| {
                    let name = field.name.as_ptr() as usize - base;
                    let value = field.value.as_ptr() as usize - base;
                    [
                        name,
                        name + field.name.len(),
                        value,
                        value + field.value.len(),
                    ]
                })
                .collect();
            (len, res.code.unwrap_or(0), res.version.unwrap_or(1), spans)
        };
        let head = buf.split_to(len).freeze();
        if (100..200).contains(&code) {
            if code == 101 {
                return Err(ExchangeError::Malformed("switching protocols unasked"));
            }
            *interim += 1;
            if *interim > MAX_INTERIM {
                return Err(ExchangeError::Malformed("too many interim answers"));
            }
            continue;
        }
        let status =
            StatusCode::from_u16(code).map_err(|_| ExchangeError::Malformed("status code"))?;
        let mut headers = HeaderMap::with_capacity(spans.len());
        // The fields that frame the body are noted on the way (a lookup
        // each afterwards would hash their names again).
        let mut fields = FramingFields::default();
        for &[n0, n1, v0, v1] in &spans {
            let name = HeaderName::from_bytes(&head[n0..n1])
                .map_err(|_| ExchangeError::Malformed("field name"))?;
            let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
                .map_err(|_| ExchangeError::Malformed("field value"))?;
            fields.note(&name, &value)?;
            headers.append(name, value);
        }
        let framing = fields.framing(status, head_only);
        let keep_alive = minor == 1 && !fields.close && framing != Framing::UntilClose;
        let mut response = Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = if minor == 1 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        *response.headers_mut() = headers;
        return Ok(Some(Parsed {
            response,
            framing,
            keep_alive,
        }));
    }
}

/// What a response head's fields say about its body and its connection.
#[derive(Debug, Default)]
struct FramingFields {
    /// `Content-Length` (every line of it agreeing).
    length: Option<u64>,
    /// The last coding of the `Transfer-Encoding` list is `chunked`; `None`
    /// while the list has no coding at all.
    chunked: Option<bool>,
    /// A `Connection` line says `close`.
    close: bool,
}

/// A `Content-Length` value: one or more ASCII digits and nothing else
/// (RFC 9110 §8.6), as hyper and nginx read it. `u64::from_str` alone
/// would take a leading `+`.
fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

impl FramingFields {
    fn note(&mut self, name: &HeaderName, value: &HeaderValue) -> Result<(), ExchangeError> {
        if *name == http::header::CONTENT_LENGTH {
            let n = content_length(value.as_bytes())
                .ok_or(ExchangeError::Malformed("content-length"))?;
            if self.length.is_some_and(|m| m != n) {
                return Err(ExchangeError::Malformed("conflicting content-length"));
            }
            self.length = Some(n);
        } else if *name == http::header::TRANSFER_ENCODING {
            // Every line is one more stretch of one list (RFC 9110 §5.3),
            // and empty elements of a list do not count (§5.6.1): the
            // framing follows the last coding of all the lines joined,
            // whatever empty elements or lines trail it.
            let list = value
                .to_str()
                .map_err(|_| ExchangeError::Malformed("transfer-encoding"))?;
            if let Some(last) = list.rsplit(',').map(str::trim).find(|t| !t.is_empty()) {
                self.chunked = Some(last.eq_ignore_ascii_case("chunked"));
            }
        } else if *name == http::header::CONNECTION {
            self.close |= value
                .to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
        }
        Ok(())
    }

    /// The body's framing (RFC 9112 §6.3): `Transfer-Encoding` wins over
    /// `Content-Length`; neither means until close.
    fn framing(&self, status: StatusCode, head_only: bool) -> Framing {
        if head_only || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            return Framing::Empty;
        }
        match (self.chunked, self.length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) | (None, None) => Framing::UntilClose,
            (None, Some(n)) => Framing::Fixed(n),
        }
    }
}

/// Where a [`RawBody`] is.
#[derive(Debug)]
enum State {
    /// The whole body, already read (the connection went home).
    Whole(Option<Bytes>),
    /// Bytes left of a fixed-length body.
    Fixed(u64),
    /// Before a chunk-size line.
    ChunkSize,
    /// Bytes left of a chunk's data.
    ChunkData(u64),
    /// Before the CRLF that ends a chunk's data.
    ChunkEnd,
    /// Before the trailer section that ends a chunked body.
    Trailers,
    /// Until the worker closes.
    UntilClose,
    /// Ended (read whole, or failed).
    Done,
}

/// A worker's response body read off a [`Conn`]; the connection goes back
/// to its pool when the body ended cleanly with nothing after it, and is
/// closed otherwise (dropped early included).
#[derive(Debug)]
pub struct RawBody {
    state: State,
    conn: Option<Conn>,
    home: Option<Arc<Pool>>,
}

impl RawBody {
    fn start(mut conn: Conn, framing: Framing, home: Option<Arc<Pool>>) -> Self {
        let state = match framing {
            Framing::Empty => State::Whole(None),
            // The common case: the whole body came with the head.
            Framing::Fixed(n) if conn.read.len() as u64 == n => {
                State::Whole((n > 0).then(|| conn.read.split().freeze()))
            }
            Framing::Fixed(n) => State::Fixed(n),
            Framing::Chunked => State::ChunkSize,
            Framing::UntilClose => State::UntilClose,
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
        self.state = State::Done;
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }
}

/// The end of the line starting the buffer (the index of its `\n`).
fn line_end(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n')
}

/// The size in a chunk-size line, its `\n` left off: hex digits, optional
/// blanks, optional extensions after a `;`, then the `\r` (RFC 9112 §7.1,
/// as hyper reads it). Anything else after the digits (a lone `\r` inside
/// the line, a bare `\n` ending it, other text) is refused: a parser that
/// skipped it would frame the body differently from one that did not.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r")?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return None;
    }
    let rest = &line[digits..];
    let blanks = rest
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    match rest.get(blanks) {
        None => {}
        Some(b';') if !rest.contains(&b'\r') => {}
        Some(_) => return None,
    }
    line[..digits].iter().try_fold(0u64, |n, &b| {
        let d = char::from(b).to_digit(16)?;
        Some(n * 16 + u64::from(d))
    })
}

/// Checks the chunk framing of the part of a chunked body already in
/// `buf` (size lines and the CRLF after each chunk's data, up to the last
/// chunk), so that a worker's malformed framing is found before the head
/// goes to the client: then it answers 502 rather than a cut body. What
/// has not arrived yet is checked as it is read ([`RawBody`]).
fn check_chunks(buf: &[u8]) -> Result<(), ExchangeError> {
    let mut at = 0;
    loop {
        let Some(end) = line_end(&buf[at..]) else {
            if buf.len() - at > MAX_CHUNK_LINE {
                return Err(ExchangeError::Malformed("chunk size line too long"));
            }
            return Ok(());
        };
        let size = chunk_size(&buf[at..at + end]).ok_or(ExchangeError::Malformed("chunk size"))?;
        if size == 0 {
            return Ok(());
        }
        at += end + 1;
        let Some(data_end) = usize::try_from(size).ok().and_then(|n| at.checked_add(n)) else {
            return Ok(());
        };
        if data_end >= buf.len() {
            return Ok(());
        }
        let crlf = &buf[data_end..buf.len().min(data_end + 2)];
        if !b"\r\n".starts_with(crlf) {
            return Err(ExchangeError::Malformed("chunk end"));
        }
        if crlf.len() < 2 {
            return Ok(());
        }
        at = data_end + 2;
    }
}

/// What the buffer allowed a [`RawBody`] to do.
enum Step {
    /// Hand on this frame.
    Frame(Frame<Bytes>),
    /// The body ended.
    End,
    /// The state changed; look again.
    Again,
    /// More bytes are needed.
    Read,
    /// The exchange failed.
    Fail(ExchangeError),
}

impl RawBody {
    /// One step on what is buffered, without reading.
    fn step(&mut self) -> Step {
        // A whole body needs no connection (it went home at the start).
        if let State::Whole(data) = &mut self.state {
            return data
                .take()
                .map_or(Step::End, |d| Step::Frame(Frame::data(d)));
        }
        let (Some(conn), false) = (self.conn.as_mut(), matches!(self.state, State::Done)) else {
            return Step::End;
        };
        let read = &mut conn.read;
        let fixed = matches!(self.state, State::Fixed(_));
        let (step, next, ended) = match &mut self.state {
            State::Whole(_) | State::Done => (Step::End, None, false),
            State::Fixed(left) | State::ChunkData(left) if !read.is_empty() => {
                let take = read.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                let data = read.split_to(take).freeze();
                *left -= take as u64;
                let done = *left == 0;
                let next = match (done, fixed) {
                    (false, _) => None,
                    (true, true) => Some(State::Done),
                    (true, false) => Some(State::ChunkEnd),
                };
                (Step::Frame(Frame::data(data)), next, done && fixed)
            }
            State::UntilClose if !read.is_empty() => {
                (Step::Frame(Frame::data(read.split().freeze())), None, false)
            }
            State::ChunkSize => match line_end(read) {
                Some(end) => match chunk_size(&read[..end]) {
                    Some(size) => {
                        read.advance(end + 1);
                        let next = match size {
                            0 => State::Trailers,
                            n => State::ChunkData(n),
                        };
                        (Step::Again, Some(next), false)
                    }
                    None => (
                        Step::Fail(ExchangeError::Malformed("chunk size")),
                        None,
                        false,
                    ),
                },
                None if read.len() > MAX_CHUNK_LINE => (
                    Step::Fail(ExchangeError::Malformed("chunk size line too long")),
                    None,
                    false,
                ),
                None => (Step::Read, None, false),
            },
            // Exactly CRLF: a bare LF is refused, as hyper and nginx do.
            State::ChunkEnd => match read.get(..2) {
                Some(b"\r\n") => {
                    read.advance(2);
                    (Step::Again, Some(State::ChunkSize), false)
                }
                None if b"\r".starts_with(read) => (Step::Read, None, false),
                _ => (
                    Step::Fail(ExchangeError::Malformed("chunk end")),
                    None,
                    false,
                ),
            },
            State::Trailers => match trailers(read) {
                Ok(Some(trailers)) => {
                    let step = match trailers {
                        Some(t) => Step::Frame(Frame::trailers(t)),
                        None => Step::End,
                    };
                    (step, Some(State::Done), true)
                }
                Ok(None) => (Step::Read, None, false),
                Err(e) => (Step::Fail(e), None, false),
            },
            State::Fixed(_) | State::ChunkData(_) | State::UntilClose => (Step::Read, None, false),
        };
        if let Some(next) = next {
            self.state = next;
        }
        if ended {
            self.release();
        }
        step
    }
}

/// Parses the trailer section off the front of `read`: `Ok(None)` when it
/// is not complete yet, `Ok(Some(None))` when it is empty.
fn trailers(read: &mut BytesMut) -> Result<Option<Option<HeaderMap>>, ExchangeError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (len, map) = match httparse::parse_headers(read, &mut fields) {
        Ok(httparse::Status::Complete((len, _))) if len > MAX_HEAD => {
            return Err(ExchangeError::HeadTooLarge)
        }
        Ok(httparse::Status::Complete((len, fields))) => {
            let mut map = HeaderMap::with_capacity(fields.len());
            for f in fields.iter() {
                let name = HeaderName::from_bytes(f.name.as_bytes())
                    .map_err(|_| ExchangeError::Malformed("trailer name"))?;
                let value = HeaderValue::from_bytes(f.value)
                    .map_err(|_| ExchangeError::Malformed("trailer value"))?;
                map.append(name, value);
            }
            (len, (!map.is_empty()).then_some(map))
        }
        Ok(httparse::Status::Partial) if read.len() < MAX_HEAD => return Ok(None),
        Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
            return Err(ExchangeError::HeadTooLarge)
        }
        Err(_) => return Err(ExchangeError::Malformed("trailers")),
    };
    read.advance(len);
    Ok(Some(map))
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
                Step::Frame(frame) => return Poll::Ready(Some(Ok(frame))),
                Step::End => {
                    this.state = State::Done;
                    return Poll::Ready(None);
                }
                Step::Fail(e) => return this.fail(e),
                Step::Again => continue,
                Step::Read => {}
            }
            let Some(conn) = this.conn.as_mut() else {
                return this.fail(ExchangeError::Closed);
            };
            match ready!(conn.poll_fill(cx)) {
                Ok(0) if matches!(this.state, State::UntilClose) => {
                    this.state = State::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => return this.fail(ExchangeError::Closed),
                Ok(_) => {}
                Err(e) => return this.fail(e.into()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done | State::Whole(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Whole(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            State::Fixed(left) => SizeHint::with_exact(*left),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<Parsed>, ExchangeError> {
        parse_head(&mut BytesMut::from(text), false, &mut 0)
    }

    #[test]
    fn heads_parse_with_their_framing() {
        let p = parse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello")
            .expect("valid")
            .expect("complete");
        assert_eq!(p.response.status(), StatusCode::OK);
        assert_eq!(p.response.headers()["x-a"], "1");
        assert_eq!(p.framing, Framing::Fixed(5));
        assert!(p.keep_alive);

        let p = parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!(p.framing, Framing::Chunked);

        let p = parse("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert!(!p.keep_alive);

        let p = parse("HTTP/1.0 200 OK\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!(p.framing, Framing::UntilClose);
        assert!(!p.keep_alive);

        let p = parse("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!(p.response.status(), StatusCode::NO_CONTENT);
        assert_eq!(p.framing, Framing::Empty);

        assert!(parse("HTTP/1.1 200 OK\r\nContent-Le")
            .expect("valid")
            .is_none());
    }

    #[test]
    fn bad_heads_are_refused() {
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "NOPE\r\n\r\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let many = (0..MAX_HEADERS + 1).fold(String::from("HTTP/1.1 200 OK\r\n"), |s, i| {
            s + &format!("x-{i}: 1\r\n")
        }) + "\r\n";
        assert!(matches!(parse(&many), Err(ExchangeError::HeadTooLarge)));
        // Whole in the buffer, but over the bound.
        let big = format!("HTTP/1.1 200 OK\r\nx-big: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert!(matches!(parse(&big), Err(ExchangeError::HeadTooLarge)));
        let trailer = format!("x-big: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert!(matches!(
            trailers(&mut BytesMut::from(trailer.as_str())),
            Err(ExchangeError::HeadTooLarge)
        ));
    }

    #[test]
    fn interim_answers_are_bounded() {
        let many =
            "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM + 1) + "HTTP/1.1 200 OK\r\n\r\n";
        assert!(matches!(parse(&many), Err(ExchangeError::Malformed(_))));
        let few =
            "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM) + "HTTP/1.1 204 No Content\r\n\r\n";
        assert!(parse(&few).expect("valid").is_some());
    }

    #[test]
    fn chunk_sizes_parse_hex_and_ignore_extensions() {
        assert_eq!(chunk_size(b"1a\r"), Some(26));
        assert_eq!(chunk_size(b"0\r"), Some(0));
        assert_eq!(chunk_size(b"ff;name=value\r"), Some(255));
        assert_eq!(chunk_size(b"7 ; name=\"quoted;value\"\r"), Some(7));
        assert_eq!(chunk_size(b"2 \t\r"), Some(2));
        for bad in [
            &b"\r"[..],
            b"zz\r",
            b"1234567890abcdef0\r",
            // What lenient parsers skip: text after the size, a CR inside
            // the line, a line ended by a bare LF.
            b"2\rX",
            b"2 X\r",
            b"2X\r",
            b"2",
            b"2;a\rb\r",
        ] {
            assert_eq!(chunk_size(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn buffered_chunk_framing_is_checked_up_to_what_arrived() {
        for good in [
            &b""[..],
            b"2\r\nok\r\n0\r\n\r\n",
            b"2\r\nok\r\n0\r\nx-t: 1\r\n\r\n",
            b"2\r\nok\r",
            b"2\r\nok",
            b"2\r\no",
            b"5;x=y\r\nhello\r\n3",
        ] {
            assert!(
                check_chunks(good).is_ok(),
                "{:?}",
                String::from_utf8_lossy(good)
            );
        }
        for bad in [
            &b"2\rX\nok\r\n0\r\n\r\n"[..],
            b"2\r\nok\n0\r\n\r\n",
            b"2\r\nokX\r\n",
            b"2\r\nok\rX",
            b"g\r\n",
        ] {
            assert!(
                matches!(check_chunks(bad), Err(ExchangeError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 1];
        assert!(check_chunks(&long).is_err());
    }

    #[test]
    fn framing_follows_the_last_coding_of_every_transfer_encoding_line() {
        for (head, framing) in [
            ("Transfer-Encoding: chunked,\r\n", Framing::Chunked),
            ("Transfer-Encoding: chunked, \r\n", Framing::Chunked),
            ("Transfer-Encoding: , chunked\r\n", Framing::Chunked),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding:\r\n",
                Framing::Chunked,
            ),
            (
                "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
                Framing::Chunked,
            ),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
                Framing::UntilClose,
            ),
            (
                "Transfer-Encoding: chunked, gzip,\r\nContent-Length: 2\r\n",
                Framing::UntilClose,
            ),
            // A list with no coding at all says nothing.
            (
                "Transfer-Encoding: ,\r\nContent-Length: 2\r\n",
                Framing::Fixed(2),
            ),
        ] {
            let text = format!("HTTP/1.1 200 OK\r\n{head}\r\n");
            let p = parse(&text).expect("valid").expect("complete");
            assert_eq!(p.framing, framing, "{head:?}");
        }
    }

    #[test]
    fn content_lengths_are_digits_only() {
        assert_eq!(content_length(b"0"), Some(0));
        assert_eq!(content_length(b"0012"), Some(12));
        for bad in [
            &b""[..],
            b"+2",
            b"-2",
            b" 2",
            b"0x2",
            b"2,2",
            b"99999999999999999999",
        ] {
            assert_eq!(
                content_length(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        for bad in ["+2", "-2", "0x2", "2, 2", "99999999999999999999"] {
            let text = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\nok");
            assert!(parse(&text).is_err(), "{text:?}");
        }
    }

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
