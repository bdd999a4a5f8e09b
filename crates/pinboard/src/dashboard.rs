//! The operator dashboard at `/dashboard`: one page served by pinboard
//! itself, its HTML, CSS and JavaScript embedded in the binary
//! (`include_str!`, no build step), behind the operator credential.
//!
//! Owns the login (the operator token exchanged for a session cookie:
//! `HttpOnly`, `SameSite=Strict`, `Path=/dashboard`, and `Secure` when the
//! browser reaches pinboard over TLS), the limit on failed logins per
//! client address ([`login_limit`]), the bounded session table
//! ([`sessions`]), the page's JSON feed and its actions ([`http`]).
//! Never puts the token in a URL, never accepts an action without the
//! session's CSRF token in a request header, and never decides anything
//! itself: actions are the same `push` as `/registry/push`, views the same
//! reads as the operator endpoints.

pub mod http;
pub mod login_limit;
pub mod sessions;

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Entropy;

use self::login_limit::LoginLimiter;
use self::sessions::Sessions;

/// The dashboard's settings, from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct DashboardSettings {
    /// The lease TTL granted to workers.
    pub lease_ttl_ms: u64,
    /// Whether the session cookie carries `Secure`: pinboard serves TLS
    /// (`--tls-cert`), or a TLS front door does
    /// (`--dashboard-secure-cookie`).
    pub secure_cookie: bool,
    /// The window of the failed-login limit (`--dashboard-login-window-ms`).
    pub login_window: Duration,
}

/// The dashboard's state on one node.
#[derive(Debug)]
pub struct Dashboard {
    /// Logged-in browser sessions.
    pub sessions: Sessions,
    /// The lease TTL granted to workers (the page shows the time since a
    /// worker's last heartbeat as TTL minus what is left of its lease).
    pub lease_ttl_ms: u64,
    /// Whether the session cookie carries `Secure`.
    pub secure_cookie: bool,
    /// Failed logins by client address.
    pub login_limit: LoginLimiter,
}

impl Dashboard {
    /// A dashboard with no one logged in.
    pub fn new(settings: DashboardSettings, entropy: Arc<dyn Entropy>) -> Self {
        Self {
            sessions: Sessions::new(entropy),
            lease_ttl_ms: settings.lease_ttl_ms,
            secure_cookie: settings.secure_cookie,
            login_limit: LoginLimiter::new(settings.login_window),
        }
    }
}
