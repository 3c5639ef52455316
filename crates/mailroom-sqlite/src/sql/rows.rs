//! Rows: inserting an event, reading one with its history, and listing
//! (or searching, or counting) them a page at a time.

use super::{after, col, db, opt_ts, query_events, ts};
use mailroom_core::{
    Attempt, Delivery, Event, EventId, EventSearch, Inserted, KeyCursor, ListFilter, NewEvent,
    Page, Result, StoreError,
};
use rusqlite::{Connection, OptionalExtension, ToSql};

/// Default and largest page of a listing.
const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;

/// Stores `e` as pending, due as its [`Delivery`] says, unless its (source,
/// dedup key) is already stored: then answers with the stored id. An event
/// due later is held (`held_until`, schema migration 6) until a claim finds
/// it due.
pub(crate) fn insert(conn: &Connection, e: &NewEvent, now: i64) -> Result<Inserted> {
    const CTX: &str = "inserting an event";
    let id = e.id.to_string();
    let inserted = conn
        .prepare_cached(
            "INSERT INTO events (id, source, topic, dedup_key, key, type, status, attempts,
                 max_attempts, next_attempt_at, received_at, correlation_id, causation_id,
                 content_type, payload, traceparent, priority, held_until, ready_at, version)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', 0, ?7, ?13, ?8, ?9, ?10, ?11, ?12, ?14,
                     ?15, CASE WHEN ?13 > ?8 THEN ?13 END, ?13, ?16)
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
            due(e.delivery, now),
            &e.traceparent,
            e.priority,
            &e.version,
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
    let id = EventId::parse_stored(&stored)?;
    Ok(Inserted {
        id,
        duplicate: true,
    })
}

/// When an event delivered as `delivery` and stored at `now` is first due.
fn due(delivery: Delivery, now: i64) -> i64 {
    match delivery {
        Delivery::Now => now,
        Delivery::At(at) => at.as_millisecond(),
        Delivery::After(d) => after(now, d),
    }
}

/// One event without its history, with its `seq`.
pub(super) fn event_by_id(conn: &Connection, id: EventId) -> Result<Option<(i64, Event)>> {
    let id = id.to_string();
    Ok(query_events(
        conn,
        concat!("SELECT ", event_cols!(), " FROM events WHERE id = ?1"),
        &[&id],
        "reading an event",
    )?
    .pop())
}

/// The attempt history of the event stored as `seq`, oldest first.
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

/// ` AND ...` conditions and their parameters for a filter.
pub(super) fn filter_sql(filter: &ListFilter) -> (String, Vec<Box<dyn ToSql>>) {
    let mut sql = String::new();
    let mut params: Vec<Box<dyn ToSql>> = Vec::new();
    if let Some(topic) = &filter.topic {
        params.push(Box::new(topic.clone()));
        sql.push_str(&format!(" AND topic = ?{}", params.len()));
    }
    if let Some(status) = filter.status {
        // A literal (one of the fixed status names), so that SQLite can
        // use the partial index of that status (`events_dead`).
        sql.push_str(&format!(" AND status = '{}'", status.as_str()));
    }
    if let Some(key) = &filter.key {
        params.push(Box::new(key.clone()));
        sql.push_str(&format!(" AND key = ?{}", params.len()));
    }
    (sql, params)
}

/// [`filter_sql`] and the conditions a search adds (error text, time range).
fn search_sql(search: &EventSearch) -> (String, Vec<Box<dyn ToSql>>) {
    let (mut sql, mut params) = filter_sql(&search.filter);
    if let Some(text) = &search.error_contains {
        params.push(Box::new(text.clone()));
        sql.push_str(&format!(" AND instr(last_error, ?{}) > 0", params.len()));
    }
    if let Some(from) = search.received_from {
        params.push(Box::new(from.as_millisecond()));
        sql.push_str(&format!(" AND received_at >= ?{}", params.len()));
    }
    if let Some(until) = search.received_until {
        params.push(Box::new(until.as_millisecond()));
        sql.push_str(&format!(" AND received_at < ?{}", params.len()));
    }
    (sql, params)
}

/// Events matching `filter`, newest first, a page at a time.
pub(crate) fn list(conn: &Connection, filter: &ListFilter) -> Result<Page> {
    search(
        conn,
        &EventSearch {
            filter: filter.clone(),
            ..EventSearch::default()
        },
    )
}

/// Events matching `search`, newest first, a page at a time.
pub(crate) fn search(conn: &Connection, search: &EventSearch) -> Result<Page> {
    const CTX: &str = "listing events";
    let filter = &search.filter;
    let limit = match filter.limit {
        0 => DEFAULT_LIMIT,
        n => n.min(MAX_LIMIT),
    };
    let (mut cond, mut params) = search_sql(search);
    if let Some(cursor) = filter.cursor {
        params.push(Box::new(cursor_seq(conn, cursor)?));
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
    let events: Vec<Event> = query_events(conn, &sql, &refs, CTX)?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    Ok(Page::from_overfetch(events, limit))
}

/// How many events match `search`.
pub(crate) fn count(conn: &Connection, search: &EventSearch) -> Result<u64> {
    const CTX: &str = "counting events";
    let (cond, params) = search_sql(search);
    let refs: Vec<&dyn ToSql> = params.iter().map(|p| p.as_ref()).collect();
    let n: i64 = conn
        .prepare_cached(&format!("SELECT COUNT(*) FROM events WHERE 1{cond}"))
        .map_err(db(CTX))?
        .query_row(&refs[..], |r| r.get(0))
        .map_err(db(CTX))?;
    Ok(n.unsigned_abs())
}

/// The `seq` a listing cursor stands for.
fn cursor_seq(conn: &Connection, KeyCursor(after_id): KeyCursor) -> Result<i64> {
    const CTX: &str = "listing events";
    let seq: Option<i64> = conn
        .prepare_cached("SELECT seq FROM events WHERE id = ?1")
        .map_err(db(CTX))?
        .query_row([after_id.to_string()], |r| r.get(0))
        .optional()
        .map_err(db(CTX))?;
    seq.ok_or_else(|| StoreError::Invalid(format!("cursor {after_id} names no stored event")))
}
