//! The durable epoch high-water mark in Postgres ([`PostgresMark`]): what
//! keeps new placement epochs above every epoch any node minted, after the
//! placement store (Redis) lost its data and even with a wall clock stepped
//! back (see [`crate::clock`]).
//!
//! Owns one row of one pinboard-only table in the workers' database
//! (`--database-url`), created on first use:
//! `pinboard_epoch_mark (name text primary key, epoch bigint)`, row
//! `'placement'`. Raising is one `INSERT … ON CONFLICT … GREATEST(…)`, so
//! the mark never goes down whatever order nodes write in. Never touches
//! the reference's tables.
//!
//! Cost: one read before every new placement and one write after it (a
//! warm route never reaches here).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use pinned_edge::logging::Chain;
use pinned_store::ConnectionString;

use futures_util::future::BoxFuture;

use crate::clock::{DurableMark, MarkError};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const POOL_SIZE: usize = 2;

/// The mark's own sessions ask for warnings only: the server's `NOTICE:
/// relation … already exists` on every start after the first is no news.
const CREATE: &str = "SET client_min_messages = warning; \
                      CREATE TABLE IF NOT EXISTS pinboard_epoch_mark \
                      (name text PRIMARY KEY, epoch bigint NOT NULL)";
const LOAD: &str = "SELECT epoch FROM pinboard_epoch_mark WHERE name = 'placement'";
const RAISE: &str = "INSERT INTO pinboard_epoch_mark (name, epoch) VALUES ('placement', $1) \
                     ON CONFLICT (name) DO UPDATE \
                     SET epoch = GREATEST(pinboard_epoch_mark.epoch, EXCLUDED.epoch)";

/// The mark in Postgres (see the module doc).
pub struct PostgresMark {
    pool: Pool,
    created: AtomicBool,
}

impl std::fmt::Debug for PostgresMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresMark").finish_non_exhaustive()
    }
}

impl PostgresMark {
    /// A mark in the database at `url` (a connection string as libpq reads it,
    /// TLS included: the same one the sweeper and the workers use); nothing
    /// connects until first use.
    ///
    /// # Errors
    ///
    /// [`MarkError`] for a malformed URL or an unsupported `sslmode`.
    pub fn connect(url: &str) -> Result<Self, MarkError> {
        let mut target =
            ConnectionString::parse(url).map_err(|e| MarkError(Chain(&e).to_string()))?;
        if target.config().get_connect_timeout().is_none() {
            target.config_mut().connect_timeout(CONNECT_TIMEOUT);
        }
        let manager = Manager::from_config(
            target.config().clone(),
            target.tls(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| MarkError(Chain(&e).to_string()))?;
        Ok(Self {
            pool,
            created: AtomicBool::new(false),
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, MarkError> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| MarkError(Chain(&e).to_string()))?;
        if !self.created.load(Ordering::Acquire) {
            client
                .batch_execute(CREATE)
                .await
                .map_err(|e| MarkError(Chain(&e).to_string()))?;
            self.created.store(true, Ordering::Release);
        }
        Ok(client)
    }

    async fn load_now(&self) -> Result<u64, MarkError> {
        let client = self.client().await?;
        let row = client
            .query_opt(LOAD, &[])
            .await
            .map_err(|e| MarkError(Chain(&e).to_string()))?;
        let epoch: i64 = row.map(|r| r.get(0)).unwrap_or(0);
        Ok(u64::try_from(epoch).unwrap_or(0))
    }

    async fn raise_now(&self, epoch: u64) -> Result<(), MarkError> {
        let epoch = i64::try_from(epoch).map_err(|_| MarkError("epoch beyond bigint".into()))?;
        let client = self.client().await?;
        client
            .execute(RAISE, &[&epoch])
            .await
            .map_err(|e| MarkError(Chain(&e).to_string()))?;
        Ok(())
    }
}

impl DurableMark for PostgresMark {
    fn load(&self) -> BoxFuture<'_, Result<u64, MarkError>> {
        Box::pin(self.load_now())
    }

    fn raise(&self, epoch: u64) -> BoxFuture<'_, Result<(), MarkError>> {
        Box::pin(self.raise_now(epoch))
    }
}
