//! [`Db`]: where the store's statements go, directly or through a
//! transaction-mode pooler.
//!
//! Directly (the default), a statement is sent on a pooled connection as
//! sqlx sends it: a named statement, prepared once per connection and
//! cached, so a statement run before costs one round trip.
//!
//! Through a pooler in transaction mode (PgBouncer, Supabase's pooler;
//! `PostgresOptions::direct` set), a server connection is ours only until
//! the end of a transaction, and sqlx sends a statement with parameters as
//! two exchanges, each ended by `Sync`: `Parse`/`Describe`, then
//! `Bind`/`Execute`. Outside a transaction the pooler may hand the second
//! exchange to another server connection, where the statement does not
//! exist (or, unnamed, is another client's). So every statement through a
//! pooler runs inside a transaction that [`Db::begin`] opens, the statement
//! cache is off (a cached name would point at a statement on some other
//! server connection), and the transaction starts by dropping the named
//! statements earlier clients left on its server connection, whose names
//! ours could collide with (`DEALLOCATE ALL`). Its other commands set what
//! a direct connection's startup sets (`synchronous_commit = on`,
//! `idle_in_transaction_session_timeout`), which a pooler does not pass on. All of it is one round trip, `BEGIN`'s.

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sqlx::postgres::{PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Either, Execute, Executor, PgPool, Postgres, Transaction};

/// What a transaction through a transaction-mode pooler runs after its
/// `BEGIN`, in the same message.
/// `idle_in_transaction_session_timeout` is the direct sessions' (`timeouts.rs`).
const POOLED_START: &str = "SET LOCAL synchronous_commit = on; \
    SET LOCAL idle_in_transaction_session_timeout = '10s'; DEALLOCATE ALL";

/// The store's pool of connections to `url`, and whether `url` is a
/// transaction-mode pooler (then every statement runs in a transaction).
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pool: PgPool,
    pooled: bool,
}

impl Db {
    /// Statements on `pool` as they are; `pooled`: in a transaction each.
    pub(crate) fn new(pool: PgPool, pooled: bool) -> Self {
        Self { pool, pooled }
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A transaction on a pooled connection (see the module's comment for
    /// what it runs first through a pooler).
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        if self.pooled {
            self.begin_with("BEGIN").await
        } else {
            self.pool.begin().await
        }
    }

    /// [`begin`](Self::begin) with `begin`, a `BEGIN` with transaction
    /// modes (which must come before any statement that takes a snapshot,
    /// as `DEALLOCATE` does).
    pub(crate) async fn begin_with(
        &self,
        begin: &'static str,
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        if self.pooled {
            let begin = format!("{begin}; {POOLED_START}");
            self.pool.begin_with(sqlx::AssertSqlSafe(begin)).await
        } else {
            self.pool.begin_with(begin).await
        }
    }
}

impl From<PgPool> for Db {
    fn from(pool: PgPool) -> Self {
        Self::new(pool, false)
    }
}

impl<'c> Executor<'c> for &'c Db {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return self.pool.fetch_many(query);
        }
        // Read whole before the commit, which comes before any result.
        let all = async move {
            let mut tx = self.begin().await?;
            let items: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(futures::stream::iter(items.into_iter().map(Ok)))
        };
        futures::stream::once(all).try_flatten().boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return self.pool.fetch_optional(query);
        }
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }
}
