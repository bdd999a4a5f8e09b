//! How a message's body is delimited, and the `Content-Length` grammar:
//! what both the head ([`head`](super::head)) and the body
//! ([`body`](super::body)) read.
//!
//! Owns no state and reads no socket.

/// How a body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (a `HEAD` request's answer, 204, 304).
    Empty,
    /// `Content-Length`.
    Fixed(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the sender closes the connection (responses only).
    UntilClose,
}

/// A `Content-Length` value: one or more ASCII digits and nothing else
/// (RFC 9110 §8.6), as hyper and nginx read it; `None` otherwise or past
/// `u64`.
#[inline]
pub fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
