//! The challenge round trip: proving that a worker's advertise URL reaches
//! the very process that registered.
//!
//! Owns the outbound `GET <advertiseUrl>/_pinned/challenge?challenge=<c>`
//! (with `Pinboard-Proxy-Secret`) and the comparison of the answered value.
//! It is the only code that sends the raw worker secret,
//! and it sends it only to `/_pinned/challenge`. Never touches the store.

use std::future::Future;
use std::time::Duration;

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use pinned_wire::headers::PROXY_SECRET;
use subtle::ConstantTimeEq;

use crate::outbound::Outbound;
use crate::upstream::empty;

/// Why a challenge failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChallengeError {
    /// The worker could not be reached (connect failure, timeout, 5xx).
    /// Registration answers 503 + `Retry-After`: retry later.
    #[error("advertise URL not reachable yet: {0}")]
    Unreachable(String),
    /// The worker answered, but not with the expected value: the URL reaches
    /// some other process (or the secret is wrong). Not retryable as is.
    #[error("advertise URL failed the challenge: {0}")]
    Mismatch(String),
}

/// Proves a challenge pair against a worker.
pub trait ChallengeProver: Send + Sync + 'static {
    /// Ask `advertise_url` for the value of `challenge`, and check it equals `value`.
    fn prove(
        &self,
        advertise_url: &str,
        secret: &str,
        challenge: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), ChallengeError>> + Send;
}

/// The real prover: probes through the node's [`Outbound`].
#[derive(Debug, Clone)]
pub struct HttpProver {
    client: Outbound,
    timeout: Duration,
}

impl HttpProver {
    /// A prover with a per-probe timeout.
    pub fn new(client: Outbound, timeout: Duration) -> Self {
        Self { client, timeout }
    }
}

const MAX_ANSWER: usize = 4096;

impl ChallengeProver for HttpProver {
    async fn prove(
        &self,
        advertise_url: &str,
        secret: &str,
        challenge: &str,
        value: &str,
    ) -> Result<(), ChallengeError> {
        let query: String =
            percent_encoding::utf8_percent_encode(challenge, percent_encoding::NON_ALPHANUMERIC)
                .collect();
        let url = format!(
            "{}/_pinned/challenge?challenge={query}",
            advertise_url.trim_end_matches('/')
        );
        let req = Request::get(&url)
            .header(PROXY_SECRET, secret)
            .body(empty())
            .map_err(|e| ChallengeError::Mismatch(format!("bad advertise URL: {e}")))?;
        let call = async {
            let res = self
                .client
                .call(advertise_url, req)
                .await
                .map_err(|e| ChallengeError::Unreachable(e.to_string()))?;
            let status = res.status();
            let body = http_body_util::Limited::new(res.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| ChallengeError::Unreachable(e.to_string()))?
                .to_bytes();
            Ok::<_, ChallengeError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| ChallengeError::Unreachable("challenge timed out".into()))??;
        if status.is_server_error() {
            return Err(ChallengeError::Unreachable(format!(
                "worker answered {status}"
            )));
        }
        if status != StatusCode::OK {
            return Err(ChallengeError::Mismatch(format!(
                "worker answered {status}"
            )));
        }
        let answer: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|_| ChallengeError::Mismatch("answer is not JSON".into()))?;
        let got = answer.get("value").and_then(|v| v.as_str()).unwrap_or("");
        if got.as_bytes().ct_eq(value.as_bytes()).into() {
            Ok(())
        } else {
            Err(ChallengeError::Mismatch("wrong challenge value".into()))
        }
    }
}
