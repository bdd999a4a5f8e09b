//! Header hygiene between a client and a worker: what the proxy removes
//! and what it adds, in both directions.
//!
//! Owns the hop-by-hop rules (RFC 9110 §7.6.1) and the forwarding headers
//! (`X-Forwarded-For`, `X-Forwarded-Proto`, `Forwarded` of RFC 7239). Never
//! adds pinboard's own headers (`Pinboard-Attestation`, `Pinboard-Epoch`:
//! that is the send phase) and never reads a body.
//!
//! Requests lose every client `pinboard-*` header, `Host` (the worker's is
//! set per attempt), the hop-by-hop headers (`Connection`, `Keep-Alive`,
//! `Proxy-Connection`, `Proxy-Authorization`, `Proxy-Authenticate`, `TE`,
//! `Trailer`, `Transfer-Encoding`, `Upgrade`) and every header the
//! `Connection` header names; a WebSocket handshake keeps `Upgrade` and
//! gets `Connection: upgrade` back. Responses lose the same hop-by-hop set
//! but `Trailer` (hyper needs it to send the worker's trailers).
//!
//! Forwarding headers describe the hop from the client to pinboard:
//! `X-Forwarded-For` gets the client's address appended (a list the client
//! or a proxy in front already started is kept), `Forwarded` gets the
//! element `for=<address>;proto=http` appended likewise, and
//! `X-Forwarded-Proto: http` is set unless a proxy in front set it. Only the
//! last element of each list is pinboard's own word: the earlier ones are
//! whatever arrived.
//!
//! Every rule here starts from a [`Scan`]: one pass over a request's header
//! names that says which rules have anything to do, fused so that a request
//! with no `pinboard-*`, forwarding or hop-by-hop header (most of them)
//! makes no lookup at all (`proxy-bench`: `Scan::of` costs about 85
//! instructions a proxied request; each lookup it spares hashes a name).

use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue};
use pinned_wire::headers::is_pinboard_header;

/// `X-Forwarded-For`.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `Forwarded` (RFC 7239).
pub const FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// Hop-by-hop headers never forwarded in either direction (RFC 9110
/// §7.6.1, plus the legacy `Proxy-Connection` and the proxy credentials).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The client end of a connection, with its forwarding header values
/// built once per connection.
#[derive(Debug, Clone)]
pub struct ClientAddr {
    /// The client's address.
    pub addr: SocketAddr,
    /// The `X-Forwarded-For` element: the bare IP.
    xff: HeaderValue,
    /// The `Forwarded` element: `for=<ip>;proto=http` (IPv6 quoted).
    forwarded: HeaderValue,
}

impl ClientAddr {
    /// The `X-Forwarded-For` and `Forwarded` values of a request that
    /// arrived with no forwarding fields: this client's address alone.
    pub fn forwarding(&self) -> (&HeaderValue, &HeaderValue) {
        (&self.xff, &self.forwarded)
    }

    /// The forwarding values for a client at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        let ip = addr.ip().to_canonical();
        let xff = ip.to_string();
        let forwarded = match ip {
            IpAddr::V4(v4) => format!("for={v4};proto=http"),
            IpAddr::V6(v6) => format!("for=\"[{v6}]\";proto=http"),
        };
        Self {
            addr,
            // An IP address and these few characters are always valid.
            xff: HeaderValue::from_str(&xff).unwrap_or(HeaderValue::from_static("unknown")),
            forwarded: HeaderValue::from_str(&forwarded)
                .unwrap_or(HeaderValue::from_static("for=unknown")),
        }
    }
}

/// What one pass over a request's header names found: which of the rules
/// here (and the cluster and world checks, all `pinboard-*` headers) have
/// anything to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// A `pinboard-*` header is present.
    pub pinboard: bool,
    /// `X-Forwarded-For`, `X-Forwarded-Proto` or `Forwarded` is present.
    pub forwarding: bool,
    /// A hop-by-hop header (or `Trailer`) is present.
    pub hop_by_hop: bool,
}

impl Scan {
    /// Scans `headers`' names once.
    pub fn of(headers: &HeaderMap) -> Self {
        let mut scan = Self::default();
        // A match on the lowercase text, not `HeaderName` equality against
        // each rule's list.
        for name in headers.keys() {
            match name.as_str() {
                "connection"
                | "keep-alive"
                | "proxy-connection"
                | "proxy-authorization"
                | "proxy-authenticate"
                | "te"
                | "transfer-encoding"
                | "upgrade"
                | "trailer" => {
                    scan.hop_by_hop = true;
                }
                "x-forwarded-for" | "x-forwarded-proto" | "forwarded" => scan.forwarding = true,
                text if text.starts_with("pinboard-") => scan.pinboard = true,
                _ => {}
            }
        }
        scan
    }

    /// Whether the request asks to switch protocols (`Connection: upgrade`
    /// with an `Upgrade` header), as [`is_upgrade`].
    pub fn is_upgrade(&self, headers: &HeaderMap) -> bool {
        self.hop_by_hop && is_upgrade(headers)
    }
}

/// A request's `Host` refused (RFC 9112 §3.2): 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// An HTTP/1.1 request without `Host`.
    #[error("missing Host header")]
    Missing,
    /// More than one `Host` line.
    #[error("more than one Host header")]
    Repeated,
}

/// The request's one `Host` value, if it has one. RFC 9112 §3.2: a server
/// answers 400 to an HTTP/1.1 request without `Host` and to any request
/// with more than one; HTTP/1.0 may carry none. Forwarding such a request
/// would leave the worker (or a cache between) to guess its authority.
///
/// # Errors
///
/// [`HostError`].
pub fn single_host(
    version: http::Version,
    headers: &HeaderMap,
) -> Result<Option<&HeaderValue>, HostError> {
    let mut all = headers.get_all(header::HOST).iter();
    let first = all.next();
    if all.next().is_some() {
        return Err(HostError::Repeated);
    }
    if first.is_none() && version == http::Version::HTTP_11 {
        return Err(HostError::Missing);
    }
    Ok(first)
}

/// The names listed in every `Connection` header (RFC 9110 §7.6.1), as
/// lowercase header names; tokens that are not header names are skipped.
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

/// Remove what must not reach a worker: client `pinboard-*` headers,
/// hop-by-hop headers and those `Connection` names. A WebSocket handshake
/// (`upgrade`) keeps `Upgrade` with `Connection: upgrade`. The client's
/// `Host` stays: each attempt's stamp replaces it (`upstream::Stamp`).
/// `scan` is [`Scan::of`] these headers.
pub fn sanitize_request(headers: &mut HeaderMap, scan: &Scan, upgrade: bool) {
    if scan.pinboard {
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|n| is_pinboard_header(n))
            .cloned()
            .collect();
        for n in names {
            headers.remove(n);
        }
    }
    if !scan.hop_by_hop {
        return;
    }
    if headers.contains_key(header::CONNECTION) {
        for name in connection_named(headers) {
            if !(upgrade && name == header::UPGRADE) {
                headers.remove(name);
            }
        }
    }
    let upgrade_value = if upgrade {
        headers.remove(header::UPGRADE)
    } else {
        None
    };
    remove_hop_by_hop(headers);
    headers.remove(header::TRAILER);
    if let Some(value) = upgrade_value {
        headers.insert(header::UPGRADE, value);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Remove hop-by-hop headers (and those `Connection` names) from a
/// worker's response before it is relayed. Not for a 101 (its
/// `Connection`/`Upgrade` belong to the handshake).
pub fn sanitize_response(headers: &mut HeaderMap) {
    // Most answers carry none: the scan's one pass over the names says so
    // without a lookup.
    if !Scan::of(headers).hop_by_hop {
        return;
    }
    if headers.contains_key(header::CONNECTION) {
        for name in connection_named(headers) {
            if name != header::TRAILER {
                headers.remove(name);
            }
        }
    }
    remove_hop_by_hop(headers);
}

/// Removes the [`HOP_BY_HOP`] headers. Most messages carry none: one pass
/// over the few names present (cheap comparisons of standard names) finds
/// that, where a removal per name would hash each of the eight.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    for h in &HOP_BY_HOP {
        headers.remove(h);
    }
}

/// Append `element` to the list header `name` (every line of it joined
/// with `, `), or set it when absent.
fn append(headers: &mut HeaderMap, name: HeaderName, element: &HeaderValue) {
    let mut existing = headers.get_all(&name).iter().peekable();
    if existing.peek().is_none() {
        headers.insert(name, element.clone());
        return;
    }
    let mut joined = Vec::new();
    for v in existing {
        joined.extend_from_slice(v.as_bytes());
        joined.extend_from_slice(b", ");
    }
    joined.extend_from_slice(element.as_bytes());
    // Joined from valid values with ", ": valid.
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(name, v);
    }
}

/// Add the forwarding headers for `client` (see the module doc); `scan`
/// is [`Scan::of`] these headers. A request that arrived with none of
/// them gets none here: the answer is `client`'s own values
/// ([`ClientAddr::forwarding`]) for each attempt's stamp to write, without
/// an insert each.
pub fn add_forwarded<'c>(
    headers: &mut HeaderMap,
    scan: &Scan,
    client: &'c ClientAddr,
) -> Option<(&'c HeaderValue, &'c HeaderValue)> {
    if !scan.forwarding {
        return Some(client.forwarding());
    }
    append(headers, X_FORWARDED_FOR, &client.xff);
    append(headers, FORWARDED, &client.forwarded);
    if !headers.contains_key(X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    None
}

/// Whether the request asks to switch protocols (`Connection: upgrade`
/// with an `Upgrade` header).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    #[test]
    fn requests_lose_pinboard_hop_by_hop_and_connection_named_headers() {
        let mut h = map(&[
            ("pinboard-attestation", "forged"),
            ("Pinboard-Epoch", "9"),
            ("connection", "keep-alive, X-Secret-Hop"),
            ("connection", "x-other"),
            ("x-secret-hop", "1"),
            ("x-other", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("proxy-authorization", "Basic Zm9vOmJhcg=="),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("host", "evil"),
            ("upgrade", "h2c"),
            ("x-keep", "1"),
        ]);
        let scan = Scan::of(&h);
        assert_eq!(
            scan,
            Scan {
                pinboard: true,
                forwarding: false,
                hop_by_hop: true
            }
        );
        sanitize_request(&mut h, &scan, false);
        // `Host` stays in the map: every attempt's stamp replaces it
        // (`upstream::Stamp`).
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["x-keep"], "1");
        assert_eq!(h["host"], "evil");

        let mut ws = map(&[
            ("connection", "Upgrade, x-hop"),
            ("upgrade", "websocket"),
            ("x-hop", "1"),
            ("sec-websocket-key", "k"),
        ]);
        let scan = Scan::of(&ws);
        assert!(scan.is_upgrade(&ws));
        sanitize_request(&mut ws, &scan, true);
        assert_eq!(ws[header::CONNECTION], "upgrade");
        assert_eq!(ws[header::UPGRADE], "websocket");
        assert!(ws.get("x-hop").is_none());
        assert_eq!(ws["sec-websocket-key"], "k");
    }

    #[test]
    fn the_scan_knows_every_hop_by_hop_name() {
        for name in HOP_BY_HOP.iter().chain([&header::TRAILER]) {
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static("x"));
            assert!(Scan::of(&h).hop_by_hop, "{name}");
        }
        for name in [X_FORWARDED_FOR, X_FORWARDED_PROTO, FORWARDED] {
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static("x"));
            assert!(Scan::of(&h).forwarding, "{name}");
        }
    }

    #[test]
    fn responses_lose_hop_by_hop_headers_but_keep_trailer() {
        let mut h = map(&[
            ("connection", "close, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("proxy-authenticate", "Basic"),
            ("trailer", "x-checksum"),
            ("content-type", "application/json"),
        ]);
        sanitize_response(&mut h);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["trailer"], "x-checksum");
    }

    #[test]
    fn forwarding_headers_append_to_what_arrived() {
        let v4 = ClientAddr::new("10.1.2.3:5555".parse().expect("addr"));
        let mut h = map(&[("host", "pinboard"), ("accept", "*/*")]);
        let scan = Scan::of(&h);
        assert_eq!(scan, Scan::default(), "nothing for the rules to do");
        sanitize_request(&mut h, &scan, false);
        // None arrived: the stamp carries the client's own.
        let (xff, forwarded) = add_forwarded(&mut h, &scan, &v4).expect("the client's own");
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(xff, "10.1.2.3");
        assert_eq!(forwarded, "for=10.1.2.3;proto=http");

        let mut h = map(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-for", "198.51.100.1"),
            ("forwarded", "for=203.0.113.9;proto=https"),
            ("x-forwarded-proto", "https"),
        ]);
        let scan = Scan::of(&h);
        assert!(scan.forwarding && !scan.pinboard && !scan.hop_by_hop);
        assert!(add_forwarded(&mut h, &scan, &v4).is_none());
        assert_eq!(h[X_FORWARDED_FOR], "203.0.113.9, 198.51.100.1, 10.1.2.3");
        assert_eq!(
            h[FORWARDED],
            "for=203.0.113.9;proto=https, for=10.1.2.3;proto=http"
        );
        assert_eq!(h[X_FORWARDED_PROTO], "https");

        let v6 = ClientAddr::new("[2001:db8::1]:80".parse().expect("addr"));
        let (xff, forwarded) = v6.forwarding();
        assert_eq!(xff, "2001:db8::1");
        assert_eq!(forwarded, "for=\"[2001:db8::1]\";proto=http");
        let mapped = ClientAddr::new("[::ffff:127.0.0.1]:80".parse().expect("addr"));
        assert_eq!(mapped.xff, "127.0.0.1");
    }
}
