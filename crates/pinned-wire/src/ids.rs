//! Instance ids and namespaces: the two names that address an instance at
//! `/<ns>/<id>`.
//!
//! This module owns the validation rules and their exact client-visible
//! messages (wire.md §1). It never allocates on the happy path of
//! [`validate_id`] and never panics on input.
//!
//! Invariants:
//! - an id is 1..=[`MAX_ID_CHARS`] Unicode scalar values, all from
//!   `[A-Za-z0-9._~-]`; the checks run in the order empty, length, charset, so
//!   the first failing rule picks the message;
//! - a namespace is `/` followed by one non-empty segment without `/` or
//!   whitespace (whitespace as Python's `\s` defines it for `str` patterns).

use std::borrow::Cow;
use std::fmt;

use percent_encoding::percent_decode_str;

/// The longest accepted id, counted in Unicode scalar values (`char`s).
pub const MAX_ID_CHARS: usize = 256;

/// Why an instance id was rejected. The `Display` text is the exact `detail`
/// of the reference's 400 answer (and the WebSocket 1008 close reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum InvalidId {
    /// The id is the empty string (for example the request path was `/ns//`).
    #[error("id must be non-empty")]
    Empty,
    /// The id has more than [`MAX_ID_CHARS`] characters.
    #[error("id must be at most 256 characters")]
    TooLong,
    /// The id holds a character outside `[A-Za-z0-9._~-]`.
    #[error("id must contain only [A-Za-z0-9._~-]")]
    BadCharacter,
}

impl InvalidId {
    /// The exact `detail` string the reference answers with.
    #[must_use]
    pub fn detail(&self) -> &'static str {
        match self {
            Self::Empty => "id must be non-empty",
            Self::TooLong => "id must be at most 256 characters",
            Self::BadCharacter => "id must contain only [A-Za-z0-9._~-]",
        }
    }
}

/// Checks an already percent-decoded instance id.
///
/// # Errors
///
/// The first failing rule of wire.md §1, in the order empty, too long
/// (more than [`MAX_ID_CHARS`] `char`s), bad character.
pub fn validate_id(id: &str) -> Result<(), InvalidId> {
    if id.is_empty() {
        return Err(InvalidId::Empty);
    }
    // Every allowed character is one byte, so a short byte length settles
    // the length rule without counting chars.
    if id.len() > MAX_ID_CHARS && id.chars().nth(MAX_ID_CHARS).is_some() {
        return Err(InvalidId::TooLong);
    }
    if !id.bytes().all(is_id_byte) {
        return Err(InvalidId::BadCharacter);
    }
    Ok(())
}

fn is_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-')
}

/// Percent-decodes one raw path segment and validates the result as an id.
///
/// The reference's server (uvicorn) decodes the whole request path with
/// `urllib.parse.unquote` before routing: `%XX` escapes are decoded, malformed
/// escapes such as `%zz` stay literal, `+` stays `+`, and bytes that are not
/// valid UTF-8 become U+FFFD (one per maximal invalid subpart). This function
/// does the same for one segment, so invalid UTF-8 ends in
/// [`InvalidId::BadCharacter`], or [`InvalidId::TooLong`] when the replaced
/// text is longer than [`MAX_ID_CHARS`], exactly as the reference counts it.
///
/// One routing difference cannot be reproduced per segment: the reference
/// decodes before splitting, so `a%2Fb` is routed as id `a` with the rest
/// `/b`. Here it decodes to `a/b` and is rejected as a bad character.
///
/// Returns the decoded id, borrowed when the segment held no escapes.
///
/// # Errors
///
/// The [`validate_id`] failure of the decoded segment.
pub fn decode_id_segment(raw: &str) -> Result<Cow<'_, str>, InvalidId> {
    let decoded: Cow<'_, str> = if raw.contains('%') {
        match percent_decode_str(raw).decode_utf8_lossy() {
            Cow::Borrowed(s) => Cow::Owned(s.to_owned()),
            Cow::Owned(s) => Cow::Owned(s),
        }
    } else {
        Cow::Borrowed(raw)
    };
    validate_id(&decoded)?;
    Ok(decoded)
}

/// A namespace that is not `/` plus a single path segment.
///
/// Its `Display` is the reference's config-time `ValueError` message, with the
/// value quoted the way Python's `repr` quotes a `str`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("namespace must be '/' plus a single path segment: {}", PyRepr(.namespace))]
pub struct InvalidNamespace {
    /// The rejected value, as given.
    pub namespace: String,
}

/// Checks a namespace: a full match of `/[^/\s]+`.
///
/// `\s` is Python's Unicode whitespace (the 29 code points for which
/// `str.isspace()` is true, including U+001C..U+001F, U+0085 and U+00A0).
///
/// # Errors
///
/// [`InvalidNamespace`] carrying the value when it does not match.
pub fn validate_namespace(ns: &str) -> Result<(), InvalidNamespace> {
    let ok = match ns.strip_prefix('/') {
        Some(segment) => {
            !segment.is_empty() && segment.chars().all(|c| c != '/' && !is_py_whitespace(c))
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(InvalidNamespace {
            namespace: ns.to_owned(),
        })
    }
}

/// Python's `str.isspace()` (equivalently `\s` in a `str` regex).
fn is_py_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\u{1c}'..='\u{20}'
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

/// Formats a string the way Python's `repr(str)` does, closely: single quotes
/// unless the text holds `'` and no `"`; `\\`, the quote, `\t`, `\n`, `\r`
/// escaped; other non-printable characters as `\xNN`, `\uNNNN` or
/// `\UNNNNNNNN`. Printability is approximated (control, separator, format and
/// private-use characters); unassigned code points are shown as-is.
struct PyRepr<'a>(&'a str);

impl fmt::Display for PyRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        let quote = if self.0.contains('\'') && !self.0.contains('"') {
            '"'
        } else {
            '\''
        };
        f.write_char(quote)?;
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '\t' => f.write_str("\\t")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                c if c == quote => write!(f, "\\{c}")?,
                c if !is_py_printable(c) => {
                    let n = u32::from(c);
                    if n < 0x100 {
                        write!(f, "\\x{n:02x}")?;
                    } else if n < 0x1_0000 {
                        write!(f, "\\u{n:04x}")?;
                    } else {
                        write!(f, "\\U{n:08x}")?;
                    }
                }
                c => f.write_char(c)?,
            }
        }
        f.write_char(quote)
    }
}

/// An approximation of Python's `str.isprintable()` for one character.
fn is_py_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || is_py_whitespace(c) {
        return false;
    }
    !matches!(
        c,
        // Format characters (Cf).
        '\u{ad}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{890}'..='\u{891}'
            | '\u{8e2}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0001}'
            | '\u{e0020}'..='\u{e007f}'
            // Private use (Co).
            | '\u{e000}'..='\u{f8ff}'
            | '\u{f0000}'..='\u{ffffd}'
            | '\u{100000}'..='\u{10fffd}'
            // Noncharacters (Cn).
            | '\u{fdd0}'..='\u{fdef}'
            | '\u{fffe}'
            | '\u{ffff}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_rules_in_order() {
        assert_eq!(validate_id(""), Err(InvalidId::Empty));
        assert_eq!(validate_id("a"), Ok(()));
        assert_eq!(validate_id("A-z_0.9~"), Ok(()));
        assert_eq!(validate_id(&"a".repeat(256)), Ok(()));
        assert_eq!(validate_id(&"a".repeat(257)), Err(InvalidId::TooLong));
        // Length wins over charset when both fail.
        assert_eq!(validate_id(&" ".repeat(257)), Err(InvalidId::TooLong));
        // 200 two-byte chars: 400 bytes but only 200 chars.
        assert_eq!(validate_id(&"é".repeat(200)), Err(InvalidId::BadCharacter));
        assert_eq!(validate_id(&"é".repeat(257)), Err(InvalidId::TooLong));
        assert_eq!(validate_id("a b"), Err(InvalidId::BadCharacter));
        assert_eq!(validate_id("a/b"), Err(InvalidId::BadCharacter));
    }

    #[test]
    fn id_messages() {
        for e in [
            InvalidId::Empty,
            InvalidId::TooLong,
            InvalidId::BadCharacter,
        ] {
            assert_eq!(e.to_string(), e.detail());
        }
        assert_eq!(
            InvalidId::TooLong.to_string(),
            "id must be at most 256 characters"
        );
    }

    #[test]
    fn segments_decode_like_unquote() {
        assert!(matches!(decode_id_segment("abc"), Ok(Cow::Borrowed("abc"))));
        assert_eq!(decode_id_segment("a%2Db").as_deref(), Ok("a-b"));
        assert_eq!(decode_id_segment("%7e").as_deref(), Ok("~"));
        assert_eq!(decode_id_segment("a%zz"), Err(InvalidId::BadCharacter));
        assert_eq!(decode_id_segment("a%2Fb"), Err(InvalidId::BadCharacter));
        assert_eq!(decode_id_segment("%FF"), Err(InvalidId::BadCharacter));
        assert_eq!(decode_id_segment(""), Err(InvalidId::Empty));
        assert_eq!(
            decode_id_segment(&"%FF".repeat(257)),
            Err(InvalidId::TooLong)
        );
        assert_eq!(
            decode_id_segment(&"%61".repeat(256)).as_deref(),
            Ok(&*"a".repeat(256))
        );
    }

    #[test]
    fn namespaces() {
        assert_eq!(validate_namespace("/counter"), Ok(()));
        assert_eq!(validate_namespace("/é"), Ok(()));
        for bad in [
            "counter",
            "/a/b",
            "/",
            "",
            "/a b",
            "/a\u{3000}",
            "/\u{1c}",
            "//",
        ] {
            assert!(validate_namespace(bad).is_err(), "{bad:?}");
        }
        // U+200B is not whitespace to Python.
        assert_eq!(validate_namespace("/a\u{200b}"), Ok(()));
    }

    #[test]
    fn namespace_message_quotes_like_python() {
        let msg = |ns: &str| validate_namespace(ns).err().map(|e| e.to_string());
        assert_eq!(
            msg("/a b").as_deref(),
            Some("namespace must be '/' plus a single path segment: '/a b'")
        );
        assert_eq!(
            msg("a'b").as_deref(),
            Some(r#"namespace must be '/' plus a single path segment: "a'b""#)
        );
        assert_eq!(
            msg("a'\"").as_deref(),
            Some(r#"namespace must be '/' plus a single path segment: 'a\'"'"#)
        );
        assert_eq!(
            msg("/\t\u{85}\u{a0}\u{3000}\u{e0001}\\").as_deref(),
            Some(
                r"namespace must be '/' plus a single path segment: '/\t\x85\xa0\u3000\U000e0001\\'"
            )
        );
    }
}
