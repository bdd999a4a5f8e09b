//! A client's request head: parsed, and sorted into what the front serves
//! itself and what it hands to hyper.
//!
//! Owns the head's parse (`httparse`, at most [`MAX_FIELDS`] fields), the
//! request built from it (every value shares the head's bytes, as hyper's
//! do) and the choice ([`sort`]). Never answers anything: a head the
//! front does not serve itself goes to hyper untouched, which answers it
//! (a malformed head, a head over the size limit, a control path) or
//! serves it (upgrades, streamed and chunked bodies, `Expect`, HTTP/1.0)
//! exactly as it always did.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};

use crate::accept::is_control_path;
use crate::proxy::headers::HostError;

/// Most fields in a request head the front parses (hyper's default too:
/// a head with more goes to hyper, which refuses it).
pub const MAX_FIELDS: usize = 100;

/// Where one field lies in the head: name and value, as byte ranges.
#[derive(Debug, Clone, Copy)]
struct Field {
    name: (u32, u32),
    value: (u32, u32),
}

/// A complete head's layout, before its bytes are split off the read
/// buffer.
#[derive(Debug)]
pub struct Layout {
    /// The head's length, blank line included.
    pub len: usize,
    method: (u32, u32),
    target: (u32, u32),
    version: u8,
}

/// The connection's reusable room for a head's field positions (no
/// allocation per request).
#[derive(Debug, Default)]
pub struct Fields(Vec<Field>);

/// What the read buffer holds.
#[derive(Debug)]
pub enum Parse {
    /// Not a complete head yet.
    Partial,
    /// A head the front leaves to hyper: malformed, too many fields.
    Hyper,
    /// A complete head.
    Complete(Layout),
}

fn range(base: &[u8], part: &[u8]) -> (u32, u32) {
    let start = part.as_ptr() as usize - base.as_ptr() as usize;
    // Heads are bounded far below 4 GiB (`--max-header-bytes`).
    (start as u32, (start + part.len()) as u32)
}

/// Parses the head at the front of `buf`, noting its fields in `fields`.
pub fn parse(buf: &BytesMut, fields: &mut Fields) -> Parse {
    let mut slots: [MaybeUninit<httparse::Header<'_>>; MAX_FIELDS] =
        [const { MaybeUninit::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_request_with_uninit_headers(&mut req, buf, &mut slots)
    {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parse::Partial,
        Err(_) => return Parse::Hyper,
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Parse::Hyper;
    };
    fields.0.clear();
    for h in req.headers.iter() {
        fields.0.push(Field {
            name: range(buf, h.name.as_bytes()),
            value: range(buf, h.value),
        });
    }
    Parse::Complete(Layout {
        len,
        method: range(buf, method.as_bytes()),
        target: range(buf, target.as_bytes()),
        version,
    })
}

/// Rewrites the request line's version `HTTP/1.<n>`, `n` from 2 to 9, to
/// `HTTP/1.1` in place; `true` when it did. RFC 9112 §2.3: a recipient
/// takes a message of a higher minor version than its own as one of the
/// highest it speaks. httparse refuses any but `1.0` and `1.1`, so the
/// front calls this when a parse failed, and parses again (the line keeps
/// its length: nothing after it moves). The request line may still be
/// incomplete; the version is then the buffer's last bytes.
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

/// A request the front serves itself.
#[derive(Debug)]
pub struct Own {
    /// Its head, every value sharing the head's bytes.
    pub head: http::request::Parts,
    /// Its body's length (`Content-Length`; 0 without one).
    pub body_len: usize,
    /// The client asked to close after it (`Connection: close`).
    pub close: bool,
    /// The client takes trailers (`TE: trailers`).
    pub trailers: bool,
    /// Its `Host` lines as RFC 9112 §3.2 wants them (exactly one): checked
    /// here, in the pass over the fields, so the proxy need not look again.
    pub host: Result<(), HostError>,
}

fn slice(head: &Bytes, (start, end): (u32, u32)) -> Bytes {
    head.slice(start as usize..end as usize)
}

/// Whether a list value (`Connection`, `TE`, `Trailer`) names `token`
/// (any parameters after `;` ignored).
pub fn lists(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|element| {
        let name = element.split(|&b| b == b';').next().unwrap_or_default();
        name.trim_ascii().eq_ignore_ascii_case(token)
    })
}

/// Builds the request of a parsed `head` (the bytes `layout` describes)
/// and sorts it: `None` hands the connection to hyper from this request
/// on. The front serves a request when it is HTTP/1.1 in origin
/// form for a path other than pinboard's own, with no body or a
/// `Content-Length` one of at most `body_limit` bytes (the bodies the
/// proxy buffers anyway), and asks for no upgrade and no `100 Continue`.
pub fn sort(head: &Bytes, layout: &Layout, fields: &Fields, body_limit: usize) -> Option<Own> {
    if layout.version != 1 {
        return None;
    }
    let target = slice(head, layout.target);
    let path_end = target
        .iter()
        .position(|&b| b == b'?')
        .unwrap_or(target.len());
    let Ok(path) = std::str::from_utf8(&target[..path_end]) else {
        return None;
    };
    if !path.starts_with('/') || is_control_path(path) {
        return None;
    }
    let Ok(method) = Method::from_bytes(&head[layout.method.0 as usize..layout.method.1 as usize])
    else {
        return None;
    };
    if method == Method::CONNECT {
        return None;
    }
    let Ok(uri) = Uri::from_maybe_shared(target) else {
        return None;
    };
    let mut headers = HeaderMap::with_capacity(fields.0.len());
    let mut body_len: Option<usize> = None;
    let mut close = false;
    let mut trailers = false;
    let mut hosts = 0u32;
    for field in &fields.0 {
        let name_bytes = &head[field.name.0 as usize..field.name.1 as usize];
        let Ok(name) = HeaderName::from_bytes(name_bytes) else {
            return None;
        };
        let Ok(value) = HeaderValue::from_maybe_shared(slice(head, field.value)) else {
            return None;
        };
        if name == header::CONTENT_LENGTH {
            let digits = value.as_bytes();
            let parsed = (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(digits).ok()?.parse::<usize>().ok())
                .flatten();
            match (parsed, body_len) {
                (Some(n), None) if n <= body_limit => body_len = Some(n),
                _ => return None,
            }
        } else if name == header::TRANSFER_ENCODING
            || name == header::UPGRADE
            || name == header::EXPECT
        {
            return None;
        } else if name == header::CONNECTION {
            close |= lists(value.as_bytes(), b"close");
        } else if name == header::TE {
            trailers |= lists(value.as_bytes(), b"trailers");
        } else if name == header::HOST {
            hosts += 1;
        }
        headers.append(name, value);
    }
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    parts.headers = headers;
    Some(Own {
        head: parts,
        body_len: body_len.unwrap_or(0),
        close,
        trailers,
        host: match hosts {
            1 => Ok(()),
            0 => Err(HostError::Missing),
            _ => Err(HostError::Repeated),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(text: &str) -> Option<Own> {
        let buf = BytesMut::from(text.as_bytes());
        let mut fields = Fields::default();
        let Parse::Complete(layout) = parse(&buf, &mut fields) else {
            panic!("not a complete head: {text:?}");
        };
        let head = Bytes::copy_from_slice(&buf[..layout.len]);
        sort(&head, &layout, &fields, 1024)
    }

    #[test]
    fn plain_requests_are_served_with_their_fields() {
        let Some(own) = sorted(
            "POST /c/a/hit?x=1 HTTP/1.1\r\nHost: pb\r\nX-A: 1\r\nx-a: 2\r\ncontent-length: 5\r\nConnection: keep-alive, Close\r\nTE: gzip;q=1, trailers\r\n\r\nhello",
        ) else {
            panic!("not served");
        };
        assert_eq!(own.head.method, Method::POST);
        assert_eq!(own.head.uri, "/c/a/hit?x=1");
        assert_eq!(own.body_len, 5);
        assert!(own.close);
        assert!(own.trailers);
        let values: Vec<_> = own.head.headers.get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        assert_eq!(own.head.headers["host"], "pb");
    }

    #[test]
    fn what_hyper_serves_is_left_to_it() {
        for text in [
            "GET /c/a HTTP/1.0\r\n\r\n",
            "GET /healthz HTTP/1.1\r\n\r\n",
            "GET /registry/workers?x=1 HTTP/1.1\r\n\r\n",
            "GET http://pb/c/a HTTP/1.1\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\n\r\n",
            "CONNECT pb:80 HTTP/1.1\r\n\r\n",
            "POST /c/a HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            "GET /c/a HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            "POST /c/a HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n",
            "POST /c/a HTTP/1.1\r\ncontent-length: 2048\r\n\r\n",
            "POST /c/a HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n",
            "POST /c/a HTTP/1.1\r\ncontent-length: +3\r\n\r\n",
            "POST /c/a HTTP/1.1\r\ncontent-length: 99999999999999999999999\r\n\r\n",
        ] {
            assert!(sorted(text).is_none(), "{text:?}");
        }
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
        assert!(matches!(parse(&buf, &mut fields), Parse::Hyper));
        lower_minor_version(&mut buf);
        assert!(matches!(parse(&buf, &mut fields), Parse::Complete(_)));
    }

    #[test]
    fn partial_and_malformed_heads() {
        let mut fields = Fields::default();
        let partial = BytesMut::from(&b"GET /c/a HTTP/1.1\r\nhost: x\r\n"[..]);
        assert!(matches!(parse(&partial, &mut fields), Parse::Partial));
        let bad = BytesMut::from(&b"GET /c/a HTTP/1.1\r\nbad header\r\n\r\n"[..]);
        assert!(matches!(parse(&bad, &mut fields), Parse::Hyper));
        let many: String = (0..=MAX_FIELDS).map(|i| format!("x-{i}: v\r\n")).collect();
        let many = BytesMut::from(format!("GET /c/a HTTP/1.1\r\n{many}\r\n").as_bytes());
        assert!(matches!(parse(&many, &mut fields), Parse::Hyper));
    }
}
