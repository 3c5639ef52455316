//! Admin: an operator's writes, replaying events (one, or every match of a
//! filter) and skipping a dead one so its key unblocks.

use super::db;
use super::rows::{event_by_id, filter_sql, get};
use mailroom_core::{Event, EventId, ListFilter, Result, Status, StoreError};
use rusqlite::{Connection, ToSql};

/// Sends a non-running event back to `pending` with `budget` more attempts.
pub(crate) fn replay(conn: &Connection, id: EventId, budget: u32, now: i64) -> Result<Event> {
    const CTX: &str = "replaying an event";
    let Some((seq, event)) = event_by_id(conn, id)? else {
        return Err(StoreError::NotFound);
    };
    if event.status == Status::Running {
        return Err(StoreError::Conflict(format!(
            "event {id} is running; wait for its attempt to end"
        )));
    }
    conn.prepare_cached(
        "UPDATE events
         SET status = 'pending', max_attempts = MIN(attempts + ?1, 4294967295), next_attempt_at = ?2,
             lease_until = NULL
         WHERE seq = ?3",
    )
    .map_err(db(CTX))?
    .execute((budget, now, seq))
    .map_err(db(CTX))?;
    get(conn, id)?.ok_or(StoreError::NotFound)
}

/// [`replay`] for every non-running event matching `filter`; returns how many.
pub(crate) fn replay_matching(
    conn: &Connection,
    filter: &ListFilter,
    budget: u32,
    now: i64,
) -> Result<u64> {
    let (cond, mut params) = filter_sql(filter);
    params.push(Box::new(budget));
    params.push(Box::new(now));
    let n = params.len();
    let sql = format!(
        "UPDATE events
         SET status = 'pending', max_attempts = MIN(attempts + ?{}, 4294967295), next_attempt_at = ?{n},
             lease_until = NULL
         WHERE status <> 'running'{cond}",
        n - 1
    );
    let refs: Vec<&dyn ToSql> = params.iter().map(|p| p.as_ref()).collect();
    let changed = conn
        .prepare_cached(&sql)
        .map_err(db("replaying events"))?
        .execute(&refs[..])
        .map_err(db("replaying events"))?;
    Ok(changed as u64)
}

/// Marks a dead event `skipped`.
pub(crate) fn skip(conn: &Connection, id: EventId) -> Result<Event> {
    let Some((seq, event)) = event_by_id(conn, id)? else {
        return Err(StoreError::NotFound);
    };
    if event.status != Status::Dead {
        return Err(StoreError::Conflict(format!(
            "only dead events can be skipped; event {id} is {}",
            event.status
        )));
    }
    conn.prepare_cached("UPDATE events SET status = 'skipped' WHERE seq = ?1")
        .map_err(db("skipping an event"))?
        .execute([seq])
        .map_err(db("skipping an event"))?;
    get(conn, id)?.ok_or(StoreError::NotFound)
}
