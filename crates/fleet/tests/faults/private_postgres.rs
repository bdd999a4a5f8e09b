//! A private Postgres database for one scenario, in the shared test
//! cluster: the workers' state store, the durable tallies the checker reads
//! at the end, and the suite's "Postgres restart".
//!
//! The shared cluster is never restarted (other suites use it at the same
//! time). A restart as the workers see it is every one of their server
//! connections dying at once, which `pg_terminate_backend` on the backends
//! of this scenario's own database does, touching nothing else.

use std::collections::HashMap;

use tokio_postgres::NoTls;

/// The cluster's URL (`PINNED_TEST_DATABASE_URL`, else the local default).
fn cluster_url() -> String {
    std::env::var("PINNED_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned())
}

/// `url` with its database name replaced.
fn with_database(url: &str, database: &str) -> String {
    let (base, _) = url.rsplit_once('/').expect("a database URL with a path");
    format!("{base}/{database}")
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e} (is Postgres up? scripts/services)"));
    tokio::spawn(connection);
    client
}

/// A database created for one scenario; [`PrivateDatabase::drop_now`] removes it
/// (and so does dropping it, when a scenario failed before its end).
pub(crate) struct PrivateDatabase {
    name: String,
    dropped: bool,
    /// Its URL, for the workers' `FLEET_DATABASE_URL`.
    pub(crate) url: String,
}

impl PrivateDatabase {
    /// Creates `faults_<random>`.
    pub(crate) async fn create() -> Self {
        let name = format!("faults_{:016x}", rand::random::<u64>());
        let admin = connect(&cluster_url()).await;
        // Concurrent `CREATE DATABASE`s copying one template may refuse
        // each other for a moment: a few tries, a few milliseconds apart.
        let mut tries = 0;
        while let Err(e) = admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
        {
            tries += 1;
            assert!(tries < 20, "create database {name}: {e}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Self {
            url: with_database(&cluster_url(), &name),
            name,
            dropped: false,
        }
    }

    /// Kills every server connection to this database (none of the
    /// cluster's others): what a restart looks like from the workers.
    /// Answers how many it killed.
    pub(crate) async fn terminate_backends(&self) -> u64 {
        let admin = connect(&cluster_url()).await;
        let row = admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&self.name],
            )
            .await
            .expect("terminate backends");
        u64::try_from(row.get::<_, i64>(0)).unwrap_or(0)
    }

    /// The durable tally of each id (`None`: no row), read straight from
    /// the table the fenced store writes.
    pub(crate) async fn tallies(&self, ids: &[String]) -> HashMap<String, Option<u64>> {
        let client = connect(&self.url).await;
        let mut out = HashMap::new();
        for id in ids {
            let row = client
                .query_opt(
                    "SELECT (doc->>'value')::BIGINT FROM pinned_tray_index \
                     WHERE id = $1 AND tray_ns = 'tally' AND tray_id = '~'",
                    &[id],
                )
                .await
                .expect("read tally");
            let value = row.map(|r| u64::try_from(r.get::<_, i64>(0)).expect("tally"));
            out.insert(id.clone(), value);
        }
        out
    }

    /// Drops the database (whoever is still connected is disconnected).
    pub(crate) async fn drop_now(mut self) {
        drop_database(&self.name).await;
        self.dropped = true;
    }
}

async fn drop_database(name: &str) {
    let admin = connect(&cluster_url()).await;
    let _ = admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await;
}

impl Drop for PrivateDatabase {
    /// A scenario that failed midway leaves no database behind: dropped
    /// from a thread of its own (the test's runtime may be gone or busy).
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let name = self.name.clone();
        let cleanup = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                runtime.block_on(async {
                    let _ = tokio::time::timeout(
                        std::time::Duration::from_secs(10),
                        drop_database(&name),
                    )
                    .await;
                });
            }
        });
        let _ = cleanup.join();
    }
}
