//! Maintenance: what the store runs periodically, rescuing expired leases
//! and applying retention in bounded steps.

use super::{before, db};
use mailroom_core::{PurgeReport, Result, Retention, expiry_reason};
use rusqlite::{Connection, OptionalExtension};
use std::time::Duration;

/// Rows (by `seq`) one purge step walks, so a purge never holds the writer long.
const PURGE_CHUNK: i64 = 2000;

/// Returns running events whose lease ended before `now` to `pending` (or
/// `dead` when out of attempts), recording the lost attempt; returns how many.
pub(crate) fn rescue_expired(conn: &Connection, now: i64) -> Result<u64> {
    const CTX: &str = "rescuing expired leases";
    conn.prepare_cached(
        "INSERT INTO attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
         SELECT seq, attempts, COALESCE(started_at, ?1), ?1, 'lease_expired', 'lease expired', worker
         FROM events WHERE status = 'running' AND lease_until < ?1",
    )
    .map_err(db(CTX))?
    .execute([now])
    .map_err(db(CTX))?;
    let rescued = conn
        .prepare_cached(
            "UPDATE events
             SET status = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
                 next_attempt_at = CASE WHEN attempts >= max_attempts THEN NULL ELSE ?1 END,
                 lease_until = NULL, last_error = 'lease expired'
             WHERE status = 'running' AND lease_until < ?1",
        )
        .map_err(db(CTX))?
        .execute([now])
        .map_err(db(CTX))?;
    Ok(rescued as u64)
}

/// Moves up to `limit` pending events of `topic` (not held) whose expiry
/// clock started `expire_after` or longer before `now` to `expired`.
pub(crate) fn expire(
    conn: &Connection,
    topic: &str,
    expire_after: Duration,
    limit: u32,
    now: i64,
) -> Result<u64> {
    const CTX: &str = "expiring events";
    let expired = conn
        .prepare_cached(
            "UPDATE events SET status = 'expired', next_attempt_at = NULL, last_error = ?4
             WHERE seq IN (SELECT e.seq FROM events e INDEXED BY events_pending
                           WHERE e.topic = ?1 AND e.status = 'pending' AND e.held_until IS NULL
                             AND COALESCE(e.ready_at, e.received_at) <= ?2
                           ORDER BY e.seq LIMIT ?3)",
        )
        .map_err(db(CTX))?
        .execute((
            topic,
            before(now, expire_after),
            limit,
            expiry_reason(expire_after),
        ))
        .map_err(db(CTX))?;
    Ok(expired as u64)
}

/// One bounded step of a purge over the rows with `from < seq <= from +
/// PURGE_CHUNK`. Returns what it did and where the next step starts, or
/// `None` when no later row can qualify: rows arrive in `received_at`
/// order, so the walk stops at the first row newer than every cutoff.
pub(crate) fn purge_step(
    conn: &Connection,
    retention: &Retention,
    now: i64,
    from: i64,
) -> Result<(PurgeReport, Option<i64>)> {
    let done_before = before(now, retention.done);
    let dead_before = before(now, retention.dead);
    let dedup_before = before(now, retention.dedup);
    let to = from.saturating_add(PURGE_CHUNK);
    // Finished rows past the dedup window go first, with their history.
    let rows_deleted = delete_finished(conn, from, to, dedup_before)?;
    let payloads_dropped = conn
        .prepare_cached(
            "UPDATE events SET payload = NULL
             WHERE seq > ?1 AND seq <= ?2 AND payload IS NOT NULL
               AND ((status IN ('done', 'skipped') AND received_at < ?3)
                 OR (status IN ('dead', 'cancelled', 'expired') AND received_at < ?4))",
        )
        .map_err(db(CTX))?
        .execute((from, to, done_before, dead_before))
        .map_err(db(CTX))? as u64;
    let next: Option<(i64, i64)> = conn
        .prepare_cached("SELECT seq, received_at FROM events WHERE seq > ?1 ORDER BY seq LIMIT 1")
        .map_err(db(CTX))?
        .query_row([to], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(db(CTX))?;
    let newest_cutoff = done_before.max(dead_before).max(dedup_before);
    let next_from = match next {
        Some((seq, received_at)) if received_at < newest_cutoff => Some(seq - 1),
        _ => None,
    };
    let report = PurgeReport {
        payloads_dropped,
        rows_deleted,
    };
    Ok((report, next_from))
}

/// What [`purge_step`] is doing, for its errors.
const CTX: &str = "applying retention";

/// Deletes, with their history, the `done` and `skipped` events with
/// `from < seq <= to` received before `received_before`; returns how many.
fn delete_finished(conn: &Connection, from: i64, to: i64, received_before: i64) -> Result<u64> {
    let doomed: Vec<i64> = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT seq FROM events
                 WHERE seq > ?1 AND seq <= ?2
                   AND status IN ('done', 'skipped') AND received_at < ?3",
            )
            .map_err(db(CTX))?;
        let rows = stmt
            .query_map((from, to, received_before), |r| r.get(0))
            .map_err(db(CTX))?;
        rows.collect::<rusqlite::Result<_>>().map_err(db(CTX))?
    };
    for seq in &doomed {
        conn.prepare_cached("DELETE FROM attempts WHERE event_seq = ?1")
            .map_err(db(CTX))?
            .execute([seq])
            .map_err(db(CTX))?;
        conn.prepare_cached("DELETE FROM events WHERE seq = ?1")
            .map_err(db(CTX))?
            .execute([seq])
            .map_err(db(CTX))?;
    }
    Ok(doomed.len() as u64)
}
