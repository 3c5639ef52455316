//! Admin: an operator's writes, replaying events (one, or every match of a
//! filter) and skipping a dead one so its key unblocks.

use super::db;
use super::rows::{event_by_id, get};
use mailroom_core::{Event, EventId, ListFilter, ReplayReport, Result, Status, StoreError};
use sqlx::PgPool;

/// Why a replay or skip of `id` changed nothing: `NotFound`, or what `why`
/// makes of the event as it is now.
async fn refused(pool: &PgPool, id: EventId, why: impl FnOnce(&Event) -> StoreError) -> StoreError {
    match event_by_id(pool, id).await {
        Ok(None) => StoreError::NotFound,
        Ok(Some((_, e))) => why(&e),
        Err(e) => e,
    }
}

/// Sends a non-running event back to `pending` with `budget` more attempts,
/// unless retention purged its payload (`payload IS NULL`).
pub(crate) async fn replay(pool: &PgPool, id: EventId, budget: u32) -> Result<Event> {
    let changed = sqlx::query(
        "UPDATE mailroom.events
         SET status = 'pending', max_attempts = LEAST(attempts + $2, 4294967295),
             next_attempt_at = now(), lease_until = NULL
         WHERE id = $1::text::uuid AND status <> 'running' AND payload IS NOT NULL",
    )
    .bind(id.to_string())
    .bind(i64::from(budget))
    .execute(pool)
    .await
    .map_err(db("replaying an event"))?
    .rows_affected();
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

/// [`replay`] for every non-running event matching `filter` whose payload
/// is still stored; counts the purged ones it leaves. One statement, so
/// both numbers come from one snapshot.
pub(crate) async fn replay_matching(
    pool: &PgPool,
    filter: &ListFilter,
    budget: u32,
) -> Result<ReplayReport> {
    let (replayed, skipped): (i64, i64) = sqlx::query_as(
        "WITH matching AS (
             SELECT seq, payload IS NULL AS purged FROM mailroom.events
             WHERE status <> 'running'
               AND ($1::text IS NULL OR topic = $1)
               AND ($2::text IS NULL OR status = $2)
               AND ($3::text IS NULL OR key = $3)
         ), replayed AS (
             UPDATE mailroom.events e
             SET status = 'pending', max_attempts = LEAST(e.attempts + $4, 4294967295),
                 next_attempt_at = now(), lease_until = NULL
             FROM matching m
             WHERE e.seq = m.seq AND NOT m.purged AND e.status <> 'running'
             RETURNING 1
         )
         SELECT (SELECT count(*) FROM replayed),
                (SELECT count(*) FROM matching WHERE purged)",
    )
    .bind(filter.topic.as_deref())
    .bind(filter.status.map(Status::as_str))
    .bind(filter.key.as_deref())
    .bind(i64::from(budget))
    .fetch_one(pool)
    .await
    .map_err(db("replaying events"))?;
    Ok(ReplayReport {
        replayed: replayed.unsigned_abs(),
        skipped_purged: skipped.unsigned_abs(),
    })
}

/// Marks a dead event `skipped`.
pub(crate) async fn skip(pool: &PgPool, id: EventId) -> Result<Event> {
    let changed = sqlx::query(
        "UPDATE mailroom.events SET status = 'skipped'
         WHERE id = $1::text::uuid AND status = 'dead'",
    )
    .bind(id.to_string())
    .execute(pool)
    .await
    .map_err(db("skipping an event"))?
    .rows_affected();
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
