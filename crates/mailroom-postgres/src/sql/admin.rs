//! Admin: an operator's writes, replaying events (one, or every match of a
//! filter) and skipping a dead one so its key unblocks.

use super::db;
use super::rows::{event_by_id, get};
use mailroom_core::{Event, EventId, ListFilter, Result, Status, StoreError};
use sqlx::PgPool;

/// Why a replay or skip of `id` changed nothing: `NotFound`, or `Conflict`
/// naming the status that refused it.
async fn refused(pool: &PgPool, id: EventId, why: impl FnOnce(Status) -> String) -> StoreError {
    match event_by_id(pool, id).await {
        Ok(None) => StoreError::NotFound,
        Ok(Some((_, e))) => StoreError::Conflict(why(e.status)),
        Err(e) => e,
    }
}

/// Sends a non-running event back to `pending` with `budget` more attempts.
pub(crate) async fn replay(pool: &PgPool, id: EventId, budget: u32) -> Result<Event> {
    let changed = sqlx::query(
        "UPDATE mailroom.events
         SET status = 'pending', max_attempts = LEAST(attempts + $2, 4294967295),
             next_attempt_at = now(), lease_until = NULL
         WHERE id = $1::text::uuid AND status <> 'running'",
    )
    .bind(id.to_string())
    .bind(i64::from(budget))
    .execute(pool)
    .await
    .map_err(db("replaying an event"))?
    .rows_affected();
    if changed == 0 {
        return Err(refused(pool, id, |_| {
            format!("event {id} is running; wait for its attempt to end")
        })
        .await);
    }
    get(pool, id).await?.ok_or(StoreError::NotFound)
}

/// [`replay`] for every non-running event matching `filter`; returns how many.
pub(crate) async fn replay_matching(
    pool: &PgPool,
    filter: &ListFilter,
    budget: u32,
) -> Result<u64> {
    let changed = sqlx::query(
        "UPDATE mailroom.events
         SET status = 'pending', max_attempts = LEAST(attempts + $4, 4294967295),
             next_attempt_at = now(), lease_until = NULL
         WHERE status <> 'running'
           AND ($1::text IS NULL OR topic = $1)
           AND ($2::text IS NULL OR status = $2)
           AND ($3::text IS NULL OR key = $3)",
    )
    .bind(filter.topic.as_deref())
    .bind(filter.status.map(Status::as_str))
    .bind(filter.key.as_deref())
    .bind(i64::from(budget))
    .execute(pool)
    .await
    .map_err(db("replaying events"))?
    .rows_affected();
    Ok(changed)
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
        return Err(refused(pool, id, |status| {
            format!("only dead events can be skipped; event {id} is {status}")
        })
        .await);
    }
    get(pool, id).await?.ok_or(StoreError::NotFound)
}
