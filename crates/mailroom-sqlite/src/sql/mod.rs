//! The SQL of every store operation, as plain functions of a connection,
//! one file per concern: [`rows`] (insert, get, list), [`claims`],
//! [`completions`] (complete, extend), [`admin`] (replay, skip),
//! [`maintenance`] (rescue, retention) and [`stats`](mod@stats). This file
//! holds what they share: error mapping, the store clock and row decoding.
//!
//! Write operations run on the writer thread inside its group transaction
//! (each in its own savepoint); reads run on a pooled read connection.
//! Why some statements are spelled as they are is told in
//! `docs/src/design/sqlite.md`.

use bytes::Bytes;
use jiff::Timestamp;
use mailroom_core::{Event, EventId, Result, StoreError};
use rusqlite::types::FromSql;
use rusqlite::{Connection, Row, ToSql};
use std::time::Duration;

/// The columns [`event_from_row`] decodes, in order.
macro_rules! event_cols {
    () => {
        "seq, id, source, topic, dedup_key, key, type, status, attempts, max_attempts, \
         next_attempt_at, received_at, correlation_id, causation_id, content_type, payload, \
         last_error, lease_until, traceparent, priority"
    };
}

mod admin;
mod claims;
mod completions;
mod maintenance;
mod rows;
mod stats;

pub(crate) use admin::{cancel, cancel_matching, replay, replay_matching, skip};
pub(crate) use claims::{claim, next_due};
pub(crate) use completions::{complete, complete_many, extend};
pub(crate) use maintenance::{expire, purge_step, rescue_expired};
pub(crate) use rows::{count, get, insert, list, search};
pub(crate) use stats::{Moved, attempt_window, count_moved, prune_traffic, stats, throughput};

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

pub(super) fn opt_ts(ms: Option<i64>) -> Result<Option<Timestamp>> {
    ms.map(ts).transpose()
}

pub(super) fn col<T: FromSql>(row: &Row<'_>, i: usize) -> Result<T> {
    row.get(i)
        .map_err(|e| StoreError::Corrupt(format!("events column {i}: {e}")))
}

/// The payload as bytes. Applications writing through the documented outbox
/// INSERT may bind a string instead of a blob; both are the same bytes.
pub(super) fn payload_col(row: &Row<'_>, i: usize) -> Result<Option<Bytes>> {
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
pub(super) fn event_from_row(row: &Row<'_>) -> Result<(i64, Event)> {
    let id: String = col(row, 1)?;
    let status: String = col(row, 7)?;
    let event = Event {
        id: EventId::parse_stored(&id)?,
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
        traceparent: col(row, 18)?,
        priority: col(row, 19)?,
        history: Vec::new(),
    };
    Ok((col(row, 0)?, event))
}

/// Runs a query returning `event_cols!()` rows.
pub(super) fn query_events(
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
