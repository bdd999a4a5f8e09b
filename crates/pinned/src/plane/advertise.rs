//! The advertise URL's port-0 rule: `ADVERTISE_URL=http://10.0.0.5:0`
//! means "this URL with the port my listener bound", so a worker on
//! `PORT=0` can join a fleet without anyone picking a free port first.
//!
//! Only the port is ever rewritten; scheme, host, user info, path and
//! query stay byte for byte what was configured. Nothing here binds or
//! registers: [`serve`](crate::serve) binds, then fills the port in before
//! the registration loop starts, and `Options::build` refuses the rule for a
//! worker nobody will bind for.

use std::ops::Range;

/// Where the port sits in `url` when it is written out and zero (`:0`,
/// `:00`, ...), as a byte range of `url`; `None` for any other URL.
pub(crate) fn zero_port(url: &str) -> Option<Range<usize>> {
    let (scheme, rest) = url.split_once("://")?;
    let start = scheme.len() + "://".len();
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    // The last ':' of the authority starts the port, unless it sits inside
    // an IPv6 literal (`[::1]` has no port).
    let colon = authority.rfind(':')?;
    let port = &authority[colon + 1..];
    if port.contains(']') || port.is_empty() || !port.bytes().all(|b| b == b'0') {
        return None;
    }
    let port_start = start + colon + 1;
    Some(port_start..start + authority_len)
}

/// `url` with its zero port replaced by `port`; `None` when `url` has no
/// zero port (it is advertised as configured).
pub(crate) fn with_port(url: &str, port: u16) -> Option<String> {
    let at = zero_port(url)?;
    Some(format!("{}{port}{}", &url[..at.start], &url[at.end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_port_is_replaced_and_nothing_else_changes() {
        for (configured, advertised) in [
            ("http://127.0.0.1:0", "http://127.0.0.1:41234"),
            (
                "https://worker-3.internal:0/",
                "https://worker-3.internal:41234/",
            ),
            (
                "http://10.0.0.5:00/base?x=1#f",
                "http://10.0.0.5:41234/base?x=1#f",
            ),
            ("http://[::1]:0", "http://[::1]:41234"),
            ("http://user:pw@host:0", "http://user:pw@host:41234"),
        ] {
            assert_eq!(
                with_port(configured, 41234).as_deref(),
                Some(advertised),
                "{configured}"
            );
        }
    }

    #[test]
    fn a_url_without_a_zero_port_is_left_alone() {
        for url in [
            "http://127.0.0.1:8080",
            "http://127.0.0.1:10",
            "http://127.0.0.1:80/0",
            "http://127.0.0.1/",
            "http://127.0.0.1:",
            "http://[::1]",
            "http://[::0]/",
            "http://user:0@host",
            "http://host/path:0",
            "http://host?q=:0",
            "127.0.0.1:0",
            "",
        ] {
            assert_eq!(zero_port(url), None, "{url}");
            assert_eq!(with_port(url, 1), None, "{url}");
        }
    }
}
