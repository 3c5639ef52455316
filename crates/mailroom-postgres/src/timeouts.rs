//! How long the store waits for PostgreSQL: every bound, in one place.
//!
//! A database behind a dead NAT or a failed-over load balancer does not
//! close its connections: packets are held or dropped, no RST comes, and a
//! statement in flight waits for TCP's retransmission timeout (about 15
//! minutes on Linux) before it fails. sqlx 0.9 opens its sockets itself
//! and exposes no TCP keepalive or `TCP_USER_TIMEOUT` setting, and a
//! keepalive would not help a connection with a statement in flight
//! anyway. So the bounds are the application's own:
//!
//! - every store operation runs under a limit ([`DATA_LIMIT`] on the data
//!   path: inserts, claims, completions, `/readyz`; [`ADMIN_LIMIT`] for
//!   reads, admin actions and maintenance; [`LONG_LIMIT`] for bulk work);
//!   past it the operation fails with [`StoreError::Unavailable`] (intake
//!   answers 503) and the connection it used is dropped, not reused;
//! - a connection's health check (the pool's ping before it hands out a
//!   connection, and after one comes back) waits at most [`PING_LIMIT`];
//!   one that does not answer is closed, so a frozen connection never goes
//!   back into the pool nor holds a slot of it;
//! - the server ends a session whose client went silent in the middle of
//!   a transaction ([`session_settings`]), so the row and advisory locks of
//!   a transaction abandoned by a timeout do not outlive it for long.
//!
//! A timed-out operation has an unknown outcome: a commit may have reached
//! the server. That is safe for each caller: an insert answered
//! `Unavailable` is retried by its sender and deduplicated (the event is
//! stored once and answered as a duplicate with the stored id); a claim
//! that committed leaves its events leased until rescue hands them out
//! again; a completion that committed makes the retried one stale.

use mailroom_core::{Result, StoreError};
use sqlx::PgConnection;
use sqlx::pool::PoolConnectionMetadata;
use std::future::Future;
use std::time::Duration;

/// The data path's bound: an insert group's transaction (acquire, insert,
/// commit), a claim, a group of completions, a lease extension, a point
/// read, `now()` for `/readyz`. Healthy, these take milliseconds; past 5 s
/// the database is as good as unreachable, and intake answers 503 rather
/// than let senders wait on it.
pub(crate) const DATA_LIMIT: Duration = Duration::from_secs(5);

/// Reads and admin actions (lists, search, stats, replay, skip, cancel)
/// and maintenance (lease rescue, counters, expiry, leader election).
pub(crate) const ADMIN_LIMIT: Duration = Duration::from_secs(30);

/// Bulk work that walks many rows: retention, bulk replay and cancel,
/// migrations.
pub(crate) const LONG_LIMIT: Duration = Duration::from_secs(600);

/// How long the pool's ping of a connection may take before the connection
/// is taken for dead and closed.
pub(crate) const PING_LIMIT: Duration = Duration::from_secs(2);

/// Server settings of every session the store opens (startup options):
/// - `idle_in_transaction_session_timeout` (10 s): a transaction whose
///   client stopped talking (a store operation past its limit, a frozen
///   network) is rolled back and its session ended within 10 s, releasing
///   its locks (e.g. the unique-key locks of an insert group whose retry
///   would otherwise wait for them);
/// - `tcp_keepalives_idle`/`interval`/`count` (10 s, 5 s, 3) and
///   `tcp_user_timeout` (30 s): the server notices a client host that
///   vanished within about 25 s (idle) or 30 s (data unacknowledged), and
///   ends its session and locks.
pub(crate) fn session_settings() -> [(&'static str, &'static str); 5] {
    [
        ("idle_in_transaction_session_timeout", "10s"),
        ("tcp_keepalives_idle", "10"),
        ("tcp_keepalives_interval", "5"),
        ("tcp_keepalives_count", "3"),
        ("tcp_user_timeout", "30000"),
    ]
}

/// `op`, or [`StoreError::Unavailable`] once it has taken `limit` (then it
/// is dropped, and the connection it held with it).
pub(crate) async fn bounded<T>(
    limit: Duration,
    what: &'static str,
    op: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, op).await {
        Ok(answer) => answer,
        Err(_) => {
            let secs = limit.as_secs();
            tracing::warn!(
                operation = what,
                limit_s = secs,
                "postgres did not answer in time; dropping the connection"
            );
            Err(StoreError::Unavailable(format!(
                "postgres: {what}: no answer within {secs} s"
            )))
        }
    }
}

/// Whether `conn` answers a ping within [`PING_LIMIT`].
pub(crate) async fn answers(conn: &mut PgConnection) -> bool {
    matches!(
        tokio::time::timeout(PING_LIMIT, sqlx::Connection::ping(conn)).await,
        Ok(Ok(()))
    )
}

/// The pool's `after_release` check: a connection that does not answer a
/// ping within [`PING_LIMIT`] (frozen, or left mid-statement by an
/// operation cut off by its limit) is closed rather than pooled. sqlx pings
/// a returned connection again after this, without a limit; this one makes
/// sure that second ping finds an answering connection.
pub(crate) fn after_release(
    conn: &mut PgConnection,
    _meta: PoolConnectionMetadata,
) -> futures::future::BoxFuture<'_, std::result::Result<bool, sqlx::Error>> {
    Box::pin(async move {
        if answers(conn).await {
            Ok(true)
        } else {
            // An error closes it without a goodbye (which could wait too).
            Err(sqlx::Error::PoolTimedOut)
        }
    })
}
