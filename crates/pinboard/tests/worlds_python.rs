//! Hostname and environment worlds with real Python reference workers
//! (`pinned` 0.16.0) behind the real pinboard, on the memory store and on
//! Redis: client requests reach only the workers of the world they name
//! (`Pinboard-Hostname`, `Pinboard-Env`), cluster calls stay in their
//! caller's world (the reference sends `Host: <hostname>`), ids stay global
//! (409 from another world), and `takeover: "wind_down"` drains the older
//! deployment, lets its in-flight work finish, then supersedes it. Without
//! `Pinboard-Hostname`, a client's `Host` names a bound hostname's world,
//! on every node of one Redis, also once its last worker is gone.

mod support;

use serde_json::Value;
use support::{
    client, eventually, get_json, pinboard, python_worker, redis_prefix, wait_workers, workers,
    Proc,
};
use test_support::PATIENCE;

const HOST: &str = "app.test";

/// A request's world: hostname and env headers (either may be absent).
#[derive(Clone, Copy)]
struct In(Option<&'static str>, Option<&'static str>);

const HOSTLESS: In = In(None, None);
const PRODUCTION: In = In(Some(HOST), Some("production"));
const STAGING: In = In(Some(HOST), Some("staging"));

/// GET `url` in `world`; status and JSON body (or `Null`).
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

/// GET `url` in `world` until it answers 200 (placement may wait for a
/// worker view refresh); its body.
async fn ok_in(c: &reqwest::Client, url: &str, world: In) -> Value {
    eventually(&format!("200 from {url}"), PATIENCE, || async {
        let (status, body) = get_in(c, url, world).await;
        assert!(status == 200 || status == 503, "GET {url}: {status} {body}");
        (status == 200).then_some(body)
    })
    .await
}

async fn process_of(c: &reqwest::Client, w: &Proc) -> Value {
    get_json(c, &format!("{}/process", w.url), PATIENCE).await["process"].clone()
}

/// Three Python workers: hostless, `app.test`/production and
/// `app.test`/staging; every rule of the worlds checked through `pb`.
async fn three_worlds(pb: &Proc) {
    let plain = python_worker(&pb.url).start();
    let prod = python_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", HOST), ("PINNED_ENV", "production")])
        .start();
    let staging = python_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", HOST), ("PINNED_ENV", "staging")])
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 3).await;
    let (p_plain, p_prod, p_staging) = (
        process_of(&c, &plain).await,
        process_of(&c, &prod).await,
        process_of(&c, &staging).await,
    );

    // Each world places on its own workers only, whatever the spread.
    for i in 0..8 {
        let url = |world: &str| format!("{}/counter/{world}{i}/hit", pb.url);
        assert_eq!(ok_in(&c, &url("plain"), HOSTLESS).await["process"], p_plain);
        assert_eq!(ok_in(&c, &url("prod"), PRODUCTION).await["process"], p_prod);
        assert_eq!(
            ok_in(&c, &url("staging"), STAGING).await["process"],
            p_staging
        );
    }
    // Hostnames are case-insensitive; environments are not.
    let (status, body) = get_in(
        &c,
        &format!("{}/counter/prod0/hit", pb.url),
        In(Some("APP.Test"), Some("production")),
    )
    .await;
    assert_eq!((status, &body["process"]), (200, &p_prod), "{body}");

    // Ids are global: one placed in a world answers 409 from any other.
    for (id, world) in [
        ("plain0", STAGING),
        ("prod0", HOSTLESS),
        ("staging0", PRODUCTION),
    ] {
        let (status, body) = get_in(&c, &format!("{}/counter/{id}/hit", pb.url), world).await;
        assert_eq!(status, 409, "{id}: {body}");
        assert_eq!(
            body["detail"],
            "this id is placed in another hostname or env world"
        );
    }

    // A world nobody serves is 503 naming it; bad names are 400.
    let (status, body) = get_in(
        &c,
        &format!("{}/counter/x/hit", pb.url),
        In(Some("other.test"), None),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["detail"],
        r#"no live worker serves this namespace for hostname "other.test""#
    );
    // `app.test` without an env is a world of its own: nobody serves it.
    let (status, body) = get_in(
        &c,
        &format!("{}/counter/x/hit", pb.url),
        In(Some(HOST), None),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["detail"],
        r#"no live worker serves this namespace for hostname "app.test""#
    );
    for (world, detail) in [
        (
            In(Some("a/b"), None),
            "malformed Pinboard-Hostname header: hostname must contain only [A-Za-z0-9.:_-]",
        ),
        (
            In(None, Some("staging")),
            "Pinboard-Env requires Pinboard-Hostname (the hostless world has no environments)",
        ),
    ] {
        let (status, body) = get_in(&c, &format!("{}/counter/x/hit", pb.url), world).await;
        assert_eq!((status, body["detail"].as_str()), (400, Some(detail)));
    }

    // Cluster calls stay in the caller's world: the reference sends
    // `Host: app.test` and no env; pinboard takes the env from the caller's
    // registration.
    for (caller, world, process) in [
        ("staging1", STAGING, &p_staging),
        ("prod1", PRODUCTION, &p_prod),
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
    // A cluster call to an id of another world is refused (409 relayed to
    // the calling instance), not served across worlds.
    let answer = ok_in(
        &c,
        &format!("{}/counter/staging2/call/prod0", pb.url),
        STAGING,
    )
    .await;
    assert_eq!(answer["status"], 409, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_workers_in_three_worlds_on_the_memory_store() {
    let pb = pinboard().start();
    three_worlds(&pb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_workers_in_three_worlds_on_redis() {
    let prefix = redis_prefix("worlds");
    let pb = pinboard().shared_redis(&prefix).start();
    three_worlds(&pb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wind_down_takeover_with_python_workers_on_the_memory_store() {
    let pb = pinboard()
        .args(&["--takeover-wind-down-ms", "3000"])
        .start();
    wind_down_takeover(&pb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wind_down_takeover_with_python_workers_on_redis() {
    let prefix = redis_prefix("worlds-wind-down");
    let pb = pinboard()
        .shared_redis(&prefix)
        .args(&["--takeover-wind-down-ms", "3000"])
        .start();
    wind_down_takeover(&pb).await;
}

/// `takeover: "wind_down"` with Python workers: the newer deployment of the
/// hostname takes new ids at once, the older one finishes its in-flight
/// request, is drained for `--takeover-wind-down-ms` (3 s here), then
/// superseded, and its ids move to the newcomer.
async fn wind_down_takeover(pb: &Proc) {
    let deployment = [
        ("PINNED_HOSTNAME", HOST),
        ("PINNED_ENV", "production"),
        ("PINNED_TAKEOVER", "wind_down"),
    ];
    let old = python_worker(&pb.url)
        .envs(&[&deployment[..], &[("PINNED_EPOCH", "1")]].concat())
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let p_old = process_of(&c, &old).await;
    let first = ok_in(&c, &format!("{}/counter/w/hit", pb.url), PRODUCTION).await;
    assert_eq!(first["process"], p_old);

    // In flight on the old deployment while the new one takes over.
    let slow = tokio::spawn({
        let (c, url) = (c.clone(), format!("{}/counter/w/slow?ms=2000", pb.url));
        async move { get_in(&c, &url, PRODUCTION).await }
    });
    let new = python_worker(&pb.url)
        .envs(&[&deployment[..], &[("PINNED_EPOCH", "2")]].concat())
        .start();
    let p_new = process_of(&c, &new).await;
    let rows = eventually(
        "the old deployment draining beside the new",
        PATIENCE,
        || async {
            let rows = workers(&c, &pb.url).await;
            let draining = |url: &str| {
                rows.iter()
                    .find(|r| r["advertiseUrl"] == url)
                    .map(|r| r["draining"] == true)
            };
            (draining(&old.url) == Some(true) && draining(&new.url) == Some(false)).then_some(rows)
        },
    )
    .await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    // New ids go to the newcomer while the old one winds down.
    for i in 0..4 {
        let fresh = ok_in(&c, &format!("{}/counter/n{i}/hit", pb.url), PRODUCTION).await;
        assert_eq!(fresh["process"], p_new);
    }
    // The in-flight request finished where it started.
    let (status, body) = slow.await.expect("slow request");
    assert_eq!((status, &body["process"]), (200, &p_old), "{body}");
    assert_eq!(body["count"], 1, "{body}");

    // After the deadline the old session is superseded and gone for good;
    // its id lives on the newcomer, fresh.
    eventually("the old deployment superseded", PATIENCE, || async {
        let rows = workers(&c, &pb.url).await;
        (rows.len() == 1 && rows[0]["advertiseUrl"] == new.url.as_str()).then_some(())
    })
    .await;
    let moved = ok_in(&c, &format!("{}/counter/w/hit", pb.url), PRODUCTION).await;
    assert_eq!(
        (&moved["process"], &moved["count"]),
        (&p_new, &Value::from(1))
    );
    assert!(
        std::fs::read_to_string(&pb.log)
            .unwrap_or_default()
            .contains("winding an older deployment down"),
        "pinboard logged the wind-down"
    );
}

/// GET `url` with `Host: host` (and `Pinboard-Hostname: named`, when
/// given); status and JSON body (or `Null`).
async fn get_with_host(
    c: &reqwest::Client,
    url: &str,
    host: Option<&str>,
    named: Option<&str>,
) -> (u16, Value) {
    let mut req = c.get(url);
    if let Some(h) = host {
        req = req.header("host", h);
    }
    if let Some(n) = named {
        req = req.header("pinboard-hostname", n);
    }
    let res = req.send().await.expect("send");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// A browser cannot set `Pinboard-Hostname`: `Host` names the world when
/// it is a bound hostname (one a worker registered, port stripped, any
/// case), on every node of the store; any other `Host` is the hostless
/// world; `Pinboard-Hostname` wins over `Host`. Once the last `shop.test`
/// worker is gone, `Host: shop.test` answers 503 naming its world, never
/// the hostless one. `nodes` all share `pb`'s store.
async fn host_names_bound_worlds(pb: &Proc, nodes: &[&Proc]) {
    const SHOP: &str = "shop.test";
    let plain = python_worker(&pb.url).start();
    let mut shop = python_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", SHOP)])
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 2).await;
    let (p_plain, p_shop) = (process_of(&c, &plain).await, process_of(&c, &shop).await);
    for (n, node) in nodes.iter().enumerate() {
        for (i, host) in ["shop.test", "SHOP.Test:8443", "shop.test:"]
            .iter()
            .enumerate()
        {
            let url = format!("{}/counter/host{n}-{i}/hit", node.url);
            let body = eventually(&format!("{url} with Host {host}"), PATIENCE, || async {
                let (status, body) = get_with_host(&c, &url, Some(host), None).await;
                assert!(status == 200 || status == 503, "{url}: {status} {body}");
                (status == 200).then_some(body)
            })
            .await;
            assert_eq!(body["process"], p_shop, "node {n}, Host {host}");
        }
        // pinboard's own address, or a hostname nobody bound: hostless.
        for (i, host) in [None, Some("unbound.test")].into_iter().enumerate() {
            let url = format!("{}/counter/plain{n}-{i}/hit", node.url);
            let (status, body) = get_with_host(&c, &url, host, None).await;
            assert_eq!(
                (status, &body["process"]),
                (200, &p_plain),
                "{host:?}: {body}"
            );
        }
        // `Pinboard-Hostname` wins over `Host`.
        let (status, body) = get_with_host(
            &c,
            &format!("{}/counter/named{n}/hit", node.url),
            Some(SHOP),
            Some("other.test"),
        )
        .await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(
            body["detail"],
            r#"no live worker serves this namespace for hostname "other.test""#
        );
    }

    shop.kill();
    eventually("the shop.test worker gone", PATIENCE, || async {
        (workers(&c, &pb.url).await.len() == 1).then_some(())
    })
    .await;
    for (n, node) in nodes.iter().enumerate() {
        let url = format!("{}/counter/after{n}/hit", node.url);
        let body = eventually(&format!("{url}: 503 for shop.test"), PATIENCE, || async {
            let (status, body) = get_with_host(&c, &url, Some(SHOP), None).await;
            assert_ne!(status, 200, "Host: shop.test reached a worker: {body}");
            (status == 503).then_some(body)
        })
        .await;
        assert_eq!(
            body["detail"], r#"no live worker serves this namespace for hostname "shop.test""#,
            "node {n}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_names_bound_worlds_on_the_memory_store() {
    let pb = pinboard().start();
    host_names_bound_worlds(&pb, &[&pb]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_names_bound_worlds_on_two_nodes_of_one_redis() {
    let prefix = redis_prefix("worlds-host");
    let pb = pinboard().shared_redis(&prefix).start();
    let other = pinboard().shared_redis(&prefix).start();
    host_names_bound_worlds(&pb, &[&pb, &other]).await;
}
