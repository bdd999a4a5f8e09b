//! Hostname bindings with real Python workers: a newer deployment epoch of
//! the same hostname supersedes the older session (which stops for good),
//! and `takeover: "deny"` keeps the incumbent (and reaches no other env);
//! two deployments of one hostname registering at once through two nodes
//! of one Redis leave one deployment live, never both.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use test_support::metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Barrier;

use support::registration::Identity;
use support::{
    bearer, client, eventually, get_json, metric, pinboard, python_worker, wait_workers, workers,
    RedisServer,
};

/// GET `url` in the `app` hostname world until it answers 200; its body.
async fn get_app(c: &reqwest::Client, url: &str) -> Value {
    let world = [("pinboard-hostname", "app")];
    test_support::get_json_with(c, url, &world, Duration::from_secs(10)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_deployment_supersedes_the_old_session() {
    let pb = pinboard().start();
    let c = client();
    let fresh = metrics::scrape(&c, &pb.url).await;
    let old = python_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "app"), ("PINNED_EPOCH", "1")])
        .start();
    wait_workers(&c, &pb.url, 1).await;
    let one = metrics::scrape(&c, &pb.url).await;
    assert_eq!(metrics::moved(&fresh, &one, "pinboard_registrations"), 1.0);
    assert_eq!(metrics::moved(&fresh, &one, "pinboard_live_workers"), 1.0);
    let before = get_app(&c, &format!("{}/counter/t/hit", pb.url)).await;
    let old_proc = get_json(&c, &format!("{}/process", old.url), Duration::from_secs(5)).await
        ["process"]
        .clone();
    assert_eq!(before["process"], old_proc);

    let new = python_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "app"), ("PINNED_EPOCH", "2")])
        .start();
    let new_proc = get_json(&c, &format!("{}/process", new.url), Duration::from_secs(10)).await
        ["process"]
        .clone();
    // Only the new session remains; the old one never comes back.
    let rows = eventually("the new session alone", Duration::from_secs(10), || async {
        let rows = workers(&c, &pb.url).await;
        (rows.len() == 1 && rows[0]["advertiseUrl"] == new.url.as_str()).then_some(rows)
    })
    .await;
    assert_eq!(rows[0]["epoch"], 2);
    let after = get_app(&c, &format!("{}/counter/t/hit", pb.url)).await;
    assert_eq!(after["process"], new_proc);
    assert_eq!(after["count"], 1);
    let superseded = metrics::scrape(&c, &pb.url).await;
    assert!(metrics::moved(&one, &superseded, "pinboard_registrations") >= 1.0);
    assert_eq!(superseded.value("pinboard_live_workers"), 1.0);
    // Heartbeats go on (the new worker's); the old one never registers again.
    let beats = "pinboard_heartbeats_total";
    test_support::metric_grows(&c, &[&pb.url], beats, 3, Duration::from_secs(10)).await;
    assert_eq!(
        workers(&c, &pb.url).await.len(),
        1,
        "the superseded worker re-registered"
    );
    let later = metrics::scrape(&c, &pb.url).await;
    assert!(metrics::moved(&superseded, &later, "pinboard_heartbeats") >= 3.0);
    assert_eq!(
        later.value("pinboard_registrations"),
        superseded.value("pinboard_registrations")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_keeps_the_incumbent() {
    let pb = pinboard().start();
    let old = python_worker(&pb.url)
        .envs(&[
            ("PINNED_HOSTNAME", "app"),
            ("PINNED_EPOCH", "1"),
            ("PINNED_TAKEOVER", "deny"),
        ])
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let before = metric(&c, &pb, "pinboard_registry_errors_total").await;
    let _new = python_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "app"), ("PINNED_EPOCH", "2")])
        .start();
    // The newcomer is refused, backs off, and is refused again.
    eventually(
        "two refused registrations",
        Duration::from_secs(20),
        || async {
            (metric(&c, &pb, "pinboard_registry_errors_total").await >= before + 2).then_some(())
        },
    )
    .await;
    let rows = workers(&c, &pb.url).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["advertiseUrl"], old.url.as_str());
    // Another env of the same hostname is another deployment: the deny
    // does not reach it, and it supersedes nobody.
    let staging = python_worker(&pb.url)
        .envs(&[
            ("PINNED_HOSTNAME", "app"),
            ("PINNED_ENV", "staging"),
            ("PINNED_EPOCH", "3"),
        ])
        .start();
    let rows = wait_workers(&c, &pb.url, 2).await;
    for url in [&old.url, &staging.url] {
        assert!(
            rows.iter().any(|r| r["advertiseUrl"] == url.as_str()),
            "{url} missing from {rows:?}"
        );
    }
}

/// A worker that answers pinboard's registration challenge as `identity`,
/// each answer held until `together` has as many challenges waiting as it
/// counts (at most 5 s): the registrations it serves leave their challenge
/// at the same moment, so their reads of the live sessions and their
/// writes interleave.
async fn challenger(identity: Identity, together: Arc<Barrier>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (identity, together) = (identity.clone(), together.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 2048];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let challenge = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|target| target.split_once("challenge="))
                    .map(|(_, c)| {
                        percent_encoding::percent_decode_str(c)
                            .decode_utf8_lossy()
                            .into_owned()
                    });
                let secret = head.lines().find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("pinboard-proxy-secret")
                        .then(|| value.trim().to_owned())
                });
                let _ = tokio::time::timeout(Duration::from_secs(5), together.wait()).await;
                let (status, body) =
                    identity.answer_challenge(secret.as_deref(), challenge.as_deref());
                let body = body.to_string();
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// `POST /registry/register` for `identity` at `addr` in `hostname`'s
/// world at deployment `epoch` (takeover: supersede); the status.
async fn register(
    pb: &str,
    identity: &Identity,
    addr: SocketAddr,
    hostname: &str,
    epoch: u64,
) -> u16 {
    client()
        .post(format!("{pb}/registry/register"))
        .header("authorization", bearer())
        .json(&json!({
            "clientId": identity.client_id, "secret": identity.secret,
            "namespaces": ["/counter"], "advertiseUrl": format!("http://{addr}"),
            "headroom": 100, "draining": false,
            "challenge": identity.challenge.0, "challengeValue": identity.challenge.1,
            "hostname": hostname, "epoch": epoch,
        }))
        .send()
        .await
        .expect("register")
        .status()
        .as_u16()
}

/// Issue 22, bug 9: the takeover check read the live sessions and then
/// wrote, so deployments 1 and 2 of one hostname registering at once
/// through two nodes could both pass it and both stay live. Now each
/// registration is applied only while the deployment version it decided
/// at holds: per hostname, deployment 2 is admitted and deployment 1 is
/// either refused (409, it decided after 2 was in) or superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deployments_racing_through_two_nodes_leave_one_live() {
    let redis = RedisServer::start();
    // A long lease: these workers never beat.
    let args = ["--lease-ttl-ms", "60000"];
    let one = pinboard().redis(&redis.url).args(&args).start();
    let two = pinboard().redis(&redis.url).args(&args).start();
    let c = client();
    let mut refused = 0;
    for round in 0..24u32 {
        let hostname = format!("race{round}.test");
        let together = Arc::new(Barrier::new(2));
        let old = Identity::named(&format!("race{round}-old"));
        let new = Identity::named(&format!("race{round}-new"));
        let old_addr = challenger(old.clone(), together.clone()).await;
        let new_addr = challenger(new.clone(), together).await;
        // Each node takes the older deployment in turn.
        let (old_pb, new_pb) = if round % 2 == 0 {
            (&one.url, &two.url)
        } else {
            (&two.url, &one.url)
        };
        let (old_status, new_status) = tokio::join!(
            register(old_pb, &old, old_addr, &hostname, 1),
            register(new_pb, &new, new_addr, &hostname, 2),
        );
        assert_eq!(new_status, 200, "{hostname}: the newer deployment refused");
        assert!(
            old_status == 200 || old_status == 409,
            "{hostname}: the older deployment answered {old_status}"
        );
        refused += u32::from(old_status == 409);
        let old_url = format!("http://{old_addr}");
        let new_url = format!("http://{new_addr}");
        for pb in [&one.url, &two.url] {
            let live: Vec<Value> = workers(&c, pb)
                .await
                .into_iter()
                .filter(|w| {
                    w["advertiseUrl"] == old_url.as_str() || w["advertiseUrl"] == new_url.as_str()
                })
                .collect();
            assert_eq!(live.len(), 1, "{hostname}: both deployments live: {live:?}");
            assert_eq!(
                live[0]["advertiseUrl"],
                new_url.as_str(),
                "{hostname}: {live:?}"
            );
        }
    }
    println!(
        "24 races: the older deployment refused in {refused}, superseded in {}",
        24 - refused
    );
}
