//! Maintenance: what the elected instance runs periodically, rescuing
//! expired leases and applying retention, and the election itself.

use super::{db, micros};
use crate::db::Db;
use mailroom_core::{PurgeReport, Result, Retention};
use std::time::Duration;

/// Rows one purge statement touches, so retention never holds many row locks.
const PURGE_CHUNK: i64 = 2000;

/// [`rescue_expired`]'s statement.
pub(super) const RESCUE: &str = "WITH expired AS (
     SELECT e.seq FROM mailroom.events e
     WHERE e.seq = ANY(ARRAY(SELECT q.seq FROM mailroom.queue q WHERE q.state = 'running'))
       AND e.status = 'running' AND e.lease_until < now()
     FOR UPDATE OF e SKIP LOCKED
 ), moved AS (
     UPDATE mailroom.events e
     SET status = CASE WHEN e.attempts >= e.max_attempts THEN 'dead' ELSE 'pending' END,
         next_attempt_at = CASE WHEN e.attempts >= e.max_attempts THEN NULL ELSE now() END,
         lease_until = NULL, last_error = 'lease expired'
     WHERE e.seq = ANY(ARRAY(SELECT seq FROM expired))
     RETURNING e.seq, e.key, e.status, e.attempts, e.started_at, e.worker
 ), requeued AS (
     UPDATE mailroom.queue q SET state = m.status, run_at = now()
     FROM moved m
     WHERE q.seq = m.seq AND (m.status = 'pending' OR m.key IS NOT NULL)
 ), dequeued AS (
     DELETE FROM mailroom.queue q USING moved m
     WHERE q.seq = m.seq AND m.status = 'dead' AND m.key IS NULL
 ), recorded AS (
     INSERT INTO mailroom.attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
     SELECT seq, attempts, COALESCE(started_at, now()), now(), 'lease_expired', 'lease expired', worker
     FROM moved
     ON CONFLICT DO NOTHING
 )
 SELECT count(*) FROM moved";

/// Returns running events whose lease has ended to `pending` (or `dead`
/// when out of attempts), recording the lost attempt; returns how many.
/// The running events are listed from `queue_running` (few: at most the
/// topics' concurrency), and locked in `events` first, as completions lock
/// them, so the two never wait on each other in opposite orders.
pub(crate) async fn rescue_expired(pool: &Db) -> Result<u64> {
    // SKIP LOCKED: a row being completed right now is not expired for long;
    // its completion wins, or the next rescue takes it.
    let rescued: i64 = sqlx::query_scalar(RESCUE)
        .fetch_one(pool)
        .await
        .map_err(db("rescuing expired leases"))?;
    Ok(u64::try_from(rescued).unwrap_or(0))
}

/// Applies retention in bounded statements (at most [`PURGE_CHUNK`] rows
/// each, skipping rows another transaction holds), so intake and claims keep
/// flowing meanwhile. Cutoffs are fixed once, on the database clock.
pub(crate) async fn purge(pool: &Db, retention: Retention) -> Result<PurgeReport> {
    let now: i64 = sqlx::query_scalar(concat!("SELECT ", us!("now()")))
        .fetch_one(pool)
        .await
        .map_err(db("applying retention"))?;
    let cutoff = |d: Duration| now.saturating_sub(micros(d));
    // Finished rows past the dedup window go first, with their history.
    let rows_deleted = delete_finished(pool, cutoff(retention.dedup)).await?;
    let payloads_dropped =
        drop_payloads(pool, cutoff(retention.done), cutoff(retention.dead)).await?;
    Ok(PurgeReport {
        payloads_dropped,
        rows_deleted,
    })
}

/// Deletes `done` and `skipped` events received before `before` (µs since
/// the epoch) with their history, a chunk at a time; returns how many.
async fn delete_finished(pool: &Db, before: i64) -> Result<u64> {
    let mut total = 0;
    loop {
        let deleted: i64 = sqlx::query_scalar(
            "WITH doomed AS (
                 SELECT seq FROM mailroom.events
                 WHERE status IN ('done', 'skipped')
                   AND received_at < timestamptz 'epoch' + $1 * interval '1 microsecond'
                 LIMIT $2 FOR UPDATE SKIP LOCKED
             ), history AS (
                 DELETE FROM mailroom.attempts WHERE event_seq IN (SELECT seq FROM doomed)
             ), gone AS (
                 DELETE FROM mailroom.events WHERE seq IN (SELECT seq FROM doomed) RETURNING 1
             )
             SELECT count(*) FROM gone",
        )
        .bind(before)
        .bind(PURGE_CHUNK)
        .fetch_one(pool)
        .await
        .map_err(db("applying retention"))?;
        total += u64::try_from(deleted).unwrap_or(0);
        if deleted < PURGE_CHUNK {
            return Ok(total);
        }
    }
}

/// Drops the payloads of finished events received before `done_before`
/// and of dead ones received before `dead_before`, a chunk at a time;
/// returns how many.
async fn drop_payloads(pool: &Db, done_before: i64, dead_before: i64) -> Result<u64> {
    let mut total = 0;
    loop {
        let dropped = sqlx::query(
            "UPDATE mailroom.events SET payload = NULL
             WHERE seq IN (
                 SELECT seq FROM mailroom.events
                 WHERE payload IS NOT NULL
                   AND ((status IN ('done', 'skipped')
                         AND received_at < timestamptz 'epoch' + $1 * interval '1 microsecond')
                     OR (status IN ('dead', 'cancelled', 'expired')
                         AND received_at < timestamptz 'epoch' + $2 * interval '1 microsecond'))
                 LIMIT $3 FOR UPDATE SKIP LOCKED)",
        )
        .bind(done_before)
        .bind(dead_before)
        .bind(PURGE_CHUNK)
        .execute(pool)
        .await
        .map_err(db("applying retention"))?
        .rows_affected();
        total += dropped;
        if dropped < PURGE_CHUNK as u64 {
            return Ok(total);
        }
    }
}

/// Takes or renews the lease on `role` for `holder`. `ON CONFLICT DO UPDATE`
/// locks the existing row and re-evaluates its `WHERE` on the newest version,
/// so of several instances racing for an expired lease exactly one gets it.
pub(crate) async fn try_lead(pool: &Db, role: &str, holder: &str, ttl: Duration) -> Result<bool> {
    let won: Option<String> = sqlx::query_scalar(
        "INSERT INTO mailroom.leaders AS l (role, holder, lease_until)
         VALUES ($1, $2, now() + $3 * interval '1 microsecond')
         ON CONFLICT (role) DO UPDATE
             SET holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until
             WHERE l.holder = EXCLUDED.holder OR l.lease_until < now()
         RETURNING holder",
    )
    .bind(role)
    .bind(holder)
    .bind(micros(ttl))
    .fetch_optional(pool)
    .await
    .map_err(db("electing a leader"))?;
    Ok(won.is_some())
}

/// Moves up to `limit` pending events of `topic` whose expiry clock
/// (`queue.ready_at`) started `expire_after` or longer ago to `expired`;
/// their queue rows go. Queue rows first, as claims lock them.
pub(crate) async fn expire(
    pool: &Db,
    topic: &str,
    expire_after: std::time::Duration,
    limit: u32,
) -> Result<u64> {
    // Scheduled rows due long ago (a busy topic) are pending first.
    sqlx::query(crate::claim::heads::PROMOTE)
        .bind(topic)
        .execute(pool)
        .await
        .map_err(db("expiring events"))?;
    let expired: i64 = sqlx::query_scalar(
        "WITH gone AS (
             DELETE FROM mailroom.queue q
             WHERE q.seq = ANY(ARRAY(
                 SELECT c.seq FROM mailroom.queue c
                 WHERE c.topic = ANY(ARRAY[$1::text]) AND c.state = 'pending'
                   AND c.ready_at <= now() - $2 * interval '1 microsecond'
                 ORDER BY c.topic, -c.priority, c.seq LIMIT $3 FOR UPDATE SKIP LOCKED))
             RETURNING q.seq
         ), expired AS (
             UPDATE mailroom.events e
             SET status = 'expired', next_attempt_at = NULL, last_error = $4
             FROM gone g WHERE e.seq = g.seq AND e.status = 'pending'
             RETURNING e.seq
         )
         SELECT count(*) FROM expired",
    )
    .bind(topic)
    .bind(super::micros(expire_after))
    .bind(i64::from(limit))
    .bind(mailroom_core::expiry_reason(expire_after))
    .fetch_one(pool)
    .await
    .map_err(db("expiring events"))?;
    Ok(expired.unsigned_abs())
}
