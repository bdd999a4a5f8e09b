//! A fake worker's side of pinboard's registration, shared by every fake
//! worker of these suites: who it says it is (client id, secret, challenge
//! pair), its answer to pinboard's challenge, and the register and
//! heartbeat calls. What a fake serves besides is its own.
//!
//! Never heartbeats by itself: a suite registering a fake uses a long
//! lease, or beats by hand ([`Identity::beat`]).

use std::net::SocketAddr;

use serde_json::{json, Value};

use super::{bearer, client};

/// Who a fake worker says it is to pinboard.
#[derive(Debug, Clone)]
pub struct Identity {
    pub client_id: String,
    pub secret: String,
    /// The challenge pinboard is told to send, and the value that answers it.
    pub challenge: (String, String),
}

impl Identity {
    /// `name`'s identity: client id `name`, secret `secret-of-<name>`,
    /// challenge `ch-<name>` answered by `val-<name>`.
    pub fn named(name: &str) -> Self {
        Self {
            client_id: name.to_owned(),
            secret: format!("secret-of-{name}"),
            challenge: (format!("ch-{name}"), format!("val-{name}")),
        }
    }

    /// The answer to `GET /_pinned/challenge?challenge=<challenge>` sent
    /// with `Pinboard-Proxy-Secret: <proxy_secret>`: 200 with the value,
    /// 403 for a wrong secret, 404 for an unknown challenge.
    pub fn answer_challenge(
        &self,
        proxy_secret: Option<&str>,
        challenge: Option<&str>,
    ) -> (u16, Value) {
        if proxy_secret != Some(self.secret.as_str()) {
            return (403, json!({"detail": "invalid proxy secret"}));
        }
        if challenge != Some(self.challenge.0.as_str()) {
            return (404, json!({"detail": "unknown challenge"}));
        }
        (200, json!({ "value": self.challenge.1 }))
    }

    /// Registers with `pb` as serving `namespaces` at `addr` (headroom
    /// 100, not draining; in `hostname`'s world when given); answers the
    /// session id.
    ///
    /// # Panics
    ///
    /// When pinboard does not answer 200.
    pub async fn register(
        &self,
        pb: &str,
        namespaces: &[&str],
        addr: SocketAddr,
        hostname: Option<&str>,
    ) -> String {
        let mut registration = json!({
            "clientId": self.client_id, "secret": self.secret, "namespaces": namespaces,
            "advertiseUrl": format!("http://{addr}"), "headroom": 100, "draining": false,
            "challenge": self.challenge.0, "challengeValue": self.challenge.1,
        });
        if let Some(hostname) = hostname {
            registration["hostname"] = json!(hostname);
        }
        let res = client()
            .post(format!("{pb}/registry/register"))
            .header("authorization", bearer())
            .json(&registration)
            .send()
            .await
            .expect("register");
        assert_eq!(res.status(), 200, "{:?}", res.text().await);
        let ack: Value = res.json().await.expect("ack");
        ack["sessionId"].as_str().expect("session").to_owned()
    }

    /// One heartbeat for `session` (it answers the same challenge pair
    /// every time); returns the status.
    pub async fn beat(&self, pb: &str, session: &str) -> u16 {
        client()
            .post(format!("{pb}/registry/heartbeat"))
            .header("authorization", bearer())
            .json(&json!({
                "sessionId": session, "headroom": 100, "draining": false,
                "challenge": self.challenge.0, "challengeValue": self.challenge.1,
            }))
            .send()
            .await
            .expect("heartbeat")
            .status()
            .as_u16()
    }
}
