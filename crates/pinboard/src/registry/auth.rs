//! Bearer credentials of `/registry/*`: which tokens a call may present.
//!
//! Owns the two credentials and their comparison; never logs a token.
//!
//! - The *worker* token (`--token`) is what workers present on register,
//!   heartbeat, release, deregister and tag.
//! - The *operator* token (`--operator-token`) is what an operator presents
//!   on push, workers and overview. A worker's token does not open those,
//!   and an operator's token does not register a worker.
//! - Without `--operator-token`, the operator endpoints take the worker
//!   token (as before there were two; `crate::run` logs a warning at
//!   start), so one token still runs a development setup.
//!
//! Each credential is a comma-separated list, so a token can be rotated
//! without downtime: deploy `new,old`, move every client to `new`, then
//! deploy `new`.
//!
//! # Comparison
//!
//! Tokens are kept only as SHA-256 digests. A presented token is hashed
//! once and compared with *every* accepted digest in constant time (no
//! early exit), so neither the position of a match nor the length or
//! content of a token shows in the time an answer takes.

use http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

/// A set of accepted bearer tokens (more than one during a rotation).
#[derive(Clone)]
pub struct Tokens {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("count", &self.digests.len())
            .finish()
    }
}

/// The entries of a comma-separated token list, trimmed; `None` when the
/// list is empty or holds an empty entry (`"a,,b"`, `"a,"`).
pub fn split_list(list: &str) -> Option<Vec<&str>> {
    let entries: Vec<&str> = list.split(',').map(str::trim).collect();
    if entries.iter().any(|e| e.is_empty()) {
        return None;
    }
    Some(entries)
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl Tokens {
    /// The tokens of a comma-separated list (entries trimmed); `None` when
    /// the list is empty or holds an empty entry.
    pub fn parse(list: &str) -> Option<Self> {
        let digests = split_list(list)?
            .into_iter()
            .map(|t| digest(t.as_bytes()))
            .collect();
        Some(Self { digests })
    }

    /// Accepts nothing.
    pub fn none() -> Self {
        Self {
            digests: Vec::new(),
        }
    }

    /// Whether `presented` is one of the tokens (constant time, see the
    /// module doc).
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let presented = digest(presented);
        let mut any = Choice::from(0);
        for d in &self.digests {
            any |= d.ct_eq(&presented);
        }
        bool::from(any) && !self.digests.is_empty()
    }

    /// Whether `headers` carry `Authorization: Bearer <one of the tokens>`.
    pub fn authorize(&self, headers: &HeaderMap) -> bool {
        let presented = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        match presented {
            Some(p) if !p.is_empty() => self.accepts(p),
            _ => false,
        }
    }
}

/// The two credentials of the registry.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// Accepted on the worker endpoints.
    pub worker: Tokens,
    /// Accepted on the operator endpoints.
    pub operator: Tokens,
    /// Whether `operator` is the worker token (no `--operator-token`).
    pub shared: bool,
}

impl Credentials {
    /// From the flag values. A list that is empty or holds an empty entry
    /// (which the configuration check refuses) accepts no token at all.
    pub fn new(worker: &str, operator: Option<&str>) -> Self {
        let worker_tokens = Tokens::parse(worker).unwrap_or_else(Tokens::none);
        match operator {
            Some(op) => Self {
                worker: worker_tokens,
                operator: Tokens::parse(op).unwrap_or_else(Tokens::none),
                shared: false,
            },
            None => Self {
                operator: worker_tokens.clone(),
                worker: worker_tokens,
                shared: true,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("header value"),
        );
        h
    }

    #[test]
    fn every_token_of_a_rotation_list_is_accepted_and_nothing_else() {
        let t = Tokens::parse(" new , old").expect("list");
        assert!(t.authorize(&bearer("new")));
        assert!(t.authorize(&bearer("old")));
        for wrong in ["ne", "newer", "new,old", " new", ""] {
            assert!(!t.authorize(&bearer(wrong)), "{wrong:?}");
        }
        assert!(!t.authorize(&HeaderMap::new()));
        let mut basic = HeaderMap::new();
        basic.insert(http::header::AUTHORIZATION, "new".parse().expect("hv"));
        assert!(!t.authorize(&basic));
    }

    #[test]
    fn empty_lists_and_entries_are_refused() {
        for bad in ["", " ", "a,", ",a", "a, ,b"] {
            assert!(Tokens::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn the_operator_token_is_its_own_unless_absent() {
        let split = Credentials::new("w1,w2", Some("op"));
        assert!(!split.shared);
        assert!(split.worker.accepts(b"w2") && !split.worker.accepts(b"op"));
        assert!(split.operator.accepts(b"op") && !split.operator.accepts(b"w1"));
        let shared = Credentials::new("w", None);
        assert!(shared.shared && shared.operator.accepts(b"w"));
        let closed = Credentials::new("w", Some(""));
        assert!(!closed.operator.accepts(b"") && !closed.operator.accepts(b"w"));
    }
}
