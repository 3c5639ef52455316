//! Keeping `mailroom.queue` lean between autovacuum's visits.
//!
//! Every claimed event leaves a dead entry in `queue_claim`, and every
//! completion a dead queue row, until VACUUM removes them; autovacuum
//! visits a database at most once a minute (`autovacuum_naptime`). Claims
//! from a floor (`floor.rs`) start past those entries, but the claim of
//! the whole topic that runs every [`RESCAN`](crate::claim::floor::RESCAN) walks
//! them all. Measured over a backlog of 1,000,000 events (`mailroom-bench
//! backlog`, `pg_stat_statements`): those claims averaged 160 ms (at most
//! 951 ms) against 8.6 ms from the floor, and the drain slowed from 39,000
//! to 28,000 events/s as it went.
//!
//! So a store that has claimed [`PostgresOptions::vacuum_queue_every`]
//! events since its last VACUUM of the queue starts one, in the
//! background, one at a time: `VACUUM (SKIP_LOCKED)`, which passes if
//! another instance's is running and never blocks claims or completions
//! (it takes no lock they wait for).
//!
//! Only a role that may VACUUM the table (its owner, the database's owner,
//! a superuser; from PostgreSQL 17 a role with `MAINTAIN` on it) does: a
//! store running under a role with only the rights to use the schema
//! (docs/src/guides/operations.md, "Migrations and least privilege") finds that out
//! before its first vacuum, says so once in the log, and leaves the queue
//! to autovacuum, instead of a server warning at every try.
//!
//! [`PostgresOptions::vacuum_queue_every`]: crate::PostgresOptions::vacuum_queue_every

use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::OnceCell;

/// The queue's vacuum trigger of one store.
#[derive(Debug)]
pub(crate) struct QueueVacuum {
    pool: PgPool,
    /// Claimed events between vacuums; 0 never vacuums.
    every: u64,
    claimed: AtomicU64,
    running: AtomicBool,
    /// Whether this store's role may VACUUM the queue, found out once.
    allowed: OnceCell<bool>,
}

impl QueueVacuum {
    pub(crate) fn new(pool: PgPool, every: u64) -> Arc<Self> {
        Arc::new(Self {
            pool,
            every,
            claimed: AtomicU64::new(0),
            running: AtomicBool::new(false),
            allowed: OnceCell::new(),
        })
    }

    /// Whether this store's role may VACUUM `mailroom.queue`; `None` until
    /// the first vacuum was due.
    #[cfg(test)]
    pub(crate) fn allowed(&self) -> Option<bool> {
        self.allowed.get().copied()
    }

    /// Counts `n` claimed events; starts a vacuum once `every` were
    /// claimed since the last one started, unless one is running.
    pub(crate) fn claimed(self: &Arc<Self>, n: usize) {
        if self.every == 0 || n == 0 {
            return;
        }
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        let total = self
            .claimed
            .fetch_add(n, Ordering::Relaxed)
            .saturating_add(n);
        if total < self.every || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        self.claimed.store(0, Ordering::Relaxed);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            if *this.allowed.get_or_init(|| may_vacuum(&this.pool)).await {
                // The simple protocol: VACUUM cannot run as a prepared statement.
                if let Err(e) = sqlx::raw_sql("VACUUM (SKIP_LOCKED) mailroom.queue")
                    .execute(&this.pool)
                    .await
                {
                    tracing::debug!(error = %e, "vacuuming mailroom.queue failed; autovacuum will");
                }
            }
            this.running.store(false, Ordering::Release);
        });
    }
}

/// Whether the pool's role may VACUUM `mailroom.queue` (PostgreSQL skips a
/// table the role may not vacuum with a warning). Says so once when not;
/// a failed check counts as not.
async fn may_vacuum(pool: &PgPool) -> bool {
    let allowed: Result<(bool, String), sqlx::Error> = sqlx::query_as(
        "SELECT CASE WHEN current_setting('server_version_num')::int >= 170000
                     THEN has_table_privilege(c.oid, 'MAINTAIN')
                     ELSE pg_has_role(c.relowner, 'USAGE')
                          OR pg_has_role((SELECT datdba FROM pg_database
                                          WHERE datname = current_database()), 'USAGE')
                END,
                current_user::text
         FROM pg_class c WHERE c.oid = 'mailroom.queue'::regclass",
    )
    .fetch_one(pool)
    .await;
    match allowed {
        Ok((true, _)) => true,
        Ok((false, role)) => {
            tracing::info!(
                role,
                "role {role} may not VACUUM mailroom.queue (not its owner): the queue is left \
                 to autovacuum; large backlogs drain a little slower"
            );
            false
        }
        Err(e) => {
            tracing::info!(error = %e, "cannot tell whether this role may VACUUM mailroom.queue: left to autovacuum");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::QueueVacuum;
    use sqlx::PgPool;
    use std::time::{Duration, Instant};

    /// A migrated database, a role on it with only the rights
    /// [`crate::grants`] gives, and a pool of the owner's.
    async fn restricted_role() -> (PgPool, String) {
        let url = mailroom_testkit::fresh_postgres_db().await;
        let owner = PgPool::connect(&url).await.unwrap();
        crate::schema::migrate(&owner).await.unwrap();
        let db: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&owner)
            .await
            .unwrap();
        let role = format!("dml_{db}");
        let create = format!("CREATE ROLE \"{role}\" LOGIN; {}", crate::grants(&role));
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&owner)
            .await
            .unwrap();
        (owner, role)
    }

    /// Polls until the vacuum trigger has decided whether its role may
    /// VACUUM the queue.
    async fn decided(v: &QueueVacuum) -> bool {
        let started = Instant::now();
        loop {
            if let Some(allowed) = v.allowed() {
                return allowed;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "no decision");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Under a role that may only use the schema's objects the queue's
    /// VACUUM is not attempted (PostgreSQL would skip it with a warning
    /// at every try); the owner's store vacuums it.
    #[tokio::test]
    async fn only_a_role_that_may_vacuum_the_queue_tries() {
        let (owner, role) = restricted_role().await;
        let as_role = (*owner.connect_options()).clone().username(&role);
        let restricted = PgPool::connect_with(as_role).await.unwrap();
        let v = QueueVacuum::new(restricted, 1);
        v.claimed(1);
        assert!(!decided(&v).await, "{role} may not vacuum mailroom.queue");

        let v = QueueVacuum::new(owner.clone(), 1);
        v.claimed(1);
        assert!(decided(&v).await);
        let started = Instant::now();
        loop {
            let vacuums: i64 = sqlx::query_scalar(
                "SELECT vacuum_count FROM pg_stat_user_tables
                 WHERE schemaname = 'mailroom' AND relname = 'queue'",
            )
            .fetch_one(&owner)
            .await
            .unwrap();
            if vacuums > 0 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "no vacuum");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
