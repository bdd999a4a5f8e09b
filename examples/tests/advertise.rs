//! A worker that picks no port: the counter example on `PORT=0` with
//! `ADVERTISE_URL=http://127.0.0.1:0` registers with a real pinboard under
//! the port it bound, and requests through pinboard reach it.

mod support;

use serde_json::{json, Value};
use support::{example_binary, pinboard_binary};
use test_support::{wait_workers, Pinboard, RustWorker, TOKEN};

#[tokio::test]
async fn a_worker_on_port_zero_registers_the_port_it_bound_and_serves_through_pinboard(
) -> anyhow::Result<()> {
    let pinboard = Pinboard::new(pinboard_binary().await?)
        .name("advertise-pinboard")
        .start();
    let worker = RustWorker::new(example_binary("counter").await?, &pinboard.url)
        .on_any_port()
        .name("advertise-counter")
        .start();
    let bound = worker.addr().port();
    anyhow::ensure!(bound != 0, "the worker printed port 0: {}", worker.url);

    let client = reqwest::Client::new();
    let rows = wait_workers(&client, &pinboard.url, TOKEN, 1).await;
    assert_eq!(
        rows[0]["advertiseUrl"],
        format!("http://127.0.0.1:{bound}"),
        "{rows:?}"
    );
    for expected in [1, 2] {
        let counted: Value = client
            .post(format!("{}/counter/a/increment", pinboard.url))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        assert_eq!(counted, json!({ "value": expected }));
    }
    Ok(())
}
