//! Fuzz target bodies for the HTTP/1 codec's two roles, shared by
//! cargo-fuzz (`fuzz/fuzz_targets/h1_*.rs`, nightly) and the stable
//! property tests (`tests/h1_fuzz_stable.rs`). Each must never panic,
//! and checks what must hold of any input.

#![allow(dead_code, unreachable_pub)]

use bytes::{Bytes, BytesMut};
use pinned_edge::h1::body::{self, Decoder, Step};
use pinned_edge::h1::framing::Framing;
use pinned_edge::h1::head::{self, Fields, HeadError};

/// Feeds `rest` to a decoder for `framing` in pieces of `piece` bytes
/// (at least one), then the end of the stream: the body it cut, or the
/// failure. Checks that it never hands on more than it was given.
pub fn decode(framing: Framing, rest: &[u8], piece: usize) -> Result<Vec<u8>, ()> {
    let piece = piece.max(1);
    let mut decoder = Decoder::new(framing);
    let mut read = BytesMut::new();
    let mut fed = 0;
    let mut out = Vec::new();
    // Every step either uses bytes, ends, or asks for more: bounded by
    // the input's length plus one step per piece and per state change.
    for _ in 0..(4 * rest.len() + 64) {
        match decoder.step(&mut read) {
            Step::Data(data) => {
                assert!(!data.is_empty());
                out.extend_from_slice(&data);
            }
            Step::Trailers(_) | Step::End => {
                assert!(decoder.is_done());
                assert!(out.len() <= rest.len());
                return Ok(out);
            }
            Step::Fail(_) => return Err(()),
            Step::Read if fed == rest.len() => {
                return match decoder.at_eof() {
                    Step::Fail(_) => Err(()),
                    _ => Ok(out),
                };
            }
            Step::Read => {
                let n = piece.min(rest.len() - fed);
                read.extend_from_slice(&rest[fed..fed + n]);
                fed += n;
            }
        }
    }
    panic!("the decoder made no progress");
}

/// The server's role: a request head, its framing, its body.
pub fn request(data: &[u8]) {
    let mut fields = Fields::default();
    let line = match head::parse_request(data, &mut fields) {
        Ok(Some(line)) => line,
        Ok(None) | Err(_) => return,
    };
    assert!(line.len <= data.len());
    assert!(line.minor <= 1);
    let head = Bytes::copy_from_slice(&data[..line.len]);
    let Ok(request) = head::request_head(&head, &line, &fields) else {
        return;
    };
    assert_eq!(request.parts.headers.len(), fields.len());
    let Ok(framing) = request.notes.request_framing(request.parts.version) else {
        return;
    };
    let rest = &data[line.len..];
    let whole = decode(framing, rest, rest.len());
    if let Framing::Fixed(n) = framing {
        // A fixed length is cut exactly, or refused when short.
        match &whole {
            Ok(body) => assert_eq!(body.len() as u64, n),
            Err(()) => assert!((rest.len() as u64) < n),
        }
    }
    // However the bytes arrive, the body is the same.
    for piece in [1, 2, 7] {
        assert_eq!(decode(framing, rest, piece), whole, "piece {piece}");
    }
}

/// The client's role: a response head (interim answers skipped), the
/// chunk check of what came with it, its body.
pub fn response(data: &[u8]) {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let head_only = flags & 1 == 1;
    let mut buf = BytesMut::from(data);
    let mut fields = Fields::default();
    let parsed = match head::response_head(&mut buf, &mut fields, head_only, &mut 0, 64 * 1024) {
        Ok(Some(parsed)) => parsed,
        Ok(None) | Err(_) => return,
    };
    let status = parsed.response.status().as_u16();
    assert!((200..1000).contains(&status));
    if head_only {
        assert_eq!(parsed.framing, Framing::Empty);
    }
    let rest = buf.freeze();
    let whole = decode(parsed.framing, &rest, rest.len());
    if parsed.framing == Framing::Chunked && body::check_chunks(&rest).is_err() {
        // What the early check refuses, the decoder refuses too.
        assert_eq!(whole, Err(()));
    }
    for piece in [1, 3] {
        assert_eq!(decode(parsed.framing, &rest, piece), whole, "piece {piece}");
    }
}

/// A chunked body alone, any bytes.
pub fn chunked(data: &[u8]) {
    let whole = decode(Framing::Chunked, data, data.len());
    if body::check_chunks(data).is_err() {
        assert_eq!(whole, Err(()));
    }
    for piece in [1, 2, 5] {
        assert_eq!(
            decode(Framing::Chunked, data, piece),
            whole,
            "piece {piece}"
        );
    }
}

/// A field error is never a panic, whatever the section.
pub fn trailers(data: &[u8]) {
    let mut fields = Fields::default();
    if let Ok(Some(len)) = head::parse_trailers(data, &mut fields) {
        let section = Bytes::copy_from_slice(&data[..len]);
        let _ = head::trailer_map(&section, &fields);
    } else if let Err(error) = head::parse_trailers(data, &mut fields) {
        assert!(matches!(
            error,
            HeadError::TooManyFields | HeadError::Malformed(_)
        ));
    }
}
