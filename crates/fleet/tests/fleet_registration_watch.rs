//! `Worker::watch_registration` publishes every change of the registration
//! state: an in-process worker against a real pinboard is seen registering
//! (with its session) and then draining, without polling.

mod support;

use std::future::IntoFuture;
use std::time::Duration;

use pinned::{HostOptions, Options, RegistrationState};
use pinned_fleet::counter::Counter;
use support::{pinboard, TOKEN};
use tokio::sync::watch;

async fn until(
    changes: &mut watch::Receiver<RegistrationState>,
    what: &str,
    done: impl Fn(&RegistrationState) -> bool,
) -> RegistrationState {
    let seen = tokio::time::timeout(Duration::from_secs(15), changes.wait_for(|s| done(s)))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .expect("the worker is alive");
    seen.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_changes_are_published() {
    let pb = pinboard().start();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let advertise = format!("http://{}", listener.local_addr().expect("addr"));
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .host_with::<Counter>("/counter", HostOptions::default())
        .pinboard(pb.url.clone(), TOKEN, advertise)
        .heartbeat_interval(Duration::from_millis(300))
        .lease_buffer(Duration::from_millis(500))
        .build()
        .expect("worker");
    let mut changes = worker.watch_registration().expect("control-plane mode");
    assert!(
        !changes.borrow().registered,
        "not registered before serving"
    );
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        pinned::serve(worker.clone())
            .listener(listener)
            .drain_deadline(Duration::from_secs(5))
            .with_graceful_shutdown(async move {
                let _ = signal.await;
            })
            .into_future(),
    );
    let registered = until(&mut changes, "registered", |s| s.registered).await;
    assert!(registered.session_id.is_some(), "{registered:?}");
    assert!(!registered.draining && !registered.superseded);
    let _ = stop.send(());
    until(&mut changes, "draining", |s| s.draining).await;
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .expect("the server stops")
        .expect("join")
        .expect("serve");
    assert!(
        !worker.registration().expect("state").registered,
        "deregistered"
    );
}
