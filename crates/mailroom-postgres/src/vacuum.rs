//! Keeping `mailroom.queue` lean between autovacuum's visits.
//!
//! Every claimed event leaves a dead entry in `queue_claim`, and every
//! completion a dead queue row, until VACUUM removes them; autovacuum
//! visits a database at most once a minute (`autovacuum_naptime`). Claims
//! from a floor (`floor.rs`) start past those entries, but the claim of
//! the whole topic that runs every [`RESCAN`](crate::floor::RESCAN) walks
//! them all. Measured over a backlog of 1,000,000 events (`mailroom-bench
//! backlog`, `pg_stat_statements`): those claims averaged 160 ms (at most
//! 951 ms) against 8.6 ms from the floor, and the drain slowed from 39,000
//! to 28,000 events/s as it went.
//!
//! So a store that has claimed [`PostgresOptions::vacuum_queue_every`]
//! events since its last VACUUM of the queue starts one, in the
//! background, one at a time: `VACUUM (SKIP_LOCKED)`, which passes if
//! another instance's is running and never blocks claims or completions
//! (it takes no lock they wait for). A role that does not own the table
//! gets a warning from the server and the vacuum does nothing.
//!
//! [`PostgresOptions::vacuum_queue_every`]: crate::PostgresOptions::vacuum_queue_every

use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The queue's vacuum trigger of one store.
#[derive(Debug)]
pub(crate) struct QueueVacuum {
    pool: PgPool,
    /// Claimed events between vacuums; 0 never vacuums.
    every: u64,
    claimed: AtomicU64,
    running: AtomicBool,
}

impl QueueVacuum {
    pub(crate) fn new(pool: PgPool, every: u64) -> Arc<Self> {
        Arc::new(Self {
            pool,
            every,
            claimed: AtomicU64::new(0),
            running: AtomicBool::new(false),
        })
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
            // The simple protocol: VACUUM cannot run as a prepared statement.
            if let Err(e) = sqlx::raw_sql("VACUUM (SKIP_LOCKED) mailroom.queue")
                .execute(&this.pool)
                .await
            {
                tracing::debug!(error = %e, "vacuuming mailroom.queue failed; autovacuum will");
            }
            this.running.store(false, Ordering::Release);
        });
    }
}
