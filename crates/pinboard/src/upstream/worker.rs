//! One live worker as pinboard reaches it: its record, its keep-alive
//! [`Pool`], the `Host` value and request targets of its advertise URL, and
//! its attestations.
//!
//! Owns what is derived once per worker record (the parsed advertise URL,
//! the HMAC key) so a request derives nothing; never decides which worker
//! a request goes to (that is `routes`) nor what to send (that is `proxy`
//! and `sweeper`).

use std::sync::Arc;

use http::uri::PathAndQuery;
use http::{HeaderValue, Uri};
use parking_lot::Mutex;
use pinned_wire::attestation;

use super::{Pool, UpstreamTls};
use crate::clock::Clock;
use crate::placement::WorkerRecord;

/// A live worker as the proxy uses it.
pub struct WorkerConn {
    /// The worker's record.
    pub record: WorkerRecord,
    /// `Host` header value for the advertise URL.
    pub host: HeaderValue,
    /// Scheme and authority of the advertise URL, for building upstream URIs
    /// without allocating; `None` when the URL has a base path (then the
    /// proxy concatenates strings).
    pub origin: Option<(http::uri::Scheme, http::uri::Authority)>,
    /// The advertise URL's path without its trailing `/` (usually empty):
    /// proxied request targets go below it.
    pub base_path: Box<str>,
    /// Keep-alive connections to the worker, kept across record changes of
    /// the same session (headroom moves with every heartbeat).
    pub pool: Arc<Pool>,
    /// HMAC key derived once from the worker secret.
    key: attestation::Key,
    /// The anonymous attestation, kept until the wall second it was minted
    /// in ends: `(end of that second on the monotonic clock, token)`.
    token: Mutex<(u64, HeaderValue)>,
}

impl std::fmt::Debug for WorkerConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConn")
            .field("session_id", &self.record.session_id)
            .field("advertise_url", &self.record.advertise_url)
            .finish_non_exhaustive()
    }
}

impl WorkerConn {
    /// `None` when the advertise URL cannot be reached (not a URL, or an
    /// `https://` host TLS cannot verify); `tls` handshakes with an
    /// `https://` worker (without it, a non-socket transport, the pool is
    /// never used).
    pub(crate) fn new(record: WorkerRecord, tls: Option<&UpstreamTls>) -> Option<Self> {
        Self::with_pool(record, None, tls)
    }

    /// As [`new`](Self::new), reusing `pool` when given (the same session
    /// with a changed record).
    pub(crate) fn with_pool(
        record: WorkerRecord,
        pool: Option<Arc<Pool>>,
        tls: Option<&UpstreamTls>,
    ) -> Option<Self> {
        let uri: http::Uri = record.advertise_url.parse().ok()?;
        let authority = uri.authority()?.clone();
        let host = HeaderValue::from_str(authority.as_str()).ok()?;
        let origin = match (uri.scheme(), uri.path()) {
            (Some(scheme), "" | "/") => Some((scheme.clone(), authority.clone())),
            _ => None,
        };
        let base_path = uri.path().trim_end_matches('/').into();
        let pool = match pool {
            Some(pool) => pool,
            None => {
                let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
                let connector = tls.filter(|_| https).map(UpstreamTls::connector);
                match Pool::new(authority, connector) {
                    Ok(pool) => pool,
                    Err(error) => {
                        tracing::warn!(
                            target: "pinboard::proxy",
                            advertise_url = %record.advertise_url,
                            %error,
                            "worker skipped: its advertise URL cannot be reached over TLS"
                        );
                        return None;
                    }
                }
            }
        };
        Some(Self {
            pool,
            origin,
            base_path,
            key: attestation::Key::new(&record.secret),
            record,
            host,
            token: Mutex::new((0, HeaderValue::from_static(""))),
        })
    }

    /// An attestation for this worker's session, minted with its secret at
    /// `clock`'s wall time; `mono_ms`: now on `clock`'s monotonic clock (read
    /// for the request already). An anonymous token is reused until the wall
    /// second it was minted in ends, judged on the monotonic clock, so a
    /// request reads the wall clock once a second per worker, not once per
    /// request (`proxy-bench`: about 100 instructions a proxied request).
    pub fn attestation(
        &self,
        clock: &dyn Clock,
        mono_ms: u64,
        caller: Option<(&str, i64)>,
    ) -> HeaderValue {
        let r = &self.record;
        if let Some((from, depth)) = caller {
            let wall_secs = clock.wall_ms() as f64 / 1000.0;
            let t = attestation::mint(&r.secret, &r.session_id, wall_secs, Some(from), Some(depth));
            return HeaderValue::from_str(&t).unwrap_or_else(|_| HeaderValue::from_static(""));
        }
        let mut cached = self.token.lock();
        if mono_ms >= cached.0 {
            let wall_ms = clock.wall_ms();
            let t = self
                .key
                .mint(&r.session_id, wall_ms as f64 / 1000.0, None, None);
            *cached = (
                mono_ms.saturating_add(1000 - wall_ms % 1000),
                HeaderValue::from_str(&t).unwrap_or_else(|_| HeaderValue::from_static("")),
            );
        }
        cached.1.clone()
    }
}

impl WorkerConn {
    /// The origin-form request target for `path_and_query` (shared bytes,
    /// no allocation), behind the advertise URL's base path if it has one.
    ///
    /// # Errors
    ///
    /// The base path and `path_and_query` do not make a valid target.
    pub fn target(&self, path_and_query: &PathAndQuery) -> Result<Uri, http::Error> {
        let base = &*self.base_path;
        if base.is_empty() {
            return Ok(Uri::from(path_and_query.clone()));
        }
        let mut target = String::with_capacity(base.len() + path_and_query.as_str().len());
        target.push_str(base);
        target.push_str(path_and_query.as_str());
        Ok(Uri::try_from(target)?)
    }

    /// `<advertiseUrl><path>?<query>`: shared bytes, no allocation, unless
    /// the advertise URL carries a base path.
    ///
    /// # Errors
    ///
    /// The advertise URL and `path_and_query` do not make a valid URI.
    pub fn absolute_uri(&self, path_and_query: &PathAndQuery) -> Result<Uri, http::Error> {
        match &self.origin {
            Some((scheme, authority)) => Uri::builder()
                .scheme(scheme.clone())
                .authority(authority.clone())
                .path_and_query(path_and_query.clone())
                .build(),
            None => {
                let base = &self.record.advertise_url;
                let mut uri = String::with_capacity(base.len() + path_and_query.as_str().len());
                uri.push_str(base);
                uri.push_str(path_and_query.as_str());
                Ok(Uri::try_from(uri)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(url: &str) -> WorkerConn {
        WorkerConn::new(
            WorkerRecord {
                session_id: "s".into(),
                client_id: "c".into(),
                secret: "k".into(),
                advertise_url: url.into(),
                namespaces: vec!["/c".into()],
                headroom: 1,
                ..Default::default()
            },
            None,
        )
        .expect("valid advertise URL")
    }

    #[test]
    fn absolute_uri_appends_path_and_query() {
        let pq = PathAndQuery::from_static("/c/a/hit?x=1");
        let u = conn("http://127.0.0.1:9").absolute_uri(&pq).expect("uri");
        assert_eq!(u.to_string(), "http://127.0.0.1:9/c/a/hit?x=1");
        let u = conn("http://10.0.0.1:9/base")
            .absolute_uri(&pq)
            .expect("uri");
        assert_eq!(u.to_string(), "http://10.0.0.1:9/base/c/a/hit?x=1");
    }

    #[test]
    fn target_is_origin_form_behind_any_base_path() {
        let pq = PathAndQuery::from_static("/c/a/hit?x=1");
        let u = conn("http://127.0.0.1:9").target(&pq).expect("uri");
        assert_eq!(u.to_string(), "/c/a/hit?x=1");
        let u = conn("http://10.0.0.1:9/base/").target(&pq).expect("uri");
        assert_eq!(u.to_string(), "/base/c/a/hit?x=1");
    }
}
