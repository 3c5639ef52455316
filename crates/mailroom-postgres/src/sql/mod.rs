//! The SQL of every store operation, as plain async functions of a pool,
//! one file per concern: [`rows`] (insert, get), [`search`] (listings and
//! searches), [`completions`] (complete, extend), [`admin`] (replay, skip),
//! [`maintenance`] (rescue, retention, election) and
//! [`stats`](mod@stats). This file holds what they share: error mapping,
//! time conversion and row decoding. The claim, with its statements, is
//! a module of its own ([`claim`](crate::claim)).
//!
//! Times cross the wire as `bigint` microseconds since the Unix epoch (the
//! resolution of `timestamptz`), so no date-time crate is needed between
//! PostgreSQL and [`jiff`]. Every instant that matters is computed by
//! PostgreSQL (`now()`: the transaction's start; `statement_timestamp()`
//! for claims' leases; `clock_timestamp()` for
//! [`Store::now`](mailroom_core::Store::now)); Rust only passes durations.
//! Why the statements are spelled as they are (index choice, generic
//! plans) is told in `docs/src/design/postgres.md`
//! and `docs/src/design/sequential.md`; the `plans` tests check it.

use crate::db::Db;
use bytes::Bytes;
use jiff::Timestamp;
use mailroom_core::event_row::{self, EVENT_COLUMNS, EventColumn, EventRow};
use mailroom_core::{Event, Result, StoreError};
use sqlx::Row;
use sqlx::postgres::PgRow;
use std::time::Duration;

/// Longest duration passed to SQL (200 years): keeps `now() + d` inside
/// both `timestamptz` and [`Timestamp`], and exact as a `float8` of microseconds.
const MAX_DURATION_US: i64 = 200 * 366 * 86_400 * 1_000_000;

/// `timestamptz` expression → `bigint` microseconds since the epoch (exact).
macro_rules! us {
    ($col:literal) => {
        concat!("(extract(epoch FROM ", $col, ") * 1000000)::int8")
    };
}

/// The columns [`event_from_row`] decodes, in order, for events aliased `e`.
macro_rules! event_cols {
    () => {
        concat!(
            "e.seq, e.id::text, e.source, e.topic, e.dedup_key, e.key, e.type, e.status, ",
            "e.attempts, e.max_attempts, ",
            us!("e.next_attempt_at"),
            ", ",
            us!("e.received_at"),
            ", e.correlation_id, e.causation_id, e.content_type, e.payload, e.last_error, ",
            us!("e.lease_until"),
            ", e.traceparent, e.priority, e.version"
        )
    };
}

mod admin;
mod completions;
mod maintenance;
#[cfg(test)]
mod plans;
mod rows;
mod search;
mod stats;
mod throttle;

pub(crate) use admin::{cancel, cancel_matching, replay, replay_matching, skip};
pub(crate) use completions::{complete, complete_many, extend};
pub(crate) use maintenance::{expire, purge, rescue_expired, try_lead};
pub(crate) use rows::{get, insert_batch};
pub(crate) use search::{count_matching, list, search};
pub(crate) use stats::{attempt_window, fold_counters, stats, throughput};
pub(crate) use throttle::{
    lock_and_count_running, pause_topic, paused_for, settle_tokens, take_tokens,
};

/// Maps a database error to a [`StoreError`], saying what was being done.
/// Data exceptions (SQLSTATE class 22: bad text encoding, out-of-range
/// values) are the caller's input; everything else means the database could
/// not do its part, and intake must answer 503 / nack.
pub(crate) fn db(context: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |e| match &e {
        sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("22")) => {
            StoreError::Invalid(format!("postgres: {context}: {e}"))
        }
        _ => StoreError::Unavailable(format!("postgres: {context}: {}", crate::tls::describe(&e))),
    }
}

/// A duration as SQL microseconds, capped at [`MAX_DURATION_US`].
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros())
        .unwrap_or(i64::MAX)
        .min(MAX_DURATION_US)
}

pub(crate) fn ts(us: i64) -> Result<Timestamp> {
    Timestamp::from_microsecond(us)
        .map_err(|e| StoreError::Corrupt(format!("timestamp {us} out of range: {e}")))
}

pub(crate) fn opt_ts(us: Option<i64>) -> Result<Option<Timestamp>> {
    us.map(ts).transpose()
}

pub(crate) fn col<'r, T>(row: &'r PgRow, i: usize) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
}

pub(super) fn count(row: &PgRow, i: usize) -> Result<u32> {
    let n: i64 = col(row, i)?;
    u32::try_from(n).map_err(|_| StoreError::Corrupt(format!("count {n} out of range")))
}

/// How many columns `event_cols!()` selects.
pub(crate) const EVENT_COLS: usize = EVENT_COLUMNS.len();

/// `event_cols!()`, for the statements written out in `.sql` files (the
/// claim's), which a test checks select it.
#[cfg(test)]
pub(crate) const EVENT_SELECT: &str = event_cols!();

/// A row selected with `event_cols!()`, read for [`event_row::decode`]
/// (times arrive as microseconds since the epoch).
struct PgEvent<'r>(&'r PgRow);

impl PgEvent<'_> {
    fn get<'r, T>(&'r self, c: EventColumn) -> Result<T>
    where
        T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        self.0
            .try_get(c.index())
            .map_err(|e| StoreError::Corrupt(format!("events column {}: {e}", c.name())))
    }
}

impl EventRow for PgEvent<'_> {
    fn text(&self, c: EventColumn) -> Result<String> {
        self.get(c)
    }
    fn opt_text(&self, c: EventColumn) -> Result<Option<String>> {
        self.get(c)
    }
    fn integer(&self, c: EventColumn) -> Result<i64> {
        match c {
            EventColumn::Priority => self.get::<i32>(c).map(i64::from),
            _ => self.get(c),
        }
    }
    fn opt_instant(&self, c: EventColumn) -> Result<Option<Timestamp>> {
        opt_ts(self.get(c)?)
    }
    fn bytes(&self, c: EventColumn) -> Result<Option<Bytes>> {
        Ok(self.get::<Option<Vec<u8>>>(c)?.map(Bytes::from))
    }
}

/// Decodes a row selected with `event_cols!()`; returns its `seq` too.
pub(crate) fn event_from_row(row: &PgRow) -> Result<(i64, Event)> {
    event_row::decode(&PgEvent(row))
}

pub(super) fn events_from_rows(rows: &[PgRow]) -> Result<Vec<(i64, Event)>> {
    rows.iter().map(event_from_row).collect()
}

pub(crate) async fn now(pool: &Db) -> Result<Timestamp> {
    let us: i64 = sqlx::query_scalar(concat!("SELECT ", us!("clock_timestamp()")))
        .fetch_one(pool)
        .await
        .map_err(db("reading the database clock"))?;
    ts(us)
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
