//! Message heads, both roles: a request head as a server reads it, a
//! response head as a client reads it, a trailer section either way.
//!
//! Owns the head's parse (`httparse`, at most [`MAX_FIELDS`] fields), the
//! fields as positions in the read buffer (so every value of the built
//! `http` head shares the head's bytes, as hyper's do), and what the
//! fields say about the message's framing and its connection ([`Notes`]:
//! one pass over the fields, read by both roles). Never reads a socket and
//! never decides what to do with a message: each role's caller does.
//!
//! The two roles differ only where RFC 9112 makes them differ: the start
//! line, and how the body is framed ([`Notes::request_framing`],
//! [`Notes::response_framing`]); field parsing and the framing fields'
//! meaning are shared, as in hyper's `proto::h1::role`.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};

use super::framing::{content_length, Framing};

/// Most fields in a head or a trailer section (hyper's default too).
pub const MAX_FIELDS: usize = 100;

/// Why a head (or a trailer section) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// More than [`MAX_FIELDS`] fields.
    #[error("more than {MAX_FIELDS} fields")]
    TooManyFields,
    /// Not valid HTTP/1.1; names the part that is not.
    #[error("malformed {0}")]
    Malformed(&'static str),
}

impl From<httparse::Error> for HeadError {
    fn from(error: httparse::Error) -> Self {
        match error {
            httparse::Error::TooManyHeaders => Self::TooManyFields,
            httparse::Error::Status => Self::Malformed("status"),
            httparse::Error::Version => Self::Malformed("version"),
            httparse::Error::Token => Self::Malformed("token"),
            httparse::Error::HeaderName => Self::Malformed("field name"),
            httparse::Error::HeaderValue => Self::Malformed("field value"),
            httparse::Error::NewLine => Self::Malformed("line end"),
        }
    }
}

/// A byte range of a head: heads are bounded far below 4 GiB.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    end: u32,
}

impl Span {
    #[inline]
    fn of(base: &[u8], part: &[u8]) -> Self {
        let start = part.as_ptr() as usize - base.as_ptr() as usize;
        Self {
            start: start as u32,
            end: (start + part.len()) as u32,
        }
    }

    #[inline]
    fn bytes<'h>(&self, head: &'h [u8]) -> &'h [u8] {
        &head[self.start as usize..self.end as usize]
    }

    #[inline]
    fn share(&self, head: &Bytes) -> Bytes {
        head.slice(self.start as usize..self.end as usize)
    }
}

/// A connection's reusable room for a head's field positions (no
/// allocation per message once it has grown).
#[derive(Debug, Default)]
pub struct Fields(Vec<(Span, Span)>);

impl Fields {
    /// How many fields the last parse found.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the last parse found none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn note(&mut self, base: &[u8], parsed: &[httparse::Header<'_>]) {
        self.0.clear();
        self.0.extend(
            parsed
                .iter()
                .map(|h| (Span::of(base, h.name.as_bytes()), Span::of(base, h.value))),
        );
    }

    /// The fields as a map, every value sharing `head` (the bytes the
    /// parse saw, split off the read buffer), with what they say about
    /// framing noted in `notes`.
    ///
    /// # Errors
    ///
    /// A field `http` refuses, or a framing field that is not valid
    /// ([`Notes::note`]).
    pub fn to_map(&self, head: &Bytes, notes: &mut Notes) -> Result<HeaderMap, HeadError> {
        self.build(head, Some(notes))
    }

    /// [`to_map`](Self::to_map) into `map`, emptied first and grown only
    /// when its room is short (a server reuses its last response's map).
    ///
    /// # Errors
    ///
    /// As [`to_map`](Self::to_map).
    pub fn to_map_into(
        &self,
        head: &Bytes,
        notes: &mut Notes,
        map: &mut HeaderMap,
    ) -> Result<(), HeadError> {
        self.build_into(head, Some(notes), map)
    }

    fn build(&self, head: &Bytes, notes: Option<&mut Notes>) -> Result<HeaderMap, HeadError> {
        let mut map = HeaderMap::new();
        self.build_into(head, notes, &mut map)?;
        Ok(map)
    }

    fn build_into(
        &self,
        head: &Bytes,
        mut notes: Option<&mut Notes>,
        map: &mut HeaderMap,
    ) -> Result<(), HeadError> {
        map.clear();
        map.try_reserve(self.0.len())
            .map_err(|_| HeadError::TooManyFields)?;
        for (name, value) in &self.0 {
            let name = HeaderName::from_bytes(name.bytes(head))
                .map_err(|_| HeadError::Malformed("field name"))?;
            let value = HeaderValue::from_maybe_shared(value.share(head))
                .map_err(|_| HeadError::Malformed("field value"))?;
            if let Some(notes) = notes.as_deref_mut() {
                notes.note(&name, &value)?;
            }
            map.append(name, value);
        }
        Ok(())
    }
}

/// A complete request head's start line, before the head is split off
/// the read buffer.
#[derive(Debug)]
pub struct RequestLine {
    /// The head's length, blank line included.
    pub len: usize,
    method: Span,
    target: Span,
    /// The minor version: `HTTP/1.<minor>`.
    pub minor: u8,
}

impl RequestLine {
    /// The method's bytes in `head`.
    pub fn method<'h>(&self, head: &'h [u8]) -> &'h [u8] {
        self.method.bytes(head)
    }

    /// The request target's bytes in `head`.
    pub fn target<'h>(&self, head: &'h [u8]) -> &'h [u8] {
        self.target.bytes(head)
    }

    /// The request target, sharing `head`.
    pub fn share_target(&self, head: &Bytes) -> Bytes {
        self.target.share(head)
    }
}

/// Parses the request head at the front of `buf`, noting its fields in
/// `fields`: `None` while it is not complete. Empty lines before the
/// request line are skipped (RFC 9112 §2.2).
///
/// # Errors
///
/// [`HeadError`]: not a request head, or too many fields.
pub fn parse_request(buf: &[u8], fields: &mut Fields) -> Result<Option<RequestLine>, HeadError> {
    // Left uninitialised: zeroing a hundred fields per head cost more than
    // the parse.
    let mut slots: [MaybeUninit<httparse::Header<'_>>; MAX_FIELDS] =
        [const { MaybeUninit::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_request_with_uninit_headers(&mut req, buf, &mut slots)?
    {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("request line"));
    };
    fields.note(buf, req.headers);
    Ok(Some(RequestLine {
        len,
        method: Span::of(buf, method.as_bytes()),
        target: Span::of(buf, target.as_bytes()),
        minor,
    }))
}

/// A complete response head's status line.
#[derive(Debug, Clone, Copy)]
pub struct StatusLine {
    /// The head's length, blank line included.
    pub len: usize,
    /// The status code as sent (three digits).
    pub code: u16,
    /// The minor version: `HTTP/1.<minor>`.
    pub minor: u8,
}

/// Parses the response head at the front of `buf`, noting its fields in
/// `fields`: `None` while it is not complete.
///
/// # Errors
///
/// [`HeadError`]: not a response head, or too many fields.
pub fn parse_response(buf: &[u8], fields: &mut Fields) -> Result<Option<StatusLine>, HeadError> {
    let mut slots: [MaybeUninit<httparse::Header<'_>>; MAX_FIELDS] =
        [const { MaybeUninit::uninit() }; MAX_FIELDS];
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, buf, &mut slots)?
    {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(None),
    };
    let (Some(code), Some(minor)) = (res.code, res.version) else {
        return Err(HeadError::Malformed("status line"));
    };
    fields.note(buf, res.headers);
    Ok(Some(StatusLine { len, code, minor }))
}

/// Parses the trailer section at the front of `buf` (after a chunked
/// body's last chunk), noting its fields in `fields`: its length, blank
/// line included, or `None` while it is not complete.
///
/// # Errors
///
/// [`HeadError`]: not a field section, or too many fields.
pub fn parse_trailers(buf: &[u8], fields: &mut Fields) -> Result<Option<usize>, HeadError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_FIELDS];
    match httparse::parse_headers(buf, &mut slots)? {
        httparse::Status::Complete((len, parsed)) => {
            fields.note(buf, parsed);
            Ok(Some(len))
        }
        httparse::Status::Partial => Ok(None),
    }
}

/// Rewrites the request line's version `HTTP/1.<n>`, `n` from 2 to 9, to
/// `HTTP/1.1` in place; `true` when it did. RFC 9112 §2.3: a recipient
/// takes a message of a higher minor version than its own as one of the
/// highest it speaks. httparse refuses any but `1.0` and `1.1`, so a
/// server calls this when a parse failed, and parses again (the line
/// keeps its length: nothing after it moves). The request line may still
/// be incomplete; the version is then the buffer's last bytes.
pub fn lower_minor_version(buf: &mut BytesMut) -> bool {
    // httparse skips empty lines before the request line (RFC 9112 §2.2).
    let Some(start) = buf.iter().position(|&b| b != b'\r' && b != b'\n') else {
        return false;
    };
    let end = buf[start..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(buf.len(), |n| start + n);
    let line = &buf[start..end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(version) = line.len().checked_sub(8).map(|at| &line[at..]) else {
        return false;
    };
    if !(version.starts_with(b"HTTP/1.") && matches!(version[7], b'2'..=b'9')) {
        return false;
    }
    // Only the version after the target (the line's last space) counts.
    if line.len() < 9 || line[line.len() - 9] != b' ' {
        return false;
    }
    let minor = start + line.len() - 1;
    buf[minor] = b'1';
    true
}

/// Whether a list value (`Connection`, `TE`, `Trailer`) names `token`
/// (any parameters after `;` ignored, case ignored).
#[inline]
pub fn lists(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|element| {
        let name = element.split(|&b| b == b';').next().unwrap_or_default();
        name.trim_ascii().eq_ignore_ascii_case(token)
    })
}

/// What a head's fields say about its message's framing and its
/// connection, noted in the one pass that builds the field map.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Notes {
    /// `Content-Length` (every line of it agreeing).
    pub length: Option<u64>,
    /// How many `Content-Length` lines there were.
    pub length_lines: u32,
    /// Any `Transfer-Encoding` line at all.
    pub transfer_encoding: bool,
    /// The last coding of every `Transfer-Encoding` line joined is
    /// `chunked`; `None` while the list has no coding at all (empty
    /// elements do not count, RFC 9110 §5.6.1).
    pub chunked: Option<bool>,
    /// A `Transfer-Encoding` list with an empty element (or an empty
    /// line): recipients differ on it (hyper takes the last element as
    /// written, empty or not), so a server refuses it.
    pub te_blank: bool,
    /// A `Connection` line says `close`.
    pub close: bool,
    /// A `TE` line says `trailers`.
    pub trailers: bool,
    /// How many `Host` lines there were.
    pub hosts: u32,
    /// An `Upgrade` line.
    pub upgrade: bool,
    /// An `Expect` line.
    pub expect: bool,
}

impl Notes {
    /// Notes one field.
    ///
    /// # Errors
    ///
    /// A `Content-Length` that is not digits only (RFC 9110 §8.6: hyper
    /// and nginx read it so; `u64::from_str` alone would take a leading
    /// `+`) or that disagrees with an earlier one; a `Transfer-Encoding`
    /// that is not text.
    #[inline]
    pub fn note(&mut self, name: &HeaderName, value: &HeaderValue) -> Result<(), HeadError> {
        if *name == header::CONTENT_LENGTH {
            let n =
                content_length(value.as_bytes()).ok_or(HeadError::Malformed("content-length"))?;
            if self.length.is_some_and(|m| m != n) {
                return Err(HeadError::Malformed("conflicting content-length"));
            }
            self.length = Some(n);
            self.length_lines += 1;
        } else if *name == header::TRANSFER_ENCODING {
            self.transfer_encoding = true;
            // Every line is one more stretch of one list (RFC 9110 §5.3):
            // the framing follows the last coding of all the lines joined,
            // whatever empty elements or lines trail it.
            let list = value
                .to_str()
                .map_err(|_| HeadError::Malformed("transfer-encoding"))?;
            if let Some(last) = list.rsplit(',').map(str::trim).find(|t| !t.is_empty()) {
                self.chunked = Some(last.eq_ignore_ascii_case("chunked"));
            }
            self.te_blank |= list.split(',').any(|t| t.trim().is_empty());
        } else if *name == header::CONNECTION {
            self.close |= lists(value.as_bytes(), b"close");
        } else if *name == header::TE {
            self.trailers |= lists(value.as_bytes(), b"trailers");
        } else if *name == header::HOST {
            self.hosts += 1;
        } else if *name == header::UPGRADE {
            self.upgrade = true;
        } else if *name == header::EXPECT {
            self.expect = true;
        }
        Ok(())
    }

    /// The body framing of a request of `version` (RFC 9112 §6.3, the
    /// server's role): chunked when `Transfer-Encoding` ends in `chunked`,
    /// `Content-Length` otherwise, none without either.
    ///
    /// As strict as any server it may stand in front of, never less:
    /// whatever hyper refuses is refused, and a few messages hyper takes
    /// are refused too, where taking them is what a smuggling attempt
    /// needs (RFC 9112 §6.1 allows the refusal).
    ///
    /// # Errors
    ///
    /// A `Transfer-Encoding` whose last coding is not `chunked` (the
    /// server cannot tell where the body ends), one with an empty element
    /// ([`te_blank`](Self::te_blank)), one in an HTTP/1.0 request
    /// (faulty framing, §6.1), or one beside a `Content-Length`.
    pub fn request_framing(&self, version: Version) -> Result<Framing, HeadError> {
        if self.transfer_encoding && (self.te_blank || version == Version::HTTP_10) {
            return Err(HeadError::Malformed("transfer-encoding"));
        }
        match (self.transfer_encoding, self.chunked, self.length) {
            (false, _, None) => Ok(Framing::Fixed(0)),
            (false, _, Some(n)) => Ok(Framing::Fixed(n)),
            (true, Some(true), None) => Ok(Framing::Chunked),
            (true, Some(true), Some(_)) => Err(HeadError::Malformed(
                "transfer-encoding beside content-length",
            )),
            (true, _, _) => Err(HeadError::Malformed("transfer-encoding")),
        }
    }

    /// A response body's framing (RFC 9112 §6.3, the client's role): none
    /// for a `HEAD` request's answer, 204 and 304 (1xx never come here);
    /// `Transfer-Encoding` wins over `Content-Length`, and a list not
    /// ending in `chunked` or neither field means until close.
    pub fn response_framing(&self, status: StatusCode, head_only: bool) -> Framing {
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

/// A request built from a parsed head (the server's role).
#[derive(Debug)]
pub struct RequestHead {
    /// Its head, every value sharing the head's bytes.
    pub parts: http::request::Parts,
    /// What its fields say about framing and the connection.
    pub notes: Notes,
}

/// Builds the request of `head` (the bytes `line` and `fields` describe,
/// split off the read buffer): method, target, version and fields.
///
/// # Errors
///
/// A method, target or field `http` refuses, or a framing field that is
/// not valid ([`Notes::note`]).
pub fn request_head(
    head: &Bytes,
    line: &RequestLine,
    fields: &Fields,
) -> Result<RequestHead, HeadError> {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    let notes = request_head_into(head, line, fields, &mut parts)?;
    Ok(RequestHead { parts, notes })
}

/// [`request_head`] into the caller's `parts` (a head is a few hundred
/// bytes: built where it stays, not moved out of a result), its fields
/// into `parts.headers` emptied first (a map with room is reused, see
/// [`Fields::to_map_into`]), answering the notes.
///
/// # Errors
///
/// As [`request_head`].
pub fn request_head_into(
    head: &Bytes,
    line: &RequestLine,
    fields: &Fields,
    parts: &mut http::request::Parts,
) -> Result<Notes, HeadError> {
    parts.method =
        Method::from_bytes(line.method(head)).map_err(|_| HeadError::Malformed("method"))?;
    parts.uri = Uri::from_maybe_shared(line.share_target(head))
        .map_err(|_| HeadError::Malformed("request target"))?;
    let mut notes = Notes::default();
    fields.to_map_into(head, &mut notes, &mut parts.headers)?;
    parts.version = if line.minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    Ok(notes)
}

/// A final response head (the client's role).
#[derive(Debug)]
pub struct ResponseHead {
    /// The response, without its body.
    pub response: http::Response<()>,
    /// How its body is delimited.
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
}

/// Most interim (1xx) answers skipped before the final one.
pub const MAX_INTERIM: usize = 16;

/// Why a response head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// Longer than the bound, or too many fields.
    #[error("response head too large")]
    TooLarge,
    /// Not a valid HTTP/1.1 response head.
    #[error("malformed response: {0}")]
    Malformed(&'static str),
}

impl From<HeadError> for ResponseError {
    fn from(error: HeadError) -> Self {
        match error {
            HeadError::TooManyFields => Self::TooLarge,
            HeadError::Malformed(what) => Self::Malformed(what),
        }
    }
}

/// Parses one final response head off the front of `buf` (interim 1xx
/// heads are skipped and split off), for a request that was `HEAD` when
/// `head_only`: `None` while it is not complete. `interim` counts the 1xx
/// heads skipped so far (at most [`MAX_INTERIM`]); `max_len` bounds a head
/// that arrived whole (the caller bounds one still coming in).
///
/// # Errors
///
/// [`ResponseError`]: too large, malformed, `101` unasked, too many 1xx.
pub fn response_head(
    buf: &mut BytesMut,
    fields: &mut Fields,
    head_only: bool,
    interim: &mut usize,
    max_len: usize,
) -> Result<Option<ResponseHead>, ResponseError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        let Some(line) = parse_response(buf, fields)? else {
            return Ok(None);
        };
        if line.len > max_len {
            return Err(ResponseError::TooLarge);
        }
        let head = buf.split_to(line.len).freeze();
        if (100..200).contains(&line.code) {
            if line.code == 101 {
                return Err(ResponseError::Malformed("switching protocols unasked"));
            }
            *interim += 1;
            if *interim > MAX_INTERIM {
                return Err(ResponseError::Malformed("too many interim answers"));
            }
            continue;
        }
        let status =
            StatusCode::from_u16(line.code).map_err(|_| ResponseError::Malformed("status code"))?;
        let mut notes = Notes::default();
        let headers = fields.to_map(&head, &mut notes)?;
        let framing = notes.response_framing(status, head_only);
        let keep_alive = line.minor == 1 && !notes.close && framing != Framing::UntilClose;
        let mut response = http::Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = if line.minor == 1 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        *response.headers_mut() = headers;
        return Ok(Some(ResponseHead {
            response,
            framing,
            keep_alive,
        }));
    }
}

/// Builds the trailer section `parse_trailers` found, sharing `section`
/// (its bytes split off the read buffer): `None` when it is empty.
///
/// # Errors
///
/// A field `http` refuses.
pub fn trailer_map(section: &Bytes, fields: &Fields) -> Result<Option<HeaderMap>, HeadError> {
    // Framing fields in trailers frame nothing: not even read.
    let map = fields.build(section, None)?;
    Ok((!map.is_empty()).then_some(map))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(text: &str) -> Result<Option<ResponseHead>, ResponseError> {
        let mut buf = BytesMut::from(text);
        response_head(&mut buf, &mut Fields::default(), false, &mut 0, 64 * 1024)
    }

    fn request(text: &str) -> Result<Option<RequestHead>, HeadError> {
        let mut fields = Fields::default();
        let Some(line) = parse_request(text.as_bytes(), &mut fields)? else {
            return Ok(None);
        };
        let head = Bytes::copy_from_slice(&text.as_bytes()[..line.len]);
        request_head(&head, &line, &fields).map(Some)
    }

    #[test]
    fn requests_parse_with_their_fields_and_notes() {
        let r = request(
            "POST /c/a/hit?x=1 HTTP/1.1\r\nHost: pb\r\nX-A: 1\r\nx-a: 2\r\ncontent-length: 5\r\nConnection: keep-alive, Close\r\nTE: gzip;q=1, trailers\r\n\r\nhello",
        )
        .expect("valid")
        .expect("complete");
        assert_eq!(r.parts.method, Method::POST);
        assert_eq!(r.parts.uri, "/c/a/hit?x=1");
        assert_eq!(r.parts.version, Version::HTTP_11);
        let values: Vec<_> = r.parts.headers.get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        assert_eq!(r.notes.length, Some(5));
        assert_eq!(r.notes.hosts, 1);
        assert!(r.notes.close && r.notes.trailers);
        assert_eq!(
            r.notes.request_framing(Version::HTTP_11),
            Ok(Framing::Fixed(5))
        );
        let r = request("POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!(
            r.notes.request_framing(Version::HTTP_11),
            Ok(Framing::Chunked)
        );
        for refused in [
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked,\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding:\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            let r = request(refused).expect("valid").expect("complete");
            assert!(
                r.notes.request_framing(r.parts.version).is_err(),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn partial_and_malformed_request_heads() {
        let mut fields = Fields::default();
        assert!(matches!(
            parse_request(b"GET /c/a HTTP/1.1\r\nhost: x\r\n", &mut fields),
            Ok(None)
        ));
        assert!(parse_request(b"GET /c/a HTTP/1.1\r\nbad header\r\n\r\n", &mut fields).is_err());
        let many: String = (0..=MAX_FIELDS).map(|i| format!("x-{i}: v\r\n")).collect();
        let many = format!("GET /c/a HTTP/1.1\r\n{many}\r\n");
        assert_eq!(
            parse_request(many.as_bytes(), &mut fields).err(),
            Some(HeadError::TooManyFields)
        );
        for bad in ["+3", "3, 4", " ", "0x3"] {
            let text = format!("POST / HTTP/1.1\r\ncontent-length: {bad}\r\n\r\n");
            assert!(request(&text).is_err(), "{text:?}");
        }
        let twice = request("POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n")
            .expect("agreeing lengths")
            .expect("complete");
        assert_eq!(twice.notes.length_lines, 2);
        assert!(
            request("POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n").is_err()
        );
    }

    #[test]
    fn higher_minor_versions_are_read_as_1_1() {
        for (text, after) in [
            (
                "GET /c/a HTTP/1.2\r\nhost: pb\r\n\r\n",
                "GET /c/a HTTP/1.1\r\nhost: pb\r\n\r\n",
            ),
            ("\r\nGET /c/a HTTP/1.9\r\n", "\r\nGET /c/a HTTP/1.1\r\n"),
            ("GET /c/a HTTP/1.2", "GET /c/a HTTP/1.1"),
        ] {
            let mut buf = BytesMut::from(text.as_bytes());
            assert!(lower_minor_version(&mut buf), "{text:?}");
            assert_eq!(&buf[..], after.as_bytes());
        }
        for text in [
            "GET /c/a HTTP/1.1\r\n\r\n",
            "GET /c/a HTTP/2.0\r\n\r\n",
            "GET /c/a HTTP/1.10\r\n\r\n",
            "GET /c/aHTTP/1.2\r\n\r\n",
            "GET /c/a HTTP/1.x\r\n\r\n",
            "HTTP/1.2",
            "",
        ] {
            let mut buf = BytesMut::from(text.as_bytes());
            assert!(!lower_minor_version(&mut buf), "{text:?}");
            assert_eq!(&buf[..], text.as_bytes());
        }
        let mut buf = BytesMut::from(&b"GET /c/a HTTP/1.2\r\nhost: pb\r\n\r\n"[..]);
        let mut fields = Fields::default();
        assert!(parse_request(&buf, &mut fields).is_err());
        lower_minor_version(&mut buf);
        assert!(matches!(parse_request(&buf, &mut fields), Ok(Some(_))));
    }

    #[test]
    fn lists_name_tokens_whatever_their_case_and_parameters() {
        assert!(lists(b"keep-alive, Close", b"close"));
        assert!(lists(b"gzip;q=1, trailers", b"trailers"));
        assert!(!lists(b"closer", b"close"));
    }

    #[test]
    fn responses_parse_with_their_framing() {
        let p = response("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello")
            .expect("valid")
            .expect("complete");
        assert_eq!(p.response.status(), StatusCode::OK);
        assert_eq!(p.response.headers()["x-a"], "1");
        assert_eq!(p.framing, Framing::Fixed(5));
        assert!(p.keep_alive);

        let p = response("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!(p.framing, Framing::Chunked);

        let p = response("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert!(!p.keep_alive);

        let p = response("HTTP/1.0 200 OK\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!(p.framing, Framing::UntilClose);
        assert!(!p.keep_alive);

        let p = response("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!(p.response.status(), StatusCode::NO_CONTENT);
        assert_eq!(p.framing, Framing::Empty);

        assert!(response("HTTP/1.1 200 OK\r\nContent-Le")
            .expect("valid")
            .is_none());
    }

    #[test]
    fn bad_response_heads_are_refused() {
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "NOPE\r\n\r\n",
        ] {
            assert!(response(bad).is_err(), "{bad:?}");
        }
        let many = (0..MAX_FIELDS + 1).fold(String::from("HTTP/1.1 200 OK\r\n"), |s, i| {
            s + &format!("x-{i}: 1\r\n")
        }) + "\r\n";
        assert_eq!(response(&many).err(), Some(ResponseError::TooLarge));
        // Whole in the buffer, but over the bound.
        let big = format!(
            "HTTP/1.1 200 OK\r\nx-big: {}\r\n\r\n",
            "a".repeat(64 * 1024)
        );
        assert_eq!(response(&big).err(), Some(ResponseError::TooLarge));
        for bad in ["+2", "-2", "0x2", "2, 2", "99999999999999999999"] {
            let text = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\nok");
            assert!(response(&text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn interim_answers_are_bounded() {
        let many =
            "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM + 1) + "HTTP/1.1 200 OK\r\n\r\n";
        assert!(matches!(response(&many), Err(ResponseError::Malformed(_))));
        let few =
            "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM) + "HTTP/1.1 204 No Content\r\n\r\n";
        assert!(response(&few).expect("valid").is_some());
    }

    #[test]
    fn response_framing_follows_the_last_coding_of_every_transfer_encoding_line() {
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
            let p = response(&text).expect("valid").expect("complete");
            assert_eq!(p.framing, framing, "{head:?}");
        }
    }
}
