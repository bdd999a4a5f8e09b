//! A client's request head, sorted into what the front serves itself and
//! what it hands to hyper.
//!
//! Owns the choice ([`sort`]) only: the head's parse and the request built
//! from it are the codec's ([`crate::h1::head`]). Never answers anything:
//! a head the front does not serve goes to hyper untouched, which answers
//! it (a malformed head, a head over the size limit) or serves it
//! (upgrades, streamed and chunked bodies, `Expect`, HTTP/1.0) exactly as
//! it would have from the connection's first byte.

use bytes::Bytes;
use http::{HeaderMap, Method};

use crate::h1::head::{self, Fields, RequestLine};

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
    /// How many `Host` lines it has.
    pub hosts: u32,
}

/// Builds the request of a parsed `head` (the bytes `line` and `fields`
/// describe) and sorts it: `None` hands the connection to hyper from this
/// request on. The front serves a request when it is HTTP/1.1 in origin
/// form for a path `takes` accepts, with no body or a single
/// `Content-Length` one of at most `body_limit` bytes, and asks for no
/// upgrade and no `100 Continue`. Its fields go into `spare` (emptied
/// first): a map with room is reused rather than allocated again.
pub fn sort(
    head: &Bytes,
    line: &RequestLine,
    fields: &Fields,
    body_limit: usize,
    spare: HeaderMap,
    takes: impl FnOnce(&str) -> bool,
) -> Option<Own> {
    if line.minor != 1 {
        return None;
    }
    let target = line.target(head);
    let path_end = target
        .iter()
        .position(|&b| b == b'?')
        .unwrap_or(target.len());
    let Ok(path) = std::str::from_utf8(&target[..path_end]) else {
        return None;
    };
    if !path.starts_with('/') || !takes(path) {
        return None;
    }
    if line.method(head) == b"CONNECT" {
        return None;
    }
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.headers = spare;
    let notes = head::request_head_into(head, line, fields, &mut parts).ok()?;
    if notes.transfer_encoding || notes.upgrade || notes.expect || notes.length_lines > 1 {
        return None;
    }
    let body_len = usize::try_from(notes.length.unwrap_or(0))
        .ok()
        .filter(|n| *n <= body_limit)?;
    debug_assert_ne!(parts.method, Method::CONNECT);
    Some(Own {
        head: parts,
        body_len,
        close: notes.close,
        trailers: notes.trailers,
        hosts: notes.hosts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(text: &str) -> Option<Own> {
        let mut fields = Fields::default();
        let Ok(Some(line)) = head::parse_request(text.as_bytes(), &mut fields) else {
            panic!("not a complete head: {text:?}");
        };
        let head = Bytes::copy_from_slice(&text.as_bytes()[..line.len]);
        sort(&head, &line, &fields, 1024, HeaderMap::new(), |path| {
            path != "/healthz"
        })
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
        assert_eq!(own.hosts, 1);
        let values: Vec<_> = own.head.headers.get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        assert_eq!(own.head.headers["host"], "pb");
    }

    #[test]
    fn what_hyper_serves_is_left_to_it() {
        for text in [
            "GET /c/a HTTP/1.0\r\n\r\n",
            "GET /healthz HTTP/1.1\r\n\r\n",
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
}
