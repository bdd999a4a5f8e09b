//! A mixed fleet: a Python reference worker and a Rust worker behind one
//! pinboard, cluster calls both ways, each verifying the other's attested
//! caller.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{client, get_json, pinboard, python_worker, rust_worker, wait_workers};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_and_python_workers_call_each_other() {
    let pb = pinboard().start();
    let rust = rust_worker(&pb.url).start();
    let _python = python_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 2).await;
    let rust_process = {
        let stats = support::stats(&c, &rust).await;
        let _ = stats;
        // The Rust worker's process token, from an id it owns.
        let mut token = None;
        for i in 0..100 {
            let body = get_json(
                &c,
                &format!("{}/counter/m-{i}/whoami", pb.url),
                Duration::from_secs(5),
            )
            .await;
            let stats = support::stats(&c, &rust).await;
            if stats["instances"]
                .as_array()
                .is_some_and(|rows| rows.iter().any(|r| r["id"] == format!("m-{i}")))
            {
                token = Some(body["process"].as_str().unwrap_or_default().to_owned());
                break;
            }
        }
        token.expect("an id on the Rust worker")
    };
    // Find one id on each side.
    let (mut on_rust, mut on_python) = (None, None);
    for i in 0..200 {
        let id = format!("m-{i}");
        let body = get_json(
            &c,
            &format!("{}/counter/{id}/whoami", pb.url),
            Duration::from_secs(5),
        )
        .await;
        if body["process"].as_str() == Some(rust_process.as_str()) {
            on_rust.get_or_insert(id);
        } else {
            on_python.get_or_insert(id);
        }
        if on_rust.is_some() && on_python.is_some() {
            break;
        }
    }
    let (r, p) = (on_rust.expect("rust id"), on_python.expect("python id"));

    let from_rust = get_json(
        &c,
        &format!("{}/counter/{r}/call/{p}", pb.url),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(from_rust["status"], 200, "{from_rust}");
    assert_eq!(from_rust["target"]["id"], p.as_str());
    assert_ne!(
        from_rust["target"]["process"].as_str(),
        Some(rust_process.as_str())
    );
    assert_eq!(
        from_rust["target"]["caller"],
        json!({"ns": "/counter", "id": r, "depth": 1})
    );

    let from_python = get_json(
        &c,
        &format!("{}/counter/{p}/call/{r}", pb.url),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(from_python["status"], 200, "{from_python}");
    assert_eq!(from_python["target"]["id"], r.as_str());
    assert_eq!(
        from_python["target"]["process"].as_str(),
        Some(rust_process.as_str())
    );
    assert_eq!(
        from_python["target"]["caller"],
        json!({"ns": "/counter", "id": p, "depth": 1})
    );
}
