//! Cluster calls in local mode: in process, through the target's full
//! route stack, with the caller attested and the depth bounded.

mod support;

use axum::extract::Path;
use axum::routing::get;
use axum::{Json, Router};
use http::HeaderMap;
use pinned::{BoxError, Call, Caller, ClusterError, Context, Object, Options};
use serde_json::{json, Value};
use support::{json, start};

struct Peer;

fn caller_json(call: &Call) -> Value {
    match call.attestation() {
        Some(Caller::Instance { ns, id, depth }) => {
            json!({"kind": "instance", "ns": ns, "id": id, "depth": depth})
        }
        Some(Caller::Account { sub, .. }) => json!({"kind": "account", "sub": sub}),
        None => Value::Null,
    }
}

async fn body_json(response: axum::response::Response) -> Value {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

impl Object for Peer {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Peer)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/whoami",
                get(|call: Call, headers: HeaderMap| async move {
                    Json(json!({
                        "me": call.ctx().id(),
                        "caller": caller_json(&call),
                        "keep": headers.get("x-keep").and_then(|v| v.to_str().ok()),
                    }))
                }),
            )
            .route(
                "/call/{ns}/{id}",
                get(
                    |call: Call, Path((ns, id)): Path<(String, String)>| async move {
                        let request = http::Request::get(format!("/{ns}/{id}/whoami"))
                            .header("x-keep", "kept")
                            // Copied inbound headers never leak an identity.
                            .header("pinboard-attestation", "forged")
                            .body(axum::body::Body::empty())
                            .map_err(|e| (http::StatusCode::BAD_REQUEST, e.to_string()))?;
                        match call.cluster().send(request).await {
                            Ok(response) => Ok(Json(body_json(response).await)),
                            Err(error) => {
                                Err((http::StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))
                            }
                        }
                    },
                ),
            )
            .route(
                "/deep/{n}",
                get(|call: Call, Path(n): Path<u64>| async move {
                    match call
                        .cluster()
                        .get(&format!("/peer/d{}/deep/{}", n + 1, n + 1))
                        .await
                    {
                        Ok(response) => Json(body_json(response).await),
                        Err(ClusterError::TooDeep { max, .. }) => {
                            Json(json!({"stoppedAt": call.depth(), "max": max}))
                        }
                        Err(other) => Json(json!({"error": other.to_string()})),
                    }
                }),
            )
    }
}

#[tokio::test]
async fn a_cluster_call_reaches_the_target_with_the_caller_attested() {
    let w = start(Options::new().host::<Peer>("/peer")).await;
    let (status, body) = json(w.get("/peer/a/call/peer/b").await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["me"], "b");
    assert_eq!(
        body["caller"],
        json!({"kind": "instance", "ns": "/peer", "id": "a", "depth": 1})
    );
    assert_eq!(body["keep"], "kept");
    // A plain client is anonymous.
    let (_, body) = json(w.get("/peer/c/whoami").await).await;
    assert_eq!(body["caller"], Value::Null);
    // A forged attestation from a client is not believed either.
    let response = w
        .client
        .get(w.url("/peer/c/whoami"))
        .header("pinboard-attestation", "a.b.c")
        .send()
        .await
        .expect("get");
    assert_eq!(json(response).await.1["caller"], Value::Null);
}

#[tokio::test]
async fn cluster_calls_stop_past_depth_50() {
    let w = start(Options::new().host::<Peer>("/peer")).await;
    let (status, body) = json(w.get("/peer/d0/deep/0").await).await;
    assert_eq!(status, 200, "{body}");
    // d0 is a client request (depth 0); d50 runs at depth 50 and may not
    // make a 51st nested call.
    assert_eq!(body, json!({"stoppedAt": 50, "max": 50}));
}

#[tokio::test]
async fn an_unknown_namespace_without_a_pinboard_is_an_error() {
    let w = start(Options::new().host::<Peer>("/peer")).await;
    let response = w.get("/peer/a/call/nowhere/x").await;
    assert_eq!(response.status(), 500);
    assert_eq!(
        response.text().await.expect("text"),
        "unknown cluster target \"/nowhere/x/whoami\": no pinboard configured"
    );
}
