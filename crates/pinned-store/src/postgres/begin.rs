//! What every transaction of the store starts with: `BEGIN`, the `SET LOCAL` timeouts,
//! the compression large documents are stored with, and the application's hook.
//!
//! Owns only that text. Large `doc` values are stored compressed (TOAST); the server
//! compresses with `pglz` unless told otherwise, and on trays whose docs grow (a list of
//! what was done) that compression is the biggest single cost of a write. Where the
//! server was built with `lz4`, the store's own transactions ask for it with
//! `SET LOCAL default_toast_compression`: several times cheaper, and invisible to every
//! reader (the server decompresses whatever method a value was stored with, so the
//! Python reference reads these rows as it reads its own). The schema is untouched.

use std::sync::atomic::{AtomicBool, Ordering};

use super::PostgresOptions;

/// Whether the server offers `lz4` for `default_toast_compression` (Postgres 14 and
/// later, built with lz4; an older server has no such setting and answers no row).
pub(super) const LZ4_OFFERED: &str = "SELECT 1 FROM pg_settings \
WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)";

/// The statements that open a transaction, with and without `lz4`.
#[derive(Debug)]
pub(super) struct Begin {
    plain: String,
    lz4: String,
    use_lz4: AtomicBool,
}

impl Begin {
    pub(super) fn new(options: &PostgresOptions) -> Self {
        let timeouts = format!(
            "BEGIN; SET LOCAL lock_timeout = '{}ms'; SET LOCAL statement_timeout = '{}ms'; \
             SET LOCAL idle_in_transaction_session_timeout = '{}ms'",
            options.lock_timeout.as_millis(),
            options.statement_timeout.as_millis(),
            options.idle_in_transaction_timeout.as_millis()
        );
        let hook = match &options.transaction_sql {
            Some(sql) => format!("; {sql}"),
            None => String::new(),
        };
        Self {
            plain: format!("{timeouts}{hook}"),
            // Before the hook, so that an application's own choice still wins.
            lz4: format!("{timeouts}; SET LOCAL default_toast_compression = 'lz4'{hook}"),
            use_lz4: AtomicBool::new(false),
        }
    }

    /// The statements to send now.
    pub(super) fn sql(&self) -> &str {
        if self.use_lz4.load(Ordering::Relaxed) {
            &self.lz4
        } else {
            &self.plain
        }
    }

    /// Records what the server offers (see [`LZ4_OFFERED`]).
    pub(super) fn offer_lz4(&self, offered: bool) {
        self.use_lz4.store(offered, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lz4_only_once_offered_and_always_before_the_hook() {
        let options = PostgresOptions {
            transaction_sql: Some("SET LOCAL ROLE app".to_owned()),
            ..PostgresOptions::default()
        };
        let begin = Begin::new(&options);
        assert!(!begin.sql().contains("lz4"));
        assert!(begin.sql().ends_with("; SET LOCAL ROLE app"));
        begin.offer_lz4(true);
        assert!(begin
            .sql()
            .contains("default_toast_compression = 'lz4'; SET LOCAL ROLE app"));
        begin.offer_lz4(false);
        assert!(!begin.sql().contains("lz4"));
    }
}
