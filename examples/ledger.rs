//! Accounts over a shared Postgres pool: every account instance appends to
//! and sums one `ledger` table through the same `deadpool_postgres::Pool`,
//! given once as application state (`Options::state`) and extracted in
//! handlers with `State<Pool>`. The instance keeps its balance in memory,
//! loaded from the table when it activates.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/test PORT=8080 cargo run --example ledger
//! curl -X POST 'localhost:8080/account/ada/deposit?amount=30'
//! curl localhost:8080/account/ada/balance
//! ```

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::extract::Query;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pinned::pinned_store::ConnectionString;
use pinned::{BoxError, Call, Context, Object, Options, Routes, State, This};
use serde::Deserialize;
use serde_json::{json, Value};

struct Account {
    balance: AtomicI64,
}

#[derive(Deserialize)]
struct Amount {
    amount: i64,
}

fn failed(error: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::SERVICE_UNAVAILABLE, error.to_string())
}

async fn deposit(
    this: This<Account>,
    call: Call,
    State(pool): State<Pool>,
    Query(Amount { amount }): Query<Amount>,
) -> Result<Json<Value>, (StatusCode, String)> {
    let client = pool.get().await.map_err(failed)?;
    client
        .execute(
            "INSERT INTO ledger (account, amount) VALUES ($1, $2)",
            &[&call.ctx().id(), &amount],
        )
        .await
        .map_err(failed)?;
    let balance = this.balance.fetch_add(amount, Ordering::SeqCst) + amount;
    Ok(Json(json!({ "balance": balance })))
}

async fn balance(this: This<Account>) -> Json<Value> {
    Json(json!({ "balance": this.balance.load(Ordering::SeqCst) }))
}

impl Object for Account {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        let pool: Pool = ctx.state().ok_or("no Postgres pool given")?;
        let row = pool
            .get()
            .await?
            .query_one(
                "SELECT COALESCE(SUM(amount), 0)::BIGINT FROM ledger WHERE account = $1",
                &[&ctx.id()],
            )
            .await?;
        Ok(Account {
            balance: AtomicI64::new(row.get(0)),
        })
    }

    fn routes() -> Routes<Self> {
        Router::new()
            .route("/deposit", post(deposit))
            .route("/balance", get(balance))
    }
}

/// A pool for `url`, read as libpq reads it (`?sslmode=verify-full&sslrootcert=…`
/// for a managed database): the same TLS the state store speaks.
fn pool(url: &str) -> Result<Pool, BoxError> {
    let mut target = ConnectionString::parse(url)?;
    target.config_mut().connect_timeout(Duration::from_secs(5));
    let manager = Manager::from_config(
        target.config().clone(),
        target.tls(),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(16)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .create_timeout(Some(Duration::from_secs(5)))
        .wait_timeout(Some(Duration::from_secs(5)))
        .build()?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // Text or JSON (`PINNED_LOG_FORMAT`, `--log-format`) on stderr, no
    // colours unless it is a terminal; `RUST_LOG` filters (default info).
    pinned::logging::init();
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to a Postgres URL")?;
    let pool = pool(&url)?;
    pool.get()
        .await?
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS ledger (account TEXT NOT NULL, amount BIGINT NOT NULL)",
        )
        .await?;
    pinned::serve(Options::from_env().host::<Account>("/account").state(pool)).await?;
    Ok(())
}
