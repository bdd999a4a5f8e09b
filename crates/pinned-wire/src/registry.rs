//! The registry's JSON shapes: what a worker sends to `pinboard`'s
//! `/registry/*` endpoints and what it gets back, plus the operator
//! endpoints' answers.
//!
//! Owns field names and optionality only (camelCase, as the Python reference
//! writes them). Never validates semantics (that is the control plane's job)
//! and never does I/O. Optional request fields deserialize leniently
//! (`#[serde(default)]`) so a worker that omits them is still understood;
//! optional answer fields are skipped when absent, so a Rust worker and a
//! Python worker see the same bytes.
//!
//! The answer types are `pinboard`'s encoding types. What a worker decodes
//! from an answer lives in [`received`]: lenient views that ignore unknown
//! fields and keep a malformed member as raw JSON, so the worker, not serde,
//! decides what a malformed answer means.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `takeover` policy a worker declares for its `hostname` binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Takeover {
    /// The displaced session is told it was superseded and winds down.
    WindDown,
    /// A newer registration of the same hostname is refused while this one lives.
    Deny,
}

/// Body of `POST /registry/register`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterRequest {
    /// Per-process client id (32 hex chars in the reference).
    pub client_id: String,
    /// Per-process secret (64 hex chars); keys attestations and the proxy secret.
    pub secret: String,
    /// Attached namespaces, each with its leading slash.
    pub namespaces: Vec<String>,
    /// Base URL that reaches this very process.
    pub advertise_url: String,
    /// Free memory in MB; placement is biased toward larger values.
    pub headroom: i64,
    /// The worker's local drain flag.
    pub draining: bool,
    /// Fresh challenge pinboard reads back through `/_pinned/challenge`.
    pub challenge: String,
    /// The value the worker's challenge route must answer.
    pub challenge_value: String,
    /// Deployment hostname, if configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Deployment environment, if configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Per-namespace environment overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envs: Option<BTreeMap<String, String>>,
    /// Takeover policy for the hostname binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover: Option<Takeover>,
    /// Deployment epoch (sent only when non-zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The session this process lost, when re-registering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_session_id: Option<String>,
    /// Ids this process still holds, per namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<BTreeMap<String, Vec<String>>>,
}

/// One `(ns, id)` the register ack tells the worker to quit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Duplicate {
    /// Namespace with its leading slash.
    pub ns: String,
    /// Instance id.
    pub id: String,
}

/// 200 answer to `POST /registry/register`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterAck {
    /// The new session (lease token).
    pub session_id: String,
    /// Lease length granted, in milliseconds.
    pub expires_in_ms: u64,
    /// Re-submitted ids owned by another live session.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub duplicates: Vec<Duplicate>,
    /// Server-side drain echo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
    /// Remaining drain seconds (`null` = no deadline); only with `draining: true`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "nullable_deadline"
    )]
    pub drain_deadline: Option<Option<f64>>,
}

/// Body of `POST /registry/heartbeat`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatRequest {
    /// Session being renewed.
    pub session_id: String,
    /// Free memory in MB.
    #[serde(default)]
    pub headroom: i64,
    /// The worker's local drain flag.
    #[serde(default)]
    pub draining: bool,
    /// Fresh challenge (the reference always sends the pair).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<String>,
    /// Matching challenge value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge_value: Option<String>,
    /// Control-message ids confirmed since the last successful heartbeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acks: Vec<String>,
}

/// 200 answer to `POST /registry/heartbeat`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatAck {
    /// Lease length granted, in milliseconds.
    pub expires_in_ms: u64,
    /// Unconfirmed control messages, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<ControlMessage>,
    /// Server-side drain echo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
    /// Remaining drain seconds (`null` = no deadline); only with `draining: true`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "nullable_deadline"
    )]
    pub drain_deadline: Option<Option<f64>>,
}

/// 409 answer to a heartbeat: the session is unknown or was displaced.
///
/// Decodes leniently, as the worker reads any non-200 heartbeat body: the
/// flags take Python's truthiness of whatever JSON they hold (absent and
/// `null` are false) and a non-string `error` reads as `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatNack {
    /// Set when the worker must register again.
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "lenient::truthy"
    )]
    pub reregister: bool,
    /// Set when a higher-epoch registration of the same hostname took over.
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "lenient::truthy"
    )]
    pub superseded: bool,
    /// Human-readable reason (with `superseded`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::string"
    )]
    pub error: Option<String>,
}

/// A control message delivered in a heartbeat ack (`wind_down` is the only
/// type the reference worker understands).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlMessage {
    /// Message type, e.g. `wind_down`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Target instance id.
    pub id: String,
    /// Target namespace (with its slash).
    #[serde(default)]
    pub ns: Option<String>,
    /// Seconds until the instance must be gone; `null` revokes. Always present.
    pub deadline: Option<f64>,
    /// Delivery id the worker acks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msg_id: Option<String>,
}

/// One item of the `POST /registry/release` array.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseItem {
    /// Session that held the placement.
    pub session_id: String,
    /// Namespace with its slash.
    pub namespace: String,
    /// Instance id.
    pub id: String,
    /// Placement epoch as a decimal string; absent when the instance never saw one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
}

/// Body of `POST /registry/deregister`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeregisterRequest {
    /// Session that ends.
    pub session_id: String,
}

/// Body of `POST /registry/tag` (inferred shape; the reference never sends it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TagRequest {
    /// Session that owns the placement.
    pub session_id: String,
    /// Namespace with its slash.
    pub namespace: String,
    /// Instance id.
    pub id: String,
    /// Admitted placement epoch as a decimal string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// Owner tag to stamp.
    pub tag: String,
}

/// Body of the operator's `POST /registry/push`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PushRequest {
    /// Mark the worker draining (no new placements; drain echo in every ack).
    #[serde(rename_all = "camelCase")]
    Drain {
        /// Target session.
        session_id: String,
        /// Seconds until the drain deadline, or `null` for none.
        #[serde(default)]
        deadline: Option<f64>,
    },
    /// Lift a server-side drain.
    #[serde(rename_all = "camelCase")]
    Undrain {
        /// Target session.
        session_id: String,
    },
    /// Queue a `wind_down` control message for one instance.
    #[serde(rename_all = "camelCase")]
    WindDown {
        /// Target session.
        session_id: String,
        /// Namespace with its slash.
        ns: String,
        /// Instance id.
        id: String,
        /// Seconds until the instance must be gone, or `null` to revoke.
        #[serde(default)]
        deadline: Option<f64>,
    },
}

/// One row of `GET /registry/workers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerRow {
    /// Session id.
    pub session_id: String,
    /// Per-process client id.
    pub client_id: String,
    /// Advertise URL.
    pub advertise_url: String,
    /// Attached namespaces.
    pub namespaces: Vec<String>,
    /// Last reported headroom (MB).
    pub headroom: i64,
    /// Local or server-side drain in effect.
    pub draining: bool,
    /// Deployment hostname.
    pub hostname: Option<String>,
    /// Deployment environment.
    pub env: Option<String>,
    /// Deployment epoch (0 when none).
    pub epoch: u64,
    /// Milliseconds until the lease lapses.
    pub expires_in_ms: u64,
    /// Placements currently owned by this session.
    pub instances: u64,
}

/// Answer of `GET /registry/workers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkersResponse {
    /// Live workers.
    pub workers: Vec<WorkerRow>,
}

/// One row of `GET /registry/overview`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRow {
    /// Namespace with its slash.
    pub ns: String,
    /// Instance id.
    pub id: String,
    /// Owning session.
    pub session_id: String,
    /// Placement epoch (decimal string, as epochs travel on the wire).
    pub epoch: String,
    /// Owner tag, if stamped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Whether the owning session is live.
    pub live: bool,
}

/// Answer of `GET /registry/overview`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverviewResponse {
    /// Live workers.
    pub workers: Vec<WorkerRow>,
    /// Placements (filtered by `?tag=` when given).
    pub placements: Vec<PlacementRow>,
}

pub mod received {
    //! What a worker decodes from the registry's answers: lenient views of
    //! [`RegisterAck`](super::RegisterAck), [`HeartbeatAck`](super::HeartbeatAck)
    //! and [`ControlMessage`](super::ControlMessage).
    //!
    //! Unknown fields are ignored. Only the members without which an ack means
    //! nothing are strict (`sessionId` a string, `expiresInMs` any JSON number,
    //! integer or float, even negative); every other member is a [`Field`] or an
    //! [`Entry`], which never fails to decode and keeps a malformed value as raw
    //! JSON for the worker to count and log. Decode from the answer object
    //! (`RegisterAck::deserialize(&map)` on a `serde_json::Map`).

    use std::fmt;

    use serde::de::{DeserializeOwned, Error as _};
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    use super::Duplicate;

    /// The only control message type a worker understands.
    pub const WIND_DOWN: &str = "wind_down";

    /// A member of an answer object, read leniently.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub enum Field<T> {
        /// The key is missing (`#[serde(default)]` on the member).
        #[default]
        Absent,
        /// The key holds `null`.
        Null,
        /// The key holds a value that decodes as `T`.
        Valid(T),
        /// The key holds something else, kept as received.
        Invalid(Value),
    }

    impl<T> Field<T> {
        /// The decoded value, if the member holds one.
        pub fn valid(&self) -> Option<&T> {
            match self {
                Self::Valid(value) => Some(value),
                Self::Absent | Self::Null | Self::Invalid(_) => None,
            }
        }
    }

    impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
        fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
            let value = Value::deserialize(de)?;
            if value.is_null() {
                return Ok(Self::Null);
            }
            Ok(match T::deserialize(&value) {
                Ok(decoded) => Self::Valid(decoded),
                Err(_) => Self::Invalid(value),
            })
        }
    }

    /// An item of an answer array that must be a JSON object decoding as
    /// `T` (an array never stands in for an object here).
    #[derive(Debug, Clone, PartialEq)]
    pub enum Entry<T> {
        /// An object that decodes as `T`.
        Valid(T),
        /// Anything else, kept as received.
        Invalid(Value),
    }

    impl<'de, T: DeserializeOwned> Deserialize<'de> for Entry<T> {
        fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
            let value = Value::deserialize(de)?;
            if !value.is_object() {
                return Ok(Self::Invalid(value));
            }
            Ok(match T::deserialize(&value) {
                Ok(decoded) => Self::Valid(decoded),
                Err(_) => Self::Invalid(value),
            })
        }
    }

    /// The server-side drain echo carried by both 200 acks.
    #[derive(Debug, Clone, Default, PartialEq, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct DrainEcho {
        /// `draining`; the echo means something only when it is a bool.
        #[serde(default)]
        pub draining: Field<bool>,
        /// `drainDeadline`: remaining seconds, `null` or absent for none.
        #[serde(default)]
        pub drain_deadline: Field<f64>,
    }

    /// A 200 answer to `POST /registry/register`, as the worker reads it.
    ///
    /// Fails to decode only without a string `sessionId` or a numeric
    /// `expiresInMs` (a malformed ack).
    #[derive(Debug, Clone, PartialEq, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct RegisterAck {
        /// The new session (lease token).
        pub session_id: String,
        /// Lease length granted, in milliseconds (any JSON number).
        pub expires_in_ms: f64,
        /// Re-submitted ids owned by another live session.
        #[serde(default)]
        pub duplicates: Field<Vec<Entry<Duplicate>>>,
        /// Server-side drain echo.
        #[serde(flatten)]
        pub echo: DrainEcho,
    }

    /// A 200 answer to `POST /registry/heartbeat`, as the worker reads it.
    ///
    /// Fails to decode only without a numeric `expiresInMs` (a malformed ack).
    #[derive(Debug, Clone, PartialEq, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct HeartbeatAck {
        /// Lease length granted, in milliseconds (any JSON number).
        pub expires_in_ms: f64,
        /// Unconfirmed control messages, oldest first.
        #[serde(default)]
        pub messages: Field<Vec<Entry<ControlMessage>>>,
        /// Server-side drain echo.
        #[serde(flatten)]
        pub echo: DrainEcho,
    }

    /// A control message as delivered: every member read leniently, and the
    /// object itself kept for error texts (its `Display` is the compact
    /// JSON as received).
    ///
    /// Decodes from any JSON object; anything else is an error.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ControlMessage {
        /// `type`, e.g. [`WIND_DOWN`].
        pub kind: Field<String>,
        /// `id`: target instance id.
        pub id: Field<String>,
        /// `ns`: target namespace (with its slash).
        pub ns: Field<String>,
        /// `deadline`: seconds until the instance must be gone; `null` revokes.
        pub deadline: Field<f64>,
        /// `msgId`: delivery id the worker acks.
        pub msg_id: Field<String>,
        /// The object as received.
        raw: Value,
    }

    /// The members of a [`ControlMessage`].
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Members {
        #[serde(default, rename = "type")]
        kind: Field<String>,
        #[serde(default)]
        id: Field<String>,
        #[serde(default)]
        ns: Field<String>,
        #[serde(default)]
        deadline: Field<f64>,
        #[serde(default)]
        msg_id: Field<String>,
    }

    impl<'de> Deserialize<'de> for ControlMessage {
        fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
            let raw = Value::deserialize(de)?;
            if !raw.is_object() {
                return Err(D::Error::custom("a control message must be a JSON object"));
            }
            let members = Members::deserialize(&raw).map_err(D::Error::custom)?;
            Ok(Self {
                kind: members.kind,
                id: members.id,
                ns: members.ns,
                deadline: members.deadline,
                msg_id: members.msg_id,
                raw,
            })
        }
    }

    impl fmt::Display for ControlMessage {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Display::fmt(&self.raw, f)
        }
    }
}

/// Serde glue for members the worker reads as the Python reference does.
mod lenient {
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    /// Python's truthiness of any JSON value (`null` is false).
    pub(super) fn truthy<'de, D: Deserializer<'de>>(de: D) -> Result<bool, D::Error> {
        Ok(match Value::deserialize(de)? {
            Value::Null => false,
            Value::Bool(b) => b,
            Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
        })
    }

    /// A string, or `None` for anything else.
    pub(super) fn string<'de, D: Deserializer<'de>>(de: D) -> Result<Option<String>, D::Error> {
        Ok(match Value::deserialize(de)? {
            Value::String(s) => Some(s),
            _ => None,
        })
    }
}

/// Serde glue for a field that is absent, `null`, or a number.
mod nullable_deadline {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Option<f64>>,
        ser: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(inner) => inner.serialize(ser),
            None => ser.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        de: D,
    ) -> Result<Option<Option<f64>>, D::Error> {
        Option::<f64>::deserialize(de).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_request_reads_the_reference_body() {
        let body = r#"{"clientId":"c","secret":"s","namespaces":["/counter"],
            "advertiseUrl":"http://127.0.0.1:1","headroom":1024,"draining":false,
            "challenge":"a","challengeValue":"b","prevSessionId":"old",
            "instances":{"/counter":["x"]}}"#;
        let req: RegisterRequest = serde_json::from_str(body).expect("parses");
        assert_eq!(req.prev_session_id.as_deref(), Some("old"));
        assert_eq!(req.instances.expect("instances")["/counter"], vec!["x"]);
    }

    #[test]
    fn heartbeat_ack_omits_absent_fields_and_keeps_null_deadline() {
        let ack = HeartbeatAck {
            expires_in_ms: 2000,
            messages: vec![],
            draining: None,
            drain_deadline: None,
        };
        assert_eq!(
            serde_json::to_string(&ack).expect("json"),
            r#"{"expiresInMs":2000}"#
        );
        let ack = HeartbeatAck {
            draining: Some(true),
            drain_deadline: Some(None),
            ..ack
        };
        assert_eq!(
            serde_json::to_string(&ack).expect("json"),
            r#"{"expiresInMs":2000,"draining":true,"drainDeadline":null}"#
        );
    }

    #[test]
    fn push_request_variants() {
        let p: PushRequest =
            serde_json::from_str(r#"{"sessionId":"s","type":"drain","deadline":null}"#)
                .expect("drain");
        assert_eq!(
            p,
            PushRequest::Drain {
                session_id: "s".into(),
                deadline: None
            }
        );
        let p: PushRequest = serde_json::from_str(
            r#"{"sessionId":"s","type":"wind_down","ns":"/c","id":"a","deadline":3}"#,
        )
        .expect("wind_down");
        assert!(matches!(p, PushRequest::WindDown { deadline: Some(d), .. } if d == 3.0));
        assert!(serde_json::from_str::<PushRequest>(r#"{"sessionId":"s","type":"x"}"#).is_err());
    }

    #[test]
    fn control_message_always_writes_deadline() {
        let m = ControlMessage {
            kind: "wind_down".into(),
            id: "a".into(),
            ns: Some("/c".into()),
            deadline: None,
            msg_id: Some("7".into()),
        };
        assert_eq!(
            serde_json::to_string(&m).expect("json"),
            r#"{"type":"wind_down","id":"a","ns":"/c","deadline":null,"msgId":"7"}"#
        );
    }
}
