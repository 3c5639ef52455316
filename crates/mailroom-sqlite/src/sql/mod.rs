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
use mailroom_core::event_row::{self, EventColumn, EventRow};
use mailroom_core::{Event, Result, StoreError};
use rusqlite::types::FromSql;
use rusqlite::{Connection, Row, ToSql};
use std::time::Duration;

/// The columns [`event_from_row`] decodes, in order.
macro_rules! event_cols {
    () => {
        "seq, id, source, topic, dedup_key, key, type, status, attempts, max_attempts, \
         next_attempt_at, received_at, correlation_id, causation_id, content_type, payload, \
         last_error, lease_until, traceparent, priority, version"
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

/// A row selected with `event_cols!()`, read for [`event_row::decode`]
/// (times are stored as milliseconds since the epoch).
struct SqliteEvent<'a, 'r>(&'a Row<'r>);

impl SqliteEvent<'_, '_> {
    fn get<T: FromSql>(&self, c: EventColumn) -> Result<T> {
        self.0.get(c.index()).map_err(|e| corrupt(c, e))
    }
}

fn corrupt(c: EventColumn, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("events column {}: {e}", c.name()))
}

impl EventRow for SqliteEvent<'_, '_> {
    fn text(&self, c: EventColumn) -> Result<String> {
        self.get(c)
    }
    fn opt_text(&self, c: EventColumn) -> Result<Option<String>> {
        self.get(c)
    }
    fn integer(&self, c: EventColumn) -> Result<i64> {
        self.get(c)
    }
    fn opt_instant(&self, c: EventColumn) -> Result<Option<Timestamp>> {
        opt_ts(self.get(c)?)
    }
    /// The payload as bytes. Applications writing through the documented
    /// outbox INSERT may bind a string instead of a blob; both are the same
    /// bytes.
    fn bytes(&self, c: EventColumn) -> Result<Option<Bytes>> {
        use rusqlite::types::ValueRef;
        match self.0.get_ref(c.index()) {
            Ok(ValueRef::Null) => Ok(None),
            Ok(ValueRef::Blob(b)) | Ok(ValueRef::Text(b)) => Ok(Some(Bytes::copy_from_slice(b))),
            Ok(other) => Err(corrupt(c, format!("of type {:?}", other.data_type()))),
            Err(e) => Err(corrupt(c, e)),
        }
    }
}

/// Decodes a row selected with `event_cols!()`; returns its `seq` too.
pub(super) fn event_from_row(row: &Row<'_>) -> Result<(i64, Event)> {
    event_row::decode(&SqliteEvent(row))
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

#[cfg(test)]
mod tests {
    use mailroom_core::event_row::{EVENT_COLUMNS, selected_names};

    /// The select list every event statement uses names the shared event
    /// columns in their order, which the decoding reads by position.
    #[test]
    fn the_event_select_list_is_the_shared_column_list() {
        let names: Vec<&str> = EVENT_COLUMNS.iter().map(|c| c.name()).collect();
        assert_eq!(selected_names(event_cols!()), names);
    }
}
