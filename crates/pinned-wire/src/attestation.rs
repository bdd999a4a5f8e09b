//! The `Pinboard-Attestation` token: a compact JWS, HS256 over the worker's
//! registration secret (wire.md §3).
//!
//! This module owns minting, verification and the caller shapes a verified
//! token yields. It never reads a clock (callers pass wall seconds) and never
//! lets the token header pick the algorithm: the MAC is recomputed and
//! compared, in constant time and as text, before any decoding.
//!
//! Invariants:
//! - [`mint`] is byte-identical to the reference: constant header segment,
//!   compact claims JSON in the order `aud`, `iat`, `exp`, `caller`, `depth`,
//!   non-ASCII escaped as `\uXXXX` (surrogate pairs above U+FFFF), `U+007F`
//!   escaped too, lowercase hex;
//! - [`verify`] accepts exactly the tokens the reference accepts, including
//!   its decoding quirks for tokens signed with the right key (see the private
//!   `pyjson` module); a token the reference would crash on is refused.

mod pyjson;

use std::collections::BTreeSet;
use std::fmt::Write as _;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::digest::generic_array::GenericArray;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use self::pyjson::PyJson;

type HmacSha256 = Hmac<Sha256>;

/// Lifetime of a minted token: `exp = iat + TTL_SECS`.
pub const TTL_SECS: i64 = 30;

/// Clock skew tolerated on each side of `[iat, exp]` when verifying.
pub const SKEW_SECS: i64 = 30;

/// The token header, exactly as minted.
pub const HEADER_JSON: &str = r#"{"alg":"HS256","typ":"pinboard+jwt"}"#;

/// The base64url form of [`HEADER_JSON`]: the first segment of every token.
pub const HEADER_SEGMENT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6InBpbmJvYXJkK2p3dCJ9";

/// Length of the base64url MAC segment (32 bytes, unpadded).
const MAC_SEGMENT_LEN: usize = 43;

/// The verified claims of a token. Unknown extra claims are dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// Audience: the session id of the placement, or a host's local audience.
    pub aud: String,
    /// Issued-at, wall seconds. Integers beyond `i64` saturate.
    pub iat: i64,
    /// Expiry, wall seconds. Integers beyond `i64` saturate.
    pub exp: i64,
    /// Calling instance path `<ns>/<id>` of a cluster call.
    pub caller: Option<String>,
    /// Subrequest depth of this call. Integers beyond `i64` saturate.
    pub depth: Option<i64>,
    /// Passport-verified principal.
    pub acct: Option<Account>,
}

/// The `acct` claim: a passport-verified principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Subject.
    pub sub: String,
    /// Granted scopes, in token order (default empty).
    pub scopes: Vec<String>,
    /// Extra principal claims (default empty). Values are converted from the
    /// reference's JSON model: integers beyond 64 bits become the nearest
    /// float, `NaN`/`Infinity` become `null`.
    pub claims: Map<String, Value>,
}

/// Who made a verified request, as the target instance sees it (wire.md §3.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Another instance, through a cluster call.
    Instance {
        /// The caller's namespace, with its leading slash.
        ns: String,
        /// The caller's id.
        id: String,
        /// The `depth` claim, or 0.
        depth: i64,
    },
    /// A passport-verified principal.
    Account {
        /// Subject.
        sub: String,
        /// Extra principal claims.
        claims: Map<String, Value>,
        /// Granted scopes.
        scopes: BTreeSet<String>,
    },
}

/// A worker secret prepared for minting and verifying many tokens: the HMAC
/// key schedule is computed once.
#[derive(Clone)]
pub struct Key {
    mac: HmacSha256,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// Prepares `secret` (its UTF-8 bytes are the HMAC key).
    #[must_use]
    pub fn new(secret: &str) -> Key {
        // HMAC's own key rule, done here so construction is infallible:
        // hash keys longer than the block, then zero-pad to the block.
        let mut block = [0u8; 64];
        let raw = secret.as_bytes();
        if raw.len() > block.len() {
            block[..32].copy_from_slice(&Sha256::digest(raw));
        } else {
            block[..raw.len()].copy_from_slice(raw);
        }
        Key {
            mac: <HmacSha256 as KeyInit>::new(GenericArray::from_slice(&block)),
        }
    }

    /// Mints a token; see [`mint`].
    #[must_use]
    pub fn mint(&self, aud: &str, now: f64, caller: Option<&str>, depth: Option<i64>) -> String {
        // Python's int(now): truncation toward zero. i128 keeps it exact
        // wherever Python would not raise.
        let iat = now as i128;
        let exp = iat + i128::from(TTL_SECS);
        let mut claims = String::with_capacity(
            48 + aud.len() + caller.map_or(0, |c| 12 + c.len()) + depth.map_or(0, |_| 30),
        );
        claims.push_str("{\"aud\":");
        push_ascii_json_str(&mut claims, aud);
        let _ = write!(claims, ",\"iat\":{iat},\"exp\":{exp}");
        if let Some(caller) = caller {
            claims.push_str(",\"caller\":");
            push_ascii_json_str(&mut claims, caller);
        }
        if let Some(depth) = depth {
            let _ = write!(claims, ",\"depth\":{depth}");
        }
        claims.push('}');

        let mut token = String::with_capacity(
            HEADER_SEGMENT.len() + 2 + claims.len().div_ceil(3) * 4 + MAC_SEGMENT_LEN,
        );
        token.push_str(HEADER_SEGMENT);
        token.push('.');
        URL_SAFE_NO_PAD.encode_string(claims.as_bytes(), &mut token);
        let tag = self.tag(token.as_bytes());
        token.push('.');
        URL_SAFE_NO_PAD.encode_string(tag, &mut token);
        token
    }

    /// Verifies a token; see [`verify`].
    pub fn verify(&self, token: &str, accept: impl Fn(&str) -> bool, now: f64) -> Option<Claims> {
        // 1. Exactly three parts.
        let mut parts = token.split('.');
        let (header, payload, mac) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        // 2. MAC, compared as text in constant time, before any decoding.
        let signing_input = &token[..header.len() + 1 + payload.len()];
        let mut expected = [0u8; MAC_SEGMENT_LEN];
        let n = URL_SAFE_NO_PAD
            .encode_slice(self.tag(signing_input.as_bytes()), &mut expected)
            .ok()?;
        if !bool::from(expected[..n].ct_eq(mac.as_bytes())) {
            return None;
        }
        // 3. Both segments decode to JSON.
        let header_ok = header == HEADER_SEGMENT || {
            let decoded = pyjson::b64url_decode(header).and_then(|b| pyjson::loads(&b))?;
            is_jose_header(&decoded)
        };
        let claims = pyjson::b64url_decode(payload).and_then(|b| pyjson::loads(&b))?;
        // 4, 5. Header equal to ours; claims an object.
        if !header_ok || !matches!(claims, PyJson::Object(_)) {
            return None;
        }
        // 6. Integer iat and exp.
        let iat = claims.get("iat")?.as_int()?;
        let exp = claims.get("exp")?.as_int()?;
        // 7. Skew, compared exactly as Python compares a float with an int:
        // for an integer n, `now < n` iff `floor(now) < n` and `now > n` iff
        // `ceil(now) > n`; `as` saturates, and NaN compares false (passes).
        let lo = i128::from(iat) - i128::from(SKEW_SECS);
        let hi = i128::from(exp) + i128::from(SKEW_SECS);
        let too_early = (now.floor() as i128) < lo;
        let too_late = (now.ceil() as i128) > hi;
        if !now.is_nan() && (too_early || too_late) {
            return None;
        }
        // 8. Accepted audience.
        let aud = claims.get("aud")?.as_str()?;
        if !accept(aud) {
            return None;
        }
        // 9. caller a string when present.
        let caller = match claims.get("caller") {
            None => None,
            Some(v) => Some(v.as_str()?.to_owned()),
        };
        // 10. depth an integer when present.
        let depth = match claims.get("depth") {
            None => None,
            Some(v) => Some(v.as_int()?),
        };
        // 11. acct well-shaped when present.
        let acct = match claims.get("acct") {
            None => None,
            Some(v) => Some(account(v)?),
        };
        Some(Claims {
            aud: aud.to_owned(),
            iat,
            exp,
            caller,
            depth,
            acct,
        })
    }

    fn tag(&self, message: &[u8]) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(message);
        mac.finalize().into_bytes().into()
    }
}

fn is_jose_header(v: &PyJson) -> bool {
    v.distinct_keys() == 2
        && v.get("alg").and_then(PyJson::as_str) == Some("HS256")
        && v.get("typ").and_then(PyJson::as_str) == Some("pinboard+jwt")
}

fn account(v: &PyJson) -> Option<Account> {
    if !matches!(v, PyJson::Object(_)) {
        return None;
    }
    let sub = v.get("sub")?.as_str()?.to_owned();
    let scopes = match v.get("scopes") {
        None => Vec::new(),
        Some(PyJson::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()?,
        Some(_) => return None,
    };
    let claims = match v.get("claims") {
        None => Map::new(),
        Some(PyJson::Object(members)) => pyjson::to_map(members),
        Some(_) => return None,
    };
    Some(Account {
        sub,
        scopes,
        claims,
    })
}

/// Appends `s` as a JSON string the way Python's `json.dumps` does with
/// `ensure_ascii=True`: printable ASCII other than `"` and `\` is kept; the
/// short escapes `\" \\ \b \f \n \r \t`; everything else as lowercase
/// `\uXXXX`, astral characters as a surrogate pair.
fn push_ascii_json_str(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let unit = |out: &mut String, u: u16| {
        out.push_str("\\u");
        for shift in [12, 8, 4, 0] {
            out.push(char::from(HEX[usize::from((u >> shift) & 0xf)]));
        }
    };
    out.push('"');
    let mut run_start = 0;
    for (i, c) in s.char_indices() {
        if matches!(c, ' '..='~') && c != '"' && c != '\\' {
            continue;
        }
        out.push_str(&s[run_start..i]);
        run_start = i + c.len_utf8();
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c => {
                let mut buf = [0u16; 2];
                for &u in c.encode_utf16(&mut buf).iter() {
                    unit(out, u);
                }
            }
        }
    }
    out.push_str(&s[run_start..]);
    out.push('"');
}

/// Mints a token for `aud`, issued at `now` (wall seconds, fractional),
/// byte-identical to the reference.
///
/// `iat` is `now` truncated toward zero (Python's `int(now)`, which equals
/// the floor for the non-negative times a clock gives); `exp = iat + 30`.
/// `caller` and `depth` are written only when given. A non-finite `now`
/// (where the reference raises) gives `iat` 0 for `NaN` or a saturated value.
///
/// For many tokens under one secret, prefer [`Key::mint`].
#[must_use]
pub fn mint(secret: &str, aud: &str, now: f64, caller: Option<&str>, depth: Option<i64>) -> String {
    Key::new(secret).mint(aud, now, caller, depth)
}

/// Verifies `token` under `secret` at wall time `now`, returning its claims,
/// or `None` for any malformed, mis-keyed, stale or unaccepted token (the
/// checks of wire.md §3.3, in order). `accept` says whether an audience is
/// accepted; it is called at most once, only with a string `aud`.
///
/// `token` is the header value as text; a caller holding raw header bytes
/// should decode them as Latin-1 to match the reference exactly. Where the
/// reference would raise rather than refuse (a non-ASCII MAC segment, a
/// non-hashable `aud`, nesting beyond about 1000 levels) this returns `None`.
///
/// For many tokens under one secret, prefer [`Key::verify`].
pub fn verify(
    token: &str,
    secret: &str,
    accept: impl Fn(&str) -> bool,
    now: f64,
) -> Option<Claims> {
    Key::new(secret).verify(token, accept, now)
}

/// The caller a verified token names (wire.md §3.5): `caller` wins (split at
/// its last `/`; an empty namespace or id part means anonymous), then `acct`;
/// `None` is anonymous.
#[must_use]
pub fn attested_caller(claims: &Claims) -> Option<Caller> {
    if let Some(path) = &claims.caller {
        let (ns, id) = path.rsplit_once('/')?;
        if ns.is_empty() || id.is_empty() {
            return None;
        }
        return Some(Caller::Instance {
            ns: ns.to_owned(),
            id: id.to_owned(),
            depth: claims.depth.unwrap_or(0),
        });
    }
    claims.acct.as_ref().map(|acct| Caller::Account {
        sub: acct.sub.clone(),
        claims: acct.claims.clone(),
        scopes: acct.scopes.iter().cloned().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6InBpbmJvYXJkK2p3dCJ9.eyJhdWQiOiJzZXNzLTEiLCJpYXQiOjE4MDAwMDAwMDAsImV4cCI6MTgwMDAwMDAzMCwiY2FsbGVyIjoiL3RocmVhZHMvYSIsImRlcHRoIjoxfQ.a-7Z9JC3ruLrA3oZtmuKeonH5aNT9wHuU6rp9ME8LRQ";

    fn only(aud: &'static str) -> impl Fn(&str) -> bool {
        move |a| a == aud
    }

    #[test]
    fn header_segment_is_header_json() {
        assert_eq!(URL_SAFE_NO_PAD.encode(HEADER_JSON), HEADER_SEGMENT);
    }

    #[test]
    fn spec_example() {
        let token = mint(
            "secret",
            "sess-1",
            1_800_000_000.7,
            Some("/threads/a"),
            Some(1),
        );
        assert_eq!(token, EXAMPLE);
        let claims = verify(EXAMPLE, "secret", only("sess-1"), 1_800_000_010.0);
        assert_eq!(
            claims,
            Some(Claims {
                aud: "sess-1".into(),
                iat: 1_800_000_000,
                exp: 1_800_000_030,
                caller: Some("/threads/a".into()),
                depth: Some(1),
                acct: None,
            })
        );
        assert_eq!(
            verify(EXAMPLE, "Secret", only("sess-1"), 1_800_000_010.0),
            None
        );
        assert_eq!(
            verify(EXAMPLE, "secret", only("sess-2"), 1_800_000_010.0),
            None
        );
    }

    #[test]
    fn window_edges() {
        let t = mint("k", "a", 1000.9, None, None);
        let at = |now: f64| verify(&t, "k", only("a"), now).is_some();
        assert!(at(970.0));
        assert!(!at(969.999_999));
        assert!(at(1060.0));
        assert!(!at(1_060.000_001));
        assert!(at(f64::NAN));
        assert!(!at(f64::INFINITY));
        assert!(!at(f64::NEG_INFINITY));
    }

    #[test]
    fn escapes_like_python() {
        let mut s = String::new();
        push_ascii_json_str(&mut s, "a\"\\/\n\u{1}\u{7f}é\u{ffff}😀");
        assert_eq!(s, r#""a\"\\/\n\u0001\u007f\u00e9\uffff\ud83d\ude00""#);
    }

    #[test]
    fn long_secret_keys_like_hmac() {
        let secret = "x".repeat(100);
        let mut reference =
            <HmacSha256 as Mac>::new_from_slice(secret.as_bytes()).expect("any key length");
        reference.update(b"m");
        let want: [u8; 32] = reference.finalize().into_bytes().into();
        assert_eq!(Key::new(&secret).tag(b"m"), want);
    }

    #[test]
    fn callers() {
        let base = Claims {
            aud: "a".into(),
            iat: 0,
            exp: 30,
            caller: None,
            depth: None,
            acct: None,
        };
        let with = |caller: &str| Claims {
            caller: Some(caller.into()),
            depth: Some(3),
            ..base.clone()
        };
        assert_eq!(
            attested_caller(&with("/a/b/c")),
            Some(Caller::Instance {
                ns: "/a/b".into(),
                id: "c".into(),
                depth: 3
            })
        );
        for anonymous in ["", "abc", "/abc", "/ns/", "/"] {
            assert_eq!(attested_caller(&with(anonymous)), None, "{anonymous:?}");
        }
        assert_eq!(attested_caller(&base), None);
        let acct = Claims {
            acct: Some(Account {
                sub: "u".into(),
                scopes: vec!["b".into(), "a".into(), "b".into()],
                claims: Map::new(),
            }),
            ..base.clone()
        };
        assert_eq!(
            attested_caller(&acct),
            Some(Caller::Account {
                sub: "u".into(),
                claims: Map::new(),
                scopes: ["a".to_owned(), "b".to_owned()].into(),
            })
        );
        let both = Claims {
            caller: Some("/n/i".into()),
            ..acct
        };
        assert!(matches!(
            attested_caller(&both),
            Some(Caller::Instance { depth: 0, .. })
        ));
    }
}
