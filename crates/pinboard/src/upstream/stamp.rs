//! pinboard's own fields on one attempt's request to a worker: `Host`,
//! the attestation, the epoch and, for a request that arrived with none,
//! the forwarding fields.
//!
//! Owns how they are written: straight into the request head by the h1
//! exchange, after the client's fields (whose `Host` it skips), or
//! inserted into a copy of the head for the transports that take a
//! header map. Never touches the client's header map itself: an attempt
//! stamps its own values without the hashing of an insert per field, and
//! a retry stamps again without undoing anything.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use pinned_wire::headers::{ATTESTATION, EPOCH};

use pinned_edge::h1::write::field_line;

/// `X-Forwarded-For`.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// The value of `X-Forwarded-Proto` pinboard sets.
const PROTO: HeaderValue = HeaderValue::from_static("http");

/// The fields one attempt adds to the client's (see the module doc).
#[derive(Debug)]
pub struct Stamp<'a> {
    /// `Host`: the worker's authority, in place of the client's.
    pub host: &'a HeaderValue,
    /// `Pinboard-Attestation`.
    pub attestation: HeaderValue,
    /// `Pinboard-Epoch`.
    pub epoch: &'a HeaderValue,
    /// `X-Forwarded-For` and `Forwarded`, with `X-Forwarded-Proto: http`,
    /// for a request that arrived with none of the three (one that had any
    /// carries the lists with the client appended in its own fields).
    pub forwarded: Option<(&'a HeaderValue, &'a HeaderValue)>,
}

impl Stamp<'_> {
    /// Each field, in the order written.
    fn each(&self, mut f: impl FnMut(&HeaderName, &HeaderValue)) {
        f(&header::HOST, self.host);
        f(&ATTESTATION, &self.attestation);
        f(&EPOCH, self.epoch);
        if let Some((xff, forwarded)) = self.forwarded {
            f(&X_FORWARDED_FOR, xff);
            f(&header::FORWARDED, forwarded);
            f(&X_FORWARDED_PROTO, &PROTO);
        }
    }

    /// Appends the fields as head lines.
    pub fn write(&self, out: &mut Vec<u8>) {
        self.each(|name, value| field_line(out, name.as_str().as_bytes(), value.as_bytes()));
    }

    /// Sets the fields in `headers` (each replaces any of its name).
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        self.each(|name, value| {
            headers.insert(name.clone(), value.clone());
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_and_inserted_alike() {
        let (host, epoch) = (
            HeaderValue::from_static("w:1"),
            HeaderValue::from_static("7"),
        );
        let (xff, fwd) = (
            HeaderValue::from_static("10.0.0.1"),
            HeaderValue::from_static("for=10.0.0.1;proto=http"),
        );
        let stamp = Stamp {
            host: &host,
            attestation: HeaderValue::from_static("tok"),
            epoch: &epoch,
            forwarded: Some((&xff, &fwd)),
        };
        let mut out = Vec::new();
        stamp.write(&mut out);
        assert_eq!(
            String::from_utf8(out).expect("text"),
            "host: w:1\r\npinboard-attestation: tok\r\npinboard-epoch: 7\r\n\
             x-forwarded-for: 10.0.0.1\r\nforwarded: for=10.0.0.1;proto=http\r\n\
             x-forwarded-proto: http\r\n"
        );
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("client"));
        stamp.insert_into(&mut headers);
        assert_eq!(headers[header::HOST], "w:1");
        assert_eq!(headers.len(), 6);
        let bare = Stamp {
            forwarded: None,
            ..stamp
        };
        let mut headers = HeaderMap::new();
        bare.insert_into(&mut headers);
        assert_eq!(headers.len(), 3);
        assert!(!headers.contains_key(X_FORWARDED_PROTO));
    }
}
