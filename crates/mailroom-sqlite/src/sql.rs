//! The SQL of every store operation, as plain functions of a connection.
//!
//! Write operations run on the writer thread inside its group transaction
//! (each in its own savepoint); reads run on a pooled read connection.

use bytes::Bytes;
use jiff::Timestamp;
use mailroom_core::{
    Attempt, AttemptOutcome, AttemptWindow, ClaimRequest, Claimed, Completion, Event, EventId,
    FencingToken, Inserted, KeyCursor, ListFilter, NewEvent, OnDead, Page, PurgeReport, Result,
    Retention, Status, StoreError, TopicStats,
};
use rusqlite::types::FromSql;
use rusqlite::{Connection, OptionalExtension, Row, ToSql};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

/// Default and largest page of a listing.
const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;
/// Rows (by `seq`) one purge step walks, so a purge never holds the writer long.
pub(crate) const PURGE_CHUNK: i64 = 2000;

/// The columns [`event_from_row`] decodes, in order.
macro_rules! event_cols {
    () => {
        "seq, id, source, topic, dedup_key, key, type, status, attempts, max_attempts, \
         next_attempt_at, received_at, correlation_id, causation_id, content_type, payload, \
         last_error, lease_until"
    };
}

/// Maps a database error to [`StoreError::Unavailable`], saying what was being done.
pub(crate) fn db(context: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |e| StoreError::Unavailable(format!("sqlite: {context}: {e}"))
}

/// The store clock, in stored units.
pub(crate) fn now_ms() -> i64 {
    Timestamp::now().as_millisecond()
}

/// `at + d`, saturating at the largest instant a [`Timestamp`] can hold.
pub(crate) fn after(at: i64, d: Duration) -> i64 {
    let d = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    at.saturating_add(d).min(Timestamp::MAX.as_millisecond())
}

/// `at − d`, saturating at the smallest instant.
pub(crate) fn before(at: i64, d: Duration) -> i64 {
    let d = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    at.saturating_sub(d).max(Timestamp::MIN.as_millisecond())
}

pub(crate) fn ts(ms: i64) -> Result<Timestamp> {
    Timestamp::from_millisecond(ms)
        .map_err(|e| StoreError::Corrupt(format!("timestamp {ms} out of range: {e}")))
}

fn opt_ts(ms: Option<i64>) -> Result<Option<Timestamp>> {
    ms.map(ts).transpose()
}

fn col<T: FromSql>(row: &Row<'_>, i: usize) -> Result<T> {
    row.get(i)
        .map_err(|e| StoreError::Corrupt(format!("events column {i}: {e}")))
}

/// The payload as bytes. Applications writing through the documented outbox
/// INSERT may bind a string instead of a blob; both are the same bytes.
fn payload_col(row: &Row<'_>, i: usize) -> Result<Option<Bytes>> {
    use rusqlite::types::ValueRef;
    match row.get_ref(i) {
        Ok(ValueRef::Null) => Ok(None),
        Ok(ValueRef::Blob(b)) | Ok(ValueRef::Text(b)) => Ok(Some(Bytes::copy_from_slice(b))),
        Ok(other) => Err(StoreError::Corrupt(format!(
            "events column {i}: payload of type {:?}",
            other.data_type()
        ))),
        Err(e) => Err(StoreError::Corrupt(format!("events column {i}: {e}"))),
    }
}

/// Decodes a row selected with `event_cols!()`; returns its `seq` too.
fn event_from_row(row: &Row<'_>) -> Result<(i64, Event)> {
    let id: String = col(row, 1)?;
    let status: String = col(row, 7)?;
    let event = Event {
        id: id
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("event id {id:?}: {e}")))?,
        source: col(row, 2)?,
        topic: col(row, 3)?,
        dedup_key: col(row, 4)?,
        key: col(row, 5)?,
        event_type: col(row, 6)?,
        status: status.parse().map_err(StoreError::Corrupt)?,
        attempts: col(row, 8)?,
        max_attempts: col(row, 9)?,
        next_attempt_at: opt_ts(col(row, 10)?)?,
        received_at: ts(col(row, 11)?)?,
        correlation_id: col(row, 12)?,
        causation_id: col(row, 13)?,
        content_type: col(row, 14)?,
        payload: payload_col(row, 15)?,
        last_error: col(row, 16)?,
        lease_until: opt_ts(col(row, 17)?)?,
        history: Vec::new(),
    };
    Ok((col(row, 0)?, event))
}

/// Runs a query returning `event_cols!()` rows.
fn query_events(
    conn: &Connection,
    sql: &str,
    params: &[&dyn ToSql],
    context: &'static str,
) -> Result<Vec<(i64, Event)>> {
    let mut stmt = conn.prepare_cached(sql).map_err(db(context))?;
    let mut rows = stmt.query(params).map_err(db(context))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db(context))? {
        out.push(event_from_row(row)?);
    }
    Ok(out)
}

fn event_by_id(conn: &Connection, id: EventId) -> Result<Option<(i64, Event)>> {
    let id = id.to_string();
    Ok(query_events(
        conn,
        concat!("SELECT ", event_cols!(), " FROM events WHERE id = ?1"),
        &[&id],
        "reading an event",
    )?
    .pop())
}

fn history(conn: &Connection, seq: i64) -> Result<Vec<Attempt>> {
    const CTX: &str = "reading attempt history";
    let mut stmt = conn
        .prepare_cached(
            "SELECT attempt, started_at, finished_at, outcome, error, worker
             FROM attempts WHERE event_seq = ?1 ORDER BY attempt",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query([seq]).map_err(db(CTX))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let outcome: String = col(row, 3)?;
        out.push(Attempt {
            attempt: col(row, 0)?,
            started_at: ts(col(row, 1)?)?,
            finished_at: opt_ts(col(row, 2)?)?,
            outcome: outcome.parse().map_err(StoreError::Corrupt)?,
            error: col(row, 4)?,
            worker: col(row, 5)?,
        });
    }
    Ok(out)
}

/// One event with its history.
pub(crate) fn get(conn: &Connection, id: EventId) -> Result<Option<Event>> {
    match event_by_id(conn, id)? {
        None => Ok(None),
        Some((seq, mut event)) => {
            event.history = history(conn, seq)?;
            Ok(Some(event))
        }
    }
}

pub(crate) fn insert(conn: &Connection, e: &NewEvent, now: i64) -> Result<Inserted> {
    const CTX: &str = "inserting an event";
    let id = e.id.to_string();
    let inserted = conn
        .prepare_cached(
            "INSERT INTO events (id, source, topic, dedup_key, key, type, status, attempts,
                 max_attempts, next_attempt_at, received_at, correlation_id, causation_id,
                 content_type, payload)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', 0, ?7, ?8, ?8, ?9, ?10, ?11, ?12)
             ON CONFLICT (source, dedup_key) DO NOTHING",
        )
        .map_err(db(CTX))?
        .execute((
            &id,
            &e.source,
            &e.topic,
            &e.dedup_key,
            &e.key,
            &e.event_type,
            e.max_attempts,
            now,
            &e.correlation_id,
            &e.causation_id,
            &e.content_type,
            &e.payload[..],
        ))
        .map_err(db(CTX))?;
    if inserted == 1 {
        return Ok(Inserted {
            id: e.id,
            duplicate: false,
        });
    }
    let stored: String = conn
        .prepare_cached("SELECT id FROM events WHERE source = ?1 AND dedup_key = ?2")
        .map_err(db(CTX))?
        .query_row((&e.source, &e.dedup_key), |r| r.get(0))
        .map_err(db(CTX))?;
    let id = stored
        .parse()
        .map_err(|err| StoreError::Corrupt(format!("event id {stored:?}: {err}")))?;
    Ok(Inserted {
        id,
        duplicate: true,
    })
}

// Claims name their index: without table statistics the planner may
// prefer `events_topic` and walk every finished event of the topic.
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
    let running: HashSet<String> = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT DISTINCT key FROM events
                 WHERE topic = ?1 AND status = 'running' AND key IS NOT NULL",
            )
            .map_err(db(CTX))?;
        let rows = stmt.query_map([topic], |r| r.get(0)).map_err(db(CTX))?;
        rows.collect::<rusqlite::Result<_>>().map_err(db(CTX))?
    };
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
        let key = match row.get_ref(1).map_err(db(CTX))? {
            rusqlite::types::ValueRef::Null => None,
            value => Some(
                value
                    .as_str()
                    .map_err(|e| StoreError::Corrupt(format!("events.key: {e}")))?,
            ),
        };
        if let Some(key) = key {
            if seen.contains(key) {
                continue;
            }
            seen.insert(key.to_owned());
            if running.contains(key) {
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

pub(crate) fn complete(
    conn: &Connection,
    id: EventId,
    token: FencingToken,
    completion: &Completion,
    now: i64,
) -> Result<()> {
    const CTX: &str = "completing an attempt";
    let (status, next, error, outcome) = match completion {
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
    };
    let id = id.to_string();
    let row: Option<(i64, i64, Option<String>)> = conn
        .prepare_cached(
            "UPDATE events
             SET status = ?1, next_attempt_at = ?2, lease_until = NULL,
                 last_error = COALESCE(?3, last_error)
             WHERE id = ?4 AND status = 'running' AND attempts = ?5
             RETURNING seq, started_at, worker",
        )
        .map_err(db(CTX))?
        .query_row((status.as_str(), next, error, &id, token.0), |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()
        .map_err(db(CTX))?;
    let Some((seq, started_at, worker)) = row else {
        return Err(stale_or_missing(conn, &id));
    };
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
/// array (history rows first, then the status), so a batch of 500 costs two
/// statement executions instead of a thousand; the rest, and any repeat of
/// an id already in the set, go through [`complete`] one by one. A stale or
/// unknown item fails alone and writes nothing; any other error is returned
/// whole, and the caller's savepoint undoes the lot.
pub(crate) fn complete_many(
    conn: &Connection,
    items: &[(EventId, FencingToken, Completion)],
    now: i64,
) -> Result<Vec<Result<()>>> {
    const CTX: &str = "completing a batch";
    let mut results: Vec<Option<Result<()>>> = (0..items.len()).map(|_| None).collect();
    // Done items with a first-seen id go to the set; two history rows for
    // one (event, attempt) would break the attempts key.
    let mut seen = HashSet::with_capacity(items.len());
    let mut set: Vec<usize> = Vec::with_capacity(items.len());
    for (i, (id, _, completion)) in items.iter().enumerate() {
        if matches!(completion, Completion::Done) && seen.insert(*id) {
            set.push(i);
        }
    }
    if !set.is_empty() {
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
        let mut applied = HashSet::with_capacity(set.len());
        {
            let mut stmt = conn
                .prepare_cached(
                    "UPDATE events SET status = 'done', next_attempt_at = NULL, lease_until = NULL
                     FROM (SELECT value ->> 0 AS id, value ->> 1 AS token FROM json_each(?1)) AS j
                     WHERE events.id = j.id AND events.status = 'running'
                       AND events.attempts = j.token
                     RETURNING events.id",
                )
                .map_err(db(CTX))?;
            let mut rows = stmt.query([&json]).map_err(db(CTX))?;
            while let Some(row) = rows.next().map_err(db(CTX))? {
                let id: String = col(row, 0)?;
                applied.insert(id);
            }
        }
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

/// ` AND ...` conditions and their parameters for a filter.
fn filter_sql(filter: &ListFilter) -> (String, Vec<Box<dyn ToSql>>) {
    let mut sql = String::new();
    let mut params: Vec<Box<dyn ToSql>> = Vec::new();
    if let Some(topic) = &filter.topic {
        params.push(Box::new(topic.clone()));
        sql.push_str(&format!(" AND topic = ?{}", params.len()));
    }
    if let Some(status) = filter.status {
        params.push(Box::new(status.as_str()));
        sql.push_str(&format!(" AND status = ?{}", params.len()));
    }
    if let Some(key) = &filter.key {
        params.push(Box::new(key.clone()));
        sql.push_str(&format!(" AND key = ?{}", params.len()));
    }
    (sql, params)
}

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

pub(crate) fn list(conn: &Connection, filter: &ListFilter) -> Result<Page> {
    const CTX: &str = "listing events";
    let limit = match filter.limit {
        0 => DEFAULT_LIMIT,
        n => n.min(MAX_LIMIT),
    };
    let (mut cond, mut params) = filter_sql(filter);
    if let Some(KeyCursor(after_id)) = filter.cursor {
        let seq: Option<i64> = conn
            .prepare_cached("SELECT seq FROM events WHERE id = ?1")
            .map_err(db(CTX))?
            .query_row([after_id.to_string()], |r| r.get(0))
            .optional()
            .map_err(db(CTX))?;
        let seq = seq.ok_or_else(|| {
            StoreError::Invalid(format!("cursor {after_id} names no stored event"))
        })?;
        params.push(Box::new(seq));
        cond.push_str(&format!(" AND seq < ?{}", params.len()));
    }
    // One row more than the page tells whether another page follows.
    params.push(Box::new(i64::from(limit) + 1));
    let sql = format!(
        concat!(
            "SELECT ",
            event_cols!(),
            " FROM events WHERE 1{} ORDER BY seq DESC LIMIT ?{}"
        ),
        cond,
        params.len()
    );
    let refs: Vec<&dyn ToSql> = params.iter().map(|p| p.as_ref()).collect();
    let mut events: Vec<Event> = query_events(conn, &sql, &refs, CTX)?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let next_cursor = if events.len() > limit as usize {
        events.truncate(limit as usize);
        events.last().map(|e| KeyCursor(e.id))
    } else {
        None
    };
    Ok(Page {
        events,
        next_cursor,
    })
}

pub(crate) fn stats(conn: &Connection) -> Result<Vec<TopicStats>> {
    const CTX: &str = "computing stats";
    // Reads run in one transaction (see `reader`): the counts are of one snapshot.
    let count_by = |sql: &str| -> Result<Vec<(String, String, u64)>> {
        let mut stmt = conn.prepare_cached(sql).map_err(db(CTX))?;
        let mut rows = stmt.query([]).map_err(db(CTX))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(db(CTX))? {
            let count: i64 = col(row, 2)?;
            out.push((
                col(row, 0)?,
                col(row, 1)?,
                u64::try_from(count).unwrap_or(0),
            ));
        }
        Ok(out)
    };
    // Each status but done is counted from an index holding only it (the
    // partial indexes of migration 2); done is what is left of the total.
    let totals = count_by("SELECT topic, 'all', COUNT(*) FROM events GROUP BY topic")?;
    let mut parts = count_by(
        "SELECT topic, 'pending', COUNT(*) FROM events WHERE status = 'pending' GROUP BY topic",
    )?;
    parts.extend(count_by(
        "SELECT topic, 'running', COUNT(*) FROM events WHERE status = 'running' GROUP BY topic",
    )?);
    parts.extend(count_by(
        "SELECT topic, status, COUNT(*) FROM events
         WHERE status IN ('dead', 'skipped') GROUP BY topic, status",
    )?);
    let mut by_topic: BTreeMap<String, TopicStats> = totals
        .into_iter()
        .map(|(topic, _, total)| {
            let mut stats = TopicStats {
                topic: topic.clone(),
                ..TopicStats::default()
            };
            stats.counts.insert(Status::Done.as_str(), total);
            (topic, stats)
        })
        .collect();
    for (topic, status, count) in parts {
        let status: Status = status.parse().map_err(StoreError::Corrupt)?;
        let Some(stats) = by_topic.get_mut(&topic) else {
            continue;
        };
        if let Some(done) = stats.counts.get_mut(Status::Done.as_str()) {
            *done = done.saturating_sub(count);
        }
        stats.counts.insert(status.as_str(), count);
    }
    for stats in by_topic.values_mut() {
        stats.counts.retain(|_, n| *n > 0);
    }
    for stats in by_topic.values_mut() {
        // Arrival order: the first pending row is the oldest (replays keep their place).
        let oldest: Option<i64> = conn
            .prepare_cached(
                "SELECT received_at FROM events WHERE topic = ?1 AND status = 'pending'
                 ORDER BY seq LIMIT 1",
            )
            .map_err(db(CTX))?
            .query_row([&stats.topic], |r| r.get(0))
            .optional()
            .map_err(db(CTX))?;
        stats.oldest_pending = opt_ts(oldest)?;
        if stats.count(Status::Dead) > 0 {
            stats.blocked_keys = blocked_keys(conn, &stats.topic)?;
        }
    }
    Ok(by_topic.into_values().collect())
}

/// Keys of `topic` whose earliest open event (pending, running or dead) is
/// dead. Pending rows are walked in arrival order only as far as the last
/// such dead event.
fn blocked_keys(conn: &Connection, topic: &str) -> Result<u64> {
    const CTX: &str = "counting blocked keys";
    let earliest = |status: &str| -> Result<HashMap<String, i64>> {
        let mut stmt = conn
            .prepare_cached(
                "SELECT key, MIN(seq) FROM events
                 WHERE topic = ?1 AND status = ?2 AND key IS NOT NULL GROUP BY key",
            )
            .map_err(db(CTX))?;
        let rows = stmt
            .query_map((topic, status), |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(db(CTX))?;
        rows.collect::<rusqlite::Result<_>>().map_err(db(CTX))
    };
    let dead = earliest("dead")?;
    let Some(&last) = dead.values().max() else {
        return Ok(0);
    };
    let running = earliest("running")?;
    let mut first_pending: HashMap<String, i64> = HashMap::new();
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, key FROM events INDEXED BY events_pending
             WHERE topic = ?1 AND status = 'pending' AND seq < ?2 ORDER BY seq",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query((topic, last)).map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let seq: i64 = col(row, 0)?;
        if let Some(key) = col::<Option<String>>(row, 1)?
            && dead.contains_key(&key)
        {
            first_pending.entry(key).or_insert(seq);
        }
    }
    let before =
        |m: &HashMap<String, i64>, key: &str, seq: i64| m.get(key).is_some_and(|s| *s < seq);
    Ok(dead
        .iter()
        .filter(|(key, seq)| !before(&running, key, **seq) && !before(&first_pending, key, **seq))
        .count() as u64)
}

/// See [`Store::attempt_window`](mailroom_core::Store::attempt_window).
/// The window's attempts come from `attempts_finished` (migration 3); the
/// p95 is the nearest rank, `ceil(0.95 n)`-th shortest.
pub(crate) fn attempt_window(conn: &Connection, window: Duration) -> Result<Vec<AttemptWindow>> {
    const CTX: &str = "reading recent attempts";
    let now = now_ms();
    let mut by_topic: BTreeMap<String, AttemptWindow> = BTreeMap::new();
    {
        let mut stmt = conn
            .prepare_cached(
                "WITH w AS (
                     SELECT e.topic AS topic, a.outcome <> 'done' AS failed,
                            MAX(a.finished_at - a.started_at, 0) AS ms
                     FROM attempts a JOIN events e ON e.seq = a.event_seq
                     WHERE a.finished_at >= ?1),
                 r AS (
                     SELECT topic, failed, ms,
                            ROW_NUMBER() OVER (PARTITION BY topic ORDER BY ms) AS rank,
                            COUNT(*) OVER (PARTITION BY topic) AS n
                     FROM w)
                 SELECT topic, MAX(n), SUM(failed),
                        MAX(CASE WHEN rank = (95 * n + 99) / 100 THEN ms END)
                 FROM r GROUP BY topic",
            )
            .map_err(db(CTX))?;
        let mut rows = stmt.query([before(now, window)]).map_err(db(CTX))?;
        while let Some(row) = rows.next().map_err(db(CTX))? {
            let topic: String = col(row, 0)?;
            let finished: i64 = col(row, 1)?;
            let failed: i64 = col(row, 2)?;
            let p95: Option<i64> = col(row, 3)?;
            by_topic.insert(
                topic.clone(),
                AttemptWindow {
                    topic,
                    finished: u64::try_from(finished).unwrap_or(0),
                    failed: u64::try_from(failed).unwrap_or(0),
                    p95: p95.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
                    longest_running: None,
                },
            );
        }
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT topic, MIN(started_at) FROM events
             WHERE status = 'running' AND started_at IS NOT NULL GROUP BY topic",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query([]).map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let topic: String = col(row, 0)?;
        let started: i64 = col(row, 1)?;
        let age = Duration::from_millis(u64::try_from(now.saturating_sub(started)).unwrap_or(0));
        by_topic
            .entry(topic.clone())
            .or_insert_with(|| AttemptWindow {
                topic,
                ..AttemptWindow::default()
            })
            .longest_running = Some(age);
    }
    Ok(by_topic.into_values().collect())
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
    const CTX: &str = "applying retention";
    let done_before = before(now, retention.done);
    let dead_before = before(now, retention.dead);
    let dedup_before = before(now, retention.dedup);
    let to = from.saturating_add(PURGE_CHUNK);

    // Finished rows past the dedup window go first, with their history.
    let doomed: Vec<i64> = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT seq FROM events
                 WHERE seq > ?1 AND seq <= ?2
                   AND status IN ('done', 'skipped') AND received_at < ?3",
            )
            .map_err(db(CTX))?;
        let rows = stmt
            .query_map((from, to, dedup_before), |r| r.get(0))
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
    let dropped = conn
        .prepare_cached(
            "UPDATE events SET payload = NULL
             WHERE seq > ?1 AND seq <= ?2 AND payload IS NOT NULL
               AND ((status IN ('done', 'skipped') AND received_at < ?3)
                 OR (status = 'dead' AND received_at < ?4))",
        )
        .map_err(db(CTX))?
        .execute((from, to, done_before, dead_before))
        .map_err(db(CTX))?;
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
    Ok((
        PurgeReport {
            payloads_dropped: dropped as u64,
            rows_deleted: doomed.len() as u64,
        },
        next_from,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::StatementStatus;

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
