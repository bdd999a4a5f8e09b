//! The ledger example against a real Postgres: accounts share one pool
//! given as application state, write through it in handlers and read it
//! back in `activate` after the process restarts.

mod support;

use anyhow::Context as _;
use serde_json::{json, Value};
use support::{start_example, terminate};

fn database_url() -> anyhow::Result<String> {
    std::env::var("PINNED_TEST_DATABASE_URL")
        .context("PINNED_TEST_DATABASE_URL must name a Postgres database (scripts/test sets it)")
}

async fn call(request: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
    let answer = request.send().await?;
    Ok((answer.status().as_u16(), answer.json().await?))
}

#[tokio::test]
async fn accounts_share_the_pool_and_survive_a_restart() -> anyhow::Result<()> {
    let url = database_url()?;
    let account = format!("acct-{:016x}", rand::random::<u64>());
    let client = reqwest::Client::new();

    let (mut ledger, address) = start_example("ledger", &[("DATABASE_URL", &url)]).await?;
    for amount in [30, 12] {
        let (status, _) = call(client.post(format!(
            "http://{address}/account/{account}/deposit?amount={amount}"
        )))
        .await?;
        assert_eq!(status, 200);
    }
    let (status, body) =
        call(client.get(format!("http://{address}/account/{account}/balance"))).await?;
    assert_eq!((status, body), (200, json!({ "balance": 42 })));
    assert!(terminate(&mut ledger).await?.success());

    // A new process: the instance activates from the table, through the pool.
    let (_ledger, address) = start_example("ledger", &[("DATABASE_URL", &url)]).await?;
    let (status, body) =
        call(client.get(format!("http://{address}/account/{account}/balance"))).await?;
    assert_eq!((status, body), (200, json!({ "balance": 42 })));
    Ok(())
}
