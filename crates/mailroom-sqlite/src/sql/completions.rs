//! Completions: the fenced writes of a worker's attempt, recording its end
//! (one, or a batch in two set-based statements) and extending its lease.

use super::{Moved, after, col, count_moved, db, ts};
use jiff::Timestamp;
use mailroom_core::{
    AttemptOutcome, Completion, EventId, FencingToken, Result, Status, StoreError,
};
use rusqlite::{Connection, OptionalExtension};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

/// `StaleToken` if the event exists, else `NotFound`.
fn stale_or_missing(conn: &Connection, id: &str) -> StoreError {
    let found = conn
        .prepare_cached("SELECT 1 FROM events WHERE id = ?1")
        .and_then(|mut s| s.exists([id]));
    match found {
        Ok(true) => StoreError::StaleToken,
        Ok(false) => StoreError::NotFound,
        Err(e) => db("checking a fencing token")(e),
    }
}

/// What `completion` at `now` writes: the event's status, its next due
/// time, its error, and the attempt's outcome.
fn recorded(
    completion: &Completion,
    now: i64,
) -> (Status, Option<i64>, Option<&str>, AttemptOutcome) {
    match completion {
        Completion::Done => (Status::Done, None, None, AttemptOutcome::Done),
        Completion::Retry { delay, error } => (
            Status::Pending,
            Some(after(now, *delay)),
            Some(error.as_str()),
            AttemptOutcome::Retry,
        ),
        Completion::Dead { error } => (
            Status::Dead,
            None,
            Some(error.as_str()),
            AttemptOutcome::Dead,
        ),
    }
}

/// Records the end of one attempt, if `token` is still current.
pub(crate) fn complete(
    conn: &Connection,
    id: EventId,
    token: FencingToken,
    completion: &Completion,
    now: i64,
) -> Result<()> {
    const CTX: &str = "completing an attempt";
    let (status, next, error, outcome) = recorded(completion, now);
    let id = id.to_string();
    let row: Option<(i64, i64, Option<String>, String)> = conn
        .prepare_cached(
            "UPDATE events
             SET status = ?1, next_attempt_at = ?2, lease_until = NULL,
                 last_error = COALESCE(?3, last_error)
             WHERE id = ?4 AND status = 'running' AND attempts = ?5
             RETURNING seq, started_at, worker, topic",
        )
        .map_err(db(CTX))?
        .query_row((status.as_str(), next, error, &id, token.0), |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()
        .map_err(db(CTX))?;
    let Some((seq, started_at, worker, topic)) = row else {
        return Err(stale_or_missing(conn, &id));
    };
    if status == Status::Done {
        // The trigger leaves running → done to the completions (migration 8).
        count_moved(conn, &topic, Moved::Done, 1)?;
    }
    conn.prepare_cached(
        "INSERT INTO attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .map_err(db(CTX))?
    .execute((
        seq,
        token.0,
        started_at,
        now,
        outcome.as_str(),
        error,
        worker,
    ))
    .map_err(db(CTX))?;
    Ok(())
}

/// Many completions in one go, each on its own fencing token, with the
/// answers in input order. The `Done` items — nearly all of them in a
/// healthy batch — are applied by two set-based statements over a JSON
/// array (history rows first, then the status), not one pair of statements
/// each; the rest, and any repeat of an id already in the set, go through
/// [`complete`] one by one. A stale or unknown item fails alone and writes
/// nothing; any other error is returned whole, and the caller's savepoint
/// undoes the lot.
pub(crate) fn complete_many(
    conn: &Connection,
    items: &[(EventId, FencingToken, Completion)],
    now: i64,
) -> Result<Vec<Result<()>>> {
    let mut results: Vec<Option<Result<()>>> = (0..items.len()).map(|_| None).collect();
    // Done items with a first-seen id go to the set; two history rows for
    // one (event, attempt) would break the attempts key.
    let mut seen = HashSet::with_capacity(items.len());
    let set: Vec<usize> = (0..items.len())
        .filter(|&i| matches!(items[i].2, Completion::Done) && seen.insert(items[i].0))
        .collect();
    if !set.is_empty() {
        let applied = complete_done(conn, items, &set, now)?;
        for &i in &set {
            let id = items[i].0.to_string();
            results[i] = Some(if applied.contains(&id) {
                Ok(())
            } else {
                Err(stale_or_missing(conn, &id))
            });
        }
    }
    items
        .iter()
        .zip(results)
        .map(|((id, token, completion), done)| match done {
            Some(result) => Ok(result),
            None => match complete(conn, *id, *token, completion, now) {
                Ok(()) => Ok(Ok(())),
                Err(e @ (StoreError::StaleToken | StoreError::NotFound)) => Ok(Err(e)),
                Err(e) => Err(e),
            },
        })
        .collect()
}

/// Marks the items at `set` (all `Done`, distinct ids) done with their
/// history rows, in two statements, and counts them per topic; returns the
/// ids whose token was current.
fn complete_done(
    conn: &Connection,
    items: &[(EventId, FencingToken, Completion)],
    set: &[usize],
    now: i64,
) -> Result<HashSet<String>> {
    const CTX: &str = "completing a batch";
    // [["<uuid>",<token>],...]: a UUID and an integer need no escaping.
    let mut json = String::with_capacity(set.len() * 48 + 2);
    json.push('[');
    for (n, &i) in set.iter().enumerate() {
        let (id, token, _) = &items[i];
        if n > 0 {
            json.push(',');
        }
        let _ = write!(json, "[\"{id}\",{}]", token.0);
    }
    json.push(']');
    conn.prepare_cached(
        "INSERT INTO attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
         SELECT e.seq, e.attempts, e.started_at, ?2, 'done', NULL, e.worker
         FROM json_each(?1) AS j
         JOIN events AS e ON e.id = j.value ->> 0
         WHERE e.status = 'running' AND e.attempts = j.value ->> 1",
    )
    .map_err(db(CTX))?
    .execute((&json, now))
    .map_err(db(CTX))?;
    let mut stmt = conn
        .prepare_cached(
            "UPDATE events SET status = 'done', next_attempt_at = NULL, lease_until = NULL
             FROM (SELECT value ->> 0 AS id, value ->> 1 AS token FROM json_each(?1)) AS j
             WHERE events.id = j.id AND events.status = 'running'
               AND events.attempts = j.token
             RETURNING events.id, events.topic",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query([&json]).map_err(db(CTX))?;
    let mut applied = HashSet::with_capacity(set.len());
    let mut per_topic: HashMap<String, usize> = HashMap::new();
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let id: String = col(row, 0)?;
        applied.insert(id);
        *per_topic.entry(col(row, 1)?).or_default() += 1;
    }
    drop(rows);
    // The trigger leaves running → done to the completions (migration 8).
    for (topic, n) in &per_topic {
        count_moved(conn, topic, Moved::Done, *n)?;
    }
    Ok(applied)
}

/// Pushes a running event's lease to `now + lease`, if `token` is current.
pub(crate) fn extend(
    conn: &Connection,
    id: EventId,
    token: FencingToken,
    lease: Duration,
    now: i64,
) -> Result<Timestamp> {
    let id = id.to_string();
    let until = after(now, lease);
    let changed = conn
        .prepare_cached(
            "UPDATE events SET lease_until = ?1
             WHERE id = ?2 AND status = 'running' AND attempts = ?3",
        )
        .map_err(db("extending a lease"))?
        .execute((until, &id, token.0))
        .map_err(db("extending a lease"))?;
    if changed == 0 {
        return Err(stale_or_missing(conn, &id));
    }
    ts(until)
}
