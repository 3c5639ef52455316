//! The claim lock of a sequential topic, held across its claims.
//!
//! Claims of a sequential topic take turns under its claim lock, a
//! PostgreSQL advisory lock ([`heads`](super::heads)). Taking it inside each
//! claim's transaction cost four round trips a claim (`BEGIN`, the lock,
//! the statement, `COMMIT`) where a claim of independent events makes
//! one. So each store gives each sequential topic it claims a *claimer*:
//! a connection of its own that takes the lock for its session and keeps
//! it while claims follow each other, each claim one statement in
//! autocommit. Measured on `heads-floor` (docs/src/design/sequential.md): 1.10×
//! the sequential drain through the store alone, 1.13× through the engine.
//!
//! Every claim of the topic, on any instance, still runs while its
//! claimer holds the lock, and its statement's snapshot is taken after the
//! lock was granted, so it sees every earlier claim of the topic
//! committed: the guarantee is the one a transaction's lock gave. The two
//! kinds of the lock are one lock in PostgreSQL, so an instance of an
//! older version, which takes it for a transaction, takes turns with this
//! one too.
//!
//! A claimer lets go of the lock:
//! - when no claim of its topic followed the last one within
//!   [`RELEASE_IDLE`] (a timer), so an idle or slow topic never keeps
//!   other instances waiting;
//! - at the end of every claim for [`SHARED_FOR`] after one saw another
//!   session waiting for the lock (the claim statement looks in
//!   `pg_locks`), so instances draining one topic together take turns
//!   claim by claim, as before: a waiter's
//!   statement holds a snapshot while it waits, and longer waits held back
//!   the pruning of every row claims and completions leave behind (two
//!   instances spent 1.46× the database CPU per event when turns lasted
//!   100 ms);
//! - at the end of a claim once it held the lock for [`HOLD_MAX`], should
//!   a waiter go unseen;
//! - when its connection fails (the claimer drops it; the server ends the
//!   session and the lock with it), or a claim on it was cut off by its
//!   time limit (a frozen network: the next claim finds the connection
//!   still marked in use and drops it), or letting go does not finish
//!   within [`PING_LIMIT`](crate::timeouts::PING_LIMIT).
//!
//! While it holds the lock its session has an `idle_session_timeout` of
//! [`CLAIM_IDLE_LIMIT`] (1 s): an instance frozen between two claims
//! (paused, cut off) is ended by the server, and its lock released, as a
//! claim frozen mid-transaction was by `idle_in_transaction_session_timeout`.
//! The connection is outside the store's pool: one per sequential topic
//! this store claims, kept while the store lives.

use crate::sql::db;
use crate::timeouts::PING_LIMIT;
use mailroom_core::Result;
use sqlx::{PgConnection, PgPool};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Advisory-lock class (first half of the two-key form) of a sequential
/// topic's claim lock, the second half `hashtext(topic)`, so it never
/// meets the migration lock, `max_running`'s lock or an application's
/// locks.
pub(crate) const CLAIM_LOCK_CLASS: i32 = 0x6d72_6374; // "mrct"

/// How long a session holding a topic's claim lock may sit idle before
/// PostgreSQL ends it (`idle_session_timeout`): an instance stopped
/// between two claims (paused, cut off) would otherwise stop every
/// instance's claims of the topic until its connection died. A claimer
/// lets go of the lock within milliseconds of its last claim
/// ([`RELEASE_IDLE`], 5 ms), so a second is 200 times what a live one
/// needs; with 10 s, two instances' deliveries stood still for 10 s when
/// one was stopped with `SIGSTOP` while it held the lock.
pub(crate) const CLAIM_IDLE_LIMIT: &str = "1s";

/// How long a claimer keeps its topic's lock after a claim when no other
/// claim of the topic follows (a draining topic loop claims again within
/// about half a millisecond).
pub(crate) const RELEASE_IDLE: Duration = Duration::from_millis(5);

/// How long a claimer holds the lock at most before letting go at the end
/// of a claim, so that other instances claiming the topic get turns.
pub(crate) const HOLD_MAX: Duration = Duration::from_millis(100);

/// How long after a claim saw another session waiting for the lock its
/// claimer lets go of it after every claim, so that a waiter waits for one
/// claim at most, as when each claim took the lock in its transaction.
pub(crate) const SHARED_FOR: Duration = Duration::from_secs(1);

/// Takes the claim lock of topic `$2` (class `$1`) for the session,
/// waiting for its holder, and bounds the session's idle time while it is
/// held (`$3`).
const LOCK: &str = "SELECT set_config('idle_session_timeout', $3, false),
                           pg_advisory_lock($1, hashtext($2))";

/// Lets go of the lock [`LOCK`] took, and of the idle bound.
const UNLOCK: &str = "SELECT pg_advisory_unlock($1, hashtext($2)),
                             set_config('idle_session_timeout', '0', false)";

/// A topic's claim connection and whether it holds the topic's lock; a
/// store keeps one per sequential topic as that topic's turn (`Turns` in
/// `store.rs`: one claim per topic at a time in this process, so a crowd
/// of callers holds one connection).
#[derive(Debug)]
pub(crate) struct Claimer {
    topic: String,
    conn: Option<PgConnection>,
    /// Since when the lock is held, if it is.
    held_since: Option<Instant>,
    /// Counts claims, so a release timer knows whether one came after it.
    claims: u64,
    /// When a claim last saw another session waiting for the lock.
    contended_at: Option<Instant>,
    /// A claim took the connection and has not reported back
    /// ([`Claimer::claimed`] or [`Claimer::failed`]): if the next claim
    /// finds this set, the last one was dropped midway (cut off by its
    /// time limit) and the connection may be mid-statement or frozen.
    in_use: bool,
}

impl Claimer {
    pub(crate) fn new(topic: &str) -> Self {
        Self {
            topic: topic.to_owned(),
            conn: None,
            held_since: None,
            claims: 0,
            contended_at: None,
            in_use: false,
        }
    }

    /// The connection, holding the topic's lock: a new one from `pool`
    /// (taken out of it) if there is none, the lock taken if not held.
    pub(crate) async fn locked(&mut self, pool: &PgPool) -> Result<&mut PgConnection> {
        const CTX: &str = "taking a sequential topic's claim lock";
        if self.in_use {
            tracing::debug!(topic = %self.topic, "the last claim was cut off; dropping its connection");
            self.failed();
        }
        // Taken out while it is used: dropped, not put back, if taking the
        // lock fails (or the call is dropped while it waits).
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => {
                self.held_since = None;
                pool.acquire().await.map_err(db(CTX))?.detach()
            }
        };
        if self.held_since.is_none() {
            sqlx::query(LOCK)
                .bind(CLAIM_LOCK_CLASS)
                .bind(&self.topic)
                .bind(CLAIM_IDLE_LIMIT)
                .execute(&mut conn)
                .await
                .map_err(db(CTX))?;
            self.held_since = Some(Instant::now());
        }
        self.claims = self.claims.wrapping_add(1);
        self.in_use = true;
        Ok(self.conn.insert(conn))
    }

    /// After a claim that failed on the connection: drops it, which ends
    /// its session and the lock with it.
    pub(crate) fn failed(&mut self) {
        self.conn = None;
        self.held_since = None;
        self.in_use = false;
    }

    /// After a claim: lets go of the lock if another session waits for it
    /// (`contended`) or it was held for [`HOLD_MAX`]; otherwise returns the
    /// claim's number for [`release_later`].
    pub(crate) async fn claimed(&mut self, contended: bool) -> Option<u64> {
        self.in_use = false;
        let held_since = self.held_since?;
        let now = Instant::now();
        if contended {
            self.contended_at = Some(now);
        }
        let shared = self
            .contended_at
            .is_some_and(|at| now.saturating_duration_since(at) < SHARED_FOR);
        if shared || now.saturating_duration_since(held_since) >= HOLD_MAX {
            self.release().await;
            return None;
        }
        Some(self.claims)
    }

    /// Lets go of the lock, if held; drops the connection if that fails or
    /// takes longer than [`PING_LIMIT`] (a frozen connection must not keep
    /// the topic's turn, which claims wait for).
    async fn release(&mut self) {
        if self.held_since.take().is_none() {
            return;
        }
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let unlock = sqlx::query(UNLOCK)
            .bind(CLAIM_LOCK_CLASS)
            .bind(&self.topic)
            .execute(conn);
        let released = match tokio::time::timeout(PING_LIMIT, unlock).await {
            Ok(released) => released.map(drop).map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {} s", PING_LIMIT.as_secs())),
        };
        if let Err(e) = released {
            tracing::debug!(error = %e, topic = %self.topic, "releasing a claim lock failed; dropping its connection");
            self.conn = None;
        }
    }
}

/// Lets go of `claimer`'s lock after [`RELEASE_IDLE`] unless another claim
/// (after claim number `claims`) came meanwhile.
pub(crate) fn release_later(claimer: Arc<tokio::sync::Mutex<Claimer>>, claims: u64) {
    tokio::spawn(async move {
        tokio::time::sleep(RELEASE_IDLE).await;
        let mut claimer = claimer.lock().await;
        if claimer.claims == claims {
            claimer.release().await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{CLAIM_LOCK_CLASS, LOCK};
    use sqlx::{Connection, PgConnection};
    use std::time::{Duration, Instant};

    /// A claimer frozen while it holds its topic's lock (a paused
    /// instance) loses it, and its session, after the idle bound: other
    /// instances' claims of the topic do not stop with it.
    #[tokio::test]
    async fn a_claimer_left_idle_loses_its_topic_lock() {
        let url = mailroom_testkit::fresh_postgres_db().await;
        let lock = |conn| {
            sqlx::query(LOCK)
                .bind(CLAIM_LOCK_CLASS)
                .bind("t")
                .bind("200ms")
                .execute(conn)
        };
        let mut stalled = PgConnection::connect(&url).await.unwrap();
        lock(&mut stalled).await.unwrap();

        let mut other = PgConnection::connect(&url).await.unwrap();
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), lock(&mut other))
            .await
            .expect("the idle claimer still holds the topic's lock")
            .unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "the lock was not held while the claimer was idle"
        );
        assert!(
            sqlx::query("SELECT 1").execute(&mut stalled).await.is_err(),
            "the idle claimer's session was not ended"
        );
    }
}
