//! Claims: moving due pending events to `running` under a lease, for
//! independent topics (one statement) and sequential ones (the heads of
//! keys, found by one walk), and the next time a claim could succeed.

use super::{after, col, db, opt_ts, query_events, ts};
use jiff::Timestamp;
use mailroom_core::{ClaimRequest, Claimed, FencingToken, OnDead, Result, StoreError};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row};
use std::collections::HashSet;

/// Independent events, oldest first. Claims name their index
/// (`INDEXED BY events_pending`), so no claim walks the finished events of
/// its topic, statistics or not (`docs/perf/sqlite.md`).
const CLAIM_ANY: &str = concat!(
    "UPDATE events
     SET status = 'running', attempts = attempts + 1, lease_until = ?1,
         started_at = ?2, worker = ?3, next_attempt_at = NULL
     WHERE seq IN (
         SELECT e.seq FROM events e INDEXED BY events_pending
         WHERE e.topic = ?4 AND e.status = 'pending' AND e.next_attempt_at <= ?2
         ORDER BY e.seq LIMIT ?5)
     RETURNING ",
    event_cols!()
);

/// Sequential topics: the chosen heads, by `seq` in a JSON array.
const CLAIM_SEQS: &str = concat!(
    "UPDATE events
     SET status = 'running', attempts = attempts + 1, lease_until = ?1,
         started_at = ?2, worker = ?3, next_attempt_at = NULL
     WHERE seq IN (SELECT value FROM json_each(?4)) AND status = 'pending'
     RETURNING ",
    event_cols!()
);

/// The head rule of sequential topics, as one walk over a topic's pending
/// rows in arrival order (the covering index `events_pending`). A keyed row
/// is its key's head if it is the first pending row of that key the walk
/// meets; a head may start if no event of its key is running and, with
/// `on_dead = "block"`, no earlier event of its key is dead. Keyless rows are
/// independent. `visit(seq, next_attempt_at)` sees each head that may start
/// (due or not) and each keyless row, oldest first, and returns whether to
/// go on. The writer thread is the only writer, so the claim that follows
/// sees the same rows.
fn walk_heads(
    conn: &Connection,
    topic: &str,
    on_dead: OnDead,
    mut visit: impl FnMut(i64, i64) -> bool,
) -> Result<()> {
    const CTX: &str = "finding the heads of keys";
    let running = running_keys(conn, topic)?;
    let mut dead_before = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM events
                 WHERE topic = ?1 AND key = ?2 AND key IS NOT NULL
                   AND status = 'dead' AND seq < ?3)",
        )
        .map_err(db(CTX))?;
    let mut seen: HashSet<String> = HashSet::new();
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, key, next_attempt_at FROM events INDEXED BY events_pending
             WHERE topic = ?1 AND status = 'pending' ORDER BY seq",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query([topic]).map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let seq: i64 = col(row, 0)?;
        let next: i64 = col::<Option<i64>>(row, 2)?.unwrap_or(0);
        if let Some(key) = key_col(row, 1)? {
            // Only the first pending row of a key is its head.
            if !seen.insert(key.to_owned()) || running.contains(key) {
                continue;
            }
            if on_dead == OnDead::Block
                && dead_before
                    .query_row((topic, key, seq), |r| r.get::<_, bool>(0))
                    .map_err(db(CTX))?
            {
                continue;
            }
        }
        if !visit(seq, next) {
            break;
        }
    }
    Ok(())
}

/// The keys of `topic` that have a running event.
fn running_keys(conn: &Connection, topic: &str) -> Result<HashSet<String>> {
    const CTX: &str = "finding the heads of keys";
    let mut stmt = conn
        .prepare_cached(
            "SELECT DISTINCT key FROM events
             WHERE topic = ?1 AND status = 'running' AND key IS NOT NULL",
        )
        .map_err(db(CTX))?;
    let rows = stmt.query_map([topic], |r| r.get(0)).map_err(db(CTX))?;
    rows.collect::<rusqlite::Result<_>>().map_err(db(CTX))
}

/// Column `i` of `row` as a key, borrowed from the row.
fn key_col<'r>(row: &'r Row<'_>, i: usize) -> Result<Option<&'r str>> {
    match row.get_ref(i).map_err(db("finding the heads of keys"))? {
        ValueRef::Null => Ok(None),
        value => value
            .as_str()
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("events.key: {e}"))),
    }
}

/// Moves up to `req.max` due pending events (for sequential topics, heads
/// of keys) to `running` under a lease ending `req.lease` after `now`.
pub(crate) fn claim(conn: &Connection, req: &ClaimRequest, now: i64) -> Result<Vec<Claimed>> {
    const CTX: &str = "claiming events";
    let lease_until = after(now, req.lease);
    let mut rows = match req.per_key {
        None => query_events(
            conn,
            CLAIM_ANY,
            &[&lease_until, &now, &req.worker, &req.topic, &req.max],
            CTX,
        )?,
        Some(on_dead) => {
            let max = usize::try_from(req.max).unwrap_or(usize::MAX);
            let mut heads: Vec<i64> = Vec::new();
            walk_heads(conn, &req.topic, on_dead, |seq, next| {
                if next <= now {
                    heads.push(seq);
                }
                heads.len() < max
            })?;
            if heads.is_empty() {
                return Ok(Vec::new());
            }
            let seqs = format!(
                "[{}]",
                heads
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            );
            query_events(
                conn,
                CLAIM_SEQS,
                &[&lease_until, &now, &req.worker, &seqs],
                CTX,
            )?
        }
    };
    // RETURNING comes in no particular order; hand out oldest arrival first.
    rows.sort_unstable_by_key(|(seq, _)| *seq);
    let until = ts(lease_until)?;
    Ok(rows
        .into_iter()
        .map(|(_, event)| Claimed {
            token: FencingToken(event.attempts),
            lease_until: until,
            event,
        })
        .collect())
}

/// The earliest due time of an event a claim could take.
pub(crate) fn next_due(conn: &Connection, req: &ClaimRequest) -> Result<Option<Timestamp>> {
    let due: Option<i64> = match req.per_key {
        None => conn
            .prepare_cached(
                "SELECT MIN(e.next_attempt_at) FROM events e INDEXED BY events_pending
                 WHERE e.topic = ?1 AND e.status = 'pending'",
            )
            .map_err(db("finding the next due event"))?
            .query_row([&req.topic], |r| r.get(0))
            .map_err(db("finding the next due event"))?,
        Some(on_dead) => {
            let mut earliest: Option<i64> = None;
            walk_heads(conn, &req.topic, on_dead, |_, next| {
                earliest = Some(earliest.map_or(next, |e| e.min(next)));
                true
            })?;
            earliest
        }
    };
    opt_ts(due)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::StatementStatus;
    use std::time::Duration;

    /// A claim binds a new `now` and `LIMIT` every time; with the planner
    /// stability guarantee set by `open_connection`, its cached statement is
    /// compiled once, not once per claim.
    #[test]
    fn claims_are_not_recompiled_per_call() {
        let dir = tempfile::tempdir().unwrap();
        let conn =
            crate::store::open_connection(&dir.path().join("t.db"), Duration::from_secs(1), false)
                .unwrap();
        crate::schema::migrate(&conn, 0).unwrap();
        for (i, max) in [5u32, 7, 100, 1].into_iter().enumerate() {
            let req = ClaimRequest {
                topic: "t".into(),
                worker: "w".into(),
                max,
                lease: Duration::from_secs(30),
                per_key: None,
            };
            claim(&conn, &req, 1_000 + i64::try_from(i).unwrap()).unwrap();
        }
        let stmt = conn.prepare_cached(CLAIM_ANY).unwrap();
        assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0);
    }
}
