//! Hostname and environment worlds with Rust workers (`fleet-worker`, the
//! `pinned` SDK) behind the real pinboard: a worker env, a per-namespace
//! env (`envs`) and a hostless worker each get only their own world's ids,
//! cluster calls stay in the caller's world whichever way the caller names
//! it (`Host`, or `Pinboard-Hostname` with `clusterHost: pinboard`), and a
//! Rust worker that declared `takeover: wind_down` winds down when a newer
//! deployment of its hostname registers.

mod support;

use serde_json::Value;
use support::{client, eventually, pinboard, rust_worker, stats, wait_workers, workers, Proc};
use test_support::PATIENCE;

/// A request's world: `Pinboard-Hostname` and `Pinboard-Env` (either may be
/// absent).
#[derive(Clone, Copy, Debug)]
struct In(Option<&'static str>, Option<&'static str>);

const HOSTLESS: In = In(None, None);
const PRODUCTION: In = In(Some("shop"), Some("production"));
const STAGING: In = In(Some("shop"), Some("staging"));

async fn get_in(c: &reqwest::Client, url: &str, world: In) -> (u16, Value) {
    let mut req = c.get(url);
    if let Some(h) = world.0 {
        req = req.header("pinboard-hostname", h);
    }
    if let Some(e) = world.1 {
        req = req.header("pinboard-env", e);
    }
    let res = req.send().await.expect("send");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// GET `url` in `world` until it answers 200; its body.
async fn ok_in(c: &reqwest::Client, url: &str, world: In) -> Value {
    eventually(
        &format!("200 from {url} in {world:?}"),
        PATIENCE,
        || async {
            let (status, body) = get_in(c, url, world).await;
            assert!(status == 200 || status == 503, "GET {url}: {status} {body}");
            (status == 200).then_some(body)
        },
    )
    .await
}

async fn process_of(c: &reqwest::Client, w: &Proc) -> Value {
    let url = format!("{}/fleet/process", w.url);
    let token = c
        .get(&url)
        .send()
        .await
        .expect("process")
        .text()
        .await
        .expect("process text");
    Value::from(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_workers_serve_only_their_own_world() {
    let pb = pinboard().start();
    let prod = rust_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "shop"), ("FLEET_ENV", "production")])
        .start();
    // Staging through the namespace's own env, naming its world on cluster
    // calls with `Pinboard-Hostname` (JS `clusterHost: "pinboard"`).
    let staging = rust_worker(&pb.url)
        .envs(&[
            ("PINNED_HOSTNAME", "shop"),
            ("FLEET_NS_ENV", "staging"),
            ("FLEET_CLUSTER_HOST", "pinboard"),
        ])
        .start();
    let plain = rust_worker(&pb.url).start();
    let c = client();
    let rows = wait_workers(&c, &pb.url, 3).await;
    let staging_row = rows
        .iter()
        .find(|r| r["advertiseUrl"] == staging.url.as_str())
        .expect("staging row");
    assert_eq!(staging_row["hostname"], "shop");
    let (p_prod, p_staging, p_plain) = (
        process_of(&c, &prod).await,
        process_of(&c, &staging).await,
        process_of(&c, &plain).await,
    );

    for i in 0..8 {
        let url = |w: &str| format!("{}/counter/{w}{i}/hit", pb.url);
        assert_eq!(ok_in(&c, &url("prod"), PRODUCTION).await["process"], p_prod);
        assert_eq!(
            ok_in(&c, &url("staging"), STAGING).await["process"],
            p_staging
        );
        assert_eq!(ok_in(&c, &url("plain"), HOSTLESS).await["process"], p_plain);
    }
    for (id, world) in [
        ("prod0", STAGING),
        ("staging0", HOSTLESS),
        ("plain0", PRODUCTION),
    ] {
        let (status, body) = get_in(&c, &format!("{}/counter/{id}/hit", pb.url), world).await;
        assert_eq!(status, 409, "{id} from {world:?}: {body}");
    }

    // Cluster calls: each caller's target lands in the caller's world.
    for (caller, world, process) in [
        ("prod1", PRODUCTION, &p_prod),
        ("staging1", STAGING, &p_staging),
        ("plain1", HOSTLESS, &p_plain),
    ] {
        let answer = ok_in(
            &c,
            &format!("{}/counter/{caller}/call/{caller}-target", pb.url),
            world,
        )
        .await;
        assert_eq!(answer["status"], 200, "{answer}");
        assert_eq!(&answer["target"]["process"], process, "{answer}");
        assert_eq!(answer["target"]["caller"]["id"], caller, "{answer}");
    }
    let across = ok_in(
        &c,
        &format!("{}/counter/staging2/call/prod0", pb.url),
        STAGING,
    )
    .await;
    assert_eq!(across["status"], 409, "{across}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_worker_winds_down_when_a_newer_deployment_takes_over() {
    let pb = pinboard()
        .args(&["--takeover-wind-down-ms", "3000"])
        .start();
    let deployment = [
        ("PINNED_HOSTNAME", "shop"),
        ("FLEET_ENV", "production"),
        ("FLEET_TAKEOVER", "wind_down"),
    ];
    let old = rust_worker(&pb.url)
        .envs(&[&deployment[..], &[("FLEET_EPOCH", "1")]].concat())
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let p_old = process_of(&c, &old).await;
    let first = ok_in(&c, &format!("{}/counter/w/hit", pb.url), PRODUCTION).await;
    assert_eq!(first["process"], p_old);
    let slow = tokio::spawn({
        let (c, url) = (c.clone(), format!("{}/counter/w/slow?ms=2000", pb.url));
        async move { get_in(&c, &url, PRODUCTION).await }
    });

    let new = rust_worker(&pb.url)
        .envs(&[&deployment[..], &[("FLEET_EPOCH", "2")]].concat())
        .start();
    let p_new = process_of(&c, &new).await;
    eventually(
        "the old deployment draining beside the new",
        PATIENCE,
        || async {
            let rows = workers(&c, &pb.url).await;
            let draining = |url: &str| {
                rows.iter()
                    .find(|r| r["advertiseUrl"] == url)
                    .map(|r| r["draining"] == true)
            };
            (draining(&old.url) == Some(true) && draining(&new.url) == Some(false)).then_some(())
        },
    )
    .await;
    for i in 0..4 {
        let fresh = ok_in(&c, &format!("{}/counter/n{i}/hit", pb.url), PRODUCTION).await;
        assert_eq!(fresh["process"], p_new);
    }
    let (status, body) = slow.await.expect("slow request");
    assert_eq!((status, &body["process"]), (200, &p_old), "{body}");

    // Past the deadline: superseded (the worker heard it and stopped), its
    // instances gone, its id fresh on the newcomer.
    eventually("the old deployment superseded", PATIENCE, || async {
        let rows = workers(&c, &pb.url).await;
        (rows.len() == 1 && rows[0]["advertiseUrl"] == new.url.as_str()).then_some(())
    })
    .await;
    eventually(
        "the old worker heard it was superseded",
        PATIENCE,
        || async {
            let text = c
                .get(format!("{}/metrics", old.url))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.lines()
                .any(|l| {
                    l.contains("operation=\"heartbeat\"") && l.contains("reason=\"superseded\"")
                })
                .then_some(())
        },
    )
    .await;
    let old_stats = stats(&c, &old).await;
    assert_eq!(
        old_stats["instances"].as_array().map(Vec::len),
        Some(0),
        "{old_stats}"
    );
    let moved = ok_in(&c, &format!("{}/counter/w/hit", pb.url), PRODUCTION).await;
    assert_eq!(
        (&moved["process"], &moved["count"]),
        (&p_new, &Value::from(1))
    );
}

/// A browser's request names its world by `Host` alone: a bound hostname
/// (the Rust worker registered `shop`), port stripped, any case; pinboard's
/// own address is the hostless world; once the last `shop` worker is gone
/// `Host: shop` answers 503 naming its world, never the hostless one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_alone_names_a_bound_hostname_world() {
    let pb = pinboard().start();
    let mut shop = rust_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "shop")])
        .start();
    let plain = rust_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 2).await;
    let (p_shop, p_plain) = (process_of(&c, &shop).await, process_of(&c, &plain).await);
    let get = |url: String, host: Option<&'static str>| {
        let c = c.clone();
        async move {
            let mut req = c.get(&url);
            if let Some(h) = host {
                req = req.header("host", h);
            }
            let res = req.send().await.expect("send");
            let status = res.status().as_u16();
            (status, res.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    for (i, host) in ["shop", "Shop:7070"].into_iter().enumerate() {
        let url = format!("{}/counter/by-host{i}/hit", pb.url);
        let body = eventually(&format!("{url} with Host {host}"), PATIENCE, || async {
            let (status, body) = get(url.clone(), Some(host)).await;
            assert!(status == 200 || status == 503, "{url}: {status} {body}");
            (status == 200).then_some(body)
        })
        .await;
        assert_eq!(body["process"], p_shop, "Host {host}");
    }
    let (status, body) = get(format!("{}/counter/by-address/hit", pb.url), None).await;
    assert_eq!((status, &body["process"]), (200, &p_plain), "{body}");

    shop.kill();
    eventually("the shop worker gone", PATIENCE, || async {
        (workers(&c, &pb.url).await.len() == 1).then_some(())
    })
    .await;
    let url = format!("{}/counter/after/hit", pb.url);
    let body = eventually("503 for Host: shop", PATIENCE, || async {
        let (status, body) = get(url.clone(), Some("shop")).await;
        assert_ne!(status, 200, "Host: shop reached a worker: {body}");
        (status == 503).then_some(body)
    })
    .await;
    assert_eq!(
        body["detail"],
        r#"no live worker serves this namespace for hostname "shop""#
    );
}
