//! Message bodies on the wire, both roles: the decoder that cuts a body out of a connection's
//! read buffer ([`Decoder`]): a fixed length, chunked, or until close.
//!
//! Owns the framing grammar only; never reads a socket (the caller fills
//! the buffer when the decoder says [`Step::Read`]) and never decides
//! whether a connection may be reused.
//!
//! Framing is read as strictly as hyper and nginx read it, so that no
//! parser between a client and a server frames a message differently (a
//! smuggling gap): a
//! chunk-size line is hex digits, optional blanks and `;` extensions, then
//! CRLF ([`chunk_size`]); a chunk's data ends with CRLF, never a bare LF.
//! Bounds: chunk-size lines of at most [`MAX_CHUNK_LINE`] bytes, a trailer
//! section of at most [`MAX_TRAILERS`] bytes and
//! [`MAX_FIELDS`](super::head::MAX_FIELDS) fields, data frames of at most
//! what the buffer holds.

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;

use super::framing::Framing;
use super::head::{self, Fields, HeadError};

/// Longest chunk-size line (hex digits and chunk extensions).
pub const MAX_CHUNK_LINE: usize = 4096;
/// Largest trailer section.
pub const MAX_TRAILERS: usize = 64 * 1024;

/// Why a body could not be read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The connection ended before the body did.
    #[error("connection closed before the body was complete")]
    Closed,
    /// The trailer section was over [`MAX_TRAILERS`] or had too many
    /// fields.
    #[error("trailer section too large")]
    TooLarge,
    /// The framing was not valid; names the part that is not.
    #[error("malformed body: {0}")]
    Malformed(&'static str),
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
pub fn chunk_size(line: &[u8]) -> Option<u64> {
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
/// chunk), so that malformed framing is found before the head is handed
/// on (a proxy then answers 502 rather than a cut body). What has not
/// arrived yet is checked as it is decoded ([`Decoder`]).
///
/// # Errors
///
/// [`BodyError::Malformed`] at the first bad size line or chunk end.
pub fn check_chunks(buf: &[u8]) -> Result<(), BodyError> {
    let mut at = 0;
    loop {
        let Some(end) = line_end(&buf[at..]) else {
            if buf.len() - at > MAX_CHUNK_LINE {
                return Err(BodyError::Malformed("chunk size line too long"));
            }
            return Ok(());
        };
        let size = chunk_size(&buf[at..at + end]).ok_or(BodyError::Malformed("chunk size"))?;
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
            return Err(BodyError::Malformed("chunk end"));
        }
        if crlf.len() < 2 {
            return Ok(());
        }
        at = data_end + 2;
    }
}

/// What the read buffer allowed a [`Decoder`] to do.
#[derive(Debug)]
pub enum Step {
    /// Hand on these bytes of the body.
    Data(Bytes),
    /// The body ended with these trailer fields.
    Trailers(HeaderMap),
    /// The body ended.
    End,
    /// More bytes are needed: fill the buffer and step again.
    Read,
    /// The framing is broken: the connection cannot be reused.
    Fail(BodyError),
}

/// Where a body's decoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
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
    /// Until the sender closes.
    UntilClose,
    /// Ended (read whole, or failed).
    Done,
}

/// Cuts one body out of a connection's read buffer, as it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoder(At);

impl Decoder {
    /// A decoder for a body framed as `framing`.
    pub fn new(framing: Framing) -> Self {
        Self(match framing {
            Framing::Empty | Framing::Fixed(0) => At::Done,
            Framing::Fixed(n) => At::Fixed(n),
            Framing::Chunked => At::ChunkSize,
            Framing::UntilClose => At::UntilClose,
        })
    }

    /// The body ended (or failed): nothing more of it is in the stream.
    pub fn is_done(&self) -> bool {
        self.0 == At::Done
    }

    /// The bytes still to come when that is known (a fixed-length body).
    pub fn remaining(&self) -> Option<u64> {
        match self.0 {
            At::Fixed(n) => Some(n),
            At::Done => Some(0),
            _ => None,
        }
    }

    /// The next step on what `read` holds: the bytes it used are split
    /// off it. After the last step of a fixed-length body, or the end of
    /// a chunked one, [`is_done`](Self::is_done) holds before the step is
    /// returned (the connection can be released with the last data).
    pub fn step(&mut self, read: &mut BytesMut) -> Step {
        loop {
            match self.0 {
                At::Done => return Step::End,
                At::Fixed(left) | At::ChunkData(left) if !read.is_empty() => {
                    let take = read.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let data = read.split_to(take).freeze();
                    let left = left - take as u64;
                    self.0 = match (self.0, left) {
                        (At::Fixed(_), 0) => At::Done,
                        (At::Fixed(_), n) => At::Fixed(n),
                        (_, 0) => At::ChunkEnd,
                        (_, n) => At::ChunkData(n),
                    };
                    return Step::Data(data);
                }
                At::UntilClose if !read.is_empty() => return Step::Data(read.split().freeze()),
                At::Fixed(_) | At::ChunkData(_) | At::UntilClose => return Step::Read,
                At::ChunkSize => match line_end(read) {
                    Some(end) => match chunk_size(&read[..end]) {
                        Some(size) => {
                            read.advance(end + 1);
                            self.0 = match size {
                                0 => At::Trailers,
                                n => At::ChunkData(n),
                            };
                        }
                        None => return self.fail(BodyError::Malformed("chunk size")),
                    },
                    None if read.len() > MAX_CHUNK_LINE => {
                        return self.fail(BodyError::Malformed("chunk size line too long"))
                    }
                    None => return Step::Read,
                },
                // Exactly CRLF: a bare LF is refused, as hyper and nginx do.
                At::ChunkEnd => match read.get(..2) {
                    Some(b"\r\n") => {
                        read.advance(2);
                        self.0 = At::ChunkSize;
                    }
                    None if b"\r".starts_with(read) => return Step::Read,
                    _ => return self.fail(BodyError::Malformed("chunk end")),
                },
                At::Trailers => {
                    return match trailers(read) {
                        Ok(Some(trailers)) => {
                            self.0 = At::Done;
                            match trailers {
                                Some(t) => Step::Trailers(t),
                                None => Step::End,
                            }
                        }
                        Ok(None) => Step::Read,
                        Err(e) => self.fail(e),
                    }
                }
            }
        }
    }

    /// The connection ended: the end of a body read until close, a
    /// [`BodyError::Closed`] failure for any other unfinished one.
    pub fn at_eof(&mut self) -> Step {
        match self.0 {
            At::UntilClose | At::Done => {
                self.0 = At::Done;
                Step::End
            }
            _ => self.fail(BodyError::Closed),
        }
    }

    fn fail(&mut self, error: BodyError) -> Step {
        self.0 = At::Done;
        Step::Fail(error)
    }
}

/// Parses the trailer section off the front of `read`: `Ok(None)` when it
/// is not complete yet, `Ok(Some(None))` when it is empty.
fn trailers(read: &mut BytesMut) -> Result<Option<Option<HeaderMap>>, BodyError> {
    let mut fields = Fields::default();
    let len = match head::parse_trailers(read, &mut fields) {
        Ok(Some(len)) if len > MAX_TRAILERS => return Err(BodyError::TooLarge),
        Ok(Some(len)) => len,
        Ok(None) if read.len() < MAX_TRAILERS => return Ok(None),
        Ok(None) | Err(HeadError::TooManyFields) => return Err(BodyError::TooLarge),
        Err(HeadError::Malformed(_)) => return Err(BodyError::Malformed("trailers")),
    };
    let section = read.split_to(len).freeze();
    head::trailer_map(&section, &fields)
        .map_err(|_| BodyError::Malformed("trailer field"))
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

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
                matches!(check_chunks(bad), Err(BodyError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 1];
        assert!(check_chunks(&long).is_err());
    }

    /// Decodes `wire` fed in pieces of `piece` bytes: the body and the
    /// trailers, or the failure.
    fn decode(framing: Framing, wire: &[u8], piece: usize) -> Result<(Vec<u8>, usize), BodyError> {
        let mut decoder = Decoder::new(framing);
        let mut read = BytesMut::new();
        let mut fed = 0;
        let mut body = Vec::new();
        let mut trailers = 0;
        loop {
            match decoder.step(&mut read) {
                Step::Data(d) => body.extend_from_slice(&d),
                Step::Trailers(t) => {
                    trailers = t.len();
                    return Ok((body, trailers));
                }
                Step::End => return Ok((body, trailers)),
                Step::Fail(e) => return Err(e),
                Step::Read if fed == wire.len() => match decoder.at_eof() {
                    Step::Fail(e) => return Err(e),
                    _ => return Ok((body, trailers)),
                },
                Step::Read => {
                    let n = piece.min(wire.len() - fed);
                    read.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
            }
        }
    }

    #[test]
    fn bodies_decode_whatever_the_pieces() {
        for piece in [1, 2, 3, 7, 1024] {
            let chunked = b"2\r\nab\r\n3;x=1\r\ncde\r\n0\r\nx-t: 1\r\n\r\n";
            assert_eq!(
                decode(Framing::Chunked, chunked, piece),
                Ok((b"abcde".to_vec(), 1))
            );
            assert_eq!(
                decode(Framing::Chunked, b"1\r\na\r\n0\r\n\r\n", piece),
                Ok((b"a".to_vec(), 0))
            );
            assert_eq!(
                decode(Framing::Fixed(3), b"abc", piece),
                Ok((b"abc".to_vec(), 0))
            );
            assert_eq!(
                decode(Framing::UntilClose, b"abc", piece),
                Ok((b"abc".to_vec(), 0))
            );
            assert_eq!(
                decode(Framing::Fixed(4), b"abc", piece),
                Err(BodyError::Closed)
            );
            assert_eq!(
                decode(Framing::Chunked, b"2\r\nab\n0\r\n\r\n", piece),
                Err(BodyError::Malformed("chunk end"))
            );
            assert_eq!(
                decode(Framing::Chunked, b"2x\r\nab\r\n0\r\n\r\n", piece),
                Err(BodyError::Malformed("chunk size"))
            );
        }
        let big = format!("0\r\nx-big: {}\r\n\r\n", "a".repeat(MAX_TRAILERS));
        assert_eq!(
            decode(Framing::Chunked, big.as_bytes(), 1 << 20),
            Err(BodyError::TooLarge)
        );
    }
}
