//! The operator dashboard at `/dashboard`: one page served by pinboard
//! itself, its HTML, CSS and JavaScript embedded in the binary
//! (`include_str!`, no build step), behind the operator credential.
//!
//! Owns the login (the operator token exchanged for a session cookie:
//! `HttpOnly`, `SameSite=Strict`, `Path=/dashboard`), the bounded session
//! table ([`sessions`]), the page's JSON feed and its actions ([`http`]).
//! Never puts the token in a URL, never accepts an action without the
//! session's CSRF token in a request header, and never decides anything
//! itself: actions are the same `push` as `/registry/push`, views the same
//! reads as the operator endpoints.

pub mod http;
pub mod sessions;

use std::sync::Arc;

use crate::clock::Entropy;

use self::sessions::Sessions;

/// The dashboard's state on one node.
#[derive(Debug)]
pub struct Dashboard {
    /// Logged-in browser sessions.
    pub sessions: Sessions,
    /// The lease TTL granted to workers (the page shows the time since a
    /// worker's last heartbeat as TTL minus what is left of its lease).
    pub lease_ttl_ms: u64,
}

impl Dashboard {
    /// A dashboard with no one logged in.
    pub fn new(lease_ttl_ms: u64, entropy: Arc<dyn Entropy>) -> Self {
        Self {
            sessions: Sessions::new(entropy),
            lease_ttl_ms,
        }
    }
}
