//! App-level authorization (`Object::authorize`): denials answer 401/403
//! with the application's message or payload before a cold instance is
//! activated (and leave nothing resident), authorizer failures answer 503
//! `authorization failed` and are counted, and a warm instance survives a
//! denied request.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::MatchedPath;
use axum::http::request::Parts;
use axum::routing::get;
use axum::Router;
use pinned::{AuthError, BoxError, Context, Denial, Object, Options};
use serde_json::json;
use support::{json, start};
use test_support::metrics;

/// Activations of the account `ada`.
static ACTIVATIONS: AtomicU64 = AtomicU64::new(0);

/// Only the user named like the id may enter.
struct Account;

impl Object for Account {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        if ctx.id() == "ada" {
            ACTIVATIONS.fetch_add(1, Ordering::SeqCst);
        }
        Ok(Account)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route("/balance", get(|| async { "42" }))
            .route("/audit/{year}", get(|| async { "audited" }))
    }

    async fn authorize(ctx: &Context, request: &Parts) -> Result<(), AuthError> {
        // Per route: the matched route is known before the handler runs.
        let route = request
            .extensions
            .get::<MatchedPath>()
            .map(MatchedPath::as_str);
        if route == Some("/audit/{year}") {
            return match request.headers.get("x-auditor") {
                Some(_) => Ok(()),
                None => Err(Denial::forbidden("auditors only"))?,
            };
        }
        let user = request.headers.get("x-user").and_then(|v| v.to_str().ok());
        match user {
            None => Err(Denial::unauthorized("who are you?"))?,
            Some("broken") => Err(std::io::Error::other("the user directory is down"))?,
            Some("coded") => Err(Denial::forbidden("x").payload(json!({ "code": "E42" })))?,
            Some("teapot") => Err(Denial::response((
                http::StatusCode::IM_A_TEAPOT,
                "short and stout",
            )))?,
            Some(user) if user != ctx.id() => Err(Denial::forbidden("not your account"))?,
            Some(_) => Ok(()),
        }
    }
}

#[tokio::test]
async fn denials_answer_before_activation_and_failures_are_counted() {
    let w = start(Options::new().host::<Account>("/account")).await;
    let before = metrics::parse(&w.worker.metrics());
    let as_user = |user: Option<&str>| {
        let mut request = w.client.get(w.url("/account/ada/balance"));
        if let Some(user) = user {
            request = request.header("x-user", user);
        }
        request
    };

    let cases = [
        (None, 401, json!({ "message": "who are you?" })),
        (Some("bob"), 403, json!({ "message": "not your account" })),
        (Some("coded"), 403, json!({ "code": "E42" })),
    ];
    for (user, status, body) in cases {
        let answer = as_user(user).send().await.expect("send");
        assert_eq!(json(answer).await, (status, body), "{user:?}");
    }
    let teapot = as_user(Some("teapot")).send().await.expect("send");
    assert_eq!(teapot.status(), 418);
    assert_eq!(teapot.text().await.expect("text"), "short and stout");
    let broken = as_user(Some("broken")).send().await.expect("send");
    assert!(broken.headers().get("retry-after").is_none());
    assert_eq!(
        json(broken).await,
        (503, json!({ "detail": "authorization failed" }))
    );
    // Nothing was activated, and the denied cold records are gone.
    assert_eq!(ACTIVATIONS.load(Ordering::SeqCst), 0);
    w.wait_for("denied records discarded", |stats| {
        stats["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let after = metrics::parse(&w.worker.metrics());
    let failed = metrics::moved(
        &before,
        &after,
        r#"pinned_request_failures{phase="auth",transport="http"}"#,
    );
    assert_eq!(failed, 1.0);

    // The owner gets in; a denied request to the live instance leaves it be.
    let owner = as_user(Some("ada")).send().await.expect("send");
    assert_eq!(owner.status(), 200);
    assert_eq!(owner.text().await.expect("text"), "42");
    let (status, _) = json(as_user(Some("bob")).send().await.expect("send")).await;
    assert_eq!(status, 403);
    let owner = as_user(Some("ada")).send().await.expect("send");
    assert_eq!(owner.status(), 200);
    assert_eq!(ACTIVATIONS.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn authorize_can_decide_per_route() {
    let w = start(Options::new().host::<Account>("/account")).await;
    let audit = w.client.get(w.url("/account/zed/audit/2026"));
    let (status, body) = json(audit.send().await.expect("send")).await;
    assert_eq!((status, body), (403, json!({ "message": "auditors only" })));
    let audit = w
        .client
        .get(w.url("/account/zed/audit/2026"))
        .header("x-auditor", "yes");
    let answer = audit.send().await.expect("send");
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.expect("text"), "audited");
}

#[tokio::test]
async fn denials_are_counted_as_denials_not_as_evictions_or_aborts() {
    let w = start(Options::new().host::<Account>("/account")).await;
    let fresh = metrics::parse(&w.worker.metrics());
    // A scanner: 50 unauthenticated requests for 50 ids.
    for i in 0..50 {
        let answer = w.get(&format!("/account/scan-{i}/balance")).await;
        assert_eq!(answer.status(), 401);
    }
    // Every denied cold record is gone (its close has run to the end)...
    let stats = w
        .wait_for("denied records discarded", |stats| {
            stats["instances"].as_array().is_some_and(Vec::is_empty)
        })
        .await;
    // ...and none of them counted as an instance's close.
    assert_eq!(stats["namespaces"]["/account"]["evictions"], 0, "{stats}");
    let scanned = metrics::parse(&w.worker.metrics());
    assert_eq!(
        metrics::moved(&fresh, &scanned, "pinned_auth_denials"),
        50.0
    );
    for family in [
        "pinned_instance_evictions",
        "pinned_instance_aborts",
        "pinned_instance_activations",
        "pinned_active_instances",
    ] {
        assert_eq!(scanned.value(family), 0.0, "{family}: {scanned}");
    }
    // A denial of a live instance is counted too, and leaves it be (not
    // `ada`: the other test counts her activations).
    let owner = w
        .client
        .get(w.url("/account/bob/balance"))
        .header("x-user", "bob")
        .send()
        .await
        .expect("send");
    assert_eq!(owner.status(), 200);
    assert_eq!(w.get("/account/bob/balance").await.status(), 401);
    let after = metrics::parse(&w.worker.metrics());
    assert_eq!(metrics::moved(&scanned, &after, "pinned_auth_denials"), 1.0);
    assert_eq!(
        metrics::moved(&scanned, &after, "pinned_active_instances"),
        1.0
    );
    assert_eq!(after.value("pinned_instance_evictions"), 0.0, "{after}");
}
