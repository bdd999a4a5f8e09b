//! Three Rust workers behind pinboard on Redis: 10 000 ids spread over
//! them, each answering from exactly one instance whose counter never
//! resets while its owner lives.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;
use support::{client, get_json, pinboard, redis_prefix, rust_worker, wait_workers};

const IDS: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_ids_each_live_in_exactly_one_instance() {
    let prefix = redis_prefix("spread");
    let pb = pinboard()
        .shared_redis(&prefix)
        .args(&["--lease-ttl-ms", "5000"])
        .start();
    let workers: Vec<_> = (0..3).map(|_| rust_worker(&pb.url).start()).collect();
    let c = client();
    wait_workers(&c, &pb.url, 3).await;

    let pass = |round: u64| {
        let c = c.clone();
        let base = pb.url.clone();
        futures_util::stream::iter(0..IDS)
            .map(move |i| {
                let c = c.clone();
                let url = format!("{base}/counter/id-{i}/hit");
                async move { (i, get_json(&c, &url, Duration::from_secs(10)).await, round) }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
    };
    let first = pass(1).await;
    let second = pass(2).await;
    let mut owner: HashMap<usize, (String, String)> = HashMap::new();
    for (i, body, _) in &first {
        assert_eq!(body["count"], 1, "id-{i} first hit: {body}");
        owner.insert(
            *i,
            (
                body["process"].as_str().unwrap_or_default().to_owned(),
                body["instance"].as_str().unwrap_or_default().to_owned(),
            ),
        );
    }
    for (i, body, _) in &second {
        assert_eq!(body["count"], 2, "id-{i} second hit: {body}");
        let (process, instance) = &owner[i];
        assert_eq!(
            body["process"].as_str(),
            Some(process.as_str()),
            "id-{i} moved"
        );
        assert_eq!(
            body["instance"].as_str(),
            Some(instance.as_str()),
            "id-{i} reset"
        );
    }
    let mut per_process: HashMap<&str, usize> = HashMap::new();
    for (process, _) in owner.values() {
        *per_process.entry(process.as_str()).or_default() += 1;
    }
    assert_eq!(per_process.len(), 3, "{per_process:?}");
    for (process, held) in &per_process {
        assert!(
            *held > IDS / 10,
            "{process} holds only {held} ids: {per_process:?}"
        );
    }
    drop(workers);
}
