//! Every id rejection answers 400 with the reference's exact message.

mod support;

use pinned::Options;
use serde_json::json;
use support::{json, start, Counter};

#[tokio::test]
async fn invalid_ids_answer_the_reference_messages() {
    let w = start(Options::new().host::<Counter>("/counter")).await;
    let long_ok = "a".repeat(256);
    let too_long = "a".repeat(257);
    let non_ascii = "%C3%A9".repeat(200);
    let cases: Vec<(String, &str)> = vec![
        ("/counter//value".into(), "id must be non-empty"),
        (
            format!("/counter/{too_long}/value"),
            "id must be at most 256 characters",
        ),
        (
            "/counter/a%20b/value".into(),
            "id must contain only [A-Za-z0-9._~-]",
        ),
        (
            "/counter/a$b/value".into(),
            "id must contain only [A-Za-z0-9._~-]",
        ),
        (
            "/counter/%C3%A9/value".into(),
            "id must contain only [A-Za-z0-9._~-]",
        ),
        // 200 characters of non-ASCII: the character rule, not the length.
        (
            format!("/counter/{non_ascii}/value"),
            "id must contain only [A-Za-z0-9._~-]",
        ),
    ];
    for (path, message) in cases {
        let (status, body) = json(w.get(&path).await).await;
        assert_eq!(status, 400, "{path}");
        assert_eq!(body, json!({ "detail": message }), "{path}");
    }
    // Routes match first, as in the reference: the bare instance URL of an
    // object without a `/` route is unknown, whatever its id.
    let (status, body) = json(w.get("/counter/").await).await;
    assert_eq!((status, body), (404, json!({ "detail": "Not Found" })));
    for ok in [long_ok.as_str(), "A-z_0.9~", "%41"] {
        let (status, _) = json(w.get(&format!("/counter/{ok}/value")).await).await;
        assert_eq!(status, 200, "{ok}");
    }
    // Percent-decoding happens before validation: %41 is the id "A".
    assert!(w.resident().await.contains(&"A".to_owned()));
    assert!(w.resident().await.iter().all(|id| !id.contains('%')));
}
