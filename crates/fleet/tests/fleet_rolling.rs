//! Rolling deploy: a new worker joins, the old one is drained with a
//! deadline (SIGTERM) while a client keeps hitting 1 000 ids: no request
//! fails (refusals are retried by pinboard, never seen by the client).

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{client, get_json, pinboard, rust_worker, until, until_explained, wait_workers};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_the_old_worker_fails_no_request() {
    let pb = pinboard().args(&["--lease-ttl-ms", "3000"]).start();
    let mut old = rust_worker(&pb.url).env("FLEET_DRAIN_MS", "1500").start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    for i in 0..1000 {
        get_json(
            &c,
            &format!("{}/counter/r-{i}/hit", pb.url),
            Duration::from_secs(5),
        )
        .await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let clients: Vec<_> = (0..16)
        .map(|lane| {
            let (c, base) = (c.clone(), pb.url.clone());
            let (stop, ok, failed, failures) =
                (stop.clone(), ok.clone(), failed.clone(), failures.clone());
            tokio::spawn(async move {
                let mut i = lane;
                while !stop.load(Ordering::SeqCst) {
                    let url = format!("{base}/counter/r-{}/hit", i % 1000);
                    match c.get(&url).send().await {
                        Ok(r) if r.status().is_success() => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            failures
                                .lock()
                                .expect("log")
                                .push(format!("{url}: {status} {text}"));
                        }
                        Err(e) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            failures.lock().expect("log").push(format!("{url}: {e}"));
                        }
                    }
                    i += 16;
                }
            })
        })
        .collect();

    // The load is under way (not a guess at how long that takes).
    let warm = || ok.load(Ordering::SeqCst) + failed.load(Ordering::SeqCst) >= 50;
    until("the load to be under way", Duration::from_secs(10), warm).await;
    let _new = rust_worker(&pb.url).start();
    wait_workers(&c, &pb.url, 2).await;
    old.terminate();
    assert!(
        old.wait_exit(Duration::from_secs(15)).await.is_some(),
        "the old worker exits after its drain"
    );
    // Requests keep going through once the old worker is gone: the new
    // one answers a further 100 before the load stops.
    let after_exit = ok.load(Ordering::SeqCst);
    until_explained(
        "100 answers after the old worker exited",
        Duration::from_secs(10),
        || ok.load(Ordering::SeqCst) >= after_exit + 100 || failed.load(Ordering::SeqCst) > 0,
        || format!("{} answers since", ok.load(Ordering::SeqCst) - after_exit),
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for lane in clients {
        lane.await.expect("client lane");
    }
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    assert!(ok > 200, "only {ok} requests went through");
    assert_eq!(
        failed,
        0,
        "{failed} of {} requests failed: {:?}",
        ok + failed,
        failures
            .lock()
            .expect("log")
            .iter()
            .take(5)
            .collect::<Vec<_>>()
    );
}
