//! Heads and bodies onto the wire, both roles: field lines, a request's
//! start line and length, and a whole response written from an
//! `http::Response` (head, then its body framed by length or chunked).
//!
//! Owns the byte layout of what is written and, for a response, the
//! choice of framing from the body's size hint; never decides what a
//! request or response says (the caller's fields are written as given,
//! but the framing fields, which this module writes itself).

use std::future::poll_fn;
use std::io::Write as _;
use std::pin::pin;
use std::task::Poll;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Body;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::head::lists;

/// A data frame at least this long is written from its own buffer rather
/// than copied behind the head.
const COPY_BELOW: usize = 16 * 1024;

/// Appends one `name: value` line (of a request's head, a response's or a
/// trailer section).
#[inline]
pub fn field_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends every field of `headers` but those `skip` names.
#[inline]
pub fn fields(out: &mut Vec<u8>, headers: &HeaderMap, skip: impl Fn(&header::HeaderName) -> bool) {
    for (name, value) in headers {
        if !skip(name) {
            field_line(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
}

/// Starts a request head in `out` (cleared first): `method target
/// HTTP/1.1`, target in origin form.
#[inline]
pub fn request_line(out: &mut Vec<u8>, method: &Method, target: &str) {
    out.clear();
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
}

/// Ends a request head whose body is `body_len` bytes: its
/// `Content-Length` (announced for an empty body only where one is
/// expected, as hyper does; elsewhere no length means none), then the
/// blank line.
#[inline]
pub fn request_end(out: &mut Vec<u8>, method: &Method, body_len: usize) {
    let announce = body_len > 0 || matches!(*method, Method::POST | Method::PUT | Method::PATCH);
    if announce {
        let mut digits = itoa::Buffer::new();
        field_line(out, b"content-length", digits.format(body_len).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// An IMF-fixdate's length (`Sun, 06 Nov 1994 08:49:37 GMT`).
const DATE_LEN: usize = 29;

thread_local! {
    /// This thread's `Date` value and the second it names, from its start
    /// to the next: formatted once a second, as hyper does, not once a
    /// response. Two comparisons tell whether it still holds, cheaper than
    /// the subtraction that would count seconds (about 60 instructions a
    /// response, `worker-bench`).
    static DATE: std::cell::Cell<(SystemTime, SystemTime, [u8; DATE_LEN])> =
        const { std::cell::Cell::new((UNIX_EPOCH, UNIX_EPOCH, [0; DATE_LEN])) };
}

/// Appends the `date` line of now.
fn date_line(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let (from, until, mut text) = DATE.get();
    // A clock stepped back formats afresh too.
    if now < from || now >= until {
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let from = UNIX_EPOCH + std::time::Duration::from_secs(second);
        let mut cursor = std::io::Cursor::new(&mut text[..]);
        // Always 29 bytes: a date that would not fit is not written.
        if write!(cursor, "{}", httpdate::HttpDate::from(now)).is_err() {
            return;
        }
        DATE.set((from, from + std::time::Duration::from_secs(1), text));
    }
    field_line(out, b"date", &text);
}

/// How a response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body: a `HEAD` answer, 1xx, 204, 304. The fields go out as the
    /// caller has them (a relayed `HEAD` keeps the origin's length).
    Empty,
    /// `Content-Length`.
    Fixed(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// The next piece of a body.
enum Piece {
    Data(Bytes),
    Trailers(HeaderMap),
    End,
    Failed,
    /// Nothing ready yet, and something buffered to write first.
    Flush,
}

/// What the request asked of its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// A `HEAD` request: the answer's head only.
    pub head_only: bool,
    /// The client takes trailers (`TE: trailers`). As hyper does, only the
    /// trailer fields the answer's `Trailer` field names are written, and
    /// none to a client that did not ask.
    pub trailers: bool,
}

/// How the connection stands after a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Written whole: another request may follow.
    KeepAlive,
    /// Written whole with `Connection: close`, or cut short (the body
    /// failed, the client went away): the connection ends here.
    Close,
}

/// Writes `res` for a request that `asked` to `io`, using `out` as the
/// write buffer (the head and small bodies leave in one write). `close`:
/// the connection ends after this response (the client asked, or the
/// server is stopping); it is also ended when the response carries
/// `Connection: close`. A body of known size goes with its length, any
/// other chunked.
pub async fn response<IO, B>(
    io: &mut IO,
    out: &mut Vec<u8>,
    res: http::Response<B>,
    asked: Asked,
    close: bool,
) -> After
where
    IO: AsyncWrite + Unpin,
    B: Body<Data = Bytes>,
{
    response_keeping(io, out, res, asked, close).await.0
}

/// [`response`], also handing back the response's field map, with its
/// room, for the next request head to be built in, which empties it first
/// ([`Fields::to_map_into`](super::head::Fields::to_map_into); a server's front
/// reuses it: freeing one map and allocating the next cost about 240
/// instructions a request, `worker-bench`).
pub async fn response_keeping<IO, B>(
    io: &mut IO,
    out: &mut Vec<u8>,
    res: http::Response<B>,
    asked: Asked,
    mut close: bool,
) -> (After, HeaderMap)
where
    IO: AsyncWrite + Unpin,
    B: Body<Data = Bytes>,
{
    let (parts, body) = res.into_parts();
    let status = parts.status;
    let framing = if asked.head_only
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Framing::Empty
    } else {
        match body.size_hint().exact() {
            Some(n) => Framing::Fixed(n),
            None => Framing::Chunked,
        }
    };
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut dated = false;
    for (name, value) in &parts.headers {
        if *name == header::CONNECTION {
            close |= lists(value.as_bytes(), b"close");
            continue;
        }
        if framing != Framing::Empty
            && (*name == header::CONTENT_LENGTH || *name == header::TRANSFER_ENCODING)
        {
            continue;
        }
        dated |= *name == header::DATE;
        field_line(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if !dated {
        date_line(out);
    }
    match framing {
        Framing::Empty => {}
        Framing::Fixed(n) => field_line(
            out,
            b"content-length",
            itoa::Buffer::new().format(n).as_bytes(),
        ),
        Framing::Chunked => field_line(out, b"transfer-encoding", b"chunked"),
    }
    if close {
        field_line(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    let whole = match framing {
        Framing::Empty => true,
        Framing::Fixed(n) => write_body(io, out, body, Some(n), None).await,
        Framing::Chunked => {
            let named = asked
                .trailers
                .then(|| parts.headers.get(header::TRAILER))
                .flatten();
            write_body(io, out, body, None, named).await
        }
    };
    let written = whole && flush(io, out).await;
    let after = if written && !close {
        After::KeepAlive
    } else {
        After::Close
    };
    (after, parts.headers)
}

/// Writes what `out` holds and empties it.
async fn flush<IO: AsyncWrite + Unpin>(io: &mut IO, out: &mut Vec<u8>) -> bool {
    let written = io.write_all(out).await.is_ok() && io.flush().await.is_ok();
    out.clear();
    written
}

/// Writes `body` behind the head already in `out`: exactly `length` bytes
/// when given, chunked otherwise, with the trailer fields `named` lists.
/// `false` when the body failed or did not match its length, or the
/// client went away.
async fn write_body<IO, B>(
    io: &mut IO,
    out: &mut Vec<u8>,
    body: B,
    length: Option<u64>,
    named: Option<&HeaderValue>,
) -> bool
where
    IO: AsyncWrite + Unpin,
    B: Body<Data = Bytes>,
{
    let mut body = pin!(body);
    let mut left = length.unwrap_or(0);
    loop {
        let piece = poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            Poll::Pending if !out.is_empty() => Poll::Ready(Piece::Flush),
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(Piece::End),
            Poll::Ready(Some(Err(_))) => Poll::Ready(Piece::Failed),
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(match frame.into_data() {
                Ok(data) => Piece::Data(data),
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => Piece::Trailers(trailers),
                    Err(_) => Piece::Data(Bytes::new()),
                },
            }),
        })
        .await;
        match piece {
            Piece::Flush => {
                if !flush(io, out).await {
                    return false;
                }
            }
            Piece::Data(data) if data.is_empty() => {}
            Piece::Data(data) => {
                if length.is_some() {
                    let n = data.len() as u64;
                    if n > left {
                        // More than announced: the client cannot be told
                        // where this answer ends.
                        return false;
                    }
                    left -= n;
                } else {
                    // Writing to a `Vec` cannot fail.
                    let _ = write!(out, "{:x}\r\n", data.len());
                }
                if data.len() < COPY_BELOW {
                    out.extend_from_slice(&data);
                } else if !(flush(io, out).await && io.write_all(&data).await.is_ok()) {
                    return false;
                }
                if length.is_none() {
                    out.extend_from_slice(b"\r\n");
                }
            }
            Piece::Trailers(trailers) => {
                if length.is_none() {
                    out.extend_from_slice(b"0\r\n");
                    let named = named.map_or(&b""[..], HeaderValue::as_bytes);
                    for (name, value) in &trailers {
                        if lists(named, name.as_str().as_bytes()) {
                            field_line(out, name.as_str().as_bytes(), value.as_bytes());
                        }
                    }
                    out.extend_from_slice(b"\r\n");
                    return true;
                }
            }
            Piece::End => {
                if length.is_none() {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
                return left == 0;
            }
            Piece::Failed => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::combinators::UnsyncBoxBody;
    use http_body_util::{BodyExt, Full, StreamBody};
    use tokio::io::AsyncReadExt;

    type Response = http::Response<UnsyncBoxBody<Bytes, std::io::Error>>;

    fn full(text: &'static str) -> UnsyncBoxBody<Bytes, std::io::Error> {
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    const GET: Asked = Asked {
        head_only: false,
        trailers: true,
    };

    async fn wire(res: Response, asked: Asked, close: bool) -> (String, After) {
        let (mut near, mut far) = tokio::io::duplex(1 << 20);
        let mut out = Vec::new();
        let after = response(&mut near, &mut out, res, asked, close).await;
        drop(near);
        let mut text = String::new();
        far.read_to_string(&mut text).await.expect("read");
        (text, after)
    }

    fn lines(text: &str) -> Vec<&str> {
        text.split("\r\n")
            .filter(|l| !l.starts_with("date: "))
            .collect()
    }

    #[tokio::test]
    async fn a_known_length_body_follows_its_head() {
        let res = http::Response::builder()
            .status(201)
            .header("content-length", "999")
            .header("x-a", "1")
            .body(full("hello"))
            .expect("response");
        let (text, after) = wire(res, GET, false).await;
        assert_eq!(
            lines(&text),
            [
                "HTTP/1.1 201 Created",
                "x-a: 1",
                "content-length: 5",
                "",
                "hello"
            ]
        );
        assert!(text.contains("\r\ndate: "));
        assert_eq!(after, After::KeepAlive);
    }

    #[tokio::test]
    async fn an_open_ended_body_is_chunked_with_its_trailers() {
        let frames = vec![
            Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(b"ab"))),
            Ok(http_body::Frame::data(Bytes::from(vec![b'x'; COPY_BELOW]))),
            Ok(http_body::Frame::trailers({
                let mut t = HeaderMap::new();
                t.insert("x-sum", "7".parse().expect("value"));
                t.insert("x-unnamed", "no".parse().expect("value"));
                t
            })),
        ];
        let body = StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync();
        let res = http::Response::builder()
            .header("date", "then")
            .header("trailer", "x-sum")
            .body(body)
            .expect("response");
        let (text, after) = wire(res, GET, true).await;
        let big = "x".repeat(COPY_BELOW);
        assert_eq!(
            text,
            format!(
                "HTTP/1.1 200 OK\r\ndate: then\r\ntrailer: x-sum\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n2\r\nab\r\n4000\r\n{big}\r\n0\r\nx-sum: 7\r\n\r\n"
            )
        );
        assert_eq!(after, After::Close);
    }

    #[test]
    fn the_date_is_an_imf_fixdate_of_now() {
        let mut out = Vec::new();
        date_line(&mut out);
        let line = String::from_utf8(out).expect("ascii");
        let value = line
            .strip_prefix("date: ")
            .and_then(|v| v.strip_suffix("\r\n"))
            .expect("a date line");
        let parsed = httpdate::parse_http_date(value).expect("an HTTP date");
        let now = std::time::SystemTime::now();
        let age = now.duration_since(parsed).expect("not in the future");
        assert!(age < std::time::Duration::from_secs(5), "{value}");
    }

    #[tokio::test]
    async fn head_answers_keep_their_fields_and_send_no_body() {
        let res = http::Response::builder()
            .header("content-length", "12")
            .header("connection", "close")
            .body(full(""))
            .expect("response");
        let (text, after) = wire(
            res,
            Asked {
                head_only: true,
                trailers: false,
            },
            false,
        )
        .await;
        assert_eq!(
            lines(&text),
            [
                "HTTP/1.1 200 OK",
                "content-length: 12",
                "connection: close",
                "",
                ""
            ]
        );
        assert_eq!(after, After::Close);
    }

    #[tokio::test]
    async fn a_body_shorter_or_longer_than_announced_ends_the_connection() {
        let body = http_body_util::Full::new(Bytes::from_static(b"hello"))
            .map_err(|never| match never {})
            .boxed_unsync();
        // A body that claims 3 bytes and yields 5.
        struct Liar(http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>);
        impl http_body::Body for Liar {
            type Data = Bytes;
            type Error = std::io::Error;
            fn poll_frame(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
                std::pin::Pin::new(&mut self.0).poll_frame(cx)
            }
            fn size_hint(&self) -> http_body::SizeHint {
                http_body::SizeHint::with_exact(3)
            }
        }
        let res = http::Response::new(Liar(body));
        let (mut near, _far) = tokio::io::duplex(1 << 20);
        let after = response(&mut near, &mut Vec::new(), res, GET, false).await;
        assert_eq!(after, After::Close);
    }
}
