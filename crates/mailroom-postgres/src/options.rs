//! How to connect: [`PostgresOptions`], built in code or from a `postgres://` URL.

use mailroom_core::StoreError;
use mailroom_core::redact::url as redact;
use sqlx::postgres::PgConnectOptions;
use std::str::FromStr;
use std::time::Duration;

/// Settings of a [`PostgresStore`](crate::PostgresStore).
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Where the database is (host, port, user, database, TLS...): every
    /// statement goes there, except the session work of [`direct`](Self::direct).
    pub connect: PgConnectOptions,
    /// A direct connection to the same database, when [`connect`](Self::connect)
    /// is a connection pooler in transaction mode (PgBouncer, Supabase's
    /// pooler): what needs a session of its own goes there (the `LISTEN`
    /// connection, the sequential topics' claim locks, migrations), and
    /// every statement through `connect` runs in a transaction of its own
    /// without cached prepared statements (`db.rs`). `None`: `connect` is
    /// direct (or a session-mode pooler), which [`PostgresStore::connect`](crate::PostgresStore::connect)
    /// checks, refusing a transaction-mode pooler.
    pub direct: Option<PgConnectOptions>,
    /// Largest number of pooled connections (claims, completions, reads and
    /// the group-commit writer share them; the listener has its own).
    pub pool_size: u32,
    /// Share one transaction and one commit among every insert waiting in
    /// the queue. `false` commits each insert on its own; only benchmarks
    /// want that.
    pub group_commit: bool,
    /// Most inserts grouped into one transaction.
    pub max_batch: usize,
    /// Inserts that may wait for the writer; beyond this, inserts fail fast
    /// with [`StoreError::Overloaded`]. Also the completions that may wait
    /// for the completion task; beyond this, a completion waits for room.
    pub queue_capacity: usize,
    /// How long an operation waits for a pooled connection before it fails
    /// with [`StoreError::Unavailable`] (e.g. while the database is down).
    pub acquire_timeout: Duration,
    /// Start the `LISTEN mailroom_events` connection behind
    /// [`PostgresStore::subscribe`](crate::PostgresStore::subscribe).
    pub listen: bool,
    /// Claimed events after which the store VACUUMs `mailroom.queue` in
    /// the background, so the claims that walk a topic whole do not step
    /// over the dead entries of every event claimed since autovacuum's
    /// last visit (`vacuum.rs`); 0 leaves it to autovacuum.
    pub vacuum_queue_every: u64,
}

impl PostgresOptions {
    /// Defaults for the database at `url` (`postgres://user@host:port/db`).
    ///
    /// TLS takes libpq's parameters: `sslmode` (`disable`, `prefer` (the
    /// default), `require`, `verify-ca`, `verify-full`), `sslrootcert`
    /// (a CA file, or `system` for the system's roots), `sslcert` and
    /// `sslkey` (a client certificate). The files are read here, so a
    /// wrong path is an error now, not at the first connection.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        Ok(Self::new(parse(url)?))
    }

    /// These options with `url` as the [`direct`](Self::direct) connection
    /// (TLS parameters as in [`from_url`](Self::from_url)).
    pub fn with_direct_url(mut self, url: &str) -> Result<Self, StoreError> {
        self.direct = Some(parse(url)?);
        Ok(self)
    }

    /// Defaults for the database `connect` names.
    pub fn new(connect: PgConnectOptions) -> Self {
        Self {
            connect,
            direct: None,
            pool_size: 16,
            group_commit: true,
            max_batch: 512,
            queue_capacity: 8192,
            acquire_timeout: Duration::from_secs(5),
            listen: true,
            vacuum_queue_every: 100_000,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        if self.pool_size < 2 || self.max_batch == 0 || self.queue_capacity == 0 {
            return Err(StoreError::Invalid(
                "postgres options: pool_size must be at least 2, max_batch and queue_capacity at least 1"
                    .into(),
            ));
        }
        Ok(())
    }
}

fn parse(url: &str) -> Result<PgConnectOptions, StoreError> {
    if !(url.starts_with("postgres:") || url.starts_with("postgresql:")) {
        return Err(StoreError::Invalid(format!(
            "not a postgres URL: {:?}",
            redact(url)
        )));
    }
    let connect = PgConnectOptions::from_str(&crate::tls::for_sqlx(url)?)
        .map_err(|e| StoreError::Invalid(format!("postgres URL {:?}: {e}", redact(url))))?;
    crate::tls::apply(url, connect)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_other_schemes_are_refused() {
        let o = PostgresOptions::from_url("postgres://u:secret@127.0.0.1:5433/db");
        assert!(o.is_ok());
        assert!(PostgresOptions::from_url("postgresql://h/db").is_ok());
        assert!(PostgresOptions::from_url("sqlite://x.db").is_err());
        let o = o.and_then(|o| o.with_direct_url("postgres://u@127.0.0.1:5432/db"));
        assert_eq!(
            o.ok().and_then(|o| o.direct).map(|d| d.get_port()),
            Some(5432)
        );
        assert!(
            PostgresOptions::from_url("postgres://h/db")
                .and_then(|o| o.with_direct_url("mysql://h/db"))
                .is_err()
        );
    }

    #[test]
    fn defaults_match_the_documentation() {
        let o = PostgresOptions::new(PgConnectOptions::new());
        assert!(o.group_commit && o.listen && o.direct.is_none());
        assert_eq!(
            (o.pool_size, o.max_batch, o.queue_capacity),
            (16, 512, 8192)
        );
        assert!(o.validate().is_ok());
    }
}
