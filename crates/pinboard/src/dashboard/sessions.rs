//! Dashboard login sessions: a random session id (the cookie) mapped to a
//! random CSRF token and an expiry.
//!
//! Owns the table and its bounds: at most [`MAX_SESSIONS`] sessions, each
//! for [`SESSION_TTL`] from login; a login into a full table first drops
//! expired sessions, then the one closest to expiry. Session ids are kept
//! as SHA-256 digests (a memory dump shows no usable cookie) and looked up
//! by digest; the CSRF token is compared in constant time. Never logs an
//! id or a token.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::clock::Entropy;

/// Most dashboard sessions at once (per pinboard node).
pub const MAX_SESSIONS: usize = 64;
/// How long a login lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

#[derive(Debug, Clone)]
struct Entry {
    csrf: String,
    expires: Instant,
}

/// The session table.
pub struct Sessions {
    entries: Mutex<HashMap<[u8; 32], Entry>>,
    entropy: Arc<dyn Entropy>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("count", &self.entries.lock().len())
            .finish()
    }
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// A new login: the cookie value and the page's CSRF token.
#[derive(Debug, Clone)]
pub struct Login {
    /// Session id (the cookie's value).
    pub id: String,
    /// CSRF token the page sends back in a header with every action.
    pub csrf: String,
}

impl Sessions {
    /// An empty table drawing ids from `entropy`.
    pub fn new(entropy: Arc<dyn Entropy>) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            entropy,
        }
    }

    /// Start a session at `now`.
    pub fn login(&self, now: Instant) -> Login {
        let login = Login {
            id: self.entropy.token_hex(32),
            csrf: self.entropy.token_hex(32),
        };
        let mut entries = self.entries.lock();
        if entries.len() >= MAX_SESSIONS {
            entries.retain(|_, e| e.expires > now);
        }
        if entries.len() >= MAX_SESSIONS {
            if let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| *k)
            {
                entries.remove(&oldest);
            }
        }
        entries.insert(
            digest(&login.id),
            Entry {
                csrf: login.csrf.clone(),
                expires: now + SESSION_TTL,
            },
        );
        login
    }

    /// The CSRF token of live session `id`, if any.
    pub fn csrf(&self, id: &str, now: Instant) -> Option<String> {
        let key = digest(id);
        let mut entries = self.entries.lock();
        match entries.get(&key) {
            Some(e) if e.expires > now => Some(e.csrf.clone()),
            Some(_) => {
                entries.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Whether `presented` is the CSRF token of live session `id`.
    pub fn check_csrf(&self, id: &str, presented: &str, now: Instant) -> bool {
        self.csrf(id, now)
            .is_some_and(|csrf| bool::from(csrf.as_bytes().ct_eq(presented.as_bytes())))
    }

    /// End session `id` (idempotent).
    pub fn logout(&self, id: &str) {
        self.entries.lock().remove(&digest(id));
    }

    /// Sessions in the table (live or not yet dropped).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SeededEntropy;

    #[test]
    fn sessions_expire_are_bounded_and_check_their_csrf() {
        let s = Sessions::new(Arc::new(SeededEntropy::seeded(7)));
        let t0 = Instant::now();
        let a = s.login(t0);
        assert!(s.check_csrf(&a.id, &a.csrf, t0));
        assert!(!s.check_csrf(&a.id, "forged", t0));
        assert!(!s.check_csrf("unknown", &a.csrf, t0));
        assert!(s.csrf(&a.id, t0 + SESSION_TTL).is_none(), "expired");
        let b = s.login(t0);
        s.logout(&b.id);
        assert!(s.csrf(&b.id, t0).is_none(), "logged out");
        for _ in 0..MAX_SESSIONS * 2 {
            s.login(t0);
        }
        assert_eq!(s.len(), MAX_SESSIONS);
    }
}
