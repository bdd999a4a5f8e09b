//! The HTTP client of the operator commands: the operator token as a
//! bearer, one deadline per call, and pinboard's answers mapped to
//! [`CliError`]s (a 400's `detail` kept as the reason).
//!
//! Owns nothing else: which endpoint to call and what to print is the
//! command's business.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::CliError;

/// A running pinboard, as an operator reaches it.
#[derive(Debug, Clone)]
pub struct OperatorClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

fn detail(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("detail")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| body.chars().take(200).collect())
}

impl OperatorClient {
    /// A client of the pinboard at `base` (`http(s)://host:port`), each
    /// call bounded by `timeout`, trusting the Mozilla roots plus the CA
    /// certificates in the PEM file `ca` for an `https://` pinboard.
    ///
    /// # Errors
    ///
    /// [`CliError::Usage`] when the client cannot be built (the CA file
    /// unreadable, say).
    pub fn new(
        base: &str,
        token: String,
        timeout: Duration,
        ca: Option<&std::path::Path>,
    ) -> Result<Self, CliError> {
        let tls = pinned_edge::tls::client_config(ca)
            .map_err(|e| CliError::Usage(format!("--ca / PINBOARD_CA: {e}")))?;
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .use_preconfigured_tls(tls)
            .build()
            .map_err(|e| CliError::Usage(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
        })
    }

    async fn answer<T: DeserializeOwned>(
        &self,
        what: &str,
        sent: Result<reqwest::Response, reqwest::Error>,
    ) -> Result<T, CliError> {
        let res = sent.map_err(|e| {
            let why = if e.is_timeout() {
                "timed out".to_owned()
            } else if e.is_connect() {
                "cannot connect".to_owned()
            } else {
                e.to_string()
            };
            CliError::Unavailable(format!("{what}: {} {why}", self.base))
        })?;
        let status = res.status();
        let body = res
            .text()
            .await
            .map_err(|e| CliError::Unavailable(format!("{what}: reading the answer: {e}")))?;
        match status.as_u16() {
            200..=299 => serde_json::from_str(&body)
                .map_err(|e| CliError::Unexpected(format!("{what}: unexpected answer ({e})"))),
            400 | 413 => Err(CliError::Refused(detail(&body))),
            401 | 403 => Err(CliError::NoPermission(status.as_u16())),
            404 => Err(CliError::NotFound(format!("{what}: {}", detail(&body)))),
            409 => Err(CliError::Conflict(detail(&body))),
            500..=599 => Err(CliError::Unavailable(format!(
                "{what}: pinboard answered {status}: {}",
                detail(&body)
            ))),
            _ => Err(CliError::Unexpected(format!(
                "{what}: pinboard answered {status}: {}",
                detail(&body)
            ))),
        }
    }

    /// `GET <path>` with `query`, decoded as `T`.
    ///
    /// # Errors
    ///
    /// See [`CliError`].
    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<T, CliError> {
        let sent = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .query(query)
            .send()
            .await;
        self.answer(path, sent).await
    }

    /// `POST <path>` with a JSON `body`, decoded as `T`.
    ///
    /// # Errors
    ///
    /// See [`CliError`].
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, CliError> {
        let sent = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await;
        self.answer(path, sent).await
    }
}
