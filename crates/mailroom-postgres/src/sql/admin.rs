//! Admin: an operator's writes, replaying events (one, or every match of a
//! filter), skipping a dead one so its key unblocks, and cancelling pending
//! ones (one, or every match); and the searches an operator runs for them
//! (error text, time range).

use super::db;
use super::rows::{event_by_id, get};
use crate::db::Db;
use mailroom_core::{Event, EventId, ListFilter, ReplayReport, Result, Status, StoreError};
use sqlx::{Postgres, Transaction};

/// Why a replay or skip of `id` changed nothing: `NotFound`, or what `why`
/// makes of the event as it is now.
async fn refused(pool: &Db, id: EventId, why: impl FnOnce(&Event) -> StoreError) -> StoreError {
    match event_by_id(pool, id).await {
        Ok(None) => StoreError::NotFound,
        Ok(Some((_, e))) => why(&e),
        Err(e) => e,
    }
}

/// Locks the queue row of event `id`, if it has one, before its `events`
/// row: claims lock in that order, so a replay or skip racing a claim waits
/// for it instead of deadlocking with it.
async fn lock_queue_row(tx: &mut Transaction<'_, Postgres>, id: EventId) -> Result<()> {
    sqlx::query(
        "SELECT q.seq FROM mailroom.queue q
         WHERE q.seq = (SELECT e.seq FROM mailroom.events e WHERE e.id = $1::text::uuid)
         FOR UPDATE OF q",
    )
    .bind(id.to_string())
    .execute(&mut **tx)
    .await
    .map_err(db("locking an event"))?;
    Ok(())
}

/// Puts the events `$replayed` returns (`seq`, `topic`, `key`) back in the
/// queue, pending and due now; a dead keyed event's row is already there.
macro_rules! requeue {
    ($replayed:literal) => {
        concat!(
            "WITH replayed AS (",
            $replayed,
            ") INSERT INTO mailroom.queue (seq, topic, key, priority, run_at, ready_at, state)
             SELECT seq, topic, key, priority, now(), now(), 'pending' FROM replayed
             ON CONFLICT (seq) DO UPDATE SET state = 'pending', run_at = EXCLUDED.run_at,
                 ready_at = EXCLUDED.ready_at, priority = EXCLUDED.priority"
        )
    };
}

/// Sends a non-running event back to `pending` with `budget` more attempts,
/// unless retention purged its payload (`payload IS NULL`).
pub(crate) async fn replay(pool: &Db, id: EventId, budget: u32) -> Result<Event> {
    const CTX: &str = "replaying an event";
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    lock_queue_row(&mut tx, id).await?;
    let changed = sqlx::query(requeue!(
        "UPDATE mailroom.events
         SET status = 'pending', max_attempts = LEAST(attempts + $2, 4294967295),
             next_attempt_at = now(), lease_until = NULL
         WHERE id = $1::text::uuid AND status <> 'running' AND payload IS NOT NULL
         RETURNING seq, topic, key, priority"
    ))
    .bind(id.to_string())
    .bind(i64::from(budget))
    .execute(&mut *tx)
    .await
    .map_err(db(CTX))?
    .rows_affected();
    tx.commit().await.map_err(db(CTX))?;
    if changed == 0 {
        // Read after the UPDATE: the attempt that refused it may have ended
        // since, so only a missing payload says "purged".
        return Err(refused(pool, id, |e| match &e.payload {
            None => StoreError::Purged(id),
            Some(_) => StoreError::Conflict(format!(
                "event {id} is running; wait for its attempt to end"
            )),
        })
        .await);
    }
    get(pool, id).await?.ok_or(StoreError::NotFound)
}

/// The non-running events matching `$1` topic, `$2` status, `$3` key.
macro_rules! matching {
    () => {
        "SELECT seq, payload IS NULL AS purged FROM mailroom.events
         WHERE status <> 'running'
           AND ($1::text IS NULL OR topic = $1)
           AND ($2::text IS NULL OR status = $2)
           AND ($3::text IS NULL OR key = $3)"
    };
}

/// [`replay`] for every non-running event matching `filter` whose payload
/// is still stored; counts the purged ones it leaves. The replay is one
/// statement, so both numbers come from one snapshot; the queue rows of
/// the matching events are locked first, as [`replay`] does.
pub(crate) async fn replay_matching(
    pool: &Db,
    filter: &ListFilter,
    budget: u32,
) -> Result<ReplayReport> {
    const CTX: &str = "replaying events";
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    sqlx::query(concat!(
        "SELECT q.seq FROM mailroom.queue q
         WHERE q.seq = ANY(ARRAY(SELECT seq FROM (",
        matching!(),
        ") m)) FOR UPDATE OF q"
    ))
    .bind(filter.topic.as_deref())
    .bind(filter.status.map(Status::as_str))
    .bind(filter.key.as_deref())
    .execute(&mut *tx)
    .await
    .map_err(db(CTX))?;
    let (replayed, skipped): (i64, i64) = sqlx::query_as(concat!(
        "WITH matching AS (",
        matching!(),
        "), replayed AS (
             UPDATE mailroom.events e
             SET status = 'pending', max_attempts = LEAST(e.attempts + $4, 4294967295),
                 next_attempt_at = now(), lease_until = NULL
             FROM matching m
             WHERE e.seq = m.seq AND NOT m.purged AND e.status <> 'running'
             RETURNING e.seq, e.topic, e.key, e.priority
         ), queued AS (
             INSERT INTO mailroom.queue (seq, topic, key, priority, run_at, ready_at, state)
             SELECT seq, topic, key, priority, now(), now(), 'pending' FROM replayed
             ON CONFLICT (seq) DO UPDATE SET state = 'pending', run_at = EXCLUDED.run_at,
                 ready_at = EXCLUDED.ready_at, priority = EXCLUDED.priority
         )
         SELECT (SELECT count(*) FROM replayed),
                (SELECT count(*) FROM matching WHERE purged)"
    ))
    .bind(filter.topic.as_deref())
    .bind(filter.status.map(Status::as_str))
    .bind(filter.key.as_deref())
    .bind(i64::from(budget))
    .fetch_one(&mut *tx)
    .await
    .map_err(db(CTX))?;
    tx.commit().await.map_err(db(CTX))?;
    Ok(ReplayReport {
        replayed: replayed.unsigned_abs(),
        skipped_purged: skipped.unsigned_abs(),
    })
}

/// Marks a dead event `skipped`; its queue row (if it has a key) goes, so
/// its key unblocks.
pub(crate) async fn skip(pool: &Db, id: EventId) -> Result<Event> {
    const CTX: &str = "skipping an event";
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    lock_queue_row(&mut tx, id).await?;
    let changed: i64 = sqlx::query_scalar(
        "WITH skipped AS (
             UPDATE mailroom.events SET status = 'skipped'
             WHERE id = $1::text::uuid AND status = 'dead'
             RETURNING seq
         ), dequeued AS (
             DELETE FROM mailroom.queue q USING skipped s WHERE q.seq = s.seq
         )
         SELECT count(*) FROM skipped",
    )
    .bind(id.to_string())
    .fetch_one(&mut *tx)
    .await
    .map_err(db(CTX))?;
    tx.commit().await.map_err(db(CTX))?;
    if changed == 0 {
        return Err(refused(pool, id, |e| {
            StoreError::Conflict(format!(
                "only dead events can be skipped; event {id} is {}",
                e.status
            ))
        })
        .await);
    }
    get(pool, id).await?.ok_or(StoreError::NotFound)
}

/// Marks a pending event `cancelled`; its queue row goes. The queue row is
/// locked first, as claims lock it: a cancel racing a claim waits for it
/// and then finds the event running.
pub(crate) async fn cancel(pool: &Db, id: EventId) -> Result<Event> {
    const CTX: &str = "cancelling an event";
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    lock_queue_row(&mut tx, id).await?;
    let changed: i64 = sqlx::query_scalar(
        "WITH cancelled AS (
             UPDATE mailroom.events SET status = 'cancelled', next_attempt_at = NULL
             WHERE id = $1::text::uuid AND status = 'pending'
             RETURNING seq
         ), dequeued AS (
             DELETE FROM mailroom.queue q USING cancelled c WHERE q.seq = c.seq
         )
         SELECT count(*) FROM cancelled",
    )
    .bind(id.to_string())
    .fetch_one(&mut *tx)
    .await
    .map_err(db(CTX))?;
    tx.commit().await.map_err(db(CTX))?;
    if changed == 0 {
        return Err(refused(pool, id, |e| match e.status {
            Status::Running => StoreError::Conflict(format!(
                "event {id} is running and cannot be cancelled; its attempt decides"
            )),
            other => StoreError::Conflict(format!(
                "only pending events can be cancelled; event {id} is {other}"
            )),
        })
        .await);
    }
    get(pool, id).await?.ok_or(StoreError::NotFound)
}

/// The pending queue rows (scheduled ones too) of `$1` topic and `$2` key.
macro_rules! pending_matching {
    () => {
        "FROM mailroom.queue q
         WHERE q.state IN ('pending', 'scheduled')
           AND ($1::text IS NULL OR q.topic = $1)
           AND ($2::text IS NULL OR q.key = $2)"
    };
}

/// [`cancel`] for every pending event matching `filter` (its status
/// aside), their queue rows locked first.
pub(crate) async fn cancel_matching(pool: &Db, filter: &ListFilter) -> Result<u64> {
    const CTX: &str = "cancelling events";
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    sqlx::query(concat!(
        "SELECT q.seq ",
        pending_matching!(),
        " FOR UPDATE OF q"
    ))
    .bind(filter.topic.as_deref())
    .bind(filter.key.as_deref())
    .execute(&mut *tx)
    .await
    .map_err(db(CTX))?;
    let cancelled: i64 = sqlx::query_scalar(concat!(
        "WITH matching AS (SELECT q.seq ",
        pending_matching!(),
        "), cancelled AS (
             UPDATE mailroom.events e SET status = 'cancelled', next_attempt_at = NULL
             FROM matching m WHERE e.seq = m.seq AND e.status = 'pending'
             RETURNING e.seq
         ), dequeued AS (
             DELETE FROM mailroom.queue q USING cancelled c WHERE q.seq = c.seq
         )
         SELECT count(*) FROM cancelled"
    ))
    .bind(filter.topic.as_deref())
    .bind(filter.key.as_deref())
    .fetch_one(&mut *tx)
    .await
    .map_err(db(CTX))?;
    tx.commit().await.map_err(db(CTX))?;
    Ok(cancelled.unsigned_abs())
}
