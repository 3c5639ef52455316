//! Admin: an operator's writes, replaying events (one, or every match of a
//! filter), skipping a dead one so its key unblocks, and cancelling pending
//! ones (one, or every match); and the count that previews a bulk one.

use super::db;
use super::rows::{event_by_id, filter_sql, get};
use mailroom_core::{Event, EventId, ListFilter, ReplayReport, Result, Status, StoreError};
use rusqlite::{Connection, ToSql};

/// Sends a non-running event back to `pending` with `budget` more attempts,
/// unless retention purged its payload (`payload IS NULL`).
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
    if event.payload.is_none() {
        return Err(StoreError::Purged(id));
    }
    conn.prepare_cached(
        "UPDATE events
         SET status = 'pending', max_attempts = MIN(attempts + ?1, 4294967295), next_attempt_at = ?2,
             lease_until = NULL, held_until = NULL, ready_at = ?2
         WHERE seq = ?3",
    )
    .map_err(db(CTX))?
    .execute((budget, now, seq))
    .map_err(db(CTX))?;
    get(conn, id)?.ok_or(StoreError::NotFound)
}

/// [`replay`] for every non-running event matching `filter` whose payload
/// is still stored; counts the purged ones it leaves.
pub(crate) fn replay_matching(
    conn: &Connection,
    filter: &ListFilter,
    budget: u32,
    now: i64,
) -> Result<ReplayReport> {
    const CTX: &str = "replaying events";
    let (cond, mut params) = filter_sql(filter);
    let refs: Vec<&dyn ToSql> = params.iter().map(|p| p.as_ref()).collect();
    let skipped_purged: i64 = conn
        .prepare_cached(&format!(
            "SELECT COUNT(*) FROM events WHERE status <> 'running' AND payload IS NULL{cond}"
        ))
        .map_err(db(CTX))?
        .query_row(&refs[..], |r| r.get(0))
        .map_err(db(CTX))?;
    params.push(Box::new(budget));
    params.push(Box::new(now));
    let n = params.len();
    let sql = format!(
        "UPDATE events
         SET status = 'pending', max_attempts = MIN(attempts + ?{}, 4294967295), next_attempt_at = ?{n},
             lease_until = NULL, held_until = NULL, ready_at = ?{n}
         WHERE status <> 'running' AND payload IS NOT NULL{cond}",
        n - 1
    );
    let refs: Vec<&dyn ToSql> = params.iter().map(|p| p.as_ref()).collect();
    let replayed = conn
        .prepare_cached(&sql)
        .map_err(db(CTX))?
        .execute(&refs[..])
        .map_err(db(CTX))?;
    Ok(ReplayReport {
        replayed: replayed as u64,
        skipped_purged: skipped_purged.unsigned_abs(),
    })
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

/// Marks a pending event `cancelled`.
pub(crate) fn cancel(conn: &Connection, id: EventId) -> Result<Event> {
    const CTX: &str = "cancelling an event";
    let Some((seq, event)) = event_by_id(conn, id)? else {
        return Err(StoreError::NotFound);
    };
    match event.status {
        Status::Pending => {}
        Status::Running => {
            return Err(StoreError::Conflict(format!(
                "event {id} is running and cannot be cancelled; its attempt decides"
            )));
        }
        other => {
            return Err(StoreError::Conflict(format!(
                "only pending events can be cancelled; event {id} is {other}"
            )));
        }
    }
    conn.prepare_cached(
        "UPDATE events SET status = 'cancelled', next_attempt_at = NULL, held_until = NULL
         WHERE seq = ?1 AND status = 'pending'",
    )
    .map_err(db(CTX))?
    .execute([seq])
    .map_err(db(CTX))?;
    get(conn, id)?.ok_or(StoreError::NotFound)
}

/// [`cancel`] for every pending event matching `filter` (its status aside).
pub(crate) fn cancel_matching(conn: &Connection, filter: &ListFilter) -> Result<u64> {
    const CTX: &str = "cancelling events";
    let filter = ListFilter {
        status: None,
        ..filter.clone()
    };
    let (cond, params) = filter_sql(&filter);
    let refs: Vec<&dyn ToSql> = params.iter().map(|p| p.as_ref()).collect();
    let cancelled = conn
        .prepare_cached(&format!(
            "UPDATE events SET status = 'cancelled', next_attempt_at = NULL, held_until = NULL
             WHERE status = 'pending'{cond}"
        ))
        .map_err(db(CTX))?
        .execute(&refs[..])
        .map_err(db(CTX))?;
    Ok(cancelled as u64)
}
