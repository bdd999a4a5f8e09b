//! Placement worlds: which workers may serve a request, by the hostname and
//! environment it names.
//!
//! Owns the names (`Pinboard-Hostname`, and our own `Pinboard-Env`), their
//! syntax, and the one matching rule between a request's world and a
//! worker's registration. Never reads the store and never allocates for a
//! hostless request (the common case): a [`World`] borrows from the
//! request's headers or the caller's record.
//!
//! # Rules (inferred: the seeds name the fields, not the matching)
//!
//! - A world is a hostname (or none: the *hostless* world) and an
//!   environment (or none). A worker serves namespace `ns` in exactly one
//!   world: its registered `hostname`, and `envs[ns]` when present, else
//!   its `env`. The reference refuses `env`/`envs` without a hostname, and
//!   so does pinboard, so the hostless world has no environment.
//! - Hostnames compare ASCII case-insensitively (they are DNS names);
//!   environments compare exactly.
//! - A client request names its hostname with `Pinboard-Hostname`; without
//!   it, with `Host` (its port stripped; the authority of an absolute-form
//!   target wins over `Host`, RFC 9112 §3.2.2) when that is a *bound*
//!   hostname: one a worker registered and the store still remembers,
//!   whether or not a worker of it is live now (the proxy's
//!   `routes::View::binds`). A browser cannot set headers, and the
//!   JS document's `clusterHost` design has `Host` name the world, with
//!   `Pinboard-Hostname` for a pinboard behind a front door that routes by
//!   `Host`. Any other `Host` (pinboard's own address, say) is the
//!   hostless world. So a hostname world whose last worker is gone answers
//!   503 naming itself, never the hostless world's answer.
//! - `Pinboard-Env` names the environment within that hostname. The seeds
//!   name no client header for it, so it is pinboard's own; it needs a
//!   hostname (named either way).
//! - A cluster call stays in its caller's world (wire.md §11: "reaches only
//!   worlds the caller's own registration covers"); see [`cluster_world`].

use http::{HeaderMap, HeaderName, HeaderValue};
use pinned_wire::headers::HOSTNAME;

use crate::placement::WorkerRecord;

/// `pinboard-env`: the environment a client request's world is in (with
/// `Pinboard-Hostname`). Pinboard's own header: the seeds name none.
pub const ENV_HEADER: HeaderName = HeaderName::from_static("pinboard-env");

/// Longest hostname accepted (a DNS name, plus room for a `:port`).
pub const MAX_HOSTNAME_LEN: usize = 259;

/// Longest environment name accepted.
pub const MAX_ENV_LEN: usize = 64;

/// A request's placement world, borrowed from where it was named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct World<'a> {
    /// Hostname; `None` is the hostless world.
    pub hostname: Option<&'a str>,
    /// Environment within the hostname.
    pub env: Option<&'a str>,
}

/// Which workers a placement may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Only workers serving the namespace in this world; an id owned in
    /// another world is refused.
    World(World<'a>),
    /// Only workers registered under this hostname, whatever their
    /// environment (the sweeper, for a row stamped with a hostname and no
    /// environment).
    Hostname(&'a str),
    /// Any worker hosting the namespace (the sweeper, for a row that names
    /// no world).
    Any,
}

/// A world header a client (or a cluster caller) got wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorldError {
    /// `Pinboard-Hostname` is not a hostname. 400.
    #[error("malformed Pinboard-Hostname header: {0}")]
    MalformedHostname(&'static str),
    /// `Pinboard-Env` is not an environment name. 400.
    #[error("malformed Pinboard-Env header: {0}")]
    MalformedEnv(&'static str),
    /// `Pinboard-Env` without `Pinboard-Hostname`. 400.
    #[error("Pinboard-Env requires Pinboard-Hostname (the hostless world has no environments)")]
    EnvWithoutHostname,
    /// A cluster call named a world its caller's registration does not
    /// cover. 403.
    #[error("a cluster call stays in its caller's world (hostname and env of its registration)")]
    OtherWorld,
}

impl WorldError {
    /// The status a client gets for it.
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::OtherWorld => http::StatusCode::FORBIDDEN,
            _ => http::StatusCode::BAD_REQUEST,
        }
    }
}

/// Check a hostname (registered or named by a request): 1 to
/// [`MAX_HOSTNAME_LEN`] bytes of letters, digits, `.`, `-`, `_` and `:`
/// (a port), starting with a letter or digit.
///
/// # Errors
///
/// What is wrong with it.
pub fn validate_hostname(hostname: &str) -> Result<(), &'static str> {
    if hostname.is_empty() {
        return Err("hostname must be non-empty");
    }
    if hostname.len() > MAX_HOSTNAME_LEN {
        return Err("hostname must be at most 259 characters");
    }
    if !hostname.as_bytes()[0].is_ascii_alphanumeric() {
        return Err("hostname must start with a letter or digit");
    }
    if !hostname
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
    {
        return Err("hostname must contain only [A-Za-z0-9.:_-]");
    }
    Ok(())
}

/// Check an environment name: 1 to [`MAX_ENV_LEN`] bytes of letters,
/// digits, `.`, `-` and `_`.
///
/// # Errors
///
/// What is wrong with it.
pub fn validate_env(env: &str) -> Result<(), &'static str> {
    if env.is_empty() {
        return Err("env must be non-empty");
    }
    if env.len() > MAX_ENV_LEN {
        return Err("env must be at most 64 characters");
    }
    if !env
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Err("env must contain only [A-Za-z0-9._-]");
    }
    Ok(())
}

fn header<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<Result<&'a str, ()>> {
    headers.get(name).map(|v| v.to_str().map_err(|_| ()))
}

impl<'a> World<'a> {
    /// The hostless world (no hostname, no environment).
    pub const HOSTLESS: World<'static> = World {
        hostname: None,
        env: None,
    };

    /// The world a client request names (`Pinboard-Hostname`,
    /// `Pinboard-Env`). Two header lookups; nothing allocated.
    ///
    /// # Errors
    ///
    /// A malformed header, or an environment without a hostname.
    pub fn from_client(headers: &'a HeaderMap) -> Result<Self, WorldError> {
        Self::from_values(headers.get(HOSTNAME), headers.get(ENV_HEADER), None)
    }

    /// The world named by a `Pinboard-Hostname` and a `Pinboard-Env` value;
    /// without a `Pinboard-Hostname`, `by_host` (a bound hostname the
    /// request's `Host` names, see the module doc) is the hostname.
    ///
    /// # Errors
    ///
    /// As [`from_client`](Self::from_client).
    pub fn from_values(
        hostname: Option<&'a HeaderValue>,
        env: Option<&'a HeaderValue>,
        by_host: Option<&'a str>,
    ) -> Result<Self, WorldError> {
        let hostname = match hostname.map(HeaderValue::to_str) {
            None => by_host,
            Some(Err(_)) => return Err(WorldError::MalformedHostname("not visible ASCII")),
            Some(Ok(h)) => {
                validate_hostname(h).map_err(WorldError::MalformedHostname)?;
                Some(h)
            }
        };
        let env = match env.map(HeaderValue::to_str) {
            None => None,
            Some(Err(_)) => return Err(WorldError::MalformedEnv("not visible ASCII")),
            Some(Ok(e)) => {
                validate_env(e).map_err(WorldError::MalformedEnv)?;
                Some(e)
            }
        };
        if env.is_some() && hostname.is_none() {
            return Err(WorldError::EnvWithoutHostname);
        }
        Ok(Self { hostname, env })
    }

    /// Whether `record` serves namespace `ns` in this world.
    pub fn served_by(&self, record: &WorkerRecord, ns: &str) -> bool {
        let same_host = match (self.hostname, record.hostname.as_deref()) {
            (None, None) => true,
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            _ => false,
        };
        same_host && self.env == record.env_for(ns)
    }

    /// The 503 `detail` when no live worker serves `ns` in this world; `None`
    /// for the hostless world (the proxy's usual "no live worker" answer).
    pub fn no_worker_detail(&self) -> Option<String> {
        let hostname = self.hostname?;
        Some(match self.env {
            None => format!("no live worker serves this namespace for hostname {hostname:?}"),
            Some(env) => format!(
                "no live worker serves this namespace for hostname {hostname:?} in env {env:?}"
            ),
        })
    }
}

/// The hostname a client request's `Host` names, for the bound-hostname
/// rule (module doc): the authority of an absolute-form target, else the
/// `Host` value; its port stripped. `None` when there is none or it is not
/// a hostname at all. With its port kept too, when it had one (a hostname
/// may be registered with a port): the caller tries the bare one first.
pub fn host_names<'a>(
    uri: &'a http::Uri,
    host: Option<&'a HeaderValue>,
) -> Option<(&'a str, Option<&'a str>)> {
    let named = match uri.authority() {
        Some(authority) => authority.as_str(),
        None => host?.to_str().ok()?,
    };
    let bare = match named.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => named,
    };
    validate_hostname(bare).ok()?;
    Some((bare, (bare.len() < named.len()).then_some(named)))
}

impl Scope<'_> {
    /// Whether `record` may own `ns` under this scope.
    pub fn admits(&self, record: &WorkerRecord, ns: &str) -> bool {
        match self {
            Scope::World(w) => w.served_by(record, ns),
            Scope::Hostname(h) => record
                .hostname
                .as_deref()
                .is_some_and(|own| own.eq_ignore_ascii_case(h)),
            Scope::Any => true,
        }
    }
}

/// The world of a verified cluster call to namespace `target_ns`: the
/// caller's registered hostname and its environment for that namespace.
///
/// The request may also *name* a world: `Pinboard-Hostname` (JS
/// `clusterHost: "pinboard"`), else `Host` when the caller has a hostname
/// (the reference sends `Host: <hostname>` on cluster calls), and
/// `Pinboard-Env`. Naming one the caller's registration does not cover is
/// refused; a hostless caller's `Host` is pinboard's own and means nothing.
///
/// # Errors
///
/// [`WorldError::OtherWorld`] (403) for a world the caller does not cover.
pub fn cluster_world<'a>(
    headers: &HeaderMap,
    caller: &'a WorkerRecord,
    target_ns: &str,
) -> Result<World<'a>, WorldError> {
    let world = World {
        hostname: caller.hostname.as_deref(),
        env: caller.env_for(target_ns),
    };
    let named_host = match header(headers, &HOSTNAME) {
        Some(h) => Some(h.map_err(|()| WorldError::OtherWorld)?),
        None if world.hostname.is_some() => match header(headers, &http::header::HOST) {
            Some(h) => Some(h.map_err(|()| WorldError::OtherWorld)?),
            None => None,
        },
        None => None,
    };
    if let Some(named) = named_host {
        let covered = world
            .hostname
            .is_some_and(|own| own.eq_ignore_ascii_case(named));
        if !covered {
            return Err(WorldError::OtherWorld);
        }
    }
    if let Some(named) = header(headers, &ENV_HEADER) {
        let named = named.map_err(|()| WorldError::OtherWorld)?;
        if world.env != Some(named) {
            return Err(WorldError::OtherWorld);
        }
    }
    Ok(world)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn record(hostname: Option<&str>, env: Option<&str>, envs: &[(&str, &str)]) -> WorkerRecord {
        WorkerRecord {
            session_id: "s".into(),
            client_id: "c".into(),
            secret: "x".into(),
            advertise_url: "http://127.0.0.1:1".into(),
            namespaces: vec!["/a".into(), "/b".into()],
            headroom: 1,
            hostname: hostname.map(Into::into),
            env: env.map(Into::into),
            envs: envs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            ..Default::default()
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header value"));
        }
        h
    }

    #[test]
    fn hostless_requests_reach_only_hostless_workers() {
        let h = HeaderMap::new();
        let w = World::from_client(&h).expect("world");
        assert_eq!(w, World::HOSTLESS);
        assert!(w.served_by(&record(None, None, &[]), "/a"));
        assert!(!w.served_by(&record(Some("app"), None, &[]), "/a"));
    }

    #[test]
    fn hostnames_match_case_insensitively_and_envs_exactly() {
        let h = headers(&[
            ("pinboard-hostname", "App.Example"),
            ("pinboard-env", "staging"),
        ]);
        let w = World::from_client(&h).expect("world");
        let staging = record(Some("app.example"), Some("staging"), &[]);
        assert!(w.served_by(&staging, "/a"));
        assert!(!w.served_by(&record(Some("app.example"), Some("production"), &[]), "/a"));
        assert!(!w.served_by(&record(Some("app.example"), None, &[]), "/a"));
        // A per-namespace env overrides the worker's env for that namespace.
        let mixed = record(
            Some("app.example"),
            Some("production"),
            &[("/b", "staging")],
        );
        assert!(!w.served_by(&mixed, "/a"));
        assert!(w.served_by(&mixed, "/b"));
    }

    #[test]
    fn a_hostname_scope_admits_every_env_of_its_hostname_only() {
        let scope = Scope::Hostname("Shop.Test");
        assert!(scope.admits(&record(Some("shop.test"), None, &[]), "/a"));
        assert!(scope.admits(&record(Some("shop.test"), Some("staging"), &[]), "/a"));
        assert!(!scope.admits(&record(Some("other.test"), None, &[]), "/a"));
        assert!(!scope.admits(&record(None, None, &[]), "/a"));
    }

    #[test]
    fn malformed_world_headers_are_refused() {
        for (pairs, want) in [
            (
                vec![("pinboard-hostname", "")],
                WorldError::MalformedHostname("hostname must be non-empty"),
            ),
            (
                vec![("pinboard-hostname", "a/b")],
                WorldError::MalformedHostname("hostname must contain only [A-Za-z0-9.:_-]"),
            ),
            (
                vec![("pinboard-env", "staging")],
                WorldError::EnvWithoutHostname,
            ),
            (
                vec![("pinboard-hostname", "app"), ("pinboard-env", "a b")],
                WorldError::MalformedEnv("env must contain only [A-Za-z0-9._-]"),
            ),
        ] {
            let h = headers(&pairs);
            assert_eq!(World::from_client(&h), Err(want), "{pairs:?}");
        }
        let long = "a".repeat(MAX_HOSTNAME_LEN + 1);
        let h = headers(&[("pinboard-hostname", &long)]);
        assert!(World::from_client(&h).is_err());
    }

    #[test]
    fn host_names_a_hostname_with_its_port_stripped() {
        let value = |v: &'static str| HeaderValue::from_static(v);
        let origin: http::Uri = "/c/a".parse().expect("uri");
        for (host, want) in [
            ("shop.test", Some(("shop.test", None))),
            (
                "Shop.Test:8080",
                Some(("Shop.Test", Some("Shop.Test:8080"))),
            ),
            (
                "127.0.0.1:7070",
                Some(("127.0.0.1", Some("127.0.0.1:7070"))),
            ),
            ("[::1]:7070", None),
            ("", None),
            ("a b", None),
            ("shop.test:", Some(("shop.test", Some("shop.test:")))),
        ] {
            let v = value(host);
            assert_eq!(host_names(&origin, Some(&v)), want, "{host:?}");
        }
        assert_eq!(host_names(&origin, None), None);
        // An absolute-form target's authority wins over Host.
        let absolute: http::Uri = "http://shop.test:80/c/a".parse().expect("uri");
        let v = value("other.test");
        assert_eq!(
            host_names(&absolute, Some(&v)),
            Some(("shop.test", Some("shop.test:80")))
        );
    }

    #[test]
    fn a_bound_host_is_the_hostname_unless_pinboard_hostname_names_one() {
        let named = HeaderValue::from_static("named.test");
        let env = HeaderValue::from_static("staging");
        assert_eq!(
            World::from_values(None, None, Some("shop.test")),
            Ok(World {
                hostname: Some("shop.test"),
                env: None
            })
        );
        assert_eq!(
            World::from_values(Some(&named), Some(&env), Some("shop.test")),
            Ok(World {
                hostname: Some("named.test"),
                env: Some("staging")
            })
        );
        assert_eq!(
            World::from_values(None, Some(&env), Some("shop.test")),
            Ok(World {
                hostname: Some("shop.test"),
                env: Some("staging")
            })
        );
        assert_eq!(
            World::from_values(None, Some(&env), None),
            Err(WorldError::EnvWithoutHostname)
        );
    }

    #[test]
    fn cluster_calls_stay_in_the_callers_world() {
        let caller = record(Some("app"), Some("staging"), &[("/b", "canary")]);
        let ok = headers(&[("host", "APP")]);
        assert_eq!(
            cluster_world(&ok, &caller, "/a"),
            Ok(World {
                hostname: Some("app"),
                env: Some("staging")
            })
        );
        assert_eq!(
            cluster_world(&ok, &caller, "/b").expect("world").env,
            Some("canary")
        );
        // JS `clusterHost: "pinboard"`: Host is pinboard's, the name travels apart.
        let js = headers(&[("host", "pinboard:7070"), ("pinboard-hostname", "app")]);
        assert!(cluster_world(&js, &caller, "/a").is_ok());
        for pairs in [
            vec![("host", "other")],
            vec![("host", "app"), ("pinboard-hostname", "other")],
            vec![("host", "app"), ("pinboard-env", "production")],
        ] {
            let h = headers(&pairs);
            assert_eq!(
                cluster_world(&h, &caller, "/a"),
                Err(WorldError::OtherWorld),
                "{pairs:?}"
            );
        }
        // A hostless caller's Host is pinboard's own; naming a hostname is not.
        let hostless = record(None, None, &[]);
        let h = headers(&[("host", "127.0.0.1:7070")]);
        assert_eq!(cluster_world(&h, &hostless, "/a"), Ok(World::HOSTLESS));
        let h = headers(&[("pinboard-hostname", "app")]);
        assert_eq!(
            cluster_world(&h, &hostless, "/a"),
            Err(WorldError::OtherWorld)
        );
    }
}
