//! The slice of Python's `json.loads(bytes)` and `base64.urlsafe_b64decode`
//! that attestation verification depends on.
//!
//! The reference decodes token segments with these two functions, so a token
//! signed by a key holder is accepted or refused according to their quirks,
//! not to RFC 8259/4648. This module reproduces those quirks for tokens with a
//! valid MAC: lenient base64 (padded or not, `+`/`/` as well as `-`/`_`,
//! foreign characters skipped), byte-encoding detection (UTF-8 with or without
//! BOM, UTF-16, UTF-32), `NaN`/`Infinity` literals, integers of any size up to
//! 4300 digits, duplicate keys (last wins) and lone surrogate escapes.
//!
//! Deviations, all on inputs only a key holder could sign: lone surrogates
//! become U+FFFD (Rust strings cannot hold them), and nesting deeper than
//! [`MAX_NESTING`] is refused where Python raises `RecursionError` at about
//! 1000 levels.
//!
//! It never panics on input.

use serde_json::{Map, Number, Value};

/// Deepest accepted array/object nesting.
pub(super) const MAX_NESTING: usize = 512;

/// Python 3.11's limit on the digits of an integer literal.
const MAX_INT_DIGITS: usize = 4300;

/// A decoded JSON value with Python's distinctions kept: integers are not
/// floats, whatever their size.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum PyJson {
    Null,
    Bool(bool),
    /// An integer literal (optional `-`, then digits), kept as text.
    Int(String),
    Float(f64),
    Str(String),
    Array(Vec<PyJson>),
    /// Members in document order; duplicates are kept and [`PyJson::get`]
    /// returns the last, as a Python dict would.
    Object(Vec<(String, PyJson)>),
}

impl PyJson {
    /// The value of `key` in an object (last duplicate wins).
    pub(super) fn get(&self, key: &str) -> Option<&PyJson> {
        match self {
            PyJson::Object(members) => members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Number of distinct keys of an object.
    pub(super) fn distinct_keys(&self) -> usize {
        match self {
            PyJson::Object(members) => members
                .iter()
                .enumerate()
                .filter(|(i, (k, _))| !members[i + 1..].iter().any(|(k2, _)| k2 == k))
                .count(),
            _ => 0,
        }
    }

    /// The integer saturated into `i64`, if this is an integer.
    pub(super) fn as_int(&self) -> Option<i64> {
        match self {
            PyJson::Int(text) => Some(saturating_i64(text)),
            _ => None,
        }
    }

    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            PyJson::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Converts to a `serde_json::Value`. Integers outside `i64`/`u64` become
    /// the nearest `f64`; `NaN` and infinities (which `Value` cannot hold)
    /// become `null`.
    pub(super) fn to_value(&self) -> Value {
        match self {
            PyJson::Null => Value::Null,
            PyJson::Bool(b) => Value::Bool(*b),
            PyJson::Int(text) => {
                if let Ok(i) = text.parse::<i64>() {
                    Value::Number(i.into())
                } else if let Ok(u) = text.parse::<u64>() {
                    Value::Number(u.into())
                } else {
                    float_value(text.parse::<f64>().unwrap_or(f64::NAN))
                }
            }
            PyJson::Float(f) => float_value(*f),
            PyJson::Str(s) => Value::String(s.clone()),
            PyJson::Array(items) => Value::Array(items.iter().map(PyJson::to_value).collect()),
            PyJson::Object(members) => Value::Object(to_map(members)),
        }
    }
}

/// Converts object members to a map, later duplicates overwriting earlier.
pub(super) fn to_map(members: &[(String, PyJson)]) -> Map<String, Value> {
    let mut map = Map::new();
    for (k, v) in members {
        map.insert(k.clone(), v.to_value());
    }
    map
}

fn float_value(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn saturating_i64(text: &str) -> i64 {
    text.parse::<i64>().unwrap_or(if text.starts_with('-') {
        i64::MIN
    } else {
        i64::MAX
    })
}

/// `base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))`:
/// CPython's non-strict decoder, which skips characters outside the alphabet,
/// stops at a completing pad sequence and ignores leftover bits.
pub(super) fn b64url_decode(segment: &str) -> Option<Vec<u8>> {
    if !segment.is_ascii() {
        return None;
    }
    let pad = (4 - segment.len() % 4) % 4;
    let input = segment.bytes().chain(std::iter::repeat_n(b'=', pad));
    let mut out = Vec::with_capacity(segment.len() / 4 * 3 + 3);
    let (mut quad_pos, mut left, mut pads) = (0u8, 0u8, 0u8);
    for ch in input {
        if ch == b'=' {
            if quad_pos >= 2 {
                pads += 1;
                if quad_pos + pads >= 4 {
                    return Some(out);
                }
            }
            continue;
        }
        let v = match ch {
            b'A'..=b'Z' => ch - b'A',
            b'a'..=b'z' => ch - b'a' + 26,
            b'0'..=b'9' => ch - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => continue,
        };
        pads = 0;
        match quad_pos {
            0 => {
                quad_pos = 1;
                left = v;
            }
            1 => {
                quad_pos = 2;
                out.push((left << 2) | (v >> 4));
                left = v & 0x0f;
            }
            2 => {
                quad_pos = 3;
                out.push((left << 4) | (v >> 2));
                left = v & 0x03;
            }
            _ => {
                quad_pos = 0;
                out.push((left << 6) | v);
                left = 0;
            }
        }
    }
    (quad_pos == 0).then_some(out)
}

/// `json.loads(bytes)`: detect the encoding, decode (surrogates pass, here
/// replaced by U+FFFD), parse.
pub(super) fn loads(bytes: &[u8]) -> Option<PyJson> {
    let text = decode_text(bytes)?;
    Parser {
        s: text.as_bytes(),
        text: &text,
        i: 0,
        depth: 0,
    }
    .document()
}

#[derive(Clone, Copy)]
enum Encoding {
    Utf8,
    Utf16 { big: bool },
    Utf32 { big: bool },
}

/// Python's `json.detect_encoding` followed by `bytes.decode(enc, "surrogatepass")`.
fn decode_text(b: &[u8]) -> Option<String> {
    let (enc, body) = if let Some(rest) = b.strip_prefix(&[0, 0, 0xfe, 0xff]) {
        (Encoding::Utf32 { big: true }, rest)
    } else if let Some(rest) = b.strip_prefix(&[0xff, 0xfe, 0, 0]) {
        (Encoding::Utf32 { big: false }, rest)
    } else if let Some(rest) = b.strip_prefix(&[0xfe, 0xff]) {
        (Encoding::Utf16 { big: true }, rest)
    } else if let Some(rest) = b.strip_prefix(&[0xff, 0xfe]) {
        (Encoding::Utf16 { big: false }, rest)
    } else if let Some(rest) = b.strip_prefix(&[0xef, 0xbb, 0xbf]) {
        (Encoding::Utf8, rest)
    } else if b.len() >= 4 {
        let enc = if b[0] == 0 {
            if b[1] != 0 {
                Encoding::Utf16 { big: true }
            } else {
                Encoding::Utf32 { big: true }
            }
        } else if b[1] == 0 {
            if b[2] != 0 || b[3] != 0 {
                Encoding::Utf16 { big: false }
            } else {
                Encoding::Utf32 { big: false }
            }
        } else {
            Encoding::Utf8
        };
        (enc, b)
    } else if b.len() == 2 && b[0] == 0 {
        (Encoding::Utf16 { big: true }, b)
    } else if b.len() == 2 && b[1] == 0 {
        (Encoding::Utf16 { big: false }, b)
    } else {
        (Encoding::Utf8, b)
    };
    match enc {
        Encoding::Utf8 => decode_utf8_surrogatepass(body),
        Encoding::Utf16 { big } => {
            if body.len() % 2 != 0 {
                return None;
            }
            let units = body.chunks_exact(2).map(|c| {
                let pair = [c[0], c[1]];
                if big {
                    u16::from_be_bytes(pair)
                } else {
                    u16::from_le_bytes(pair)
                }
            });
            Some(
                char::decode_utf16(units)
                    .map(|r| r.unwrap_or(char::REPLACEMENT_CHARACTER))
                    .collect(),
            )
        }
        Encoding::Utf32 { big } => {
            if body.len() % 4 != 0 {
                return None;
            }
            body.chunks_exact(4)
                .map(|c| {
                    let quad = [c[0], c[1], c[2], c[3]];
                    let n = if big {
                        u32::from_be_bytes(quad)
                    } else {
                        u32::from_le_bytes(quad)
                    };
                    match n {
                        0xd800..=0xdfff => Some(char::REPLACEMENT_CHARACTER),
                        n => char::from_u32(n),
                    }
                })
                .collect()
        }
    }
}

/// UTF-8 where encoded surrogates (`ED A0..BF 80..BF`) are let through, as
/// Python's `surrogatepass` does; each becomes U+FFFD.
fn decode_utf8_surrogatepass(mut b: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(b.len());
    loop {
        match std::str::from_utf8(b) {
            Ok(s) => {
                out.push_str(s);
                return Some(out);
            }
            Err(e) => {
                let (good, rest) = b.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).ok()?);
                match rest {
                    [0xed, 0xa0..=0xbf, 0x80..=0xbf, tail @ ..] => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        b = tail;
                    }
                    _ => return None,
                }
            }
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn document(mut self) -> Option<PyJson> {
        self.ws();
        let v = self.value()?;
        self.ws();
        (self.i == self.s.len()).then_some(v)
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Option<PyJson> {
        match self.peek()? {
            b'"' => self.string().map(PyJson::Str),
            b'{' => self.nested(Self::object),
            b'[' => self.nested(Self::array),
            b'n' if self.eat("null") => Some(PyJson::Null),
            b't' if self.eat("true") => Some(PyJson::Bool(true)),
            b'f' if self.eat("false") => Some(PyJson::Bool(false)),
            b'N' if self.eat("NaN") => Some(PyJson::Float(f64::NAN)),
            b'I' if self.eat("Infinity") => Some(PyJson::Float(f64::INFINITY)),
            b'-' if self.eat("-Infinity") => Some(PyJson::Float(f64::NEG_INFINITY)),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn nested(&mut self, f: fn(&mut Self) -> Option<PyJson>) -> Option<PyJson> {
        if self.depth >= MAX_NESTING {
            return None;
        }
        self.depth += 1;
        let v = f(self);
        self.depth -= 1;
        v
    }

    fn object(&mut self) -> Option<PyJson> {
        self.i += 1; // '{'
        let mut members = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Some(PyJson::Object(members));
        }
        loop {
            if self.peek() != Some(b'"') {
                return None;
            }
            let key = self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return None;
            }
            self.i += 1;
            self.ws();
            let v = self.value()?;
            members.push((key, v));
            self.ws();
            match self.peek()? {
                b'}' => {
                    self.i += 1;
                    return Some(PyJson::Object(members));
                }
                b',' => {
                    self.i += 1;
                    self.ws();
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self) -> Option<PyJson> {
        self.i += 1; // '['
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Some(PyJson::Array(items));
        }
        loop {
            items.push(self.value()?);
            self.ws();
            match self.peek()? {
                b']' => {
                    self.i += 1;
                    return Some(PyJson::Array(items));
                }
                b',' => {
                    self.i += 1;
                    self.ws();
                }
                _ => return None,
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Option<PyJson> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let int_start = self.i;
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        let int_digits = self.i - int_start;
        let mut is_float = false;
        if self.peek() == Some(b'.') && matches!(self.s.get(self.i + 1), Some(b'0'..=b'9')) {
            self.i += 1;
            self.digits();
            is_float = true;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let e_start = self.i;
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() > 0 {
                is_float = true;
            } else {
                // Not an exponent after all; what follows is a syntax error
                // for the enclosing value.
                self.i = e_start;
            }
        }
        let text = &self.text[start..self.i];
        if is_float {
            text.parse::<f64>().ok().map(PyJson::Float)
        } else if int_digits > MAX_INT_DIGITS {
            None
        } else {
            Some(PyJson::Int(text.to_owned()))
        }
    }

    fn hex4(&self, at: usize) -> Option<u16> {
        let h = self.s.get(at..at + 4)?;
        let h = std::str::from_utf8(h).ok()?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u16::from_str_radix(h, 16).ok()
    }

    /// A string starting at the opening quote (strict: raw control characters
    /// are refused).
    fn string(&mut self) -> Option<String> {
        self.i += 1; // '"'
        let mut out = String::new();
        loop {
            let run_start = self.i;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.i += 1;
            }
            out.push_str(&self.text[run_start..self.i]);
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(out);
                }
                b'\\' => {
                    let esc = *self.s.get(self.i + 1)?;
                    self.i += 2;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4(self.i)?;
                            self.i += 4;
                            out.push(self.unit(hi));
                        }
                        _ => return None,
                    }
                }
                _ => return None, // raw control character
            }
        }
    }

    /// The character for a `\uXXXX` unit already consumed, joining a
    /// following low-surrogate escape to a high surrogate.
    fn unit(&mut self, hi: u16) -> char {
        if (0xd800..0xdc00).contains(&hi) && self.s[self.i..].starts_with(b"\\u") {
            if let Some(lo @ 0xdc00..=0xdfff) = self.hex4(self.i + 2) {
                self.i += 6;
                let c = 0x1_0000 + ((u32::from(hi) - 0xd800) << 10) + (u32::from(lo) - 0xdc00);
                return char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER);
            }
        }
        char::from_u32(u32::from(hi)).unwrap_or(char::REPLACEMENT_CHARACTER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(s: &str) -> PyJson {
        PyJson::Int(s.to_owned())
    }

    #[test]
    fn python_number_rules() {
        assert_eq!(loads(b"1"), Some(int("1")));
        assert_eq!(loads(b"-0"), Some(int("-0")));
        assert_eq!(loads(b"1.0"), Some(PyJson::Float(1.0)));
        assert_eq!(loads(b"1e2"), Some(PyJson::Float(100.0)));
        assert_eq!(loads(b"1E400"), Some(PyJson::Float(f64::INFINITY)));
        assert!(matches!(loads(b"NaN"), Some(PyJson::Float(f)) if f.is_nan()));
        assert_eq!(loads(b"-Infinity"), Some(PyJson::Float(f64::NEG_INFINITY)));
        for bad in [
            &b"01"[..],
            b"1.",
            b".5",
            b"+1",
            b"1e",
            b"-",
            b"--1",
            b"0x1",
            b"infinity",
        ] {
            assert_eq!(loads(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let big = "9".repeat(MAX_INT_DIGITS);
        assert_eq!(loads(big.as_bytes()), Some(int(&big)));
        assert_eq!(
            loads(format!("-{big}").as_bytes()).map(|v| v.as_int()),
            Some(Some(i64::MIN))
        );
        assert_eq!(loads(format!("{big}9").as_bytes()), None);
        assert_eq!(int(&big).as_int(), Some(i64::MAX));
    }

    #[test]
    fn python_string_rules() {
        assert_eq!(loads(br#""\ud83d\ude00""#), Some(PyJson::Str("😀".into())));
        assert_eq!(
            loads(br#""\ud83dA""#),
            Some(PyJson::Str("\u{fffd}A".into()))
        );
        assert_eq!(
            loads(br#""\ude00\ud83d""#),
            Some(PyJson::Str("\u{fffd}\u{fffd}".into()))
        );
        assert_eq!(loads(br#""\u00E9\/""#), Some(PyJson::Str("é/".into())));
        assert_eq!(loads(b"\"a\x01\""), None);
        assert_eq!(loads(b"\"a\x7f\""), Some(PyJson::Str("a\u{7f}".into())));
        assert_eq!(loads(br#""\x""#), None);
        assert_eq!(loads(br#""\u12""#), None);
        assert_eq!(loads(b"\"abc"), None);
    }

    #[test]
    fn python_structure_rules() {
        assert_eq!(
            loads(b" {\"a\" : [ ] } \r\n"),
            Some(PyJson::Object(vec![("a".into(), PyJson::Array(vec![]))]))
        );
        let dup = loads(br#"{"a":1,"a":2}"#);
        assert_eq!(dup.as_ref().and_then(|v| v.get("a")), Some(&int("2")));
        assert_eq!(dup.map(|v| v.distinct_keys()), Some(1));
        for bad in [
            &b"[1,]"[..],
            b"{\"a\":1,}",
            b"{1:2}",
            b"[1 2]",
            b"",
            b" ",
            b"{} x",
            b"\x0c{}",
        ] {
            assert_eq!(loads(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = "[".repeat(MAX_NESTING) + &"]".repeat(MAX_NESTING);
        assert!(loads(deep.as_bytes()).is_some());
        let deeper = "[".repeat(MAX_NESTING + 1) + &"]".repeat(MAX_NESTING + 1);
        assert!(loads(deeper.as_bytes()).is_none());
    }

    #[test]
    fn encodings() {
        let expect = Some(PyJson::Object(vec![("a".into(), int("1"))]));
        let utf16le: Vec<u8> = "{\"a\":1}"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        let utf16be: Vec<u8> = "{\"a\":1}"
            .encode_utf16()
            .flat_map(u16::to_be_bytes)
            .collect();
        let utf32le: Vec<u8> = "{\"a\":1}"
            .chars()
            .flat_map(|c| u32::from(c).to_le_bytes())
            .collect();
        assert_eq!(loads(&utf16le), expect);
        assert_eq!(loads(&utf16be), expect);
        assert_eq!(loads(&utf32le), expect);
        assert_eq!(loads(&[&[0xff, 0xfe][..], &utf16le].concat()), expect);
        assert_eq!(loads(b"\xef\xbb\xbf{\"a\":1}"), expect);
        assert_eq!(
            loads(b"\"\xed\xa0\x80\""),
            Some(PyJson::Str("\u{fffd}".into()))
        );
        assert_eq!(loads(b"\"\xff\""), None);
        assert_eq!(loads(b"12"), Some(int("12")));
    }

    #[test]
    fn base64_like_cpython() {
        assert_eq!(b64url_decode("YQ"), Some(b"a".to_vec()));
        assert_eq!(b64url_decode("YQ=="), Some(b"a".to_vec()));
        assert_eq!(b64url_decode("YR"), Some(b"a".to_vec()));
        assert_eq!(b64url_decode("-_-_"), b64url_decode("+/+/"));
        assert_eq!(b64url_decode("Y!Q"), None);
        assert_eq!(b64url_decode("Y!Q="), None);
        assert_eq!(b64url_decode("Y!!Q"), None);
        assert_eq!(b64url_decode("YQ!==="), Some(b"a".to_vec()));
        assert_eq!(b64url_decode("YQ==YWJj"), Some(b"a".to_vec()));
        assert_eq!(b64url_decode("Y"), None);
        assert_eq!(b64url_decode(""), Some(vec![]));
        assert_eq!(b64url_decode("é"), None);
    }
}
